"""`python -m tests.gpu.talker_modes MODE DEVICE OUT`: the Qwen3-Omni talker stage's engine in one
mode (eager, or graphs: vLLM's torch.compile + CUDA graphs, whose FULL graphs of decode batches
replay the whole step, code predictor included) on the tiny checkpoint, fp32, fed as the
talker stage is fed (in-process engine, prompt and per-step rows from the `qwen3_omni_talker`
processor, hidden-row output), 8 concurrent requests (text, image and audio prompts, three
speakers), each fed its thinker reply one token per talker step; every request's frames (16
codes each) and group-0 tokens against transformers' `generate` (fp32, greedy, CPU). Writes
{"info", "requests"} to OUT. Each mode runs in a process of its own (a fresh vLLM engine and
CUDA context): tests/gpu/test_qwen3_talker_graphs.py starts one per mode."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from omni_mp.models.qwen3_omni.codes import codes_of_rows  # noqa: E402
from tests.launcher import in_process_engine  # noqa: E402
from tests.qwen3_talker_oracle import TEXTS, Talk, model_dir, oracle  # noqa: E402

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
        t1 = time.monotonic()
        steps = drive(eng, talks)
        python = core.model_executor.collective_rpc(_python_forwards)[0] - before
        info = {
            "init_s": round(init_s, 1),
            "run_s": round(time.monotonic() - t1, 2),
            "cudagraph_mode": mode,
            "engine_steps": steps,
            "python_forwards": python,
        }
    return talks, info


def drive(eng: Any, talks: list[Talk]) -> int:
    """Feed and step until every request finished; the engine steps taken."""
    by_id = {t.rid: t for t in talks}
    steps = 0
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
    return steps


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
        rows.append({"request": t.rid, "case": case, "speaker": speaker, **verdict(t)})
    return {"info": info, "requests": rows}


if __name__ == "__main__":
    mode_, device_, out_ = sys.argv[1:4]
    Path(out_).write_text(json.dumps(run_one(mode_, device_), indent=2))
