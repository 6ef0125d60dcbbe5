"""The messages between processes: msgspec Structs in one tagged union, with the bounds of
every list, map and string in their types. How they travel (encoding, validation against
Limits, tensors as headers plus raw buffers) is codec.py's job.

A tensor field holds a torch tensor or a numpy array when sending; received, it is what the
receiver's ArrayCodec builds (torch in stages and the coordinator; numpy in a client that
does not use torch). On the wire it is a TensorRef header.

Adding a message type: subclass MessageBase and add the class to `Message` below.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import TYPE_CHECKING, Annotated, Any, get_args

import msgspec
from msgspec import Meta

from omni_mp.wire.shm_pool import ShmRef
from omni_mp.wire.tensor_codec import (
    MAX_INFO_ENTRIES,
    MAX_LIST_LENGTH,
    MAX_NDIM,
    PayloadError,
    array_codec,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "AUDIO_KEY",
    "IMAGE_KEY",
    "IMAGE_STEP_KEY",
    "SAMPLE_RATE_KEY",
    "MAX_BATCH",
    "MAX_PROCESSES",
    "MAX_REPLICAS",
    "MAX_STAGES",
    "MESSAGE_TYPES",
    "REQUEST_ID_PATTERN",
    "RequestParams",
    "Abort",
    "BoundReplica",
    "AdditionalInformation",
    "AudioInput",
    "Connect",
    "Connected",
    "ErrorEvent",
    "Finished",
    "Heartbeat",
    "HiddenRows",
    "ImageInput",
    "InfoValue",
    "LinkBytes",
    "LayerRows",
    "MRopePositions",
    "Message",
    "MessageBase",
    "MultiModalInput",
    "PackedRows",
    "PromptEmbeds",
    "Ready",
    "RowRange",
    "SamplingParamsMsg",
    "Shutdown",
    "StageDone",
    "StageEndpoint",
    "StageOutputBatch",
    "StageOutputChunk",
    "StageRequest",
    "StageResult",
    "StageSampling",
    "StageStats",
    "StageStatus",
    "StepColumns",
    "StatusReply",
    "StatusRequest",
    "Submit",
    "TensorRef",
]


# A step's batch: at most vLLM's max_num_seqs requests (1024 is already a very large batch).
MAX_BATCH = 8192
# Stages of one pipeline (config.PipelineConfig checks it too): bounds every per-stage list.
MAX_STAGES = 64
# Replicas of one stage, and stage processes of one pipeline (replicas counted): bound the
# per-process lists (links, status).
MAX_REPLICAS = 64
MAX_PROCESSES = 1024


class TensorRef(msgspec.Struct, forbid_unknown_fields=True):
    """Wire header of one tensor. `loc` is the index of the frame holding its bytes, or the
    shared-memory region holding them."""

    dtype: Annotated[str, Meta(max_length=16)]
    shape: Annotated[list[int], Meta(max_length=MAX_NDIM)]
    nbytes: int
    loc: int | ShmRef


if TYPE_CHECKING:
    Tensor = torch.Tensor | np.ndarray
else:
    # msgspec reads annotations to decode, and on the wire a tensor *is* its TensorRef
    # header: decode() swaps each header for the real tensor once everything is validated.
    # Encoding ignores annotations (enc_hook turns tensors into headers).
    Tensor = TensorRef

TokenId = Annotated[int, Meta(ge=0)]
StageId = Annotated[int, Meta(ge=0, le=2**31)]
# Every list and map is bounded in its type, so an oversized one is refused while msgspec
# decodes it, before any of its items exist (a Submit with 100k `sampling` entries took
# 0.6 s to decode and refuse; now it fails at the length prefix). Limits (YAML) may lower
# the bounds of token lists, strings and maps further; they are checked after decoding.
TokenIds = Annotated[list[TokenId], Meta(max_length=MAX_LIST_LENGTH)]
PerStage = Meta(max_length=MAX_STAGES)
PerProcess = Meta(max_length=MAX_PROCESSES)
ReplicaIndex = Annotated[int, Meta(ge=0, lt=MAX_REPLICAS)]
InfoValue = Tensor | Annotated[list[int], Meta(max_length=MAX_LIST_LENGTH)] | int | float | bool | str
# Named tensors and scalars for the next stage (e.g. per-step hidden states, speaker).
AdditionalInformation = Annotated[dict[str, InfoValue], Meta(max_length=MAX_INFO_ENTRIES)]
StrMap = Annotated[dict[str, str], Meta(max_length=MAX_INFO_ENTRIES)]

# AdditionalInformation keys of a chunk of audio: float32 [n] samples in [-1, 1], and their rate.
AUDIO_KEY = "audio"
SAMPLE_RATE_KEY = "sample_rate"
# AdditionalInformation keys of an image output: uint8 [height, width, 3] RGB pixels, and the
# denoising step it was decoded after (a preview) or absent (the final image).
IMAGE_KEY = "image"
IMAGE_STEP_KEY = "image_step"

SpeakerName = Annotated[str, Meta(min_length=1, max_length=64)]
# A request's model parameters (e.g. an image's size and steps): a flat map of scalars that
# the stages' model family parses into its own params struct (and refuses when invalid).
ParamValue = Annotated[str, Meta(max_length=65536)] | int | float | bool | None
RequestParams = Annotated[dict[Annotated[str, Meta(max_length=64)], ParamValue], Meta(max_length=MAX_INFO_ENTRIES)]

REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]+")


class PromptEmbeds(msgspec.Struct, forbid_unknown_fields=True):
    """Embeddings to use as (part of) the next stage's prompt: [num_tokens, hidden]."""

    data: Tensor


class LayerRows(msgspec.Struct, forbid_unknown_fields=True):
    """Rows of one intermediate layer (Hugging Face numbering: 0 = embeddings)."""

    layer: Annotated[int, Meta(ge=0, le=4096)]
    rows: Tensor  # [n, hidden]


class MRopePositions(msgspec.Struct, forbid_unknown_fields=True):
    """M-RoPE models: a prompt's positions and the offset of every later position (row i >= L
    is at i + delta on every axis; text after images runs ahead of or behind its index)."""

    positions: Tensor  # int64 [3, L]
    delta: int


class RowRange(msgspec.Struct, forbid_unknown_fields=True, array_like=True):
    start: Annotated[int, Meta(ge=0)]
    stop: Annotated[int, Meta(ge=0)]


class HiddenRows(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Hidden states of consecutive positions [start, start + n) of one request: the one
    type of a hidden-row stream from the engine that computed them, over the wire, to the
    stage that consumes them (omni_mp.engines.rows.RowStream accumulates them there).

    `last` is the last layer after the final norm. Inside a StageOutputBatch the rows travel
    in the batch's `packed` tensors and `packed` names this request's range of them."""

    start: Annotated[int, Meta(ge=0)]
    last: Tensor | None = None  # [n, hidden]
    layers: Annotated[list[LayerRows], Meta(max_length=64)] = []
    mrope: MRopePositions | None = None  # with a request's first rows
    packed: RowRange | None = None


class PackedRows(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The hidden rows of every chunk of one step batch, concatenated: one header and one
    buffer per layer and step instead of one per request."""

    last: Tensor
    layers: Annotated[list[LayerRows], Meta(max_length=64)] = []

    def rows(self, start: int, stop: int) -> tuple[Any, list[LayerRows]]:
        """Rows [start, stop) of the last layer and of every other layer, as views."""
        return self.last[start:stop], [LayerRows(lr.layer, lr.rows[start:stop]) for lr in self.layers]


class AudioInput(msgspec.Struct, forbid_unknown_fields=True):
    """A mono waveform: float32 [samples] in [-1, 1] at `sample_rate` (the stage resamples)."""

    samples: Tensor
    sample_rate: Annotated[int, Meta(ge=1000, le=384_000)]


class ImageInput(msgspec.Struct, forbid_unknown_fields=True):
    """An RGB image: uint8 [height, width, 3]."""

    pixels: Tensor


class MultiModalInput(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Media for an entry stage whose model takes them (e.g. Qwen2.5-Omni's thinker), in the
    order the prompt mentions them. Shapes and sizes are checked by the stage against its
    model (MediaLimits) before anything is processed."""

    audios: Annotated[list[AudioInput], Meta(max_length=16)] = []
    images: Annotated[list[ImageInput], Meta(max_length=16)] = []


class SamplingParamsMsg(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    max_tokens: Annotated[int, Meta(ge=0)] = 16
    min_tokens: Annotated[int, Meta(ge=0)] = 0
    temperature: Annotated[float, Meta(ge=0.0)] = 0.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=0)] = 0  # 0 = disabled
    seed: int | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0)] = 1.0
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=1024)] = []
    ignore_eos: bool = False
    # Ids never sampled (transformers' suppress_tokens), e.g. a talker's codec_bos.
    suppress_token_ids: Annotated[list[TokenId], Meta(max_length=1024)] = []
    # An xgrammar structural tag (JSON) the output must follow, through vLLM's structured
    # outputs: e.g. a forced tool call in the model's own format (omni_mp.http.vllm_hooks_tools).
    structural_tag: Annotated[str, Meta(max_length=1 << 20)] | None = None


class MessageBase(
    msgspec.Struct, tag_field="t", tag=True, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, weakref=True
):
    """Base of every wire message; the tag is the class name. (weakref: a receiver tracks
    which shared-memory regions a message holds without keeping the message alive.)"""


class BoundReplica(msgspec.Struct, forbid_unknown_fields=True, array_like=True):
    """A request's replica of one stage."""

    stage_id: StageId
    replica: ReplicaIndex


class StageRequest(MessageBase):
    """Coordinator -> stage: register a request (every stage of the pipeline gets one); an
    entry stage also gets the prompt, as text (tokenized by the stage) or token ids."""

    request_id: str
    stage_id: StageId
    prompt: str | None = None
    prompt_token_ids: TokenIds | None = None
    prompt_embeds: PromptEmbeds | None = None
    multi_modal: MultiModalInput | None = None  # entry stages only
    forced_reply: str | None = None  # entry stages only (Submit.forced_reply)
    chat_formatted: bool = False  # `prompt` is already in the stage's chat format (Submit.chat_formatted)
    speaker: SpeakerName | None = None  # stages that speak use it; None: their default
    params: RequestParams | None = None  # the client's model parameters (Submit.params), for every stage
    additional_information: AdditionalInformation | None = None
    sampling_params: SamplingParamsMsg | None = None
    # Seconds left of the request's deadline when sent: relative, so that no two hosts' clocks
    # need agree; the stage adds it to its own monotonic clock on receipt.
    deadline_s: Annotated[float, Meta(ge=0.0, le=1e7)] | None = None
    hidden_states: bool = False  # a final stage sends its hidden rows to the client too (Submit.hidden_states)
    # The replica of each downstream stage this request is bound to (omni_mp.control.router):
    # its outputs go there only. A stage missing here: its replica 0.
    downstream_replicas: Annotated[list[BoundReplica], PerStage] = []
    # Whether a stage this request runs on (downstream of this one) or the client reads this
    # stage's hidden rows: false lets a stage that captures them read its prefix cache.
    rows_wanted: bool = True
    # Those readers read the prompt's rows only at its media placeholders (family.Processor
    # `prompt_rows`): the stage reads its prefix cache up to the first one and sends rows from there.
    media_rows_only: bool = False


class StageOutputChunk(MessageBase):
    """One engine step's output for one request."""

    request_id: str
    stage_id: StageId
    token_ids: TokenIds = []  # new tokens of this step
    prompt_token_ids: TokenIds | None = None  # the stage's prompt, on its first chunk
    prompt_embeds: PromptEmbeds | None = None
    hidden: HiddenRows | None = None  # stages that emit hidden states
    additional_information: AdditionalInformation | None = None
    finished: bool = False
    finish_reason: str | None = None
    text: str | None = None  # the decoded output, on the last chunk of a final stage


# A request id inside a step's columns: what REQUEST_ID_PATTERN allows, bounded while decoding.
ColumnRequestId = Annotated[str, Meta(min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9._:-]+$")]
Counts = Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=MAX_BATCH)]


class StepColumns(msgspec.Struct, forbid_unknown_fields=True):
    """The plain chunks of a step batch as columns: chunk i is request `request_ids[i]` with
    `token_counts[i]` new tokens (consecutive in `token_ids`) and, when `row_counts[i]` > 0,
    that many hidden rows at positions from `row_starts[i]` (consecutive in the batch's
    `packed` rows, after those of the batch's other chunks). A plain chunk carries nothing
    else: no prompt, M-RoPE positions, information, text or end.

    Why columns: a decode step of N requests is N such chunks, and as Structs each one is
    walked by validation, encoded and decoded field by field (at 64 requests ~0.3 ms a side
    in Python); as five lists msgspec handles them in C, bounds included."""

    request_ids: Annotated[list[ColumnRequestId], Meta(max_length=MAX_BATCH)]
    token_counts: Counts
    token_ids: TokenIds
    row_starts: Counts
    row_counts: Counts


class StageOutputBatch(MessageBase):
    """The chunks of one engine step, for every request that produced output: one message per
    step and destination, whatever the batch size (per-message costs do not grow with it).

    `pack()` builds the compact form: the chunks' hidden rows concatenated in `packed` (see
    PackedRows) and the plain chunks (tokens and rows only, the common case) as `columns`;
    `unpacked()` gives every chunk back, in the step's order, its rows as views of the packed
    ones. (Order matters: a request's companion prompts are chunks of the same request in the
    same step, and their rows follow the prompt's.)"""

    chunks: Annotated[list[StageOutputChunk], Meta(max_length=MAX_BATCH)]
    packed: PackedRows | None = None
    stage_id: StageId = 0  # of the columns' chunks
    columns: StepColumns | None = None
    chunks_at: Counts = []  # with columns: where each of `chunks` is in the step's order

    @classmethod
    def pack(cls, chunks: list[StageOutputChunk], rows_for: Container[str] | None = None) -> StageOutputBatch:
        """The compact form of a step's chunks (one stage's; every chunk's rows have the same
        layers). Plain chunks go into `columns` and their rows first into `packed`; the other
        chunks stay chunks (copies: `chunks` are left as they are), their rows after those,
        named by `hidden.packed`. `rows_for`: the requests whose rows go along (None: all)."""
        plain: list[StageOutputChunk] = []
        keep: list[bool] = []  # per plain chunk: its rows go along
        rest: list[StageOutputChunk] = []
        at: list[int] = []
        for i, c in enumerate(chunks):
            rows = rows_for is None or c.hidden is None or c.request_id in rows_for
            if _is_plain(c):
                plain.append(c)
                keep.append(rows)
            else:
                rest.append(c if rows else msgspec.structs.replace(c, hidden=None))
                at.append(i)
        last: list[Any] = []
        layers: dict[int, list[Any]] = {}
        row = 0

        def take(h: HiddenRows) -> int:
            nonlocal row
            n = h.last.shape[0]
            last.append(h.last)
            for lr in h.layers:
                layers.setdefault(lr.layer, []).append(lr.rows)
            row += n
            return n

        columns = None
        if plain:
            counts: list[int] = []
            starts: list[int] = []
            tokens: list[int] = []
            for c, rows in zip(plain, keep, strict=True):
                tokens.extend(c.token_ids)
                h = c.hidden if rows else None
                starts.append(0 if h is None else h.start)
                counts.append(0 if h is None else take(h))
            columns = StepColumns(
                request_ids=[c.request_id for c in plain],
                token_counts=[len(c.token_ids) for c in plain],
                token_ids=tokens,
                row_starts=starts,
                row_counts=counts,
            )
        for j, c in enumerate(rest):
            h = c.hidden
            if h is None or h.last is None:
                continue
            first = row
            take(h)
            rest[j] = msgspec.structs.replace(
                c, hidden=msgspec.structs.replace(h, last=None, layers=[], packed=RowRange(first, row))
            )
        packed = None
        if last:
            packed = PackedRows(last=_concat(last), layers=[LayerRows(k, _concat(v)) for k, v in layers.items()])
        if not plain:
            return cls(chunks=rest, packed=packed)
        return cls(chunks=rest, packed=packed, stage_id=plain[0].stage_id, columns=columns, chunks_at=at)

    def unpacked(self) -> list[StageOutputChunk]:
        """Every chunk in the step's order, its rows as views of the packed ones; PayloadError
        on columns, positions or row ranges that do not add up."""
        packed = self.packed
        available = 0 if packed is None else packed.last.shape[0]
        for lr in [] if packed is None else packed.layers:
            if lr.rows.shape[0] != available:
                raise PayloadError(
                    f"StageOutputBatch.packed.layers (layer {lr.layer}): {lr.rows.shape[0]} rows, "
                    f"the last layer has {available}"
                )
        out: list[StageOutputChunk] = []  # the column chunks, then merged with `chunks`
        col = self.columns
        if col is not None:
            n = len(col.request_ids)
            for name in ("token_counts", "row_starts", "row_counts"):
                if len(getattr(col, name)) != n:
                    raise PayloadError(
                        f"StageOutputBatch.columns.{name}: {len(getattr(col, name))} entries for {n} requests"
                    )
            if sum(col.token_counts) != len(col.token_ids):
                raise PayloadError(
                    f"StageOutputBatch.columns.token_counts: sum to {sum(col.token_counts)}, "
                    f"{len(col.token_ids)} token ids sent"
                )
            if sum(col.row_counts) > available:
                raise PayloadError(
                    f"StageOutputBatch.columns.row_counts: sum to {sum(col.row_counts)}, {available} packed rows sent"
                )
            t = r = 0
            for rid, nt, start, nr in zip(
                col.request_ids, col.token_counts, col.row_starts, col.row_counts, strict=True
            ):
                hidden = None
                if nr:
                    assert packed is not None  # nr <= available
                    last, layers = packed.rows(r, r + nr)
                    hidden = HiddenRows(start=start, last=last, layers=layers)
                    r += nr
                out.append(
                    StageOutputChunk(
                        request_id=rid, stage_id=self.stage_id, token_ids=col.token_ids[t : t + nt], hidden=hidden
                    )
                )
                t += nt
        for i, chunk in enumerate(self.chunks):
            h = chunk.hidden
            if h is not None and h.packed is not None:
                rr = h.packed
                if packed is None or not rr.start <= rr.stop <= available:
                    size = "no packed rows" if packed is None else f"{available} packed rows"
                    raise PayloadError(
                        f"StageOutputBatch.chunks[{i}].hidden.packed: [{rr.start}, {rr.stop}) "
                        f"is not a row range ({size})"
                    )
                last, layers = packed.rows(rr.start, rr.stop)
                chunk.hidden = msgspec.structs.replace(h, last=last, layers=layers, packed=None)
        at = self.chunks_at
        if col is None and not at:
            return self.chunks
        total = len(out) + len(self.chunks)
        increasing = all(a < b for a, b in zip(at, at[1:], strict=False))
        if col is None or len(at) != len(self.chunks) or not increasing or (at and at[-1] >= total):
            raise PayloadError(
                f"StageOutputBatch.chunks_at: {len(at)} positions for {len(self.chunks)} chunks, "
                f"not increasing within 0..{total - 1}"
            )
        for i, chunk in zip(at, self.chunks, strict=True):
            out.insert(i, chunk)
        return out


def _is_plain(chunk: StageOutputChunk) -> bool:
    """Whether `chunk` fits StepColumns: tokens and (one or more) hidden rows, nothing else."""
    h = chunk.hidden
    return (
        chunk.prompt_token_ids is None
        and chunk.prompt_embeds is None
        and chunk.additional_information is None
        and not chunk.finished
        and chunk.finish_reason is None
        and chunk.text is None
        and (h is None or (h.last is not None and h.mrope is None and h.packed is None and h.last.shape[0] > 0))
    )


def _concat(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    codec = array_codec(parts[0])
    assert codec is not None  # hidden rows are tensors
    return codec.concat(parts)


class ErrorEvent(MessageBase):
    """A request ended with an error. `stage_id` None: raised by the coordinator itself;
    `request_id` None: the offending message could not be tied to a request."""

    request_id: str | None
    stage_id: StageId | None
    code: str
    message: str


class Abort(MessageBase):
    request_id: str
    reason: str


class Ready(MessageBase):
    """Stage -> coordinator: the engine is up; `info["input"]` is the address it bound."""

    stage_id: StageId
    pid: int
    info: StrMap = {}
    replica: ReplicaIndex = 0


Count = Annotated[int, Meta(ge=0)]


class LinkBytes(msgspec.Struct, forbid_unknown_fields=True):
    """Bytes a stage sent to one downstream stage over its socket (tensors in shared memory
    not counted: they never cross the socket)."""

    stage_id: StageId  # the downstream stage
    nbytes: Count


class StageStats(msgspec.Struct, forbid_unknown_fields=True):
    """A stage run's load and counters, sent with its heartbeats. The counters start at zero
    with each run (a restart resets them, as Prometheus expects of a restarted target)."""

    running: Count = 0  # requests in the engine
    waiting: Count = 0  # registered here, not yet in the engine (waiting on upstream or preparation)
    steps: Count = 0  # engine steps so far
    step_seconds: Annotated[float, Meta(ge=0)] = 0.0  # their total time
    sent: Annotated[list[LinkBytes], PerStage] = []  # per downstream stage


class Heartbeat(MessageBase):
    stage_id: StageId
    seq: int
    time: float
    stats: StageStats | None = None  # None while the engine starts
    replica: ReplicaIndex = 0


class Shutdown(MessageBase):
    reason: str = ""


class StageEndpoint(msgspec.Struct, forbid_unknown_fields=True):
    stage_id: StageId
    endpoint: str
    replica: ReplicaIndex = 0


class Connect(MessageBase):
    """Coordinator -> stage: send your outputs to these downstream stage inputs (again after
    a downstream stage restarted, possibly at a new address)."""

    downstream: Annotated[list[StageEndpoint], PerProcess]


class Connected(MessageBase):
    """Stage -> coordinator: the links to these downstream stage inputs are open (after Connect)."""

    stage_id: StageId
    downstream: Annotated[list[StageEndpoint], PerProcess]
    replica: ReplicaIndex = 0


class StageDone(MessageBase):
    """Stage -> coordinator: a request finished in this stage; counts and unix timestamps."""

    request_id: str
    stage_id: StageId
    num_prompt_tokens: int
    num_output_tokens: int
    t_registered: float  # the stage's input thread received the registration
    t_started: float
    t_first_token: float | None
    t_finished: float
    finish_reason: str | None = None
    replica: ReplicaIndex = 0  # which replica of the stage ran it
    num_cached_tokens: int = 0  # prompt tokens read from the stage's prefix cache (of num_prompt_tokens)
    # An entry stage's preparation off the engine thread (unix timestamps; None elsewhere): its
    # preparer took the request, the model's input was built (prompt format, media), the engine's
    # request was built. t_started follows once the engine thread is between steps.
    t_prepare_taken: float | None = None
    t_input_built: float | None = None
    t_prepared: float | None = None


class StageSampling(msgspec.Struct, forbid_unknown_fields=True):
    stage_id: StageId
    params: SamplingParamsMsg


class Submit(MessageBase):
    """Client -> coordinator: run a request through the pipeline. Exactly one of `prompt`,
    `prompt_token_ids` and `prompt_embeds`; `sampling` overrides stage defaults;
    `deadline_s` is relative."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: TokenIds | None = None
    prompt_embeds: PromptEmbeds | None = None  # for entry stages with `prompt_embeds: true`
    multi_modal: MultiModalInput | None = None  # audio/images for an entry stage that takes them
    # The entry stage's reply, given instead of generated (with a text `prompt`): the stage
    # tokenizes it as plain text and prefills it after the prompt's chat format as if it had
    # generated it (teacher-forced: causal attention gives the same hidden states), then
    # generates only its format's end of turn. Downstream stages see it as that stage's
    # output, so a talker voices exactly this text (omni_mp.stage.prepare.forced_reply_input).
    forced_reply: str | None = None
    # `prompt` is already in the entry stage's chat format (a whole conversation rendered with
    # the model's chat template, one placeholder per medium of `multi_modal`, in order): the
    # stage takes it as it is instead of wrapping it as one user turn.
    chat_formatted: bool = False
    speaker: SpeakerName | None = None  # the voice of stages that speak (unknown: an error)
    # Model parameters the stages' family reads (e.g. omni_mp.models.qwen_image.ImageParams
    # as builtins); every stage of the request gets them.
    params: RequestParams | None = None
    sampling: Annotated[list[StageSampling], PerStage] = []
    deadline_s: Annotated[float, Meta(gt=0.0, le=1e7)] | None = None  # NaN and inf refused while decoding
    stream: bool = False
    # The final stages to answer (empty: all of them). Only they and the stages upstream of
    # them run the request, e.g. [0] for the text answer of thinker -> talker -> token2wav.
    final_stages: Annotated[list[StageId], PerStage] = []
    # Stream the hidden rows of the final stages that emit them (`hidden_states:` in their
    # config) in this request's chunks; without it they go only to downstream stages.
    hidden_states: bool = False


class StageResult(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What a final stage produced for a request."""

    stage_id: StageId
    token_ids: TokenIds = []
    text: str | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    audio: Tensor | None = None  # float32 [samples] of an audio-producing stage (omni_mp.wire.outputs)
    sample_rate: int | None = None
    image: Tensor | None = None  # uint8 [height, width, 3] RGB of an image-producing stage (omni_mp.wire.outputs)


class Finished(MessageBase):
    """Coordinator -> client: the request's terminal success event."""

    request_id: str
    outputs: Annotated[list[StageResult], PerStage]
    stage_timings: Annotated[list[StageDone], PerStage]
    t_submit: float
    t_finished: float


class StatusRequest(MessageBase):
    """Client -> coordinator; the reply carries the same `request_id` (the client's tag)."""

    request_id: str | None = None


class StageStatus(msgspec.Struct, forbid_unknown_fields=True):
    stage_id: StageId
    pid: int
    alive: bool
    ready: bool  # serving: engine up and links to its downstream stages open
    restarts: int
    info: StrMap = {}
    stats: StageStats | None = None  # from the current run's latest heartbeat
    failed: str | None = None  # down for good (its restart budget spent): why it last died
    replica: ReplicaIndex = 0  # which replica of the stage (StageConfig.replicas)


class StatusReply(MessageBase):
    pipeline: str
    stages: Annotated[list[StageStatus], PerProcess]  # one per replica of each stage
    inflight: int
    request_id: str | None = None  # the StatusRequest's


Message = (
    StageRequest | StageOutputChunk | StageOutputBatch | ErrorEvent | Abort | Ready | Heartbeat | Shutdown
    | Connect | Connected | StageDone | Submit | Finished | StatusRequest | StatusReply
)  # fmt: skip
MESSAGE_TYPES: tuple[type[MessageBase], ...] = get_args(Message)
