"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

from __future__ import annotations

import re

import msgspec

from omni_mp.client.omni_client import RequestError
from omni_mp.engines.base import CONTEXT_LENGTH_EXCEEDED


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


class ApiError(Exception):
    """An answer other than success: raised anywhere in a handler, rendered by the app."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorEnvelope(ErrorBody(message=message, type=type, param=param, code=code))
        self.headers = headers or {}

    @property
    def code(self) -> str:
        return self.body.error.code or self.body.error.type


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


# A msgspec validation error ends with " - at `$.path`" (the object holding the bad field).
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"unknown field `(?P<name>[^`]+)`")


def from_validation(err: msgspec.MsgspecError) -> ApiError:
    """A body that does not decode as the schema: 400 with `param` = the JSON path of the field."""
    m = _AT.match(str(err))
    what, path = (m.group("what"), m.group("path") or "") if m else (str(err), "")
    unknown = _UNKNOWN.search(what)
    if unknown is not None:
        path = f"{path}.{unknown.group('name')}"
    param = path.lstrip(".") or None
    code = (
        "unknown_field" if unknown else "invalid_value" if isinstance(err, msgspec.ValidationError) else "invalid_json"
    )
    return bad_request(f"{what}" + (f" (at `{param}`)" if param else ""), param, code)


# The pipeline's error codes (omni_mp.client.omni_client.RequestError.code) -> HTTP status.
_STATUS = {
    "invalid_input": 400,
    "invalid_message": 400,
    "overloaded": 429,
    "stage_unavailable": 503,
    "client_closed": 503,
    "deadline_exceeded": 504,
}


def from_request_error(err: RequestError, prompt_param: str | None = None) -> ApiError:
    """A request the pipeline ended with an error: 4xx for what the client sent, 429 for
    overload (with Retry-After), 5xx naming the stage for a failure inside the pipeline.
    `prompt_param`: the request field the prompt came from (`messages`), named by the 400 for a
    prompt longer than the model's context (media tokens counted by the model's processor)."""
    status = _STATUS.get(err.code, 500)
    where = "the coordinator" if err.stage_id is None else f"stage {err.stage_id}"
    message = f"{where}: {err.event.message}"
    if "unknown speaker" in err.event.message:
        return ApiError(400, message, param="audio.voice", code="invalid_value")
    if err.code == "invalid_input" and err.event.message.startswith(CONTEXT_LENGTH_EXCEEDED):
        return ApiError(400, message, param=prompt_param, code="context_length_exceeded")
    if status == 429:
        return ApiError(429, message, type="rate_limit_error", code=err.code, headers={"Retry-After": "1"})
    if status >= 500:
        return ApiError(status, message, type="server_error", code=err.code)
    return ApiError(status, message, code=err.code)


def too_large(param: str, size: int, limit: int) -> ApiError:
    return ApiError(400, f"{param}: about {size} bytes > the limit of {limit}", param=param, code="too_large")
