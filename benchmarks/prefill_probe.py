"""Does a prefill step of the Qwen3-Omni thinker cost what its tokens cost? (issue 22)

In the pipeline's timeline (benchmarks.qwen3_omni_gpu, one H200) the thinker's prefill
chunks took 63 ms for 2048 tokens and 71 ms for 452, and the talker's about the same: a cost
per prefill step rather than per token, most of the first audio. This runs the thinker alone,
outside omni_mp's stage loop: vLLM's `LLM` on the same model part (`model_part:
qwen3_omni_thinker`, released sizes, random weights, no hidden-state export), one request at a
time, prompt-only (max_tokens 1), at several prompt lengths; wall ms per request, median of
--reps. If the short prompts cost what the long ones do in vLLM alone, the fixed cost is in
the model's kernels; if not, it is in the pipeline around them.

Found with it: a step above vLLM's largest CUDA graph size (2 x max_num_seqs by default) ran
outside any graph at 50-75 ms whatever its size; `--capture-sizes` adds prompt-chunk sizes
(docs/benchmarks/journal.md, "CUDA graphs for prefill steps").

    python3 -m benchmarks.prefill_probe --model-dir /tmp/qwen3_omni_gpu/qwen3_omni-released \
        [--max-num-seqs 64] [--capture-sizes 1,2,4,8,...,128,192,256,384,512,768,1024,1280,1536,1792,2048]
    (the dir benchmarks.qwen3_omni_gpu writes, benchmarks.common.checkpoints; written here when missing)

Each prompt length runs once unmeasured (its shapes' first run) before its --reps measured runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common.checkpoints import qwen3_omni_dir

# The engine core in this process, where omni_mp registered the thinker's architecture (as in a stage).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/qwen3_omni_gpu/qwen3_omni-released"))
    p.add_argument("--lengths", default="16,128,452,1024,2048,2500")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--max-num-seqs", type=int, default=64, help="the stage's (benchmarks.qwen3_omni_gpu)")
    p.add_argument(
        "--capture-sizes",
        default="",
        help="comma list: vLLM's cudagraph_capture_sizes (default: vLLM's own, up to 2 x max_num_seqs)",
    )
    p.add_argument("--out", type=Path, default=Path("prefill_probe.json"))
    args = p.parse_args()
    if not (args.model_dir / "config.json").is_file():
        args.model_dir = qwen3_omni_dir(args.model_dir.parent)
    from vllm import LLM, SamplingParams

    from omni_mp.models.qwen3_omni.vllm_hooks_thinker import thinker_engine_model

    em = thinker_engine_model(
        str(args.model_dir),
        {
            "dtype": "bfloat16", "load_format": "dummy", "skip_tokenizer_init": True, "max_model_len": 4096,
            "limit_mm_per_prompt": {"audio": 0, "image": 0, "video": 0}, "gpu_memory_utilization": 0.8, "seed": 0,
            "max_num_batched_tokens": 2048,  # the stage's (vLLM's online default); offline LLM takes more
            "max_num_seqs": args.max_num_seqs,
            **({"compilation_config": {"cudagraph_capture_sizes": [int(x) for x in args.capture_sizes.split(",")]}}
               if args.capture_sizes else {}),
        },
    )  # fmt: skip
    t0 = time.perf_counter()
    llm = LLM(model=em.model, **em.engine_args)
    ready_s = time.perf_counter() - t0
    print(f"[probe] engine ready in {ready_s:.1f}s", flush=True)
    comp = llm.llm_engine.vllm_config.compilation_config
    graphs = {"capture_sizes": list(comp.cudagraph_capture_sizes or []), "mode": str(comp.cudagraph_mode)}
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    rng = random.Random(0)
    results: dict[str, float] = {}
    for n in [int(x) for x in args.lengths.split(",")]:
        times = []
        for rep in range(args.reps + 1):
            ids = [rng.randrange(1000, 100000) for _ in range(n)]
            t = time.perf_counter()
            llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
            if rep:  # the first run of a length warms it
                times.append((time.perf_counter() - t) * 1000)
        results[str(n)] = statistics.median(times)
        print(f"[probe] {n:5d} prompt tokens: {results[str(n)]:7.1f} ms (median of {args.reps})", flush=True)
    doc = {"lengths_ms": results, "ready_s": ready_s, "graphs": graphs, "engine_args": em.engine_args}
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
