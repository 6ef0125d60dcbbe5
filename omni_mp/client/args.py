"""Checks of what a caller hands the client, before anything is sent: a `ValueError` that
names the argument, never a library's own error from deep inside encoding or the pipeline's
refusal after a round trip. (Media are checked by `media_files`.) Torch-free."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np

from omni_mp.wire.messages import RequestParams, SamplingParamsMsg, StageSampling
from omni_mp.wire.tensor_codec import array_codec


def check_seconds(name: str, value: float | None) -> None:
    """None, or a finite number of seconds > 0."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be a finite number of seconds > 0 (or None), got {value!r}")


def _check_text(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"`{name}` must be a non-empty string (or None), got {value!r}")


def _check_token_ids(ids: Any) -> None:
    if isinstance(ids, str | bytes) or not isinstance(ids, list | tuple) or not ids:
        raise ValueError(f"`prompt_token_ids` must be a non-empty list of token ids, got {type(ids).__name__}")
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int | np.integer) or t < 0), None)
    if bad is not None:
        raise ValueError(f"`prompt_token_ids`: token ids are ints >= 0, got {bad!r}")


def _check_embeds(embeds: Any) -> None:
    codec = array_codec(embeds)
    if codec is None:
        raise ValueError(f"`prompt_embeds` must be a numpy array or torch tensor, got {type(embeds).__name__}")
    dtype, shape, _ = codec.header(embeds, "prompt_embeds")
    if len(shape) != 2 or 0 in shape or "float" not in dtype:
        got = f"{dtype} of shape {list(shape)}"
        raise ValueError(f"`prompt_embeds`: expected floating-point [tokens, hidden], got {got}")


def check_prompt(prompt: Any, prompt_token_ids: Any, prompt_embeds: Any) -> None:
    """Exactly one of the three, each of the right kind."""
    if sum(x is not None for x in (prompt, prompt_token_ids, prompt_embeds)) != 1:
        raise ValueError("give exactly one of `prompt`, `prompt_token_ids` and `prompt_embeds`")
    _check_text("prompt", prompt)
    if prompt_token_ids is not None:
        _check_token_ids(prompt_token_ids)
    if prompt_embeds is not None:
        _check_embeds(prompt_embeds)


def check_names(request_id: Any, speaker: Any) -> None:
    _check_text("request_id", request_id)
    _check_text("speaker", speaker)


def check_forced_reply(reply: Any, prompt: Any) -> None:
    """A given reply: non-empty text, after a text prompt."""
    _check_text("forced_reply", reply)
    if reply is not None and prompt is None:
        raise ValueError("`forced_reply` follows a text `prompt`: give one")


def stage_sampling(sampling: Mapping[int, SamplingParamsMsg | Mapping[str, Any]] | None) -> list[StageSampling]:
    """Per-stage overrides, each value checked against SamplingParamsMsg's bounds (a Struct's
    constructor checks none: the coordinator would refuse the whole message undecoded). A
    value may also be a dict of its fields. Stage ids are the pipeline's to check."""
    if sampling is None:
        return []
    if not isinstance(sampling, Mapping):
        raise ValueError(f"`sampling` must map stage ids to SamplingParamsMsg, got {type(sampling).__name__}")
    out = []
    for stage_id, params in sampling.items():
        if isinstance(stage_id, bool) or not isinstance(stage_id, int) or stage_id < 0:
            raise ValueError(f"`sampling`: stage ids are ints >= 0, got {stage_id!r}")
        fields = msgspec.structs.asdict(params) if isinstance(params, SamplingParamsMsg) else params
        if not isinstance(fields, Mapping):
            raise ValueError(
                f"`sampling[{stage_id}]` must be a SamplingParamsMsg or a dict, got {type(params).__name__}"
            )
        try:
            checked = msgspec.convert(dict(fields), SamplingParamsMsg)
        except msgspec.ValidationError as err:
            raise ValueError(f"`sampling[{stage_id}]`: {err}") from None
        out.append(StageSampling(stage_id=stage_id, params=checked))
    return out


def request_params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`params` (model parameters, e.g. an image's size and steps) as Submit carries them (the
    wire type `RequestParams`: names to str, int, float, bool or None), finite numbers only;
    ValueError naming a bad entry. What the names mean is the model family's to check (a
    stage refuses unknown ones)."""
    if params is None:
        return None
    if not isinstance(params, Mapping):
        raise ValueError(f"`params` must be a mapping of names to values, got {type(params).__name__}")
    plain = {k: v.item() if isinstance(v, np.generic) else v for k, v in params.items()}
    try:
        out = msgspec.convert(plain, RequestParams)
    except msgspec.ValidationError as err:
        for name, value in plain.items():  # name the entry, where one is at fault
            try:
                msgspec.convert({name: value}, RequestParams)
            except msgspec.ValidationError as one:
                raise ValueError(f"`params[{name!r}]`: {one}") from None
        raise ValueError(f"`params`: {err}") from None
    bad = next((k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:
        raise ValueError(f"`params[{bad!r}]`: must be finite, got {out[bad]!r}")
    return out
