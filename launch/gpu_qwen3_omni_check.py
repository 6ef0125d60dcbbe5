"""CUDA graphs check for Qwen3-Omni: the tiny thinker -> talker (code predictor inside its step)
-> code2wav pipeline (omni_mp/stage_configs/tiny_qwen3_omni.yaml, fp32) with `enforce_eager: true` and
with vLLM's default (torch.compile + CUDA graphs), side by side on the GPU: 8 concurrent
requests (text, audio, image and audio + image prompts, three speakers). Per request it prints
whether the thinker tokens, the talker's frames (group 0) and the audio agree; with
`--oracle`, also against transformers (CPU, tests/hf_oracle_qwen3_omni.py).

    python launch/gpu_qwen3_omni_check.py                # every stage on GPU 0
    python launch/gpu_qwen3_omni_check.py --gpus 2       # thinker on GPU 0, talker + code2wav on GPU 1
    python launch/gpu_qwen3_omni_check.py --gpus 0       # CPU: torch.compile without graphs
    python launch/gpu_qwen3_omni_check.py --compare sync,graphs   # async scheduling vs synchronous

Exit code 0 when the two modes agree everywhere, 1 otherwise. On hosts whose vLLM lacks
`blake3` (the lent GPU machines), set VLLM_MM_HASHER_ALGORITHM=sha256 (vLLM hashes media).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.gpu_omni_check import COMPARE_HELP, MODES, compare_modes  # noqa: E402
from omni_mp.client.omni_client import AsyncOmniClient  # noqa: E402
from omni_mp.config.validate import parse_config  # noqa: E402
from omni_mp.control.embedded import embedded_pipeline  # noqa: E402
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.messages import Finished  # noqa: E402
from tests.synthetic_media import pattern, tone  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
AUDIO_RTOL = 1e-3  # relative L2 between the two runs' waveforms (same codes)

REQUESTS: list[dict[str, Any]] = [
    {"text": "Tell me a short story about the sea.", "speaker": "ethan"},
    {"text": "What do you hear?", "audio": True, "speaker": "chelsie"},
    {"text": "Describe the picture.", "image": True, "speaker": "aiden"},
    {"text": "Hello there, how are you?", "speaker": "chelsie"},
    {"text": "Listen and look.", "audio": True, "image": True, "speaker": "ethan"},
    {"text": "Graphs must not change the answer.", "speaker": "aiden"},
    {"text": "What colour is it?", "image": True, "speaker": "ethan"},
    {"text": "Count to five.", "speaker": "chelsie"},
]


def config(mode: str, gpus: int) -> Any:
    """The YAML's pipeline with every stage on the GPU(s) (gpus 0: on the CPU, as in the YAML)."""
    raw = yaml.safe_load((CONFIG_DIR / "tiny_qwen3_omni.yaml").read_text())
    raw["name"] = f"tiny_qwen3_omni_{mode}"
    for stage in raw["stages"]:
        args = stage.setdefault("engine_args", {})
        if stage.get("kind") != "diffusion":
            args.update(MODES[mode])
        if gpus == 0:
            continue
        stage["devices"] = [0] if gpus == 1 or stage["id"] == 0 else [1]
        if stage.get("kind") != "diffusion":
            args["kv_cache_memory_bytes"] = 1 << 30  # engines share a GPU
    return parse_config(raw)


def _media(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "audios": [(torch.from_numpy(tone(1.0)), 16_000)] if r.get("audio") else [],
        "images": [torch.from_numpy(pattern(64))] if r.get("image") else [],
    }


async def run(cfg: Any, inspect: Callable[[Any], None] | None = None) -> tuple[list[Finished], float]:
    """The requests, concurrently; `inspect` sees the running coordinator first."""
    with embedded_pipeline(cfg, progress=lambda m: print(f"  {m}", flush=True)) as coord:
        if inspect is not None:
            inspect(coord)
        async with AsyncOmniClient(coord.client_endpoint) as client:
            t0 = time.perf_counter()
            jobs = [client.generate(r["text"], speaker=r["speaker"], deadline_s=900, **_media(r)) for r in REQUESTS]
            done = await asyncio.gather(*jobs)
            return list(done), time.perf_counter() - t0


def outputs(done: Finished) -> tuple[list[int], list[int], torch.Tensor]:
    """Thinker tokens, the talker's group-0 codes (without the codec eos), audio."""
    out = {o.stage_id: o for o in done.outputs}
    codes = out[1].token_ids[:-1] if out[1].finish_reason == "stop" else out[1].token_ids
    return out[0].token_ids, codes, out[2].audio


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, choices=(0, 1, 2), default=1, help="0: on the CPU (torch.compile, no graphs)")
    p.add_argument("--oracle", action="store_true", help="also compare with transformers on the CPU")
    p.add_argument("--out", type=Path, default=Path("qwen3_omni_check.json"))
    p.add_argument("--compare", default="eager,graphs", help=COMPARE_HELP)
    args = p.parse_args()
    modes = compare_modes(p, args.compare)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    results = {}
    for label in modes:
        print(f"[check] {label} ({device}, {args.gpus} GPU(s))", flush=True)
        results[label], wall = asyncio.run(run(config(label, args.gpus)))
        print(f"[check] {label}: {len(REQUESTS)} requests in {wall:.1f}s", flush=True)
    ok = True
    rows = []
    for i, r in enumerate(REQUESTS):
        (te, ce, ae), (tg, cg, ag) = outputs(results[modes[0]][i]), outputs(results[modes[1]][i])
        rel = float((ae - ag).norm() / ae.norm()) if ae.shape == ag.shape and ae.norm() > 0 else math.inf
        agree = te == tg and ce == cg and rel <= AUDIO_RTOL
        row: dict[str, Any] = {
            "request": i,
            "prompt": r["text"] + (" +audio" if r.get("audio") else "") + (" +image" if r.get("image") else ""),
            "speaker": r["speaker"],
            "thinker_tokens": len(te),
            "frames": len(ce),
            "audio_s": ae.numel() / 24_000,
            "thinker_equal": te == tg,
            "frames_equal": ce == cg,
            "audio_rel_l2": rel,
        }
        if args.oracle:
            from omni_mp.models.registry import resolve_model
            from tests.hf_oracle_qwen3_omni import omni_generate

            thinker_tokens = int(config("eager", 0).stages[0].sampling.max_tokens)
            want = omni_generate(
                resolve_model("tiny-qwen3-omni"), r["text"],
                audio=tone(1.0) if r.get("audio") else None, image=pattern(64) if r.get("image") else None,
                speaker=r["speaker"], thinker_max_new_tokens=thinker_tokens, talker_max_new_tokens=512,
            )  # fmt: skip
            group0 = want.codes[:, 0].tolist()
            for what, got, ref, margins in (
                ("thinker", te, want.thinker_ids, want.thinker_margins),
                ("frames", ce, group0, want.code_margins),
            ):
                first = next((k for k, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), None)
                row[f"transformers_{what}_equal"] = got == ref
                if first is not None:
                    row[f"transformers_{what}_first_diff"] = first
                    row[f"transformers_{what}_margin_there"] = margins[first] if first < len(margins) else None
            if want.wav.shape == ae.shape:
                row["transformers_audio_rel_l2"] = float((ae - want.wav).norm() / want.wav.norm())
        ok &= agree
        rows.append(row)
        print(f"[check] req{i} {'AGREE' if agree else 'DIFFER'}: {json.dumps(row)}", flush=True)
    args.out.write_text(json.dumps({"device": device, "gpus": args.gpus, "compare": modes, "requests": rows}, indent=2))
    print(f"[check] {'ALL AGREE' if ok else 'MISMATCH'} -> {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
