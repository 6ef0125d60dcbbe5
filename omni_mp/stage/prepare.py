"""Preparing an entry stage's requests beside the engine thread.

A request's preparation (media checks, resampling, the prompt format, tokenization and vLLM's
input processing: the model's audio feature extractor and image processor) can take seconds
for long audio or a large image. Done on the engine thread it would stall every request in
flight; here it runs on a thread of its own, one request at a time in arrival order, and the
engine thread only adds what comes back prepared. Not on the socket thread either: control
messages and upstream data keep flowing while a request is prepared.

Any exception while preparing one request fails that request only, with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omni_mp.config.schema import StageConfig
from omni_mp.engines.base import EngineInputError, PreparedRequest, StageEngine, StageInput
from omni_mp.models.registry import prompt_format
from omni_mp.stage.io_threads import Stopped
from omni_mp.stage.media import MediaError, build_entry_input, check_media
from omni_mp.wire.messages import SamplingParamsMsg, StageRequest

log = logging.getLogger("omni_mp.stage")

# Requests registered and waiting for their preparation; past this the stage is overloaded
# (the coordinator's admission limit keeps it far below in normal operation).
MAX_PENDING = 1024


@dataclass(frozen=True, slots=True)
class PrepareJob:
    msg: StageRequest
    sampling: SamplingParamsMsg
    token: object  # Arrival.prepare_token: the engine thread drops a result whose token is not its request's


@dataclass(frozen=True, slots=True)
class Prepared:
    """A preparation's outcome, for the engine thread: the request, or why it failed."""

    request_id: str
    token: object
    request: PreparedRequest | None = None
    code: str = ""
    error: str = ""
    first_chunk_info: dict[str, Any] | None = None  # StageInput.first_chunk_info
    # time.time() when the preparer took it, built the model's input, built the engine's request
    times: tuple[float, float, float] | None = None


def entry_input(stage: StageConfig, engine: StageEngine, msg: StageRequest) -> StageInput:
    """An entry stage's input from its registration (raises EngineInputError or MediaError)."""
    if msg.multi_modal is not None and stage.prompt_format is None:
        raise EngineInputError(f"stage {stage.id} takes no media (it has no prompt_format)")
    if msg.prompt_embeds is not None:
        # A copy: the received tensor is a view of the message buffer.
        return StageInput(prompt_embeds=msg.prompt_embeds.data.clone())
    if msg.prompt_token_ids is not None:
        return StageInput(prompt_token_ids=list(msg.prompt_token_ids))
    if msg.forced_reply is not None:
        return forced_reply_input(stage, engine, msg)
    if msg.prompt is not None and stage.prompt_format is not None and _embeds_prompt(stage):
        return embedded_entry_input(stage, msg)
    if msg.prompt is not None and stage.prompt_format is not None:
        return build_entry_input(stage, msg.prompt, msg.multi_modal, msg.params, formatted=msg.chat_formatted)
    if msg.prompt is not None:
        return StageInput(prompt_token_ids=engine.tokenize(msg.prompt))
    raise EngineInputError("an entry stage needs a prompt, prompt_token_ids or prompt_embeds")


def _embeds_prompt(stage: StageConfig) -> bool:
    """Whether the stage's prompt format builds its input as embeddings (a TTS talker's)."""
    return stage.prompt_format is not None and bool(getattr(prompt_format(stage.prompt_format), "embeds_prompt", False))


def embedded_entry_input(stage: StageConfig, msg: StageRequest) -> StageInput:
    """The stage input a prompt format builds itself from the request's text, params and
    speaker (its model's tables, loaded once per process): ValueError -> EngineInputError."""
    from omni_mp.models.registry import resolve_model

    assert stage.prompt_format is not None and msg.prompt is not None
    fmt = prompt_format(stage.prompt_format)
    clip = None
    if msg.multi_modal is not None:
        check_media(stage, msg.multi_modal)  # sizes against the stage's limits, before anything is computed
        if msg.multi_modal.images or len(msg.multi_modal.audios) != 1:
            raise EngineInputError(f"stage {stage.id} takes one audio clip (a voice to clone) and no images")
        audio = msg.multi_modal.audios[0]
        clip = (audio.samples.numpy().copy(), audio.sample_rate)  # (the received tensor views the buffer)
    try:
        args = (resolve_model(stage.model), msg.prompt, msg.params, msg.speaker)
        return fmt.stage_input(*args, clip) if clip is not None else fmt.stage_input(*args)  # type: ignore[attr-defined]
    except ValueError as err:
        raise EngineInputError(str(err)) from None


def forced_reply_input(stage: StageConfig, engine: StageEngine, msg: StageRequest) -> StageInput:
    """A text prompt with its reply given (StageRequest.forced_reply): the prompt in the stage's
    chat format, tokenized here so that the reply's ids follow it exactly as generated ids
    would (tokenized apart, the reply's text as plain text: a special-token string in it
    stays text and cannot end the turn early), then the format's end of turn."""
    fmt = None if stage.prompt_format is None else prompt_format(stage.prompt_format)
    if fmt is None or fmt.reply_end is None or msg.prompt is None or msg.forced_reply is None:
        raise EngineInputError(f"stage {stage.id} takes no given reply (forced_reply): its prompt format has no turns")
    if msg.multi_modal is not None:
        raise EngineInputError("forced_reply: takes a text-only prompt")
    prompt = build_entry_input(stage, msg.prompt, None, msg.params)
    if prompt.companions or prompt.prompt_text is None:
        raise EngineInputError("forced_reply: not with prompts run beside the request's own")
    end = engine.tokenize(fmt.reply_end)
    if len(end) != 1:
        raise EngineInputError(f"the end of turn {fmt.reply_end!r} is not one token of stage {stage.id}'s tokenizer")
    reply = engine.tokenize(msg.forced_reply, literal=True)
    if not reply:
        raise EngineInputError("forced_reply: no tokens")
    return StageInput(prompt_token_ids=engine.tokenize(prompt.prompt_text), forced_reply=[*reply, *end])


class Preparer(threading.Thread):
    """Prepares entry requests in order; results go to `deliver` (the engine thread's inbox)."""

    def __init__(
        self, stage: StageConfig, engine: StageEngine, deliver: Callable[[Prepared], None], stop: threading.Event
    ) -> None:
        super().__init__(name=f"stage{stage.id}-prepare", daemon=True)
        self.stage, self.engine, self.deliver, self.stop = stage, engine, deliver, stop
        self._jobs: deque[PrepareJob] = deque()
        self._cond = threading.Condition()
        self.error: BaseException | None = None

    def submit(self, job: PrepareJob) -> bool:
        """Queue a request (the input thread, as it arrives; never blocks). False: too many are waiting."""
        with self._cond:
            if len(self._jobs) >= MAX_PENDING:
                return False
            self._jobs.append(job)
            self._cond.notify()
            return True

    def _prepare(self, job: PrepareJob) -> Prepared:
        rid = job.msg.request_id
        taken = time.time()
        try:
            stage_input = entry_input(self.stage, self.engine, job.msg)
            stage_input.rows_wanted = job.msg.rows_wanted
            stage_input.media_rows_only = job.msg.media_rows_only
            built = time.time()
            prepared = self.engine.prepare(rid, job.sampling, stage_input, job.msg.speaker)
        except (EngineInputError, MediaError) as err:
            return Prepared(rid, job.token, code="invalid_input", error=str(err))
        except Exception as err:  # noqa: BLE001 - e.g. MemoryError in a processor: this request only
            log.exception("stage %d: preparing request %s failed", self.stage.id, rid)
            text = f"stage {self.stage.id} could not prepare the request's input: {type(err).__name__}: {err}"
            return Prepared(rid, job.token, code="invalid_input", error=text)
        times = (taken, built, time.time())
        return Prepared(rid, job.token, request=prepared, first_chunk_info=stage_input.first_chunk_info, times=times)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                with self._cond:
                    if not self._jobs:
                        self._cond.wait(0.05)
                        continue
                    job = self._jobs.popleft()
                self.deliver(self._prepare(job))
        except Stopped:
            pass
        except BaseException as err:  # noqa: BLE001 - reported by the engine thread, which exits
            self.error = err
            self.stop.set()
