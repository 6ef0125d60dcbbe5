"""POST /v1/audio/voices: a cloned voice from an uploaded clip, OpenAI's custom-voice form
(multipart: `name`, `audio_sample`, `consent`) plus vllm-omni's `ref_text` (given: in-context
cloning) and `x_vector_only_mode`; the answer is OpenAI's `audio.voice` object, whose `id` a
speech request names as `voice: {"id": ...}` or as the `voice` string (omni_mp.http.voice_store).

The clip is checked as a speech request's `ref_audio` is: its size before it is read whole, its
duration before and while decoding (the stage's `max_audio_s`), then the model's rules on the
clip, here too (omni_mp.models.qwen3_tts.clone.check_clip on the decoded samples), so a voice
that is stored can be spoken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import msgspec
from msgspec import Meta
from starlette.datastructures import UploadFile
from starlette.requests import Request

from omni_mp.http.audio_in import AudioUploadError, decode_upload
from omni_mp.http.errors import bad_request, from_validation, too_large
from omni_mp.http.transcriptions import read_form
from omni_mp.http.voice_store import ClonedVoice, VoiceStoreError

if TYPE_CHECKING:
    from omni_mp.http.app import Server


class VoiceForm(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    consent: Annotated[str, Meta(max_length=256)] | None = None  # OpenAI's consent recording id (kept unchecked)
    ref_text: Annotated[str, Meta(min_length=1, max_length=4096)] | None = None
    x_vector_only_mode: bool = False


def _parse(form: dict[str, object]) -> VoiceForm:
    try:  # (strict=False: form values are strings: "true")
        return msgspec.convert(form, VoiceForm, strict=False)
    except msgspec.ValidationError as err:
        raise from_validation(err) from None


async def clone_voice(
    request: Request, srv: Server, read_body: Callable[[Request, int], Awaitable[bytes]]
) -> ClonedVoice:
    if srv.view.speech_task != "Base":
        raise bad_request(f"this model clones no voices (it is {srv.view.speech_task or 'not a speech model'}; "
                          "a Qwen3-TTS Base checkpoint does)", "model", "unsupported_value")  # fmt: skip
    form = await read_form(request, await read_body(request, srv.settings.max_body_bytes))
    try:
        fields = {k: v for k, v in form.multi_items() if k != "audio_sample"}
        if any(isinstance(v, UploadFile) for v in fields.values()):
            raise bad_request("only `audio_sample` is a file upload", "audio_sample")
        upload = form.get("audio_sample")
        if not isinstance(upload, UploadFile):
            raise bad_request("an `audio_sample` file upload is required (multipart/form-data)", "audio_sample")
        req = _parse(fields)
        if upload.size is not None and upload.size > srv.sizes.max_media_bytes:
            raise too_large("audio_sample", upload.size, srv.sizes.max_media_bytes)
        raw = await upload.read()
    finally:
        await form.close()
    return await asyncio.to_thread(_store, srv, req, raw)


def _store(srv: Server, req: VoiceForm, raw: bytes) -> ClonedVoice:
    from omni_mp.models.qwen3_tts.clone import CloneError, check_clip

    try:
        samples, rate = decode_upload(raw, srv.view.media_limits.max_audio_s)
        check_clip(samples, rate)
        return srv.cloned.put(req.name, samples, rate, req.ref_text, req.x_vector_only_mode)
    except (AudioUploadError, CloneError, VoiceStoreError) as err:
        raise bad_request(
            f"audio_sample: {err}".replace("audio_sample: ref_audio: ", "audio_sample: "), "audio_sample"
        ) from None
