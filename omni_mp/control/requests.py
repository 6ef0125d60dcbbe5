"""The coordinator's request table: who submitted what, under which internal id, until when.

Invariant: a request leaves the table exactly once (`pop`), and only the code that pops it
sends its terminal event, so no request can end twice.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from omni_mp.config.schema import PipelineConfig
from omni_mp.media.limits import MediaError, check_media_sizes
from omni_mp.wire.messages import MultiModalInput, SamplingParamsMsg, StageDone, StageResult, Submit
from omni_mp.wire.outputs import AudioParts, FinalImage


@dataclass
class Inflight:
    client: bytes
    request_id: str  # the client's id
    internal_id: str  # unique per submission: a reused client id never meets stale stage state
    stream: bool
    deadline: float | None
    t_submit: float
    pending_final: set[int]
    results: dict[int, StageResult] = field(default_factory=dict)
    done: dict[int, StageDone] = field(default_factory=dict)
    audio: dict[int, AudioParts] = field(default_factory=dict)  # final stages' audio chunks
    image: dict[int, FinalImage] = field(default_factory=dict)  # final stages' final images
    route: dict[int, int] = field(default_factory=dict)  # stage -> the replica it is bound to (router)
    released: set[int] = field(default_factory=set)  # stages where it no longer counts as outstanding


class Rejected(Exception):
    """A submission refused before admission: `code` and a message naming what was wrong."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_submit(cfg: PipelineConfig, msg: Submit) -> dict[int, SamplingParamsMsg]:
    """Validate a Submit against the pipeline; returns its per-stage sampling overrides."""
    if sum(x is not None for x in (msg.prompt, msg.prompt_token_ids, msg.prompt_embeds)) != 1:
        raise Rejected("invalid_input", "give exactly one of `prompt`, `prompt_token_ids` and `prompt_embeds`")
    if msg.prompt is not None and not msg.prompt.strip():
        raise Rejected("invalid_input", "`prompt` is empty")
    if msg.prompt_token_ids is not None and not msg.prompt_token_ids:
        raise Rejected("invalid_input", "`prompt_token_ids` is empty")
    if msg.prompt_embeds is not None and not all(s.prompt_embeds for s in cfg.entry_stages):
        raise Rejected(
            "invalid_input", "`prompt_embeds`: the entry stage does not take embeddings (set `prompt_embeds: true`)"
        )
    if msg.multi_modal is not None and (msg.prompt is None or any(s.prompt_format is None for s in cfg.entry_stages)):
        raise Rejected(
            "invalid_input",
            "`multi_modal`: needs a text `prompt` and an entry stage that takes media (with a `prompt_format`)",
        )
    if msg.chat_formatted and (msg.prompt is None or any(s.prompt_format is None for s in cfg.entry_stages)):
        raise Rejected(
            "invalid_input",
            "`chat_formatted`: needs a text `prompt` and an entry stage with a chat format (`prompt_format`)",
        )
    if msg.multi_modal is not None:
        _check_media_sizes(cfg, msg.multi_modal)
    if msg.forced_reply is not None:
        _check_forced_reply(cfg, msg)
    sampling: dict[int, SamplingParamsMsg] = {}
    ids = {s.id for s in cfg.stages}
    for s in msg.sampling:
        if s.stage_id not in ids:
            raise Rejected("invalid_input", f"`sampling`: unknown stage id {s.stage_id} (stages: {sorted(ids)})")
        if s.stage_id in sampling:
            raise Rejected("invalid_input", f"`sampling`: stage id {s.stage_id} given twice")
        sampling[s.stage_id] = s.params
    deadline_s = msg.deadline_s
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        raise Rejected("invalid_input", f"`deadline_s` must be a finite number > 0, got {deadline_s}")
    finals = sorted(s.id for s in cfg.final_stages)
    for sid in msg.final_stages:
        if sid not in finals:
            raise Rejected("invalid_input", f"`final_stages`: stage {sid} is not a final stage (final: {finals})")
    if len(set(msg.final_stages)) != len(msg.final_stages):
        raise Rejected("invalid_input", "`final_stages`: a stage id is given twice")
    if msg.hidden_states:
        _check_hidden_states(cfg, msg)
    return sampling


def _check_forced_reply(cfg: PipelineConfig, msg: Submit) -> None:
    """A given reply follows a text prompt in an AR entry stage's chat format (the stage
    checks that its format has an end of turn)."""
    if not (msg.forced_reply or "").strip():
        raise Rejected("invalid_input", "`forced_reply` is empty")
    if msg.prompt is None or msg.multi_modal is not None:
        raise Rejected("invalid_input", "`forced_reply`: needs a text `prompt` and no media")
    if any(s.kind != "ar" or s.prompt_format is None for s in cfg.entry_stages):
        raise Rejected("invalid_input", "`forced_reply`: the entry stage must be an AR stage with a `prompt_format`")


def _check_hidden_states(cfg: PipelineConfig, msg: Submit) -> None:
    """`hidden_states` asks the final stages for rows that only streamed chunks carry."""
    if not msg.stream:
        raise Rejected("invalid_input", "`hidden_states`: hidden rows arrive in streamed chunks; stream the request")
    wanted = set(msg.final_stages) or {s.id for s in cfg.final_stages}
    if not any(s.hidden_states is not None for s in cfg.final_stages if s.id in wanted):
        raise Rejected(
            "invalid_input",
            f"`hidden_states`: none of the final stages {sorted(wanted)} emits hidden states "
            "(`hidden_states:` in its config)",
        )


def _check_media_sizes(cfg: PipelineConfig, media: MultiModalInput) -> None:
    """Media counts, audio seconds and image pixels against every entry stage's limits (the
    model's: `cfg` has them resolved), from the arrays' shapes alone: what does not fit is
    refused here, before it is forwarded. Layouts and values are the stage's to check."""
    audios = [(math.prod(a.samples.shape), a.sample_rate) for a in media.audios]
    images = [(im.pixels.shape[0], im.pixels.shape[1]) for im in media.images if len(im.pixels.shape) >= 2]
    for stage in cfg.entry_stages:
        try:
            check_media_sizes(stage.id, stage.media, audios, images)
        except MediaError as err:
            raise Rejected("invalid_input", str(err)) from None


def request_stages(cfg: PipelineConfig, final_stages: set[int]) -> set[int]:
    """The stages a request runs in: its final stages and every stage upstream of them."""
    runs: set[int] = set()
    todo = list(final_stages)
    while todo:
        sid = todo.pop()
        if sid not in runs:
            runs.add(sid)
            todo.extend(cfg.stage(sid).inputs)
    return runs


class RequestTable:
    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self._by_internal: dict[str, Inflight] = {}
        self._by_client: dict[tuple[bytes, str], str] = {}
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._by_internal)

    def __contains__(self, internal_id: str) -> bool:
        return internal_id in self._by_internal

    def get(self, internal_id: str) -> Inflight | None:
        return self._by_internal.get(internal_id)

    def lookup(self, client: bytes, request_id: str) -> Inflight | None:
        """The client's own request of that id: a client can reach only what it submitted."""
        internal = self._by_client.get((client, request_id))
        return None if internal is None else self._by_internal[internal]

    def ids(self) -> list[str]:
        return list(self._by_internal)

    def bound_to(self, stage_id: int, replica: int) -> list[str]:
        """The requests bound to that replica of that stage and not done there (one done there
        holds nothing in it any more)."""
        return [
            r.internal_id
            for r in self._by_internal.values()
            if r.route.get(stage_id) == replica and stage_id not in r.released
        ]

    def of_client(self, client: bytes) -> list[str]:
        return [r.internal_id for r in self._by_internal.values() if r.client == client]

    def admit(
        self, client: bytes, msg: Submit, now: float, deadline_s: float | None, final_stages: set[int]
    ) -> Inflight:
        """Add a request; Rejected if the id is in flight for this client or the table is full."""
        if (client, msg.request_id) in self._by_client:
            raise Rejected("duplicate_request", f"request id {msg.request_id!r} is already in flight")
        if len(self._by_internal) >= self.max_inflight:
            raise Rejected("overloaded", f"{len(self._by_internal)} requests in flight (max_inflight); retry later")
        req = Inflight(
            client=client,
            request_id=msg.request_id,
            internal_id=f"q{next(self._ids)}",  # stages see only this id
            stream=msg.stream,
            deadline=None if deadline_s is None else now + deadline_s,
            t_submit=now,
            pending_final=set(final_stages),
        )
        self._by_internal[req.internal_id] = req
        self._by_client[(client, msg.request_id)] = req.internal_id
        return req

    def pop(self, internal_id: str) -> Inflight | None:
        """Remove a request (it is ending); None if it already ended."""
        req = self._by_internal.pop(internal_id, None)
        if req is not None:
            del self._by_client[(req.client, req.request_id)]
        return req

    def expired(self, now: float) -> list[Inflight]:
        return [r for r in self._by_internal.values() if r.deadline is not None and now >= r.deadline]
