"""Process lifecycle: start-up failures, CLI batch runs, shutdown by signal, SIGKILL of the coordinator."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from omni_mp.client.omni_client import OmniClient, RequestError
from omni_mp.media.audio_io import write_wav
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import SamplingParamsMsg
from tests.launcher import REPO, abstract_sockets_of, check_shipped_run, config_args, run_cli, serve, sockets_left

pytestmark = pytest.mark.engine

SINGLE = REPO / "tests" / "configs" / "tiny_single.yaml"


def _launch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "omni_mp.launch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_a_mistyped_model_exits_2_before_any_stage_starts() -> None:
    t0 = time.monotonic()
    proc = _launch("--config", str(REPO / "tests/configs/bad_model.yaml"), "--prompt", "x")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "`stages[0].model`: '/nonexistent/omni_mp/model' is neither a built-in model (" in line
    assert "tiny-qwen2_5-omni" in line and "a path to a dir with config.json" in line
    assert "starting" not in proc.stderr  # no stage process was started
    assert elapsed <= 10, f"{elapsed:.1f}s"


def test_missing_or_unreadable_input_files_exit_2_before_any_stage_starts(tmp_path: Path) -> None:
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not an image")
    cases = [
        (["--audio", str(tmp_path / "missing.wav")], "missing.wav: no such file"),
        (["--image", str(not_an_image)], "cannot read the media files"),
        (["--prompts-file", str(tmp_path / "missing.txt")], "missing.txt"),
    ]
    for extra, want in cases:
        proc = _launch("--config", str(CONFIG_DIR / "tiny_qwen2_5_omni.yaml"), "--prompt", "x", *extra)
        assert proc.returncode == 2 and want in proc.stderr, (extra, proc.stderr[-2000:])
        assert "starting" not in proc.stderr
    # Audio longer than the model's processor takes whole is refused with both lengths.
    long = tmp_path / "long.wav"
    write_wav(long, np.zeros(16_000 * 40, dtype=np.float32), 16_000)
    proc = _launch("--config", str(CONFIG_DIR / "tiny_qwen2_5_omni.yaml"), "--prompt", "x", "--audio", str(long))
    assert proc.returncode == 2 and "40.00 s of audio; stage 0 takes at most 30 s" in proc.stderr
    # Media for a pipeline whose entry stage takes none (no prompt_format) are refused as well.
    audio = tmp_path / "a.wav"
    write_wav(audio, np.zeros(1600, dtype=np.float32), 16_000)
    proc = _launch("--config", str(CONFIG_DIR / "tiny_chain.yaml"), "--prompt", "x", "--audio", str(audio))
    assert proc.returncode == 2 and "stage 0 takes no media (it has no `prompt_format`)" in proc.stderr


def test_tcp_without_keys_says_how_to_make_them() -> None:
    proc = _launch("--config", str(CONFIG_DIR / "tiny_chain.yaml"), "--bind", "tcp://127.0.0.1:0")
    assert proc.returncode == 2
    assert "`omni-mp keys DIR --client NAME`" in proc.stderr and "`security: {keys: DIR}`" in proc.stderr
    assert "starting" not in proc.stderr


def test_startup_failure_names_the_stage_and_shows_its_log(tmp_path: Path) -> None:
    """A checkpoint dir that exists but that vLLM cannot load: only the stage can find out."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["NoSuchModelForLM"]}))
    config = tmp_path / "bad.yaml"
    config.write_text(
        (REPO / "tests/configs/bad_model.yaml").read_text().replace("/nonexistent/omni_mp/model", str(model))
    )
    t0 = time.monotonic()
    proc = _launch("--config", str(config), "--prompt", "x")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "stage 0 exited with code" in proc.stderr
    assert "NoSuchModelForLM" in proc.stderr  # from the stage's own log lines
    assert time.monotonic() - t0 < 120


def test_cli_runs_prompts_through_tiny_chain(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prompts = ["--prompt", "Hello world, how are you?", "--prompt", "The quick brown fox"]
    proc = run_cli(*config_args("tiny_chain"), *prompts, "--output-dir", str(out), cwd=tmp_path, timeout=600)
    check_shipped_run("tiny_chain", proc, out, requests=2)  # as tests/test_shipped_configs.py would run it
    assert "2/2 requests succeeded" in proc.stdout
    assert "stage 0: " in proc.stdout and "stage 1: " in proc.stdout
    records = [json.loads((out / f"req{i}.json").read_text()) for i in range(2)]
    assert records[1]["prompt"] == "The quick brown fox"
    assert len(records[0]["outputs"][0]["token_ids"]) == 16
    assert "requests: 100%" in proc.stderr  # the progress bar
    # Built-in tiny models: the output is noise by design, and the CLI says so (and where it went).
    assert "tiny-qwen2, tiny-qwen2-b = built-in tiny model(s) with random weights" in proc.stderr
    assert f"results go to {out.resolve()}/" in proc.stderr and "shutting down the pipeline" in proc.stderr


def test_sigterm_fails_inflight_requests_and_exits_clean() -> None:
    with serve(SINGLE) as served:
        with OmniClient(served.endpoint) as client:
            stage_pids = [s.pid for s in client.status().stages]
            errors: list[BaseException] = []
            started = threading.Event()

            def run() -> None:
                try:
                    long = {0: SamplingParamsMsg(max_tokens=2000, ignore_eos=True)}
                    for _ in client.stream("Hello", sampling=long, timeout_s=60):
                        started.set()
                except BaseException as err:  # noqa: BLE001
                    errors.append(err)

            t = threading.Thread(target=run)
            t.start()
            assert started.wait(60)
            t_signal = time.monotonic()
            served.proc.send_signal(signal.SIGTERM)
            t.join(30)
            assert served.proc.wait(60) == 0
            stop_s = time.monotonic() - t_signal
        # Stages close their sockets and exit without vLLM's teardown or the interpreter's
        # finalization (9.6 s before, here, for the three-stage demo; see omni_mp.utils.procs.exit_now).
        assert stop_s <= 2.0, f"the served pipeline took {stop_s:.1f}s to stop on SIGTERM"
        assert any("shutting down the pipeline" in line for line in served.lines)
        assert len(errors) == 1 and isinstance(errors[0], RequestError), errors
        assert errors[0].code in ("shutdown", "stage_died")
        for pid in stage_pids:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_sigterm_stops_a_server_whose_output_pipe_is_gone() -> None:
    """A server whose stdout and stderr went to a reader that has gone (a closed terminal, a
    supervisor that died, `| head`) still stops on SIGTERM, stages and sockets included: saying
    that it is shutting down must not stand in the way of shutting down."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_mp.launch", "--config", str(SINGLE)],
        cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        endpoint = None
        for line in proc.stdout:  # bounded by the start-up: the launcher prints its endpoint, or exits
            if m := re.search(r"serving pipeline .* on (\S+)", line):
                endpoint = m.group(1)
                break
        assert endpoint is not None, "the launcher exited before serving"
        with OmniClient(endpoint) as client:
            stage_pids = [s.pid for s in client.status().stages]
        run_id = endpoint.split("@", 1)[1].rsplit("-client", 1)[0]
        proc.stdout.close()  # the reader goes away: every later write of the launcher fails
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
    assert code == 0 and stop_s <= 10, f"exit {code} after {stop_s:.1f}s"
    _, alive = psutil.wait_procs([psutil.Process(p) for p in stage_pids if psutil.pid_exists(p)], timeout=10)
    assert not alive, f"stage processes outlived the launcher: {alive}"
    assert not sockets_left(run_id)


def test_coordinator_sigkill_leaves_no_orphans_or_sockets() -> None:
    with serve(SINGLE) as served:
        with OmniClient(served.endpoint) as client:
            stage_pids = [s.pid for s in client.status().stages]
        run_id = served.endpoint.split("@", 1)[1].rsplit("-client", 1)[0]
        assert abstract_sockets_of(run_id), "expected the run's abstract sockets while it is alive"
        served.proc.kill()
        served.proc.wait(10)
        gone, alive = psutil.wait_procs([psutil.Process(p) for p in stage_pids], timeout=5)
        assert not alive, f"stage processes survived a SIGKILL of the coordinator: {alive}"
        assert not sockets_left(run_id)
        # A killed coordinator cannot remove its stages' logs: they stay for a post-mortem. This
        # test's are removed here, so that a run of the suite leaves nothing behind.
        logs = list(Path(tempfile.gettempdir()).glob(f"{run_id}-logs-*"))
        assert len(logs) == 1 and (logs[0] / "stage0.log").exists(), logs
        shutil.rmtree(logs[0])
