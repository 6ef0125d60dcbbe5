"""CUDA graphs check for the Qwen3-Omni talker stage: our vLLM talker (the code predictor inside
its step) on the tiny checkpoint, fp32, as the talker stage runs it (in-process engine, prompt
and per-step rows from the `qwen3_omni_talker` processor, hidden-row output), with
`enforce_eager: true` and with vLLM's default (torch.compile + CUDA graphs: FULL graphs of
decode batches replay the whole step, code predictor included), against transformers'
`generate` (fp32, greedy thinker/talker/code predictor, on the CPU): 8 concurrent requests
(text, image and audio prompts, three speakers), each fed its thinker reply one token per
talker step. Per request and mode it prints AGREE when every frame's 16 codes (and the
group-0 tokens) equal transformers', DIFFER otherwise; and how many forwards ran in Python
(a replayed CUDA graph runs none).

    python launch/gpu_qwen3_talker_check.py                  # GPU 0, eager then graphs
    python launch/gpu_qwen3_talker_check.py --device cpu --modes eager   # CPU smoke run

Exit code 0 when every request agrees in every mode, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from omni_mp.models.qwen3_omni.codes import codes_of_rows  # noqa: E402
from tests.launcher import in_process_engine  # noqa: E402
from tests.test_qwen3_talker import TEXTS, Talk, model_dir, oracle  # noqa: E402

REQUESTS = [  # (case, text, speaker)
    ("text", TEXTS[0], "Ethan"),
    ("image", TEXTS[0], "Chelsie"),
    ("audio", TEXTS[1], "Aiden"),
    ("text", TEXTS[2], "Chelsie"),
    ("text", TEXTS[1], "Ethan"),
    ("image", TEXTS[2], "Aiden"),
    ("audio", TEXTS[0], "Ethan"),
    ("text", TEXTS[0], "Aiden"),
]


def _python_forwards(worker: Any) -> int:
    return int(worker.model_runner.get_model().python_forwards)


def run_mode(eager: bool, device: str) -> tuple[list[Talk], dict[str, Any]]:
    from omni_mp.engines.ar import EngineFeatures
    from omni_mp.models.qwen3_omni.vllm_hooks_talker import talker_engine_model

    em = talker_engine_model(model_dir(), {"dtype": "float32", "enforce_eager": eager, "max_model_len": 512})
    args = {**em.engine_args, "max_num_seqs": 8}
    if device == "cuda":
        args["kv_cache_memory_bytes"] = 1 << 30  # a fixed KV cache: the two engines run one after the other
    features = EngineFeatures(hidden_states=True, prompt_embeds=True, step_embeds=True)
    t0 = time.monotonic()
    with in_process_engine(em.model, args, features) as eng:
        init_s = time.monotonic() - t0
        core = eng.driver.core
        mode = str(core.vllm_config.compilation_config.cudagraph_mode)
        before = core.model_executor.collective_rpc(_python_forwards)[0]
        talks = [
            Talk(eng, f"r{i}", oracle(case, text, speaker), speaker, streamed=True)
            for i, (case, text, speaker) in enumerate(REQUESTS)
        ]
        by_id = {t.rid: t for t in talks}
        steps = 0
        t1 = time.monotonic()
        for _ in range(2000):
            for t in talks:
                t.feed()
            if all(t.finished for t in talks):
                break
            if not eng.can_step():
                continue
            outputs, _ = eng.step()
            steps += 1
            failed = eng.take_failed()
            if failed:
                raise RuntimeError(f"requests failed: {failed}")
            for out in outputs:
                by_id[out.request_id].take(out)
        python = core.model_executor.collective_rpc(_python_forwards)[0] - before
        info = {
            "init_s": round(init_s, 1),
            "run_s": round(time.monotonic() - t1, 2),
            "cudagraph_mode": mode,
            "engine_steps": steps,
            "python_forwards": python,
        }
    return talks, info


def verdict(t: Talk) -> dict[str, Any]:
    rows = torch.cat(t.rows) if t.rows else torch.zeros(0, 17)
    got = codes_of_rows(rows)[t.prompt_len :] if rows.shape[0] else rows
    want = t.run.codes
    same = t.tokens == t.run.talker_tokens and got.shape == want.shape and torch.equal(got, want)
    out = {"frames": int(want.shape[0]), "got_frames": int(got.shape[0]), "agree": bool(same)}
    n = min(got.shape[0], want.shape[0])
    diff = (got[:n] != want[:n]).nonzero()
    if diff.shape[0]:  # where it starts: group 0 is the decoder's token, 1..15 the code predictor's
        out["first_diff"] = {"frame": int(diff[0, 0]), "group": int(diff[0, 1]), "codes_differing": int(diff.shape[0])}
    return out


def run_one(label: str, device: str) -> dict[str, Any]:
    """One mode in this process: its engine, its verdicts."""
    print(f"[check] oracle: transformers generate on the CPU for {len(REQUESTS)} requests", flush=True)
    for case, text, speaker in REQUESTS:
        oracle(case, text, speaker)
    talks, info = run_mode(label == "eager", device)
    rows = []
    for (case, _text, speaker), t in zip(REQUESTS, talks, strict=True):
        v = verdict(t)
        rows.append({"request": t.rid, "case": case, "speaker": speaker, **v})
    return {"info": info, "requests": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="eager,graphs", help="comma-separated: eager, graphs")
    p.add_argument("--out", type=Path, default=Path("qwen3_talker_check.json"))
    args = p.parse_args()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    modes = args.modes.split(",")
    report: dict[str, Any] = {"device": name, "modes": {}}
    if len(modes) == 1:
        report["modes"][modes[0]] = run_one(modes[0], args.device)
    else:  # each mode in a process of its own: a fresh vLLM engine and CUDA context each
        for label in modes:
            print(f"[check] {label} on {name}", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "mode.json"
                cmd = [sys.executable, __file__, "--device", args.device, "--modes", label, "--out", str(out)]
                done = subprocess.run(cmd, check=False)
                if done.returncode not in (0, 1) or not out.exists():
                    print(f"[check] {label}: failed (exit {done.returncode})")
                    return 2
                report["modes"][label] = json.loads(out.read_text())["modes"][label]
    ok = True
    for label, result in report["modes"].items():
        print(f"[check] {label} on {name}: {result['info']}")
        for row in result["requests"]:
            ok &= row["agree"]
            verdict_s = "AGREE" if row["agree"] else f"DIFFER {row.get('first_diff', '')}"
            print(f"  {row['request']} {row['case']:5s} {row['speaker']:7s} frames {row['frames']:3d}: {verdict_s}")
    args.out.write_text(json.dumps(report, indent=2))
    print(f"[check] {'AGREE' if ok else 'DIFFER'} (report: {args.out})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
