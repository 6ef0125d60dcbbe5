"""What a model family declares to the runtime (omni_mp.models.registry reads it).

A family is one package under omni_mp/models/ whose `__init__` holds a `FAMILY`: the names
it serves (processors, prompt formats, model parts, diffusion model types, built-in
checkpoints), each mapped to a loader (a processor: a loader and the traits validation
checks): a small function that imports the code behind the name
when a stage asks for it, so reading the names (config validation, the registry's listings)
imports no torch, transformers or vLLM code of the family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

# Returns the code behind a name, importing its module then (static imports inside the loader:
# the import graph stays visible, and no module path is ever built from a string).
Loader = Callable[[], Any]


class Processor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A processor's entry: the loader of its StageProcessor class (no-argument constructor) and
    the traits config validation checks, as data, so that validating a YAML imports no family
    code (tests/test_model_registry.py holds them equal to the class's own attributes)."""

    load: Loader
    needs_hidden_states: bool = False  # upstream stages must emit hidden states
    feeds_diffusion: bool = False  # made for a diffusion stage (codec ids in); False: for AR stages
    # Which of the upstream prompt's hidden rows it reads: "all", or "media" (only at the
    # prompt's media placeholders: the upstream stage may read its prefix cache up to the first).
    prompt_rows: Literal["all", "media"] = "all"

    def __call__(self) -> Any:
        """The processor class (a Processor is a Loader too)."""
        return self.load()


class Family(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    # processor name -> its loader and traits
    processors: dict[str, Processor] = {}
    # prompt_format name -> a loader of a PromptFormat
    prompt_formats: dict[str, Loader] = {}
    # model_part name -> a loader of a ModelPart function
    model_parts: dict[str, Loader] = {}
    # diffusion model_type -> a loader of a function (model_dir, device) -> DiffusionModel
    diffusion_models: dict[str, Loader] = {}
    # built-in checkpoint name (a stage's `model:`) -> a loader of a function (name) -> its built dir
    builtin_models: dict[str, Loader] = {}
    # a checkpoint's config.json `model_type` -> a loader of its CheckpointSizing (GPU memory planning)
    checkpoint_types: dict[str, Loader] = {}
    # the diffusion model types (of `diffusion_models`) whose stages make images (omni_mp.wire.outputs)
    # rather than audio: the HTTP server answers /v1/images/generations with them
    image_models: frozenset[str] = frozenset()


class ChatPolicy(msgspec.Struct, frozen=True):
    """What a family's chat format asks of a whole conversation (omni_mp.http.conversation)
    beyond its checkpoint's chat template, from the model's own documentation and reference."""

    # The system prompt the model needs to speak (its model card), None: any. When set, a
    # spoken answer's system turn starts with it; the client's system text follows it.
    speech_system: str | None = None
    tools: bool = False  # the chat template renders `tools`, tool calls and tool results
    # The roles of the prompt's turns the talker reads (the reference's generate()); None: the
    # whole prompt. Informational: the talker's processor finds them in the prompt's ids.
    talker_roles: tuple[str, ...] | None = None


class PromptFormat(Protocol):
    """An entry stage's chat format and what its model's processor takes as media."""

    audio_rate: int  # the sample rate audio is resampled to before the model's processor
    # The token that ends the model's turn in this format (a reply given rather than generated
    # ends with it: Submit.forced_reply); None: the format takes no given reply.
    reply_end: str | None
    chat: ChatPolicy  # what a whole conversation needs beyond the checkpoint's chat template

    def max_audio_s(self, model_dir: str) -> float | None:
        """The longest audio (seconds) the checkpoint's processor takes whole (longer audio
        would be cut); None: no such limit."""
        ...

    def render(self, text: str, n_audio: int, n_image: int, system: str | None = None) -> str:
        """The prompt for one user turn: `text` with one placeholder per audio and per image;
        `system`: the system turn instead of the format's default (ValueError where the
        format has none to replace)."""
        ...

    def companions(self, params: Mapping[str, Any] | None) -> list[str]:
        """Prompts run beside the request's prompt for these model parameters (e.g. an
        image's negative prompt; most formats: none). ValueError on bad parameters."""
        ...


def whisper_frames(samples: int) -> int:
    """Whisper features of an audio (Qwen's audio encoders take them): one per hop of 160
    samples at 16 kHz (vLLM pads the audio to whole hops)."""
    return -(-samples // 160)


@runtime_checkable
class CountsAudio(Protocol):
    """A prompt format that knows how many prompt tokens an audio takes (its placeholder
    expanded as vLLM's processor for the family does), without running the processor."""

    audio_placeholder: str  # the token the processor expands, once per audio

    def audio_tokens(self, samples: int) -> int:
        """The tokens of an audio of `samples` samples at `audio_rate`."""
        ...


class EngineModel(msgspec.Struct, frozen=True):
    """What an AR stage's engine is built from: a model dir and vLLM engine args."""

    model: str
    engine_args: dict[str, Any]


class ModelPart(Protocol):
    def __call__(self, model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
        """The engine model of this part of the checkpoint in `model_dir` (registering any
        vLLM model class of ours it needs)."""
        ...


class CheckpointSizing(Protocol):
    """How the memory planner sizes a stage on one of the family's checkpoints (a checkpoint
    of no family is sized whole, as a causal LM)."""

    def part(self, stage: Any) -> str:
        """The part of the checkpoint the stage runs: its weights' name prefix ('all': whole)."""
        ...

    def skipped(self, stage: Any, part: str) -> set[str]:
        """Weight-name prefixes inside `part` the engine does not build for this stage."""
        ...

    def part_dir(self, model_dir: Path, part: str) -> Path:
        """The dir whose config.json and safetensors hold `part`: `model_dir`, or a sub-model's
        dir inside it (e.g. Qwen3-TTS's `speech_tokenizer/`)."""
        ...

    def meta_model(self, config: Any, part: str) -> tuple[type, Any]:
        """`part`'s Hugging Face class and config (its parameter count without weights)."""
        ...

    def text_config(self, config: dict[str, Any], part: str) -> dict[str, Any]:
        """The config of `part`'s decoder (an AR stage's KV cache and activations)."""
        ...

    def diffusion_activations(self, stage: Any, config: dict[str, Any]) -> int:
        """Activation bytes of a diffusion stage on this checkpoint (`config`: the config.json
        of its part's `part_dir`)."""
        ...


def unbuilt_omni_towers(stage: Any) -> set[str]:
    """For `CheckpointSizing.skipped` of an omni thinker (towers `audio_tower.` and `visual.`):
    the towers vLLM does not build, those whose modalities all have limit 0."""
    limits = stage.engine_args.get("limit_mm_per_prompt") or {}
    skipped = set()
    if limits.get("audio") == 0:
        skipped.add("audio_tower.")
    if limits.get("image") == 0 and limits.get("video") == 0:
        skipped.add("visual.")
    return skipped


class BuiltinBuilder(Protocol):
    def __call__(self, name: str) -> Path: ...
