"""A pipeline served by the launcher with its HTTP server, for the benchmarks that go through
HTTP (benchmarks.http_serving, benchmarks.http_turns); and the shipped Qwen3-Omni config on the
released-size checkpoint (random weights), which the GPU runs of those benchmarks serve."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common.phases import REPO
from benchmarks.common.warmup import warmup_line
from omni_mp.stage_configs import CONFIG_DIR


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(config: Path, url: str) -> tuple[subprocess.Popen[str], str]:
    """The launcher serving `config` with its HTTP server at `url`: (process, ZMQ endpoint)
    once /health answers 200. Stop it with SIGINT."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "omni_mp.launch", "--config", str(config), "--http", url.removeprefix("http://")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    endpoint = None
    for line in proc.stdout:
        print(line, end="", flush=True)  # the launcher's start-up, for the record
        m = re.search(r"serving pipeline .* on (\S+)", line)
        if m:
            endpoint = m.group(1)
            break
    if endpoint is None:
        raise RuntimeError(f"the launcher exited with {proc.wait()}")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep its pipe drained
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, endpoint
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the HTTP server did not come up")


def measure_served(
    config: Path, serving: tuple[str, str] | None, measure: Callable[[str, str], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """`measure(url, endpoint)` on the pipeline already `serving` at (URL, ZMQ endpoint), or on
    one started here for `config` and stopped after."""
    if serving is not None:
        return asyncio.run(measure(*serving))
    url = f"http://127.0.0.1:{free_port()}"
    proc, endpoint = start(config, url)
    try:
        return asyncio.run(measure(url, endpoint))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)


def write_result(out: Path | None, config: Path, tokens: int, result: dict[str, Any]) -> None:
    """The warm-up line, and the result as JSON in `out` (if given)."""
    print(warmup_line(result["warmup"]), flush=True)
    if out:
        out.write_text(json.dumps({"config": str(config), "tokens": tokens, **result}, indent=1))


def released_qwen3_omni(work_dir: Path, thinker_tokens: int, talker_frames: int, http_workers: int = 1) -> Path:
    """omni_mp/stage_configs/qwen3_omni.yaml as shipped (one GPU; the thinker's prefix cache on),
    on the released-size checkpoint with random weights (load_format dummy) and the released
    tokenizer ids: every answer `thinker_tokens` long (ignore_eos), every spoken one
    `talker_frames` frames (the codec's control ids suppressed), so runs compare like for like;
    served by `http_workers` HTTP server processes."""
    from benchmarks.common.checkpoints import qwen3_omni_processor_dir

    model = str(qwen3_omni_processor_dir(work_dir))
    raw: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "qwen3_omni.yaml").read_text())
    talker_cfg = yaml.safe_load((Path(model) / "config.json").read_text())["talker_config"]
    codebook = int(talker_cfg["code_predictor_config"]["vocab_size"])
    talker_vocab = int(talker_cfg["text_config"]["vocab_size"])
    for stage in raw["stages"]:
        stage["model"] = model
        if stage.get("kind", "ar") == "ar":
            stage["engine_args"]["load_format"] = "dummy"
    thinker, talker = raw["stages"][0], raw["stages"][1]
    thinker["sampling"].update(max_tokens=thinker_tokens, ignore_eos=True)
    talker["sampling"] = {
        "temperature": 0.0, "ignore_eos": True, "max_tokens": talker_frames + 1,
        "suppress_token_ids": list(range(codebook, talker_vocab)),
    }  # fmt: skip
    if http_workers != 1:
        raw.setdefault("http", {})["workers"] = http_workers
    out = work_dir / f"qwen3_omni_served_{thinker_tokens}_{talker_frames}_w{http_workers}.yaml"
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def released_qwen3_tts(work_dir: Path) -> Path:
    """omni_mp/stage_configs/qwen3_tts.yaml as shipped on the released-size Qwen3-TTS checkpoint
    with random weights (benchmarks.common.checkpoints.qwen3_tts_released_dir): `qwen3_tts_served`."""
    from benchmarks.common.checkpoints import qwen3_tts_released_dir

    out = work_dir / "qwen3_tts_served.yaml"
    out.write_text(yaml.safe_dump(qwen3_tts_served(qwen3_tts_released_dir(work_dir)), sort_keys=False))
    return out


def qwen3_tts_served(model: Path) -> dict[str, Any]:
    """The shipped qwen3_tts.yaml (raw) on checkpoint `model`, its talker never sampling EOS:
    random weights may say it at once or never, so every request runs to its `max_new_tokens`
    (benchmarks.tts_serving sets one per sentence) and runs compare like for like."""
    raw: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "qwen3_tts.yaml").read_text())
    eos = int(json.loads((model / "config.json").read_text())["talker_config"]["codec_eos_token_id"])
    for stage in raw["stages"]:
        stage["model"] = str(model)
    raw["stages"][0]["sampling"]["suppress_token_ids"] = [eos]  # beside the entry stage's control ids
    return raw


def main() -> None:
    """`python -m benchmarks.common.served WORK_DIR TOKENS FRAMES [HTTP_WORKERS]`: write the released
    config, print its path (scripts/gpu/http_benchmarks.sh serves it once for several benchmarks)."""
    work_dir, tokens, frames = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    print(released_qwen3_omni(Path(work_dir), tokens, frames, workers))


if __name__ == "__main__":
    main()
