"""The model families omni_mp serves, and the one place the runtime asks, by name, for the
code behind a stage: its processor, its prompt format, the engine model of a `model_part`,
a diffusion `model_type`, a built-in checkpoint.

Adding a family is a package of its own under omni_mp/models/ (its `__init__` declares a
`FAMILY`, see omni_mp.models.family) plus one line in FAMILY_PACKAGES. Nothing here imports a
family's code until a stage asks for one of its names: config validation reads the names and
the processors' declared traits only.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from omni_mp.models import generic, qwen2_5_omni, qwen3_omni, qwen3_tts, qwen_image
from omni_mp.models.family import CheckpointSizing, EngineModel, Family, Loader, Processor, PromptFormat

if TYPE_CHECKING:
    import torch

    from omni_mp.engines.diffusion.model import DiffusionModel
    from omni_mp.models.processor import StageProcessor


# The generic processors and test checkpoints (omni_mp.models.generic) come first, then one line
# per model family: its package (whose `__init__` declares its FAMILY: names only).
FAMILY_PACKAGES: tuple[ModuleType, ...] = (
    qwen2_5_omni,
    qwen_image,
    qwen3_omni,
    qwen3_tts,
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
    found = (generic.FAMILY, *(package.FAMILY for package in FAMILY_PACKAGES))
    for kind in KINDS:
        owner: dict[str, str] = {}
        for family in found:
            for name in getattr(family, kind):
                if name in owner:
                    raise RegistryError(f"{_WHAT[kind]} {name!r}: claimed by {owner[name]!r} and {family.name!r}")
                owner[name] = family.name
    for family in found:
        stray = sorted(family.image_models - set(family.diffusion_models))
        if stray:
            raise RegistryError(f"family {family.name!r}: image_models {stray} are not among its diffusion_models")
    return found


def names(kind: Kind) -> list[str]:
    """The names of `kind` that some family serves, sorted."""
    return sorted(name for family in families() for name in getattr(family, kind))


def check(kind: Kind, name: str) -> None:
    """RegistryError (listing the known names) unless some family serves `name` as a `kind`."""
    if name not in names(kind):
        raise RegistryError(f"unknown {_WHAT[kind]} {name!r}; known: {names(kind)}")


def makes_images(model_type: str) -> bool:
    """Whether a diffusion stage of `model_type` makes images (its family says so), not audio."""
    return any(model_type in family.image_models for family in families())


def _load(kind: Kind, name: str) -> Any:
    """The code behind `name` (its module imported now)."""
    for family in families():
        loader: Loader | None = getattr(family, kind).get(name)
        if loader is not None:
            return loader()
    raise RegistryError(f"unknown {_WHAT[kind]} {name!r}; known: {names(kind)}")


def processor_traits(name: str) -> Processor:
    """The declared traits of processor `name` (data: nothing is imported)."""
    for family in families():
        if name in family.processors:
            return family.processors[name]
    raise RegistryError(f"unknown processor {name!r}; known: {names('processors')}")


@functools.cache
def stage_processor(name: str) -> StageProcessor:
    """The processor named `name` (one shared instance; a stage binds it to its checkpoint)."""
    return _load("processors", name)()


@functools.cache
def prompt_format(name: str) -> PromptFormat:
    return _load("prompt_formats", name)


def engine_model(model_part: str | None, model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
    """What an AR stage's engine starts from: the checkpoint as is, or what the family of
    `model_part` makes of it (e.g. a view dir holding one part, our vLLM model registered)."""
    if model_part is None:
        return EngineModel(model_dir, dict(engine_args))
    return _load("model_parts", model_part)(model_dir, dict(engine_args))


def diffusion_model(
    model_type: str, model_dir: str, device: torch.device, options: dict[str, Any] | None = None
) -> DiffusionModel:
    """The DiffusionModel of `model_type`, loaded from `model_dir` onto `device` with its
    `diffusion.model_options` (keywords of its loader)."""
    return _load("diffusion_models", model_type)(model_dir, device, **(options or {}))


def builtin_model(name: str) -> Path:
    """The dir of the built-in checkpoint `name`, built on first use (then cached on disk)."""
    return _load("builtin_models", name)(name)


def check_model(name_or_path: str) -> None:
    """RegistryError unless `name_or_path` is a built-in checkpoint name or a checkpoint dir
    (a dir with config.json) on this host; nothing is fetched from a hub."""
    if name_or_path in names("builtin_models") or (Path(name_or_path) / "config.json").is_file():
        return
    raise RegistryError(
        f"{name_or_path!r} is neither a built-in model ({', '.join(names('builtin_models'))}) nor a checkpoint "
        "directory on this host (a path to a dir with config.json; nothing is downloaded)"
    )


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
    return _load("checkpoint_types", model_type)
