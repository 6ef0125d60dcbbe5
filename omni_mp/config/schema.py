"""The pipeline config's types: every YAML key as a msgspec Struct (unknown keys refused, bounds
checked while decoding). Validation across keys, the model registry's names and loading a file
live in `omni_mp.config.validate`; this module imports no model code, so the wire, the stage and
the model families can name these types without a circle through the registry.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from omni_mp.engines.diffusion.params import DiffusionStageConfig
from omni_mp.wire.codec import Limits
from omni_mp.wire.messages import MAX_REPLICAS, MAX_STAGES, SamplingParamsMsg
from omni_mp.wire.shm_pool import ShmPoolConfig


class ConfigError(ValueError):
    """A pipeline config is invalid; the message names the key path."""


# Durations: NaN, infinities and negatives are refused while decoding (Meta checks NaN too).
Seconds = Annotated[float, Meta(gt=0.0, le=1e7)]
Count = Annotated[int, Meta(ge=0, le=2**31)]


class RestartPolicy(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What the coordinator does when a stage process dies: restart it up to `max_restarts`
    times, `backoff_s` after its death (doubled per restart, up to 64x). Once the budget is
    spent, `when_spent: stop` leaves the stage down for good: no request can be served, the
    coordinator's status says `failed`, and a served pipeline exits non-zero;
    `when_spent: retry` keeps restarting it at the longest back-off."""

    max_restarts: Count = 0  # 0 = never restart
    backoff_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 1.0
    when_spent: Literal["stop", "retry"] = "stop"


class HiddenStatesOutput(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Stream the hidden states of every computed token (prompt and generated) downstream,
    step by step, as AdditionalInformation `hidden_states` [rows, hidden] (the last layer
    after the final norm) plus `hidden_start` (the position of the first row)."""

    # Intermediate layers to add, Hugging Face numbering (`output_hidden_states` index):
    # 0 = the input embeddings, i = the output of decoder layer i-1.
    layers: list[int] = []


class MediaLimits(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What an entry stage with a `prompt_format` accepts as media per request, checked
    before any of it is decoded or processed."""

    max_audios: Annotated[int, Meta(ge=0, le=16)] = 4
    max_images: Annotated[int, Meta(ge=0, le=16)] = 4
    # None: the longest audio the checkpoint's processor takes whole (omni_mp.media.limits);
    # longer is refused, never cut. A value above that is a config error.
    max_audio_s: Annotated[float, Meta(gt=0, le=3600)] | None = None
    max_image_pixels: Annotated[int, Meta(ge=1, le=2**28)] = 16_777_216  # 4096 x 4096


class StageMemory(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A stage's GPU memory budget, per device it is pinned to (omni_mp.control.memory_budget).

    Checked before any stage starts: the budgets of the stages sharing a device must fit in
    it, and each budget must hold the stage's weights, a minimum KV cache (one
    `max_model_len` request, AR stages) or its activations (`max_batch` trajectories,
    diffusion stages), and `reserve_gib`. An AR stage then gets the rest as its KV cache
    (vLLM's `kv_cache_memory_bytes`) instead of a `gpu_memory_utilization` share of the
    device, so several engines can share one GPU whatever order they start in. The stage holds
    to it while serving (omni_mp.stage.memory_check): PyTorch's allocations are capped at the
    budget less a CUDA context, and a started stage over it refuses to serve."""

    gpu_gib: Annotated[float, Meta(gt=0.0, le=1e5)]
    # CUDA context, CUDA graph pools, allocator slack: what no estimate below counts.
    reserve_gib: Annotated[float, Meta(ge=0.0, le=1e5)] = 2.0


class StageConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    id: Annotated[int, Meta(ge=0, le=2**31)]
    model: str  # a checkpoint dir, or the name of a built-in checkpoint (omni_mp.models.registry)
    kind: Literal["ar", "diffusion"] = "ar"
    engine_args: dict[str, Any] = {}
    # GPU indices into the caller's visible GPUs (its CUDA_VISIBLE_DEVICES, as in vLLM, torch
    # and Ray; omni_mp.utils.devices); empty = CPU. With `replicas`, every replica's.
    devices: list[int] = []
    # Copies of this stage, each its own process with its own devices, memory budget, restart
    # budget and heartbeats; a request is bound to one replica of each stage at admission
    # (omni_mp.control.router). Every replica is linked to every replica of its downstream stages.
    replicas: Annotated[int, Meta(ge=1, le=MAX_REPLICAS)] = 1
    # One device list per replica (e.g. [[0], [1]]: replica 0 on GPU 0, replica 1 on GPU 1),
    # instead of `devices`; every list of one length (the same tensor-parallel size).
    replica_devices: list[list[int]] = []
    # placement ray: one `ray_resources` per replica (e.g. each on its own node), instead of it.
    replica_ray_resources: list[dict[Annotated[str, Meta(max_length=256)], Annotated[float, Meta(ge=0)]]] = []
    inputs: list[int] = []  # upstream stage ids; empty = takes the client's prompt
    processor: str | None = None  # registry name, required when `inputs` is not empty
    final_output: bool = False
    hidden_states: HiddenStatesOutput | None = None
    prompt_embeds: bool = False  # an entry stage that also takes prompts as embeddings
    # An entry stage: wrap text prompts (and the request's media) in this model's chat format
    # (a prompt format of the model registry, e.g. `qwen2_5_omni`); media need one.
    prompt_format: str | None = None
    media: MediaLimits = MediaLimits()
    # Load only this part of a multi-part checkpoint, as a vLLM model of ours (a model part
    # of the model registry, e.g. Qwen2.5-Omni's `talker`; its thinker and token2wav need none).
    model_part: str | None = None
    # True: start a request only once every upstream stage has finished it (no inter-stage
    # streaming; for measuring what streaming gains).
    wait_for_upstream: bool = False
    # AR stages: before serving, run the model once at a token count of each fused-MoE Triton
    # kernel variant a prefill chunk can select, so no request pays its compile (about 1.2 s
    # on an H200; omni_mp.engines.vllm_hooks_warmup). None: on a GPU. No MoE layers: nothing.
    warm_moe_kernels: bool | None = None
    sampling: SamplingParamsMsg = msgspec.field(default_factory=SamplingParamsMsg)
    restart: RestartPolicy = RestartPolicy()
    diffusion: DiffusionStageConfig = DiffusionStageConfig()  # `kind: diffusion` only
    memory: StageMemory | None = None  # GPU stages: a memory budget per device (see StageMemory)
    # GPU stages under MPS (`gpu_sharing`): `below_normal` makes this stage's kernels yield to
    # those of the normal-priority stages on its GPU (CUDA_MPS_CLIENT_PRIORITY=1), for a stage
    # with slack beside ones on the critical path. Time-sliced, it changes nothing.
    mps_priority: Literal["normal", "below_normal"] = "normal"
    # GPU stages under MPS: the share of the GPU's SMs this stage's kernels may hold at once
    # (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), so a stage that streams weights at every step (a
    # decoding thinker) leaves SMs free for the short kernels of a stage beside it, which then
    # start at once instead of queueing behind it. None: all of them. Time-sliced: no effect.
    mps_sm_percent: Annotated[int, Meta(ge=1, le=100)] | None = None
    # CPU only: KV cache size (VLLM_CPU_KVCACHE_SPACE) and the cores its threads bind to
    # (VLLM_CPU_OMP_THREADS_BIND); None = one core per stage, round-robin.
    cpu_kv_cache_gib: int = 1
    cpu_cores: str | None = None
    # placement ray: custom Ray resources this stage's bundle reserves besides its CPU and
    # GPUs, e.g. {"node:10.0.0.7": 0.01} or a label resource a node was started with.
    ray_resources: dict[Annotated[str, Meta(max_length=256)], Annotated[float, Meta(ge=0)]] = {}

    def replica(self, index: int) -> StageConfig:
        """Replica `index` of this stage, as one stage: its own devices and Ray resources."""
        return msgspec.structs.replace(
            self,
            devices=list(self.replica_devices[index]) if self.replica_devices else list(self.devices),
            ray_resources=dict(self.replica_ray_resources[index]) if self.replica_ray_resources else self.ray_resources,
        )


class PlacementConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Where stage processes run. `local`: subprocesses of the coordinator on this host.
    `ray`: actors on a Ray cluster (`address` as for `ray.init`, e.g. "auto" or
    "10.0.0.5:6379"; None starts a local Ray), one placement-group bundle per stage replica, placed
    by `strategy`; stages then talk over tcp with CURVE keys (`endpoints`, `security`)."""

    kind: Literal["local", "ray"] = "local"
    address: str | None = None
    namespace: str | None = None
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"


class EndpointsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Where processes talk. `ipc` uses Linux abstract sockets (no files to leave behind);
    `tcp` binds every socket on `host` with ephemeral ports (stages on other hosts)."""

    transport: Literal["ipc", "tcp"] = "ipc"
    host: str = "127.0.0.1"
    # Same-host stage links (ipc): tensors of at least `threshold_bytes` travel through a
    # bounded shared-memory pool per link instead of the ZMQ message.
    shm: ShmPoolConfig = ShmPoolConfig()


class TimeoutsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    stage_startup_s: Seconds = 600.0  # engine init (model load, warm-up) must finish within this
    heartbeat_interval_s: Seconds = 0.5
    heartbeat_timeout_s: Seconds = 30.0  # a live process silent this long is considered hung
    default_deadline_s: Seconds | None = None  # per-request deadline when the client sets none


class AdmissionConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How much work the coordinator takes on. Past `max_inflight` requests (or when a stage
    has `stage_queue` registrations not yet taken), new requests get `overloaded` at once
    rather than queueing: latency stays bounded and memory with it."""

    max_inflight: Annotated[int, Meta(ge=1, le=2**20)] = 1024
    # Messages queued for one client (ZMQ's queue to it, then the coordinator's): a client
    # that reads slower than its streams produce gets `slow_consumer` for those streams.
    # Terminal events are never dropped (they are bounded by max_inflight).
    client_queue: Annotated[int, Meta(ge=1, le=2**20)] = 1024
    # Messages queued for one stage beyond ZMQ's own queue; a stage that stays behind is hung.
    stage_queue: Annotated[int, Meta(ge=1, le=2**20)] = 4096


class SecurityConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Who may connect, and what a YAML file may make vLLM import.

    `keys`: a CURVE key directory (`omni-mp keys DIR`). Required when `endpoints.transport`
    is tcp; with it every socket (ipc too) uses CURVE and admits only listed public keys.
    `allow_code_import`: lets `engine_args` name code for vLLM to import or run
    (IMPORT_CAPABLE_ENGINE_ARGS): only for YAML files you trust as much as code."""

    keys: str | None = None
    allow_code_import: bool = False


class GpuSharingConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How stages that share a GPU share it (omni_mp.control.mps).

    Processes on one GPU time-slice it by default: the GPU runs one process's kernels at a
    time, so a stage's step waits out the others' steps even when neither fills the GPU (the
    small kernels of a talker's code predictor, a vocoder's convolutions). Under NVIDIA's
    Multi-Process Service (MPS) their kernels run side by side. `auto`: when local stages share
    a GPU, start a private MPS daemon for them (or use the one already serving this host) if
    `nvidia-cuda-mps-control` is installed, else time-slice; `mps`: the same, but no MPS is an
    error; `time_slice`: never MPS. Nothing of the GPU's own settings changes. One trade-off:
    under MPS a fatal GPU fault (an illegal memory access) in one stage ends every stage on
    that GPU, and the supervisor restarts them all."""

    mode: Literal["auto", "mps", "time_slice"] = "auto"


class AudioIdsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The spoken answers kept for `assistant.audio.id` (omni_mp.http.audio_ids): bounds and
    lifetime. Expired entries are evicted first, then the least recently used."""

    max_entries: Annotated[int, Meta(ge=1, le=10_000_000)] = 10_000
    max_bytes: Annotated[int, Meta(ge=1 << 10, le=1 << 34)] = 32 << 20  # ids + transcripts (UTF-8) + 96 B each
    ttl_s: Annotated[int, Meta(ge=1, le=30 * 86_400)] = 3600  # an answer's `expires_at` is this after it


class ClonedVoicesConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Voices cloned with POST /v1/audio/voices (omni_mp.http.voice_store): bounds. A new voice
    that does not fit evicts the least recently used ones."""

    max_entries: Annotated[int, Meta(ge=1, le=1_000_000)] = 1000
    max_bytes: Annotated[int, Meta(ge=1 << 20, le=1 << 36)] = (
        256 << 20
    )  # the clips' samples (float32) + text + 256 B each


class RealtimeConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`/v1/realtime` sessions (omni_mp.http.realtime): bounds and barge-in."""

    max_sessions: Annotated[int, Meta(ge=0, le=100_000)] = 64  # open WebSockets per server process
    max_turn_audio_s: Annotated[float, Meta(gt=0.0, le=3600.0)] = 60.0  # one user turn's buffered audio
    max_append_bytes: Annotated[int, Meta(ge=1024, le=64 << 20)] = 1 << 20  # one append's base64 text
    max_history_items: Annotated[int, Meta(ge=2, le=10_000)] = 64  # oldest user turns dropped past it
    # A response's prompt in tokens (oldest turns dropped past it; omni_mp.http.realtime.budget);
    # None: the thinker's max_model_len less the answer's room.
    max_history_tokens: Annotated[int, Meta(ge=16, le=10_000_000)] | None = None
    idle_timeout_s: Seconds = 300.0  # no client event for this long: the session is closed
    barge_in: bool = True  # speech starting while an answer plays cancels it (server VAD)


class HttpConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The OpenAI-compatible HTTP server's settings (omni_mp.http)."""

    # Server processes on the one listening socket (uvicorn's workers), each a client of the
    # coordinator; with more than one they share the audio-id store (SQLite) and the metrics.
    workers: Annotated[int, Meta(ge=1, le=64)] = 1
    audio_ids: AudioIdsConfig = AudioIdsConfig()
    cloned_voices: ClonedVoicesConfig = ClonedVoicesConfig()
    realtime: RealtimeConfig = RealtimeConfig()

    # Voice names a request may use for one of the model's voices, e.g. {alloy: Chelsie}: added
    # to (or replacing) the defaults that map each of OpenAI's voice names (omni_mp.http.voices).
    voice_aliases: dict[Annotated[str, Meta(min_length=1, max_length=64)], str] = {}


class PipelineConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    stages: Annotated[list[StageConfig], Meta(max_length=MAX_STAGES)]
    limits: Limits = Limits()
    endpoints: EndpointsConfig = EndpointsConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    admission: AdmissionConfig = AdmissionConfig()
    security: SecurityConfig = SecurityConfig()
    placement: PlacementConfig = PlacementConfig()
    gpu_sharing: GpuSharingConfig = GpuSharingConfig()
    http: HttpConfig = HttpConfig()

    def stage(self, stage_id: int) -> StageConfig:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    @property
    def entry_stages(self) -> list[StageConfig]:
        return [s for s in self.stages if not s.inputs]

    @property
    def final_stages(self) -> list[StageConfig]:
        return [s for s in self.stages if s.final_output]

    def downstream(self, stage_id: int) -> list[int]:
        return [s.id for s in self.stages if stage_id in s.inputs]

    def replica_stages(self) -> list[tuple[int, StageConfig]]:
        """Every process of the pipeline: (replica index, the stage as that replica), by stage."""
        return [(r, s.replica(r)) for s in self.stages for r in range(s.replicas)]


def parse_core_list(spec: str) -> list[int]:
    """'0', '0-3', '0,2,5-6' -> core ids; ValueError if malformed."""
    cores: list[int] = []
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"bad core range {part!r}")
        cores.extend(range(first, last + 1))
    return cores


def config_to_json(cfg: PipelineConfig) -> bytes:
    return msgspec.json.encode(cfg)


def config_from_json(blob: bytes | str) -> PipelineConfig:
    return msgspec.json.decode(blob, type=PipelineConfig)
