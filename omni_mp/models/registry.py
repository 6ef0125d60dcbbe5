"""The model families omni_mp serves, and the one place the runtime asks, by name, for the
code behind a stage: its processor, its prompt format, the engine model of a `model_part`,
a diffusion `model_type`, a built-in checkpoint.

Adding a family is a package of its own under omni_mp/models/ (its `__init__` declares a
`FAMILY`, see omni_mp.models.family) plus one line in FAMILY_PACKAGES. Nothing here imports a
family's code until a stage asks for one of its names: config validation reads the names only.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from omni_mp.models.family import CheckpointSizing, EngineModel, Family, PromptFormat, load_ref

if TYPE_CHECKING:
    import torch

    from omni_mp.engines.diffusion.model import DiffusionModel
    from omni_mp.processors.base import StageProcessor

# Processors of no particular model, and the plain Qwen2 test checkpoints (vLLM runs Qwen2
# itself: no engine code of ours).
GENERIC = Family(
    name="generic",
    processors={
        "codec_tokens": "omni_mp.processors.generic:CodecTokens",
        "continue_tokens": "omni_mp.processors.generic:ContinueTokens",
        "generated_tokens": "omni_mp.processors.generic:GeneratedTokens",
        "thinker_to_talker": "omni_mp.processors.generic:ThinkerToTalker",
    },
    builtin_models={name: "omni_mp.models.tiny:build_named" for name in ("tiny-qwen2", "tiny-qwen2-b", "small-qwen2")},
)

# One line per model family: the package whose `__init__` declares its FAMILY.
FAMILY_PACKAGES: tuple[str, ...] = (
    "omni_mp.models.qwen2_5_omni",
)  # fmt: skip

Kind = Literal["processors", "prompt_formats", "model_parts", "diffusion_models", "builtin_models", "checkpoint_types"]
KINDS: tuple[Kind, ...] = (
    "processors", "prompt_formats", "model_parts", "diffusion_models", "builtin_models", "checkpoint_types"
)  # fmt: skip
_WHAT = {
    "processors": "processor",
    "prompt_formats": "prompt format",
    "model_parts": "model part",
    "diffusion_models": "diffusion model type",
    "builtin_models": "built-in model",
    "checkpoint_types": "checkpoint model_type",
}


class RegistryError(ValueError):
    """A name no family serves (the message lists the known ones), or a name two families claim."""


@functools.cache
def families() -> tuple[Family, ...]:
    found = (GENERIC, *(load_ref(f"{package}:FAMILY") for package in FAMILY_PACKAGES))
    for kind in KINDS:
        owner: dict[str, str] = {}
        for family in found:
            for name in getattr(family, kind):
                if name in owner:
                    raise RegistryError(f"{_WHAT[kind]} {name!r}: claimed by {owner[name]!r} and {family.name!r}")
                owner[name] = family.name
    return found


def names(kind: Kind) -> list[str]:
    """The names of `kind` that some family serves, sorted."""
    return sorted(name for family in families() for name in getattr(family, kind))


def check(kind: Kind, name: str) -> None:
    """RegistryError (listing the known names) unless some family serves `name` as a `kind`."""
    _ref(kind, name)


def _ref(kind: Kind, name: str) -> str:
    for family in families():
        ref: str | None = getattr(family, kind).get(name)
        if ref is not None:
            return ref
    raise RegistryError(f"unknown {_WHAT[kind]} {name!r}; known: {names(kind)}")


@functools.cache
def stage_processor(name: str) -> StageProcessor:
    """The processor named `name` (one shared instance; a stage binds it to its checkpoint)."""
    return load_ref(_ref("processors", name))()


@functools.cache
def prompt_format(name: str) -> PromptFormat:
    return load_ref(_ref("prompt_formats", name))


def engine_model(model_part: str | None, model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
    """What an AR stage's engine starts from: the checkpoint as is, or what the family of
    `model_part` makes of it (e.g. a view dir holding one part, our vLLM model registered)."""
    if model_part is None:
        return EngineModel(model_dir, dict(engine_args))
    return load_ref(_ref("model_parts", model_part))(model_dir, dict(engine_args))


def diffusion_model(model_type: str, model_dir: str, device: torch.device) -> DiffusionModel:
    """The DiffusionModel of `model_type`, loaded from `model_dir` onto `device`."""
    return load_ref(_ref("diffusion_models", model_type))(model_dir, device)


def builtin_model(name: str) -> Path:
    """The dir of the built-in checkpoint `name`, built on first use (then cached on disk)."""
    return load_ref(_ref("builtin_models", name))(name)


def resolve_model(name_or_path: str) -> str:
    """A stage's `model:`: a built-in checkpoint name -> its dir; anything else is a path,
    returned as is."""
    if name_or_path in names("builtin_models"):
        return str(builtin_model(name_or_path))
    return name_or_path


def checkpoint_sizing(model_type: str) -> CheckpointSizing | None:
    """How to size a checkpoint of `model_type` (config.json) for GPU memory planning; None:
    no family claims it (it is sized whole, as a causal LM)."""
    if model_type not in names("checkpoint_types"):
        return None
    return load_ref(_ref("checkpoint_types", model_type))
