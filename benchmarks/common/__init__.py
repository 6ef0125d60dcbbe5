"""What the benchmark runners share (a runner imports these, never another runner):

- report: progress lines (`make_say`), phase errors, matplotlib if present, formatting
- stats: percentiles (each runner's own definition, named)
- phases: a phase in a fresh process, its result file, the device's name
- warmup: each concurrency level's warm-up, recorded for the report and the JSON
- rounds: the omni pipelines' request rounds (timing, playback, fixed-length checks)
- timelines: the stages' step timelines (OMNI_MP_PROFILE_DIR), per level and per request
- peer_report: vllm-omni's result files (benchmarks.peer_vllm_omni) beside omni_mp's
- checkpoints: the Qwen2.5-Omni and Qwen3-Omni model dirs at released sizes (random weights)
- qwen_image_dir: the Qwen-Image checkpoint dir at real sizes (random weights)
- omni_bench_dir: tokenizer and processor files beside a config-only dir
- token2wav_options: token2wav's precision and torch.compile choices
- cuda_timing: synchronized wall times, CUDA-event timings, kernel tables
"""
