"""The Qwen3-Omni talker with its code predictor as a vLLM 0.25.0 model, registered by our code
(vLLM has none).

What transformers' `Qwen3OmniMoeTalkerForConditionalGeneration` computes per step (5.17.0):
the decoder (vLLM's `Qwen3MoeModel`: M-RoPE attention with q/k norms, 128 experts top-k plus a
sigmoid-gated shared expert, which vLLM's `Qwen3MoeSparseMoeBlock` builds from
`shared_expert_intermediate_size`) reads one input row per position; `codec_head` of its last
hidden state h_t gives code group 0 of frame t (sampled by vLLM). The input of the next
position is `codec_embedding(c0) + sum_{g=1..15} cp_embedding[g-1](c_g) + text row`, where
c1..c15 come from the code predictor: a 5-layer dense decoder run on a fresh sequence
[h_t, codec_embedding(c0)] for 15 greedy AR steps (lm_head[g-1] gives c_g, which is fed back
through cp_embedding[g-1]).

How the step is split between vLLM and this model:
- vLLM samples c0 after the forward, so the code predictor of frame t runs at the start of the
  NEXT forward, where c0 is that position's input token: per request, batched over the
  step's decode rows. The runner has already written `codec_embedding(c0)` plus the
  processor's text row (omni_mp.engines.vllm_hooks' step embeddings) into `inputs_embeds`;
  the forward adds the 15 residual embeddings there, then runs the decoder.
- h_t of every request lives in a device buffer `h_store[max_num_seqs + 1, hidden]`, one slot
  per running request (the last is a scratch slot), written at the end of each forward at
  the last token of each request's chunk and read by the next forward's code predictor.
  Which row reads or writes which slot is in static index buffers that `omni_prepare_step`
  (called by the runner hooks before every forward, outside any graph) fills from the
  host; so the whole forward, code predictor included, has fixed shapes, no host syncs and
  no data-dependent shapes: the runner's CUDA graphs capture it (FULL graphs of decode
  batches replay it whole). Its code predictor KV is a fresh 16-position tensor per call.
- Output rows are `[hidden + 16]` float32: the hidden state (what `codec_head` reads) and the
  16 codes of the frame completed at that position (omni_mp.models.qwen3_omni.codes).
- Preemption: vLLM recomputes a resumed request's positions from their token ids; this
  model re-adds the text rows (step embeddings) but not the code predictor's residual
  embeddings of frames already emitted, so a resumed talker continues on a slightly
  different context (its frames stay well-formed; size the KV cache to avoid preemption).
- Code predictor decoding follows the request's talker sampling, as generate mirrors
  `talker_do_sample` onto it: greedy when the talker's temperature is 0, else sampled with
  the code predictor's `CodeSampling` (generate's: top-k 50, top-p 0.8, temperature 1), from
  the device's default generator (per-request seeds apply to group 0 only). Group 0 is vLLM's.

Hook points for Qwen3-TTS's talker (omni_mp.models.qwen3_tts.vllm_hooks_talker), each a no-op
here: `OmniMpQwen3OmniTalker.decoder_cls` and `.code_predictor_cls`, `CodePredictor.input_projection`
(a predictor narrower than the talker: identity here, where the widths must agree) and
`CodePredictor.sampling`.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, ExitStack
from typing import Any, Literal

import msgspec
import torch
import torch.nn.functional as F
from torch import nn
from vllm import _custom_ops
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.interfaces import SupportsMRoPE
from vllm.model_executor.models.qwen3_moe import Qwen3MoeModel
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix
from vllm.sequence import IntermediateTensors

from omni_mp.engines.vllm_hooks import StepBatch
from omni_mp.models.family import EngineModel
from omni_mp.models.qwen3_omni.codes import NO_CODE, NUM_CODE_GROUPS, ROW_DTYPE
from omni_mp.models.qwen3_omni.talker_view import TALKER_ARCH, talker_view_dir

CP_STEPS = NUM_CODE_GROUPS - 1  # code predictor AR steps per frame
CP_POSITIONS = NUM_CODE_GROUPS  # [h, c0, c1..c14]: c15 is never fed back


class CodeSampling(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How a sampled request's code predictor draws codes 1..15, transformers' warpers in their
    order: logits / temperature, top-k, then top-p; settings of one model (constants in the
    captured graphs)."""

    do_sample: bool = True  # False: greedy even for requests whose talker samples
    top_k: int = 50  # 0: no top-k
    top_p: float = 0.8  # 1.0: no top-p
    temperature: float = 1.0


OMNI_CODE_SAMPLING = CodeSampling()  # Qwen3-Omni generate's code predictor sampling


def sample_top_k_top_p(logits: torch.Tensor, sampling: CodeSampling = OMNI_CODE_SAMPLING) -> torch.Tensor:
    """[R, V] -> [R] codes drawn with `sampling`'s temperature, top-k then top-p (the smallest
    set of most likely codes whose probability reaches top_p), fixed shapes, no host sync."""
    scores = logits.float()
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    k = logits.shape[-1] if sampling.top_k <= 0 else min(sampling.top_k, logits.shape[-1])
    vals, idx = scores.topk(k, dim=-1)  # descending
    probs = vals.softmax(dim=-1)
    if sampling.top_p < 1.0:  # transformers adds no top-p warper at 1.0
        keep = probs.cumsum(dim=-1) - probs < sampling.top_p  # the top code always stays
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    # probs / Exp(1) noise, argmax: a draw from probs (renormalizing does not move the argmax).
    choice = (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1, keepdim=True)
    return idx.gather(-1, choice)[:, 0]


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


KernelMode = Literal["native", "ops", "fused"]


class EagerKernels:
    """The kernels the code predictor's vLLM layers run. The talker's decoder is compiled, and
    with Inductor vLLM 0.25.0 switches its custom ops off (RMSNorm's IR op priority is
    `native`; rotary embedding and SiluAndMul run `forward_native`) for Inductor to fuse. The
    code predictor runs outside that compiled region (eager Python, recorded into the FULL CUDA
    graph as is), where the native forms stay separate kernels: about 8 per RMSNorm and 15 per
    rotary embedding, 75 layer passes per frame. Modes:
    - `native`: vLLM's default dispatch there (for A/B runs);
    - `ops`: vLLM's own CUDA kernel for each of those ops (those vLLM uses without Inductor);
    - `fused` (CUDA default): as `ops`, and q/k norms with the rotary embedding in one kernel
      (vLLM's `fused_qk_norm_rope`, what its compile pass puts in Qwen3 decoders; bf16 and fp16
      only, others fall back to `ops`), whose output keeps K and V side by side, so they go
      to the cache in one copy: 225 of a frame's 1354 kernels fewer
      (benchmarks.qwen3_code_predictor_profile)."""

    def __init__(self, mode: KernelMode) -> None:
        self.mode = mode
        self.ops = mode != "native"

    def scope(self) -> AbstractContextManager[Any]:
        """While open, RMSNorm layers dispatch to vLLM's CUDA kernel (IR provider `vllm_c`)."""
        stack = ExitStack()
        if self.ops:
            from vllm import ir

            for op in (ir.ops.rms_norm, ir.ops.fused_add_rms_norm):
                stack.enter_context(op.set_priority([p for p in ("vllm_c",) if p in op.impls] + ["native"]))
        return stack

    def fuses_qk(self, qkv: torch.Tensor) -> bool:
        return (
            self.mode == "fused"
            and qkv.dtype in (torch.bfloat16, torch.float16)
            and hasattr(torch.ops._C, "fused_qk_norm_rope")
        )

    def qk_norm_rope(
        self, layer: CodePredictorLayer, rope: Any, positions: torch.Tensor, qkv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """qkv [n, q + 2 kv] (contiguous) -> q [n, q] normed per head and rotated, and
        [n, 2 kv]: k (normed, rotated) then v per row, for one cache write."""
        attn, d, n = layer.self_attn, layer.head_dim, qkv.shape[0]
        if self.fuses_qk(qkv):  # in place in qkv
            _custom_ops.fused_qk_norm_rope(
                qkv,
                layer.heads,
                layer.kv_heads,
                layer.kv_heads,
                d,
                attn.q_norm.variance_epsilon,
                attn.q_norm.weight,
                attn.k_norm.weight,
                rope._match_cos_sin_cache_dtype(qkv),  # vLLM's cache in the query's dtype
                rope.is_neox_style,
                positions,
            )
            return qkv[:, : layer.q_size], qkv[:, layer.q_size :]
        q, k, v = qkv.split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
        q = attn.q_norm(q.view(n, layer.heads, d)).view(n, layer.q_size)
        k = attn.k_norm(k.view(n, layer.kv_heads, d)).view(n, layer.kv_size)
        q, k = rope.forward_cuda(positions, q, k) if self.ops else rope(positions, q, k)
        return q, torch.cat([k, v], dim=-1)

    def silu_and_mul(self, act: SiluAndMul, x: torch.Tensor) -> torch.Tensor:
        return act.forward_cuda(x) if self.ops else act(x)


class CodePredictorLayer(nn.Module):
    """One Qwen3 dense decoder layer (q/k norms, GQA, gated SiLU MLP) over a fixed-shape batch
    of short sequences; its KV lives in the caller's tensors. q/k/v and gate/up are one matmul
    each (`load_weights` stacks transformers' separate weights), and the residual stream is
    carried between layers, so each norm is one fused add + norm."""

    def __init__(self, cfg: Any, prefix: str) -> None:
        super().__init__()
        hidden = int(_get(cfg, "hidden_size"))
        self.heads = int(_get(cfg, "num_attention_heads"))
        self.kv_heads = int(_get(cfg, "num_key_value_heads"))
        self.head_dim = int(_get(cfg, "head_dim") or hidden // self.heads)
        eps = float(_get(cfg, "rms_norm_eps", 1e-6))
        inter = int(_get(cfg, "intermediate_size"))
        d = self.head_dim
        self.q_size, self.kv_size = self.heads * d, self.kv_heads * d
        q, kv = self.q_size, self.kv_size
        # transformers' weight -> (our stacked parameter, its rows)
        self.stacked = {
            "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0, q),
            "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", q, q + kv),
            "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", q + kv, q + 2 * kv),
            "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0, inter),
            "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", inter, 2 * inter),
        }
        self.self_attn = nn.Module()
        attn = self.self_attn
        attn.qkv_proj = ReplicatedLinear(hidden, q + 2 * kv, bias=False, prefix=f"{prefix}.self_attn.qkv_proj")
        attn.o_proj = ReplicatedLinear(q, hidden, bias=False, prefix=f"{prefix}.self_attn.o_proj")
        attn.q_norm = RMSNorm(d, eps=eps)
        attn.k_norm = RMSNorm(d, eps=eps)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = ReplicatedLinear(hidden, 2 * inter, bias=False, prefix=f"{prefix}.mlp.gate_up_proj")
        self.mlp.down_proj = ReplicatedLinear(inter, hidden, bias=False, prefix=f"{prefix}.mlp.down_proj")
        self.act = SiluAndMul()
        self.input_layernorm = RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps=eps)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rope: Any,
        kernels: EagerKernels,
        kv_cache: torch.Tensor,
        t0: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h [R*T, hidden]: R rows of T new positions t0..t0+T-1 each, row-major (T > 1 only
        from t0 = 0); `residual` its residual stream (None at the first layer); `positions`
        [R*T] for `rope`. `kv_cache` [R, 2, kv_heads, CP_POSITIONS, head_dim] (K, V) holds
        positions < t0 and gets these. Returns (output, residual stream): their sum is the
        layer's hidden state."""
        d, attn = self.head_dim, self.self_attn
        n, r = h.shape[0], kv_cache.shape[0]
        t = n // r
        if residual is None:
            residual, h = h, self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        q, kv = kernels.qk_norm_rope(self, rope, positions, attn.qkv_proj(h)[0])
        kv_cache[:, :, :, t0 : t0 + t] = kv.view(r, t, 2, self.kv_heads, d).permute(0, 2, 3, 1, 4)
        # Causal within the new positions (several only from position 0); every earlier
        # position is visible.
        out = F.scaled_dot_product_attention(
            q.view(r, t, self.heads, d).transpose(1, 2),
            kv_cache[:, 0, :, : t0 + t],
            kv_cache[:, 1, :, : t0 + t],
            is_causal=t > 1,
            enable_gqa=self.kv_heads != self.heads,
        )
        h = attn.o_proj(out.transpose(1, 2).reshape(n, self.q_size))[0]
        h, residual = self.post_attention_layernorm(h, residual)
        h = self.mlp.down_proj(kernels.silu_and_mul(self.act, self.mlp.gate_up_proj(h)[0]))[0]
        return h, residual

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """transformers' names; q/k/v and gate/up go into their rows of the stacked matrices."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, w in weights:
            if name in self.stacked:
                name, a, b = self.stacked[name]
                if tuple(w.shape) != (b - a, params[name].shape[1]):
                    raise ValueError(f"code predictor: a {tuple(w.shape)} weight for rows {a}:{b} of {name}")
                params[name].data[a:b].copy_(w)
            else:
                default_weight_loader(params[name], w)
            loaded.add(name)
        return loaded


class CodePredictorModel(nn.Module):
    """The predictor's layers and norm at its width; its code embeddings at the talker's
    (`embedding_dim`: they are summed into the talker's next input)."""

    def __init__(self, cfg: Any, prefix: str, embedding_dim: int) -> None:
        super().__init__()
        hidden = int(_get(cfg, "hidden_size"))
        vocab = int(_get(cfg, "vocab_size"))
        n_layers = int(_get(cfg, "num_hidden_layers"))
        self.layers = nn.ModuleList([CodePredictorLayer(cfg, f"{prefix}.layers.{i}") for i in range(n_layers)])
        self.norm = RMSNorm(hidden, eps=float(_get(cfg, "rms_norm_eps", 1e-6)))
        self.codec_embedding = nn.ModuleList([nn.Embedding(vocab, embedding_dim) for _ in range(CP_STEPS)])


class CodePredictor(nn.Module):
    """transformers' `Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration`, run as
    15 AR steps over a fixed-shape batch (module names follow it, but for the stacked q/k/v
    and gate/up projections). Its inputs come at the talker's width (`talker_hidden`; default
    its own) through `small_to_mtp_projection` (`input_projection`: identity here)."""

    sampling: CodeSampling = OMNI_CODE_SAMPLING  # a sampled request's draw (Qwen3-TTS: its own)

    def __init__(self, cfg: Any, prefix: str, talker_hidden: int | None = None) -> None:
        super().__init__()
        hidden = int(_get(cfg, "hidden_size"))
        vocab = int(_get(cfg, "vocab_size"))
        if int(_get(cfg, "num_code_groups", NUM_CODE_GROUPS)) != NUM_CODE_GROUPS:
            raise ValueError(f"code predictor: num_code_groups must be {NUM_CODE_GROUPS}")
        self.hidden_size = hidden
        talker_hidden = hidden if talker_hidden is None else talker_hidden
        self.small_to_mtp_projection = self.input_projection(talker_hidden, hidden)
        self.model = CodePredictorModel(cfg, f"{prefix}.model", talker_hidden)
        self.lm_head = nn.ModuleList([nn.Linear(hidden, vocab, bias=False) for _ in range(CP_STEPS)])
        layer = self.model.layers[0]
        self.rope = get_rope(
            layer.head_dim,
            max_position=CP_POSITIONS,
            rope_parameters=dict(_get(cfg, "rope_parameters") or {"rope_type": "default", "rope_theta": 10000.0}),
        )
        self.kernel_mode: KernelMode = "fused"  # EagerKernels' mode on CUDA (the others for A/B runs)

    def input_projection(self, talker_hidden: int, hidden: int) -> nn.Module:
        """The map of every predictor input (talker width) to the predictor's width: Qwen3-Omni's
        widths agree, so none."""
        if talker_hidden != hidden:
            raise ValueError("talker: the code predictor's hidden_size must equal the talker's")
        return nn.Identity()

    def pick(self, logits: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """[R, V] logits -> [R] codes: drawn with `sampling` where `sample`, else the argmax."""
        if not self.sampling.do_sample:  # the model's setting: the same for every step
            return logits.argmax(dim=-1)
        return torch.where(sample, sample_top_k_top_p(logits, self.sampling), logits.argmax(dim=-1))

    def forward(
        self, h_prev: torch.Tensor, e0: torch.Tensor, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """h_prev, e0 [R, talker hidden], sample [R] bool (rows drawn rather than greedy) ->
        (codes 1..15 [R, 15] int64, sum of their embeddings [R, talker hidden])."""
        r, width = h_prev.shape
        hidden = self.hidden_size
        layers = self.model.layers
        shape = (r, 2, layers[0].kv_heads, CP_POSITIONS, layers[0].head_dim)
        kv_caches = [h_prev.new_empty(shape) for _ in layers]
        # [position, row]: every row of a call sits at the same positions.
        table = torch.arange(CP_POSITIONS, device=h_prev.device)[:, None].expand(CP_POSITIONS, r).contiguous()
        kernels = EagerKernels(self.kernel_mode if h_prev.is_cuda else "native")
        # positions 0, 1 of each row, at the predictor's width
        x = self.small_to_mtp_projection(torch.stack([h_prev, e0], dim=1).view(2 * r, width))
        positions = table[:2].t().reshape(2 * r)
        codes: list[torch.Tensor] = []
        total = torch.zeros_like(h_prev)
        with kernels.scope():
            for g in range(CP_STEPS):
                t0 = 0 if g == 0 else g + 1
                h, residual = x, None
                for i, layer in enumerate(layers):
                    h, residual = layer(h, residual, positions, self.rope, kernels, kv_caches[i], t0)
                if g == 0:  # each row's last position
                    h, residual = (
                        h.view(r, 2, hidden)[:, 1].contiguous(),
                        residual.view(r, 2, hidden)[:, 1].contiguous(),
                    )
                last, _ = self.model.norm(h, residual)
                logits = self.lm_head[g](last)
                code = self.pick(logits, sample)
                codes.append(code)
                emb = self.model.codec_embedding[g](code)
                total = total + emb  # the talker's next input sums the embeddings unprojected
                if g + 1 < CP_STEPS:
                    x, positions = self.small_to_mtp_projection(emb), table[g + 2]
        return torch.stack(codes, dim=1), total


class CodePredictorGraphs:
    """The code predictor alone in CUDA graphs, one per row bucket, for the steps vLLM runs
    outside a FULL graph (prompt chunks, and decodes beside them): eager, a frame's ~1350 small
    kernels cost more to launch from Python than to run (a mixed talker step of 2048 tokens at
    8 requests took 73 ms against 25 ms for a prompt chunk alone, on an H200). Inputs go into
    static buffers; rows past the caller's compute on whatever the buffers hold and are
    dropped (rows never mix: every op is per row). Sampling draws from the device's default
    generator, which graph replays advance like eager calls."""

    BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

    def __init__(self, cp: CodePredictor, max_rows: int, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        self.buckets = sorted({b for b in self.BUCKETS if b < max_rows} | {max_rows})
        self.h = torch.zeros(max_rows, hidden, dtype=dtype, device=device)
        self.e0 = torch.zeros_like(self.h)
        self.sample = torch.zeros(max_rows, dtype=torch.bool, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        pool = None
        for b in reversed(self.buckets):  # the largest first: the others reuse its memory pool
            args = (self.h[:b], self.e0[:b], self.sample[:b])
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture stream, as torch advises
                cp(*args)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                codes, emb = cp(*args)
            pool = graph.pool()
            self.graphs[b] = (graph, codes, emb)

    def __call__(
        self, h_prev: torch.Tensor, e0: torch.Tensor, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `CodePredictor.forward`; the results are views of the graph's outputs, valid
        until the next call."""
        r = h_prev.shape[0]
        b = next(b for b in self.buckets if b >= r)
        self.h[:r].copy_(h_prev)
        self.e0[:r].copy_(e0)
        self.sample[:r].copy_(sample)
        graph, codes, emb = self.graphs[b]
        graph.replay()
        return codes[:r], emb[:r]


@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,  # [3, n] with M-RoPE (Qwen3MoeModel's own decorator marks dim 0)
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    }
)
class TalkerDecoder(Qwen3MoeModel):
    """vLLM's Qwen3-MoE decoder (the talker's: shared experts from the config), compiled
    with M-RoPE positions."""


class OmniMpQwen3OmniTalker(nn.Module, SupportsMRoPE):
    """vLLM's view of `Qwen3OmniMoeTalkerForConditionalGeneration` (module names follow it)."""

    # The decoder under the code predictor (Qwen3-TTS's talker: a dense Qwen3 decoder instead),
    # and the code predictor (Qwen3-TTS's: its input projection and sampling).
    decoder_cls: type[nn.Module] = TalkerDecoder
    code_predictor_cls: type[CodePredictor] = CodePredictor

    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={
            "talker.model.codec_embedding.": "model.embed_tokens.",
            "talker.code_predictor.": "code_predictor.",
            "talker.codec_head.": "codec_head.",
            "talker.model.": "model.",
            "talker.text_projection.": None,  # the processor's (omni_mp.models.qwen3_omni.processor)
            "talker.hidden_projection.": None,
            "thinker.": None,
            "code2wav.": None,
        }
    )

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.hidden_size = int(config.hidden_size)
        if int(getattr(config, "num_code_groups", NUM_CODE_GROUPS)) != NUM_CODE_GROUPS:
            raise ValueError(f"talker: num_code_groups must be {NUM_CODE_GROUPS}")
        cp_cfg = config.code_predictor_config
        self.model = self.decoder_cls(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.codec_head = ParallelLMHead(config.vocab_size, self.hidden_size, prefix=maybe_prefix(prefix, "codec_head"))
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.code_predictor = self.code_predictor_cls(cp_cfg, maybe_prefix(prefix, "code_predictor"), self.hidden_size)
        # Per-request state and the static index buffers (module docstring).
        sched = vllm_config.scheduler_config
        self.max_slots = int(sched.max_num_seqs)
        # A forward's (padded) token count: at most the scheduler's budget or a graph size.
        graph_max = int(getattr(vllm_config.compilation_config, "max_cudagraph_capture_size", None) or 0)
        max_tokens = max(int(sched.max_num_batched_tokens), graph_max) + 64
        self.scratch = self.max_slots
        dtype = vllm_config.model_config.dtype
        self.register_buffer(
            "h_store", torch.zeros(self.max_slots + 1, self.hidden_size, dtype=dtype), persistent=False
        )
        self.register_buffer("cp_tok", torch.zeros(max_tokens, dtype=torch.long), persistent=False)
        self.register_buffer("cp_slot", torch.full((max_tokens,), self.scratch, dtype=torch.long), persistent=False)
        self.register_buffer("cp_valid", torch.zeros(max_tokens, dtype=dtype), persistent=False)
        self.register_buffer("cp_code0", torch.zeros(max_tokens, dtype=torch.long), persistent=False)
        self.register_buffer("cp_sample", torch.zeros(max_tokens, dtype=torch.bool), persistent=False)
        self.register_buffer("dst_slot", torch.full((max_tokens,), self.scratch, dtype=torch.long), persistent=False)
        self._slots: dict[str, int] = {}
        self._last_pos: dict[str, int] = {}  # request -> position whose hidden state its slot holds
        self._free = list(range(self.max_slots - 1, -1, -1))
        self._used: dict[str, int] = {}  # request -> the last step that scheduled it
        self._step = 0
        self._num_cp: int | None = None  # rows of this step's code predictor batch (None: a dummy run)
        self.cp_graphs: CodePredictorGraphs | None = None  # omni_capture_graphs (CUDA graphs on)
        self.python_forwards = 0  # forwards run in Python (a replayed CUDA graph runs none): checks
        self.cp_rows_last = 0  # rows the code predictor ran in the last forward run in Python: checks

    # ---- per-step layout (host side, before the forward) -----------------------------------
    def omni_prepare_step(self, batch: StepBatch) -> None:
        """Fill the static index buffers for the coming forward (see the module docstring)."""
        self._step += 1
        for rid in [r for r in self._slots if r not in batch.live]:
            self._free.append(self._slots.pop(rid))
            self._last_pos.pop(rid, None)
            self._used.pop(rid, None)
        n = batch.num_input_tokens
        cp_tok: list[int] = []
        cp_slot: list[int] = []
        cp_valid: list[float] = []
        cp_sample: list[bool] = []
        dst = [self.scratch] * n
        qsl = batch.query_start_loc
        for i, rid in enumerate(batch.req_ids):
            a, b = qsl[i], qsl[i + 1]
            if b <= a:
                continue
            slot = self._slots.get(rid)
            if slot is None:
                slot = self._slots[rid] = self._free.pop() if self._free else self._evict(batch.req_ids)
            self._used[rid] = self._step
            start = batch.num_computed[i]
            if start >= batch.prompt_lens[i]:
                # The chunk's first token is generated: it completes a frame from the previous
                # position's hidden state, if this slot holds exactly that one. (A request
                # resumed after preemption recomputes several generated positions at once:
                # rows but the first get no code predictor row, so they keep NO_CODE.)
                ok = self._last_pos.get(rid) == start - 1
                cp_tok.append(a)
                cp_slot.append(slot if ok else self.scratch)
                cp_valid.append(1.0 if ok else 0.0)
                cp_sample.append(float(getattr(batch.sampling[i], "temperature", 0.0) or 0.0) > 0.0)
            dst[b - 1] = slot
            self._last_pos[rid] = start + (b - a) - 1
        m = len(cp_tok)  # <= requests <= max_slots
        # A batch a FULL graph may replay (vLLM's uniform decode: one token a request, n <=
        # max_num_seqs) runs the code predictor on n rows, the shape captured. Any other runs
        # this forward in Python (the code predictor outside the compiled decoder) on its m
        # rows: a prompt step completes no frame and runs none. (It had run n padded rows: on
        # an H200 a one-request 59-token prompt step, those included, took 13.6 ms against 8
        # for a decode step.)
        # The buffers hold n rows whenever a graph of n rows could replay (padding: no frame,
        # the scratch slot), whichever way this forward runs.
        laid = n if n <= self.max_slots else m
        uniform = all(qsl[i + 1] - qsl[i] == 1 for i in range(len(batch.req_ids)))
        pad = laid - m
        dev = self.cp_tok.device
        self._put(self.cp_tok, cp_tok + [0] * pad, dev)
        self._put(self.cp_slot, cp_slot + [self.scratch] * pad, dev)
        self._put(self.cp_valid, cp_valid + [0.0] * pad, dev)
        self._put(self.cp_sample, cp_sample + [False] * pad, dev)
        self._put(self.dst_slot, dst, dev)
        if laid:
            self.cp_code0[:laid].copy_(batch.input_ids.index_select(0, self.cp_tok[:laid]))
        self._num_cp = laid if uniform else m

    def _evict(self, scheduled: list[str]) -> int:
        """A slot for a new request when every slot is held: the runner keeps the states of
        preempted requests, so more requests than max_num_seqs may be live. The least recently
        scheduled request not in this step loses its slot; if it decodes again without a
        recompute, its frame gets NO_CODE (code2wav fails that request alone)."""
        now = set(scheduled)
        victim = min((r for r in self._slots if r not in now), key=lambda r: self._used.get(r, -1))
        self._last_pos.pop(victim, None)
        self._used.pop(victim, None)
        return self._slots.pop(victim)

    @staticmethod
    def _put(buf: torch.Tensor, values: list[Any], device: torch.device) -> None:
        if not values:
            return
        host = torch.tensor(values, dtype=buf.dtype, pin_memory=device.type == "cuda")
        buf[: len(values)].copy_(host, non_blocking=True)

    def omni_capture_graphs(self) -> None:
        """After vLLM captured its graphs (omni_mp.engines.vllm_hooks): the code predictor's
        own, for the steps that replay no FULL graph."""
        self.cp_graphs = CodePredictorGraphs(
            self.code_predictor, self.max_slots, self.hidden_size, self.h_store.dtype, self.h_store.device
        )

    # ---- the model ----------------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        self.python_forwards += 1
        x = self.model.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        n = x.shape[0]
        if self._num_cp is not None:
            rows = self._num_cp  # what omni_prepare_step laid out for this forward
        else:  # a capture or dummy run (no prepare: scratch slots): the shape a graph holds
            rows = min(n, self.max_slots)
        self._num_cp = None
        self.cp_rows_last = rows
        tok, valid = self.cp_tok[:rows], self.cp_valid[:rows]
        codes = torch.full((n, NUM_CODE_GROUPS), float(NO_CODE), dtype=ROW_DTYPE, device=x.device)
        if rows:
            code0 = self.cp_code0[:rows]
            h_prev = self.h_store[self.cp_slot[:rows]]
            # Captured into a FULL graph as it is; elsewhere replayed from its own graphs.
            eager = self.cp_graphs is None or torch.cuda.is_current_stream_capturing()
            run = self.code_predictor if eager else self.cp_graphs
            rest, emb = run(h_prev, self.model.embed_input_ids(code0), self.cp_sample[:rows])
            # In place, into the runner's persistent inputs_embeds buffer: the compiled decoder's
            # piecewise CUDA graphs read their input at the address they were captured with.
            x.index_add_(0, tok, (emb * valid[:, None]).to(x.dtype))
            frame = torch.cat([code0[:, None], rest], dim=1).to(ROW_DTYPE) - NO_CODE
            codes.index_add_(0, tok, frame * valid[:, None].to(ROW_DTYPE))
        hidden = self.model(None, positions, intermediate_tensors, x)
        self.h_store.index_copy_(0, self.dst_slot[:n], hidden)
        return torch.cat([hidden.to(ROW_DTYPE), codes], dim=1)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        h = hidden_states[:, : self.hidden_size].to(self.codec_head.weight.dtype)
        return self.logits_processor(self.codec_head, h)

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
        """Text positions (arange on all three axes, delta 0); a prompt with media gets its
        positions from the processor (StageInput.positions) through `vllm_hooks`."""
        if mm_features:
            raise ValueError("the talker takes no multimodal inputs (its processor passes positions)")
        n = len(input_tokens)
        return torch.arange(n, dtype=torch.int64).expand(3, n).clone(), 0

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Only `talker.*` keys of a full checkpoint but its projections (the processor's)."""
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


def register_talker() -> None:
    """Make `TALKER_ARCH` resolvable by vLLM (idempotent; before vLLM builds the engine config)."""
    from vllm import ModelRegistry

    if TALKER_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(TALKER_ARCH, OmniMpQwen3OmniTalker)


def talker_engine_model(model_dir: str, engine_args: dict[str, Any]) -> EngineModel:
    """`model_part: qwen3_omni_talker`: our vLLM model of the talker, loaded from a view of the
    checkpoint whose config is the talker's; codec ids are not text, so vLLM starts no tokenizer."""
    register_talker()
    view = talker_view_dir(model_dir, require_weights=engine_args.get("load_format") != "dummy")
    return EngineModel(str(view), {**engine_args, "skip_tokenizer_init": True})
