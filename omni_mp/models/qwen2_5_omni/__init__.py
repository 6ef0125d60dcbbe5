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

from omni_mp.models.family import Family

_PKG = "omni_mp.models.qwen2_5_omni"

FAMILY = Family(
    name="qwen2_5_omni",
    processors={"qwen2_5_omni_talker": f"{_PKG}.processor:Qwen25OmniTalkerInputs"},
    prompt_formats={"qwen2_5_omni": f"{_PKG}.prompt:PROMPT_FORMAT"},
    model_parts={"talker": f"{_PKG}.vllm_hooks_talker:talker_engine_model"},
    diffusion_models={"qwen2_5_omni_token2wav": f"{_PKG}.token2wav:Token2WavModel.from_checkpoint"},
    checkpoint_types={"qwen2_5_omni": f"{_PKG}.sizing:SIZING"},
    builtin_models={
        name: f"{_PKG}.tiny:build_named" for name in ("tiny-qwen2_5-omni", "tiny-token2wav", "token2wav-default-size")
    },
)
