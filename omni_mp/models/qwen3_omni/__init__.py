"""Qwen3-Omni-30B-A3B (thinker -> talker with its code predictor -> code2wav): everything
omni_mp knows of this family.

- `chat_template`: the released special token strings and the chat template.
- `code2wav`: code2wav as a streaming window decoder (`diffusion.model_type: qwen3_omni_code2wav`);
  `code2wav_inputs` the talker -> code2wav link (`processor: qwen3_omni_code2wav`);
  `tiny_code2wav` its tiny checkpoint with weights that make audible audio (tests).
- `tiny`: the tiny checkpoint dir (tests) and the released shapes with random weights
  (benchmarks); never imported at run time but through the registry's built-in names.

vLLM runs the thinker with its own Qwen3-Omni thinker model. This module only declares names
(omni_mp.models.registry reads them); each is imported when a stage asks for it.
"""

from typing import Any

from omni_mp.models.family import Family


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
    builtin_models={"tiny-qwen3-omni": _tiny, "tiny-qwen3-omni-code2wav": _tiny_code2wav},
    diffusion_models={"qwen3_omni_code2wav": _code2wav},
    processors={"qwen3_omni_code2wav": _code2wav_inputs},
)
