"""vLLM 0.25.0's own Qwen3-Omni thinker, able to return intermediate layers (aux hidden states).

vLLM's `Qwen3OmniMoeThinkerForConditionalGeneration` runs its text decoder through
`Qwen3MoeLLMModel`, whose forward (it adds deepstack visual features after the first layers)
drops the EAGLE-3 aux-hidden-state outputs of its base `Qwen3MoeModel`; so it cannot give the
talker the thinker's layer `accept_hidden_layer` (exports.py). This module subclasses, pinned to
0.25.0 and touching nothing of vLLM's own classes:
- `ThinkerTextModel(Qwen3MoeLLMModel)`: the same forward, plus vLLM's own aux collection
  (`EagleModelMixin._maybe_add_hidden_state`) with HF's numbering: layer 0 = the input
  embeddings, layer k = the output of decoder layer k - 1 *before* its deepstack addition
  (transformers records a layer's output with a forward hook on the layer, and deepstack is
  added after it). The class inherits `Qwen3MoeLLMModel`'s `support_torch_compile` wrapping,
  which compiles `self.forward` (this forward): torch.compile and CUDA graphs return the aux
  tensors, which vllm_hooks gathers like any model's (no hooks, no Python state per step).
- `ThinkerLM(Qwen3MoeLLMForCausalLM)` building that text model, and
  `OmniMpQwen3OmniThinker(Qwen3OmniMoeThinkerForConditionalGeneration, SupportsEagle3)`
  building that LM: the parent's constructor hard-codes its language model class, so ours
  builds the same towers and buffers itself (the multimodal processor, M-RoPE positions,
  embedding merge, weight loading and forward are the parent's, unchanged).
Registered as `THINKER_ARCH`; `thinker_engine_model` (model_part `qwen3_omni_thinker`) points
vLLM at it through `hf_overrides.architectures`, on the checkpoint dir itself (vLLM's thinker
loads only `thinker.*` weights and skips the talker's and code2wav's).
"""

from __future__ import annotations

import dataclasses
from itertools import islice
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import SupportsEagle3
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
from vllm.model_executor.models.qwen3_omni_moe_thinker import (
    Qwen3MoeLLMForCausalLM,
    Qwen3MoeLLMModel,
    Qwen3Omni_VisionTransformer,
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoeThinkerForConditionalGeneration,
)
from vllm.model_executor.models.utils import maybe_prefix
from vllm.sequence import IntermediateTensors

from omni_mp.models.family import EngineModel

THINKER_ARCH = "OmniMpQwen3OmniThinker"


class ThinkerTextModel(Qwen3MoeLLMModel):
    """Qwen3MoeLLMModel whose forward also returns the aux hidden states asked for through
    `set_aux_hidden_state_layers` (HF numbering; see the module docstring)."""

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        deepstack_input_embeds: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors | tuple[torch.Tensor, list[torch.Tensor]]:
        if get_pp_group().is_first_rank:
            hidden_states = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            residual = None
        else:
            assert intermediate_tensors is not None
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        aux = self._maybe_add_hidden_state([], self.start_layer, hidden_states, residual)
        deepstack_levels = 0 if deepstack_input_embeds is None else len(deepstack_input_embeds)
        layers = islice(self.layers, self.start_layer, self.end_layer)
        for layer_idx, layer in enumerate(layers, start=self.start_layer):
            hidden_states, residual = layer(positions, hidden_states, residual)
            self._maybe_add_hidden_state(aux, layer_idx + 1, hidden_states, residual)
            if layer_idx < deepstack_levels:
                assert deepstack_input_embeds is not None
                hidden_states = hidden_states + deepstack_input_embeds[f"deepstack_input_embeds_{layer_idx}"]
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = self.norm(hidden_states, residual)
        return (hidden_states, aux) if aux else hidden_states


class ThinkerLM(Qwen3MoeLLMForCausalLM):
    """Qwen3MoeLLMForCausalLM with `ThinkerTextModel` as its decoder (same attributes)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super(Qwen3MoeForCausalLM, self).__init__()  # nn.Module's, as the parent does
        config = vllm_config.model_config.hf_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.model = ThinkerTextModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=self.quant_config)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors


class OmniMpQwen3OmniThinker(Qwen3OmniMoeThinkerForConditionalGeneration, SupportsEagle3):
    """vLLM's Qwen3-Omni thinker with `ThinkerLM`; `set_aux_hidden_state_layers` (SupportsEagle3's
    default) reaches `ThinkerTextModel` through `get_language_model()`."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        self.vllm_config = vllm_config  # torch.compile's forward context reads it
        thinker_config = vllm_config.model_config.hf_config.thinker_config
        self.config = thinker_config
        self.multimodal_config = vllm_config.model_config.multimodal_config
        self.quant_config = vllm_config.quant_config
        with self._mark_tower_model(vllm_config, "audio"):
            self.audio_tower = Qwen3OmniMoeAudioEncoder(
                thinker_config.audio_config, prefix=maybe_prefix(prefix, "audio_tower")
            )
        vision = thinker_config.vision_config
        self.use_deepstack = hasattr(vision, "deepstack_visual_indexes")
        self.deepstack_num_level = len(vision.deepstack_visual_indexes) if self.use_deepstack else 0
        self.visual_dim = vision.out_hidden_size
        self.multiscale_dim = self.visual_dim * self.deepstack_num_level
        with self._mark_tower_model(vllm_config, {"image", "video"}):
            self.visual = Qwen3Omni_VisionTransformer(
                vision_config=vision,
                norm_eps=getattr(thinker_config.text_config, "rms_norm_eps", 1e-6),
                quant_config=self.quant_config,
                prefix=maybe_prefix(prefix, "visual"),
            )
            if self.use_deepstack:
                # The parent's deepstack buffers (one per level; its forward reads and clears them).
                rows = vllm_config.scheduler_config.max_num_batched_tokens
                width = thinker_config.text_config.hidden_size
                self.deepstack_input_embeds = [torch.zeros(rows, width) for _ in range(self.deepstack_num_level)]
                self.deepstack_input_embeds_num_tokens = 0
        text_config = vllm_config.with_hf_config(thinker_config.text_config, architectures=["Qwen3MoeForCausalLM"])
        with self._mark_language_model(vllm_config):
            self.language_model = ThinkerLM(
                vllm_config=text_config,
                prefix=maybe_prefix(prefix, "language_model"),
            )
        self.make_empty_intermediate_tensors = self.language_model.make_empty_intermediate_tensors

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        """The prompt's M-RoPE positions as transformers computes them (`get_rope_index`).
        vLLM 0.25.0's version reads an image or audio item's `mm_position.offset` as the
        position of its start token (`<|vision_start|>` / `<|audio_start|>`), while its
        processor sets it to the first placeholder token: every image lands one position late
        (its grid starts at the start token's position + 2 instead of + 1, and its end token
        takes a grid position). Audio positions are sequential either way. So the items are
        handed over with their offsets on their start tokens (video items, which vLLM counts
        differently, are left as they are)."""
        moved = [
            dataclasses.replace(f, mm_position=dataclasses.replace(f.mm_position, offset=f.mm_position.offset - 1))
            if f.modality in ("image", "audio") and f.mm_position.offset > 0
            else f
            for f in mm_features
        ]
        return super().get_mrope_input_positions(input_tokens, moved)


def register_thinker() -> None:
    """Make `THINKER_ARCH` resolvable by vLLM (idempotent; before vLLM builds the engine config)."""
    from vllm import ModelRegistry

    if THINKER_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(THINKER_ARCH, OmniMpQwen3OmniThinker)


def thinker_engine_model(model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
    """`model_part: qwen3_omni_thinker` (omni_mp.models.family.ModelPart): vLLM's Qwen3-Omni
    thinker as `OmniMpQwen3OmniThinker`, on the checkpoint dir as it is."""
    register_thinker()
    overrides = dict(engine_args.get("hf_overrides") or {})
    overrides["architectures"] = [THINKER_ARCH]
    return EngineModel(model_dir, {**engine_args, "hf_overrides": overrides})
