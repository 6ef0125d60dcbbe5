"""A speech model's (Qwen3-TTS) extra fields of POST /v1/audio/speech, named as vllm-omni names them
so that its clients work: `task_type`, `language`, `max_new_tokens`, `non_streaming_mode`, and for
Base (cloning) `ref_audio`, `ref_text`, `x_vector_only_mode` (docs/http.md).

What is checked here, before any audio is decoded: the task type against the checkpoint's
variant, cloning fields only on a Base checkpoint, `max_new_tokens` within the talker stage's
`max_tokens`, and `ref_audio`'s size (its base64 length against `max_media_bytes`). The clip is
decoded off the event loop (`decode_clip`: libsndfile, else PyAV; its declared duration checked
against the stage's `max_audio_s` before decoding, and again while decoding; down-mixed to mono by
the channels' mean, as the reference does). The model's own rules on the clip (too short, too
long, silent, its rate) are the entry stage's (omni_mp.models.qwen3_tts.clone): a 400 naming
`ref_audio`.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from omni_mp.config.schema import MediaLimits
from omni_mp.http.audio_in import AudioUploadError, decode_upload
from omni_mp.http.errors import bad_request
from omni_mp.http.media import MediaSizes, b64_payload
from omni_mp.http.pipeline import PipelineView
from omni_mp.http.schemas import SpeechRequest
from omni_mp.http.voice_store import StoredVoice
from omni_mp.wire.messages import SamplingParamsMsg

CLONE_FIELDS = ("ref_audio", "ref_text", "x_vector_only_mode")
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def tts_params(req: SpeechRequest, task: str | None, stored: StoredVoice | None = None) -> dict[str, Any]:
    """The entry stage's params (omni_mp.models.qwen3_tts.prompt) from the request's fields and
    the stored voice it names, if any."""
    if req.task_type is not None and req.task_type != task:
        raise bad_request(f"task_type {req.task_type!r}: this model is a {task} checkpoint", "task_type")
    given = [f for f in CLONE_FIELDS if getattr(req, f) is not None]
    if given and task != "Base":
        raise bad_request(f"{given}: voice cloning needs a Base checkpoint; this model is {task}", given[0])
    if req.ref_audio is None and (req.ref_text is not None or req.x_vector_only_mode is not None):
        raise bad_request("ref_text and x_vector_only_mode go with a reference clip: give ref_audio", "ref_audio")
    params: dict[str, Any] = {}
    if req.instructions and req.instructions.strip():
        params["instructions"] = req.instructions.strip()
    for key in ("language", "task_type", "ref_text", "x_vector_only_mode", "non_streaming_mode"):
        if getattr(req, key) is not None:
            params[key] = getattr(req, key)
    if stored is not None:
        params["x_vector_only_mode"] = stored.x_vector_only
        if stored.ref_text:
            params["ref_text"] = stored.ref_text
    return params


def talker_sampling(req: SpeechRequest, view: PipelineView) -> dict[int, SamplingParamsMsg] | None:
    """`max_new_tokens`: the talker's steps, at most its stage's `max_tokens` (the decoder's input
    bound is sized to it)."""
    if req.max_new_tokens is None:
        return None
    talker = view.cfg.entry_stages[0]
    cap = talker.sampling.max_tokens
    if req.max_new_tokens > cap:
        raise bad_request(f"max_new_tokens {req.max_new_tokens}: at most {cap} here", "max_new_tokens")
    return {talker.id: msgspec.structs.replace(talker.sampling, max_tokens=req.max_new_tokens)}


def decode_clip(data: str, sizes: MediaSizes, limits: MediaLimits) -> tuple[np.ndarray, int]:
    """`ref_audio` (base64 or a data: URL) -> mono float32 samples and their rate; 400 naming it."""
    if _URL.match(data[:32]):
        raise bad_request(
            "ref_audio: a URL; this server fetches nothing: send the clip as base64 or a base64 data: URL",
            "ref_audio",
            "unsupported_url",
        )
    raw = b64_payload(data, sizes.max_media_bytes, "ref_audio")
    try:
        return decode_upload(raw, limits.max_audio_s)
    except AudioUploadError as err:
        raise bad_request(f"ref_audio: {err}", "ref_audio") from None
