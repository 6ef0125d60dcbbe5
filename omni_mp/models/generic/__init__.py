"""Processors of no particular model, and the plain Qwen2 test checkpoints (vLLM runs Qwen2
itself: no engine code of ours).

- `processors`: token continuation (`continue_tokens`, `generated_tokens`), the generic
  thinker -> talker link (`thinker_to_talker`), codec ids into a diffusion stage (`codec_tokens`).
- `tiny`: the tiny Qwen2 checkpoints of the tests (`tiny-qwen2`, `tiny-qwen2-b`, `small-qwen2`).
"""

from typing import Any

from omni_mp.models.family import Family, Processor


def _continue_tokens() -> Any:
    from omni_mp.models.generic.processors import ContinueTokens

    return ContinueTokens


def _generated_tokens() -> Any:
    from omni_mp.models.generic.processors import GeneratedTokens

    return GeneratedTokens


def _thinker_to_talker() -> Any:
    from omni_mp.models.generic.processors import ThinkerToTalker

    return ThinkerToTalker


def _codec_tokens() -> Any:
    from omni_mp.models.generic.processors import CodecTokens

    return CodecTokens


def _tiny_qwen2() -> Any:
    from omni_mp.models.generic.tiny import build_named

    return build_named


FAMILY = Family(
    name="generic",
    processors={
        "codec_tokens": Processor(_codec_tokens, feeds_diffusion=True),
        "continue_tokens": Processor(_continue_tokens),
        "generated_tokens": Processor(_generated_tokens),
        "thinker_to_talker": Processor(_thinker_to_talker, needs_hidden_states=True),
    },
    builtin_models={name: _tiny_qwen2 for name in ("tiny-qwen2", "tiny-qwen2-b", "small-qwen2")},
)
