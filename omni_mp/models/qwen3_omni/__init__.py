"""Qwen3-Omni-30B-A3B (thinker -> talker with its code predictor -> code2wav): everything
omni_mp knows of this family.

- `chat_template`: the released special token strings and the chat template.
- `prompt`: the thinker's prompt format (`prompt_format: qwen3_omni`).
- `vllm_hooks_thinker`: vLLM's thinker able to stream intermediate layers
  (`model_part: qwen3_omni_thinker`); `exports`: what the thinker stage streams to the talker.
- `sizing`: what the GPU memory planner needs to know of its checkpoints.
- `vllm_hooks_talker`: our vLLM model of the talker with its code predictor inside its step
  (`model_part: qwen3_omni_talker`), loaded from a `talker_view` of the checkpoint; what it
  emits per frame: `codes`.
- `code2wav`: code2wav as a streaming window decoder (`diffusion.model_type: qwen3_omni_code2wav`);
  `code2wav_inputs` the talker -> code2wav link (`processor: qwen3_omni_code2wav`);
  `tiny_code2wav` its tiny checkpoint with weights that make audible audio (tests).
- `processor`: the thinker -> talker link (`processor: qwen3_omni_talker`).
- `tiny`: the tiny checkpoint dir (tests) and the released shapes with random weights
  (benchmarks); never imported at run time but through the registry's built-in names.

vLLM runs the thinker with its own Qwen3-Omni thinker model. This module only declares names
(omni_mp.models.registry reads them); each is imported when a stage asks for it.
"""

from typing import Any

from omni_mp.models.family import Family, Processor


def _prompt_format() -> Any:
    from omni_mp.models.qwen3_omni.prompt import PROMPT_FORMAT

    return PROMPT_FORMAT


def _thinker() -> Any:
    from omni_mp.models.qwen3_omni.vllm_hooks_thinker import thinker_engine_model

    return thinker_engine_model


def _talker_inputs() -> Any:
    from omni_mp.models.qwen3_omni.processor import Qwen3OmniTalkerInputs

    return Qwen3OmniTalkerInputs


def _talker() -> Any:
    from omni_mp.models.qwen3_omni.vllm_hooks_talker import talker_engine_model

    return talker_engine_model


def _sizing() -> Any:
    from omni_mp.models.qwen3_omni.sizing import SIZING

    return SIZING


def _code2wav() -> Any:
    from omni_mp.models.qwen3_omni.code2wav import Code2WavModel

    return Code2WavModel.from_checkpoint


def _code2wav_inputs() -> Any:
    from omni_mp.models.qwen3_omni.code2wav_inputs import Qwen3OmniCode2WavInputs

    return Qwen3OmniCode2WavInputs


def _tiny_code2wav() -> Any:
    from omni_mp.models.qwen3_omni.tiny_code2wav import build_named

    return build_named


def _tiny() -> Any:
    from omni_mp.models.qwen3_omni.tiny import build_named

    return build_named


FAMILY = Family(
    name="qwen3_omni",
    processors={
        "qwen3_omni_talker": Processor(_talker_inputs, needs_hidden_states=True, prompt_rows="media"),
        "qwen3_omni_code2wav": Processor(_code2wav_inputs, needs_hidden_states=True, feeds_diffusion=True),
    },
    prompt_formats={"qwen3_omni": _prompt_format},
    model_parts={"qwen3_omni_thinker": _thinker, "qwen3_omni_talker": _talker},
    checkpoint_types={"qwen3_omni_moe": _sizing},
    builtin_models={"tiny-qwen3-omni": _tiny, "tiny-qwen3-omni-code2wav": _tiny_code2wav},
    diffusion_models={"qwen3_omni_code2wav": _code2wav},
)
