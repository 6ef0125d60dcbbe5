"""Per-request bookkeeping inside one stage process."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from omni_mp.engines.rows import RowGap, RowStream
from omni_mp.models.processor import ProcessorError, RequestContext, UpstreamResult
from omni_mp.wire.messages import (
    HiddenRows,
    LayerRows,
    MRopePositions,
    SamplingParamsMsg,
    StageOutputChunk,
    StageRequest,
)


@dataclass(frozen=True, slots=True)
class Arrival:
    """A registration as the input thread received it, for the engine thread: when it came,
    and for an entry stage the token of the preparation the input thread already queued."""

    msg: StageRequest
    t_received: float  # time.time()
    prepare_token: object | None = None


@dataclass
class StageRequestState:
    """Everything this stage holds of one request (the engine's own state of it aside), from
    its registration until it ends here, which `StageLoop._end` does in one place."""

    request_id: str
    sampling: SamplingParamsMsg
    deadline: float | None  # time.monotonic() of this process (StageRequest.deadline_s is relative)
    inputs: list[int]  # upstream stage ids this request waits for (empty for an entry stage)
    ctx: RequestContext = field(default_factory=RequestContext)
    upstream: dict[int, UpstreamResult] = field(default_factory=dict)
    started: bool = False  # handed to the engine
    prompt_len: int = 0
    prompt_token_ids: list[int] | None = None  # None for an embeddings prompt
    output_token_ids: list[int] = field(default_factory=list)
    sent_first: bool = False  # the first chunk (which carries the prompt ids) went out
    first_chunk_info: dict[str, Any] | None = None  # sent on the first chunk (StageInput.first_chunk_info)
    rows_extended: int = 0  # per-step extra embeddings handed to the engine
    inputs_extended: int = 0  # input ids handed to the engine after its prompt (streamed inputs)
    cached_tokens: int = 0  # prompt tokens the engine read from its prefix cache
    t_registered: float = field(default_factory=time.time)  # received by this stage (Arrival.t_received)
    t_started: float | None = None
    t_first_token: float | None = None
    prepare_times: tuple[float, float, float] | None = None  # Prepared.times (entry stages)
    prepare_token: object | None = None  # Arrival.prepare_token: a Prepared with another one is stale
    hidden_to_client: bool = False  # a final stage streams this request's hidden rows to its client too
    # The (downstream stage, replica) links its outputs go to (StageRequest.downstream_replicas).
    targets: tuple[tuple[int, int], ...] = ()

    def add_upstream(self, chunk: StageOutputChunk) -> None:
        """Accumulate an upstream chunk; raises ProcessorError on inconsistent hidden states."""
        up = self.upstream.setdefault(chunk.stage_id, UpstreamResult(stage_id=chunk.stage_id))
        if chunk.prompt_token_ids is not None:
            up.prompt_token_ids = list(chunk.prompt_token_ids)
            if chunk.additional_information:  # the first chunk's values for this stage (copied out)
                up.first_info = {
                    k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in chunk.additional_information.items()
                }
        up.output_token_ids.extend(chunk.token_ids)
        h = chunk.hidden
        if h is not None:
            where = f"hidden rows from stage {chunk.stage_id}"
            if h.last is None:
                raise ProcessorError(f"{where}: no rows (packed rows outside a batch)")
            try:
                # The chunk's tensors are views of the received buffer: keep a copy of our own.
                up.hidden.append(h.last.clone(), h.start)
                for lr in h.layers:
                    up.layers.setdefault(lr.layer, RowStream()).append(lr.rows.clone(), h.start)
            except RowGap as err:
                raise ProcessorError(f"{where}: {err}") from None
            if h.mrope is not None:
                n = len(up.prompt_token_ids or [])
                if list(h.mrope.positions.shape) != [3, n]:
                    raise ProcessorError(
                        f"{where}: M-RoPE positions of shape {list(h.mrope.positions.shape)} for a {n}-token prompt"
                    )
                up.mrope_positions, up.mrope_delta = h.mrope.positions.clone(), h.mrope.delta
        if chunk.finished:
            up.finished = True
            up.finish_reason = chunk.finish_reason

    def expired(self, now: float) -> bool:
        """`now`: time.monotonic() of this process, like `deadline`."""
        return self.deadline is not None and now >= self.deadline


def _private_copy(chunk: StageOutputChunk) -> StageOutputChunk:
    """The chunk with its tensors copied out of the received buffers (shared-memory slots
    go back to the sender at once instead of when the chunk is used)."""
    info, h = chunk.additional_information, chunk.hidden
    if info:
        info = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in info.items()}
    if h is not None:
        mrope = h.mrope and MRopePositions(h.mrope.positions.clone(), h.mrope.delta)
        last = None if h.last is None else h.last.clone()
        layers = [LayerRows(lr.layer, lr.rows.clone()) for lr in h.layers]
        h = HiddenRows(start=h.start, last=last, layers=layers, mrope=mrope)
    return msgspec.structs.replace(chunk, additional_information=info, hidden=h)


def _nbytes(chunk: StageOutputChunk) -> int:
    info = chunk.additional_information or {}
    tensors = [v for v in info.values() if isinstance(v, torch.Tensor)]
    h = chunk.hidden
    if h is not None:
        tensors += [t for t in (h.last, h.mrope and h.mrope.positions) if t is not None]
        tensors += [lr.rows for lr in h.layers]
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class OrphanChunks:
    """Upstream chunks that arrived before the coordinator's registration of their request.

    Registration and data come over different pipes, so a chunk may overtake it; such chunks
    wait here (copied out of shared memory, so the upstream's pool never waits on them),
    bounded in count, bytes and age (a restarted stage must not act on stale data).
    """

    max_chunks: int = 4096
    max_bytes: int = 256 << 20
    ttl_s: float = 10.0
    chunks: dict[str, list[tuple[float, StageOutputChunk]]] = field(default_factory=dict)
    count: int = 0
    nbytes: int = 0

    def add(self, chunk: StageOutputChunk) -> str | None:
        """Keep the chunk; or say why it cannot be kept (then its request cannot complete)."""
        size = _nbytes(chunk)
        if self.count >= self.max_chunks or self.nbytes + size > self.max_bytes:
            return (
                f"{self.count} chunks ({self.nbytes} bytes) already wait for their registration "
                f"(limits {self.max_chunks} chunks, {self.max_bytes} bytes)"
            )
        self.chunks.setdefault(chunk.request_id, []).append((time.monotonic(), _private_copy(chunk)))
        self.count += 1
        self.nbytes += size
        return None

    def take(self, request_id: str) -> list[StageOutputChunk]:
        items = self.chunks.pop(request_id, [])
        self.count -= len(items)
        self.nbytes -= sum(_nbytes(c) for _, c in items)
        return [c for _, c in items]

    def expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        for rid in [r for r, items in self.chunks.items() if items[0][0] < cutoff]:
            self.take(rid)


@dataclass
class EndedRequests:
    """Ids of requests that ended in this stage (finished, failed or aborted), so that their
    late upstream chunks are dropped at once instead of waiting as orphans. Bounded: the
    oldest ids are forgotten first (by then no chunk of theirs is in flight)."""

    max_ids: int = 65536
    ids: dict[str, None] = field(default_factory=dict)  # insertion-ordered

    def add(self, request_id: str) -> None:
        self.ids.pop(request_id, None)
        self.ids[request_id] = None
        while len(self.ids) > self.max_ids:
            del self.ids[next(iter(self.ids))]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.ids
