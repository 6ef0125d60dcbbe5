"""Diffusion request parameters and stage settings (no torch or vLLM imports: config uses them)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta


class DiffusionParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """How one request is sampled. Defaults are transformers' token2wav defaults."""

    num_steps: Annotated[int, Meta(ge=2, le=1000)] = 10  # time points; num_steps - 1 solver steps
    solver: Literal["rk4", "euler"] = "rk4"  # rk4: transformers' 3/8-rule RK4 (4 model calls a step)
    guidance_scale: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.5  # classifier-free guidance; < 1e-5: off
    sway_coefficient: float | None = -1.0  # time-grid warp t + s*(cos(pi t / 2) - 1 + t); None: linear
    seed: int | None = None  # None: a random seed, drawn when the request is added
    speaker: str | None = None  # None: the stage's default speaker


class StreamingConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Chunked streaming over the input codes (sizes in codes; 50 codes = 1 s of token2wav audio).

    Every window starts on an attention-block boundary (12 codes for token2wav), so its blocks
    are the one-shot pass's blocks. Defaults: a 24-code first chunk (0.48 s of audio: the first
    audio needs 36 upstream codes), then 48-code chunks; 24 codes of left context (the block
    before, which one-shot layers attend to, plus one more so the edge effect of the cut fades);
    12 codes of right context (token2wav's look-ahead layers attend to the next block); a 10 ms
    linear crossfade where chunks meet."""

    first_chunk: Annotated[int, Meta(ge=1)] = 24
    chunk: Annotated[int, Meta(ge=1)] = 48
    # Growing chunks: after the first, chunk sizes double from `chunk` up to `max_chunk`
    # (0: every later chunk is `chunk`). A model that re-runs context per chunk does less work
    # per id with long chunks, and a stream that has played its first chunks has the audio
    # buffered to wait for longer ones, while the first audio stays as soon as before.
    max_chunk: Annotated[int, Meta(ge=0)] = 0
    left_context: Annotated[int, Meta(ge=0)] = 24
    right_context: Annotated[int, Meta(ge=0)] = 12
    crossfade_ms: Annotated[float, Meta(ge=0.0, le=100.0)] = 10.0
    # Chunks of one request solved at the same time. 1: a request's next chunk starts when its
    # previous one is done, so a step's batch holds the first chunks of new requests rather than
    # the later chunks of old ones (time to first audio under load); each chunk is still ready
    # long before the previous one has played (9 steps vs 0.96 s of audio). More: a lone request
    # finishes sooner where a step has room to spare.
    max_chunks_in_flight: Annotated[int, Meta(ge=1, le=64)] = 1

    def chunk_at(self, index: int) -> int:
        """The size of chunk `index` (before its last, which may take a short tail)."""
        if index == 0:
            return self.first_chunk
        if self.max_chunk <= self.chunk:
            return self.chunk
        return min(self.max_chunk, self.chunk << min(index - 1, 62))

    def steady_chunk(self) -> int:
        """The size later chunks settle at."""
        return max(self.chunk, self.max_chunk)

    def largest_chunk(self) -> int:
        return max(self.first_chunk, self.steady_chunk())


class DiffusionStageConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The `diffusion:` section of a `kind: diffusion` stage."""

    model_type: str = "qwen2_5_omni_token2wav"  # a diffusion model type of omni_mp.models.registry
    # The model's own settings, passed to its loader as keywords (its family checks them).
    model_options: dict[str, Any] = {}
    defaults: DiffusionParams = DiffusionParams()
    default_speaker: str = "Chelsie"
    stream: bool = True  # emit audio chunk by chunk as upstream codes arrive; False: one shot at the end
    streaming: StreamingConfig = StreamingConfig()
    max_batch: Annotated[int, Meta(ge=1, le=1024)] = 16  # trajectories advanced together in one step
    # A model whose velocity runs in parts (an image DiT, `PartedVelocity`) steps one part per
    # engine step. A trajectory admitted while its group's step is in flight restarts that
    # step together with it if at most this fraction of the step's parts has run (that work is
    # discarded: the step is recomputed from the same state, so results are unchanged), and
    # otherwise joins at the next step. A new request's first step then starts within about
    # one part of its arrival, or at worst this fraction of a step later. 0: join at the next step.
    restart_step_before: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5
    max_input_len: Annotated[int, Meta(ge=1)] = 4096  # codes per request (memory bound, checked on arrival)
    # float32 matmuls on CUDA: "highest" is exact fp32, as transformers runs token2wav; "high"
    # lets them use TF32 tensor cores (a 10-bit mantissa: faster, not bit-comparable).
    float32_matmul: Literal["highest", "high"] = "highest"
    # PyTorch's cuDNN attention kernel for SDPA, which importing vLLM switches off process-wide
    # (vLLM's models hit a crash with it); diffusers and transformers run their modules with it
    # on, and on Hopper it is the fastest bf16 kernel, masked or not. Qwen-Image at 1024x1024 on
    # an H100: 42 ms of attention per CFG step with it against 72 ms (flash) without, the whole
    # step 369 vs 406 ms (benchmarks.qwen_image_step_profile). fp32 attention never uses it.
    cudnn_attention: bool = True
    # On CUDA, for models that support it: each solver step's batch is padded to a bucket
    # (batch size from graph_batch_sizes, frames to whole attention blocks up to
    # graph_max_frames) and replayed from a CUDA graph of that bucket, captured on its first
    # use; the vocoder too. Real rows get the eager pass's result at the padded shape. A window
    # decoder (code2wav) pads and graphs its own calls (rows to a bucket; see its model).
    # Ignored on a CPU. Steps past the largest bucket, and shapes past max_graphs, run eagerly.
    cuda_graphs: bool = True
    graph_batch_sizes: tuple[Annotated[int, Meta(ge=1, le=1024)], ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
    graph_max_frames: Annotated[int, Meta(ge=1)] = 512
    max_graphs: Annotated[int, Meta(ge=1, le=1024)] = 64  # per graphed function (DiT velocity, vocoder)
    # With cuda_graphs: capture at start-up, before the stage is ready, the graphs streamed
    # requests use (every batch bucket up to max_batch's, at the streamed windows' frame
    # buckets; the vocoder at the streamed window lengths, whose other lengths then run
    # eagerly). Off: each graph is captured inside the first step that needs it, which stalls
    # that step (120-470 ms a graph on an H200).
    warm_up_graphs: bool = True
