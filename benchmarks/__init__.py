"""omni_mp's benchmarks: one runner per model or question, run from a checkout's root with
`python -m benchmarks.<name> --help` (they are not part of the installed package). Each
runner's docstring says what it measures, on what, and the command of each device call.

Pipelines at real sizes (random weights) against a baseline, per concurrency level:
  omni_gpu          Qwen2.5-Omni (thinker -> talker -> token2wav) vs transformers
  qwen3_omni_gpu    Qwen3-Omni-30B-A3B (thinker -> talker -> code2wav) vs published figures
  image_gpu         Qwen-Image (text encoder -> DiT + VAE) vs diffusers
  peer_vllm_omni    vllm-omni on the same model dirs, prompts and lengths (the peer)
  gpu_pipeline      one AR stage vs vLLM alone; the thinker -> talker chain vs its first stage
  http_serving      the OpenAI-compatible HTTP server vs the ZMQ client, same pipeline
  realtime_sessions /v1/realtime: simulated callers, voice-to-voice latency, audio gaps, VAD CPU
Parts alone: token2wav, code2wav, first_chunk, ar_hidden_states, transport, step_metadata,
resample, client_import, ray_two_nodes; on a GPU, kernel by kernel: token2wav_profile,
token2wav_graphs (speed of its CUDA graphs), qwen3_code_predictor_profile,
qwen_image_step_profile, prefill_probe.

Every runner that measures concurrency levels warms each level's shapes up (an unmeasured
round at that level) before it measures the level, and says so in its report and JSON
(benchmarks.common.warmup). What the runners share is in benchmarks/common/; a runner imports
from there and from omni_mp, never from another runner or from tests/.
"""
