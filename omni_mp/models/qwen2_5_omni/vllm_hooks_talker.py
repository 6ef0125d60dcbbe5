"""The Qwen2.5-Omni talker as a vLLM 0.25.0 model, registered by our code (vLLM has none).

It computes what transformers' `Qwen2_5OmniTalkerForConditionalGeneration` computes:
`codec_head(norm(decoder(thinker_to_talker_proj(x))))`, where the input row `x` lives in the
thinker's space (width E = `embedding_size`): prompt rows come as prompt embeddings, and a
decode step's row is `embed_tokens(code)` (an Embedding(Vc, E)) plus the per-step extra
embedding that `vllm_hooks` adds in place into the runner's `inputs_embeds` buffer. The view
config (`omni_mp.models.qwen2_5_omni.talker_view`) sets `projection_size = E`, so that buffer is E wide.

The decoder is built from vLLM's Llama layers, not Qwen2's: vLLM's `Qwen2Attention` derives
head_dim from hidden/heads, while the talker's `head_dim` is an explicit field (the 7B talker
has heads * head_dim != hidden). `LlamaAttention` reads `config.head_dim`; Qwen2's biases (q/k/v
with bias, o_proj and MLP without) come from `qkv_bias=True`, `attention_bias=False`,
`mlp_bias=False` on a copy of the config (`LlamaDecoderLayer` in 0.25.0 reads exactly these).
RoPE is M-RoPE (`rope_parameters.mrope_section`: vLLM's `get_rope` returns MRotaryEmbedding),
so positions are [3, n]; the runner asks `get_mrope_input_positions` for a prompt's positions
(text: arange on all axes) unless `vllm_hooks` overrides them with the thinker's.

The projection sits inside the compiled module, so torch.compile and CUDA graphs cover it;
forward keeps no per-step Python state.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.interfaces import SupportsMRoPE
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaModel
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, make_layers, maybe_prefix
from vllm.sequence import IntermediateTensors

from omni_mp.models.family import EngineModel
from omni_mp.models.qwen2_5_omni.talker_view import TALKER_ARCH, talker_view_dir


def _decoder_config(config: Any) -> Any:
    """The talker config as `LlamaDecoderLayer` reads it, with Qwen2's bias layout."""
    cfg = copy.deepcopy(config)
    cfg.qkv_bias = True
    cfg.attention_bias = False  # also o_proj's bias in LlamaDecoderLayer
    cfg.mlp_bias = False
    if getattr(cfg, "head_dim", None) is None:
        raise ValueError("the talker config needs an explicit head_dim")
    return cfg


@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,  # [3, n] with M-RoPE
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    }
)
class TalkerModel(nn.Module):
    """Codec embedding (Vc x E), thinker_to_talker_proj (E -> Hk), decoder layers, final norm."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        decoder_config = _decoder_config(config)
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.embedding_size)
        self.thinker_to_talker_proj = ReplicatedLinear(
            config.embedding_size, config.hidden_size, bias=True, prefix=f"{prefix}.thinker_to_talker_proj"
        )
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: LlamaDecoderLayer(vllm_config=vllm_config, prefix=prefix, config=decoder_config),
            prefix=f"{prefix}.layers",
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden_states, _ = self.thinker_to_talker_proj(inputs_embeds)
        residual = None
        for layer in self.layers[self.start_layer : self.end_layer]:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class OmniMpQwen2_5OmniTalker(nn.Module, SupportsMRoPE):
    """vLLM's view of `Qwen2_5OmniTalkerForConditionalGeneration` (module names follow it)."""

    # HF checkpoint names -> ours: q/k/v and gate/up stacked as vLLM's Llama layers expect; the
    # projection lives in the compiled `model`; the thinker and token2wav are not ours to load.
    hf_to_vllm_mapper = LlamaModel.hf_to_vllm_mapper | WeightsMapper(
        orig_to_new_prefix={
            "talker.thinker_to_talker_proj.": "model.thinker_to_talker_proj.",
            "talker.": "",
            "thinker.": None,
            "token2wav.": None,
        }
    )

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = TalkerModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.codec_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, bias=False, prefix=maybe_prefix(prefix, "codec_head")
        )
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Codec ids -> codec embeddings in the thinker's space (width E, before the projection)."""
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.codec_head, hidden_states)

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        """Text positions (arange on all three axes, delta 0). A talker prompt that follows a
        multimodal thinker prompt gets the thinker's positions from `vllm_hooks` instead."""
        if mm_features:
            raise ValueError("the talker takes no multimodal inputs (pass the thinker's positions instead)")
        n = len(input_tokens)
        return torch.arange(n, dtype=torch.int64).expand(3, n).clone(), 0

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Only `talker.*` keys of a full omni checkpoint (vLLM's `load_format: dummy` skips this)."""
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


def register_talker() -> None:
    """Make `TALKER_ARCH` (the architecture a talker view's config names) resolvable by vLLM.
    Idempotent; call it in the stage process before vLLM builds the engine config."""
    from vllm import ModelRegistry

    if TALKER_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(TALKER_ARCH, OmniMpQwen2_5OmniTalker)


def talker_engine_model(model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
    """`model_part: talker` (omni_mp.models.family.ModelPart): our vLLM model of the talker,
    loaded from a view of the checkpoint whose config is the talker's; codec ids are not text,
    so vLLM starts no tokenizer."""
    register_talker()
    view = talker_view_dir(model_dir, require_weights=engine_args.get("load_format") != "dummy")
    return EngineModel(str(view), {**engine_args, "skip_tokenizer_init": True})
