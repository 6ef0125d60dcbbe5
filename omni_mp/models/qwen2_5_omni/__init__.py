"""Qwen2.5-Omni (thinker -> talker -> token2wav): everything omni_mp knows of this family.

- `prompt`: the chat format of the thinker's prompt and the media its processor takes.
- `processor`: the thinker -> talker link (`processor: qwen2_5_omni_talker`).
- `vllm_hooks_talker`: our vLLM model of the talker and its registration (`model_part: talker`),
  loaded from a `talker_view` of the checkpoint.
- `token2wav`: the DiT + BigVGAN as a DiffusionModel (`diffusion.model_type: qwen2_5_omni_token2wav`).
- `speakers`: the checkpoint's `spk_dict.pt`.
- `sizing`: what the GPU memory planner needs to know of its checkpoints.
- `tiny` (tests) and `shapes` (benchmarks): checkpoint dirs written locally; never imported
  at run time but through the registry's built-in names.

vLLM runs the thinker with its own Qwen2.5-Omni model. This module only declares names
(omni_mp.models.registry reads them); each is imported when a stage asks for it.
"""

from typing import Any

from omni_mp.models.family import Family, Processor


def _processor() -> Any:
    from omni_mp.models.qwen2_5_omni.processor import Qwen25OmniTalkerInputs

    return Qwen25OmniTalkerInputs


def _prompt_format() -> Any:
    from omni_mp.models.qwen2_5_omni.prompt import PROMPT_FORMAT

    return PROMPT_FORMAT


def _talker() -> Any:
    from omni_mp.models.qwen2_5_omni.vllm_hooks_talker import talker_engine_model

    return talker_engine_model


def _token2wav() -> Any:
    from omni_mp.models.qwen2_5_omni.token2wav import Token2WavModel

    return Token2WavModel.from_checkpoint


def _sizing() -> Any:
    from omni_mp.models.qwen2_5_omni.sizing import SIZING

    return SIZING


def _tiny() -> Any:
    from omni_mp.models.qwen2_5_omni.tiny import build_named

    return build_named


FAMILY = Family(
    name="qwen2_5_omni",
    processors={"qwen2_5_omni_talker": Processor(_processor, needs_hidden_states=True)},
    prompt_formats={"qwen2_5_omni": _prompt_format},
    model_parts={"talker": _talker},
    diffusion_models={"qwen2_5_omni_token2wav": _token2wav},
    checkpoint_types={"qwen2_5_omni": _sizing},
    builtin_models={name: _tiny for name in ("tiny-qwen2_5-omni", "tiny-token2wav", "token2wav-default-size")},
)
