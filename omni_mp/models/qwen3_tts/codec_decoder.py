"""Qwen3-TTS's 12 Hz codec decoder (`speech_tokenizer/` `decoder.*`) as a streaming window decoder:
Qwen3-Omni code2wav's streaming (omni_mp.models.qwen3_omni.code2wav: the sliding-window
transformer run incrementally over cached keys and values, the convolutions over the inputs each
request kept, chunks joined by plain concatenation) with Qwen3-TTS's own front, which the
reference puts before the transformer (docs/qwen3_tts.md):

    split RVQ lookup (1 + 15 codebooks, summed) -> pre_conv (causal, kernel 3) -> input_proj
    -> transformer -> norm -> output_proj -> Qwen3-Omni's upsampler and SnakeBeta decoder.

The causal pre_conv reaches 2 frames back: each request keeps its last 2 quantized frames (zeros
before its first, as the reference's left padding), so a chunk's frames see what the one-shot
pass sees. On a GPU the front runs inside the transformer's CUDA graph (Code2WavModel's
`use_graphs`: rows padded to a bucket, frames to the longest streamed chunk).

The other difference in the convolutions: Qwen3-TTS's transposed convolutions trim k - s samples
on the right only (Qwen3-Omni's on both sides), so the decoder is causal with no look-ahead: T
frames give exactly 1920 T samples, each final when made (no right context needed), set here by
`left_pad = 0` on transformers' modules (code2wav_convs reads it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.nn.functional as F
from torch import nn

from omni_mp.models.checkpoint import load_prefixed
from omni_mp.models.qwen3_omni.code2wav import Code2WavModel, Code2WavOptions, Code2WavWindow, _PastKV, _Stream

PRE_CONV_REACH = 2  # frames before a frame that the kernel-3 causal pre_conv reads
# The reference decodes a request's codes CHUNK_FRAMES at a time, each chunk after the
# LEFT_CONTEXT_FRAMES before it (qwen-tts `chunked_decode`'s defaults [V]): a chunk's audio comes
# from a decoder state begun afresh 25 frames before it, its context's audio dropped. Streamed,
# a request restarts its stream there too, so its audio equals the reference's past 300 frames.
CHUNK_FRAMES = 300
LEFT_CONTEXT_FRAMES = 25


class CodecFront(nn.Module):
    """The decoder's parts before the transformer's layers, with the reference's tensor names
    (`quantizer.*`, `pre_conv.conv.*`, `pre_transformer.input_proj/output_proj`)."""

    def __init__(self, state: dict[str, torch.Tensor], groups: int) -> None:
        super().__init__()
        books = []
        for part, n in (("rvq_first", 1), ("rvq_rest", groups - 1)):
            for i in range(n):
                cb = f"quantizer.{part}.vq.layers.{i}._codebook."
                usage = state[cb + "cluster_usage"].clamp(min=1e-5)  # the reference's epsilon
                books.append(state[cb + "embedding_sum"] / usage[:, None])
        self.register_buffer("books", torch.stack(books), persistent=False)  # [groups, codebook, dim]
        self.out_first = nn.Parameter(state["quantizer.rvq_first.output_proj.weight"][:, :, 0], requires_grad=False)
        self.out_rest = nn.Parameter(state["quantizer.rvq_rest.output_proj.weight"][:, :, 0], requires_grad=False)
        self.pre_conv = nn.Conv1d(*state["pre_conv.conv.weight"].shape[1::-1], kernel_size=3)
        self.pre_conv.weight.data.copy_(state["pre_conv.conv.weight"])
        self.pre_conv.bias.data.copy_(state["pre_conv.conv.bias"])
        self.input_proj = _linear(state, "pre_transformer.input_proj.")
        self.output_proj = _linear(state, "pre_transformer.output_proj.")

    def quantized(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [rows, groups, n] -> [rows, n, codebook_dim]: the RVQ sums, first book apart."""
        g = torch.arange(codes.shape[1], device=codes.device)[None, :, None]
        vecs = self.books[g, codes]  # [rows, groups, n, dim]
        return F.linear(vecs[:, 0], self.out_first) + F.linear(vecs[:, 1:].sum(1), self.out_rest)

    def conv(self, quantized: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """[rows, n, dim] after `context` [rows, 2, dim] -> pre_conv then input_proj, [rows, n, hidden]."""
        x = torch.cat([context, quantized], dim=1).transpose(1, 2)
        return self.input_proj(self.pre_conv(x).transpose(1, 2))


_OMNI_KEYS = (
    "codebook_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "sliding_window", "num_quantizers", "upsample_rates", "upsampling_ratios", "decoder_dim",
    "max_position_embeddings", "rms_norm_eps", "layer_scale_initial_scale",
)  # fmt: skip


def omni_code2wav_config(decoder: dict[str, Any], hidden: int) -> Any:
    """A Qwen3-Omni code2wav config (transformers') of this decoder's sizes at width `hidden`:
    its modules are the decoder's past the front (the tiny builder draws them from it too)."""
    from transformers import Qwen3OmniMoeConfig

    rope = {"rope_type": "default", "rope_theta": float(decoder.get("rope_theta", 10000.0))}
    base = {k: decoder[k] for k in _OMNI_KEYS if k in decoder} | {"rope_parameters": rope, "hidden_size": hidden}
    return Qwen3OmniMoeConfig(code2wav_config=base).code2wav_config


def _linear(state: dict[str, torch.Tensor], prefix: str) -> nn.Linear:
    w, b = state[prefix + "weight"], state[prefix + "bias"]
    lin = nn.Linear(w.shape[1], w.shape[0])
    lin.weight.data.copy_(w)
    lin.bias.data.copy_(b)
    return lin


@dataclass
class TtsStream(_Stream):
    context: torch.Tensor | None = None  # [2, codebook_dim]: the request's last quantized frames


@dataclass(frozen=True, slots=True)
class _ChunkContext(Code2WavWindow):
    """A chunk's left context: decoded on a fresh stream that starts at it, its audio dropped."""


class TtsCodecDecoder(Code2WavModel):
    """The decoder on one device, fp32 (Code2WavModel's streaming, the front above)."""

    def __init__(
        self, hf_convs: Any, front: CodecFront, device: torch.device, options: Code2WavOptions | None = None
    ) -> None:
        super().__init__(hf_convs, device, options=options)
        self.front = front.to(device).eval()
        # request -> codes [groups, <= LEFT_CONTEXT_FRAMES] of its frames just before its next window
        self.tails: dict[str, torch.Tensor] = {}

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, device: torch.device, **options: Any) -> TtsCodecDecoder:
        opts = msgspec.convert(options, Code2WavOptions)
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeCode2Wav,
            Qwen3OmniMoeCode2WavTransformerModel,
        )

        tok_dir = Path(model_dir) / "speech_tokenizer"
        d = json.loads((tok_dir / "config.json").read_text())["decoder_config"]
        # The convolutions run at latent_dim; the transformer at hidden_size (Qwen3-Omni: one width).
        convs_cfg, tr_cfg = omni_code2wav_config(d, d["latent_dim"]), omni_code2wav_config(d, d["hidden_size"])
        if "head_dim" in d:
            tr_cfg.head_dim = d["head_dim"]
        for cfg in (convs_cfg, tr_cfg):
            cfg._attn_implementation = "sdpa"
        with torch.device(device):
            hf = Qwen3OmniMoeCode2Wav._from_config(convs_cfg, dtype=torch.float32)
            hf.pre_transformer = Qwen3OmniMoeCode2WavTransformerModel._from_config(tr_cfg, dtype=torch.float32)
        state = load_prefixed(tok_dir, "decoder.")
        if not state:
            raise ValueError(f"{tok_dir}: no `decoder.*` weights (is it a Qwen3-TTS 12 Hz speech tokenizer?)")
        mine = {
            k: v
            for k, v in state.items()
            if k.startswith(("upsample.", "decoder.", "pre_transformer.layers.", "pre_transformer.norm."))
        }
        missing, unexpected = hf.load_state_dict(mine, strict=False)
        missing = [k for k in missing if not k.startswith("code_embedding.")]  # the Omni front, unused
        if missing or unexpected:
            raise ValueError(f"{tok_dir}: decoder weights do not match: missing {missing}, unexpected {unexpected}")
        for blocks in (*hf.upsample, hf.decoder):
            for m in _modules(blocks):
                if type(m).__name__ == "Qwen3OmniMoeCausalTransConvNet":
                    m.left_pad = 0  # Qwen3-TTS trims the right only: causal, no look-ahead
        front = CodecFront({k: v.float() for k, v in state.items() if k not in mine}, int(d["num_quantizers"]))
        return cls(hf, front, device, options=opts)

    # ---- the front before the transformer (graphed with it: `use_graphs`) ----------------------
    def _front_inputs(self, streams: list[_Stream], rows: int) -> tuple[torch.Tensor, ...]:
        """Each row's context: its stream's last 2 quantized frames (zeros before its first, as
        the reference's left padding; zeros for padded rows)."""
        ctx = torch.zeros(rows, PRE_CONV_REACH, self.front.out_first.shape[0], device=self.device)
        for r, st in enumerate(streams):
            if getattr(st, "context", None) is not None:
                ctx[r] = st.context  # type: ignore[attr-defined]
        return (ctx,)

    def _keep_front_state(
        self, st: _Stream, row: int, new: int, inputs: tuple[torch.Tensor, ...], outputs: list[torch.Tensor]
    ) -> None:
        (ctx,), (q,) = inputs, outputs
        st.context = torch.cat([ctx[row], q[row, :new]])[-PRE_CONV_REACH:].clone()  # type: ignore[attr-defined]

    def _attend(  # type: ignore[override]
        self,
        codes: torch.Tensor,
        first: torch.Tensor,
        cached: torch.Tensor,
        new: torch.Tensor,
        kv: torch.Tensor,
        ctx: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Code2WavModel._attend with this decoder's front first, tensors only (capture-safe):
        codes [rows, groups, n] and each row's context [rows, 2, codebook_dim] -> the transformer,
        its norm and output_proj: ([rows, n, latent], new keys and values, the new quantized
        frames [rows, n, codebook_dim] for the rows' next contexts). Padded frames come after a
        row's real ones, which the causal pre_conv and the mask keep apart."""
        tr, front = self.hf.pre_transformer, self.front
        q = front.quantized(codes)
        x = front.conv(q, ctx)
        q_pos = first[:, None] + torch.arange(x.shape[1], device=x.device)
        past = _PastKV(kv)
        mask = self._mask(first, q_pos, cached, new, kv.shape[4])
        pe = tr.rotary_emb(x, q_pos)
        h = x
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_embeddings=pe, past_key_values=past)
        return front.output_proj(tr.norm(h)), torch.stack(past.new, dim=1), q

    # ---- the reference's chunks ------------------------------------------------------------------
    def release(self, request_id: str) -> None:
        super().release(request_id)
        self.tails.pop(request_id, None)

    @torch.no_grad()
    def decode_windows(self, windows: Sequence[Code2WavWindow]) -> list[torch.Tensor]:
        """Code2WavModel's, each window split where the reference's chunks start (CHUNK_FRAMES),
        each chunk after its left context on a fresh stream (whose audio is dropped)."""
        parts = [self._chunked(w) for w in windows]
        outs = iter(super().decode_windows([p for ps in parts for p in ps]))
        audio = []
        for ps in parts:
            kept = [
                wav for p, wav in zip(ps, [next(outs) for _ in ps], strict=True) if not isinstance(p, _ChunkContext)
            ]
            audio.append(kept[0] if len(kept) == 1 else torch.cat(kept))
        return audio

    def _chunked(self, w: Code2WavWindow) -> list[Code2WavWindow]:
        """`w` as the reference's chunks cut it: its part in each chunk, a chunk's start preceded
        by the chunk's left context (from the codes kept of earlier windows and `w`'s own)."""
        if w.end <= w.start:
            return [w]  # no frames (e.g. a request closed after its last window): nothing to cut
        tail = self.tails.get(w.request_id)
        history = w.codes if tail is None else torch.cat([tail, w.codes], dim=1)
        first = w.end - history.shape[1]  # the frame of history[:, 0]
        out: list[Code2WavWindow] = []
        pos = w.start
        while pos < w.end:
            chunk = pos // CHUNK_FRAMES
            end = min(w.end, (chunk + 1) * CHUNK_FRAMES)
            if chunk and pos == chunk * CHUNK_FRAMES:
                ctx = pos - LEFT_CONTEXT_FRAMES
                out.append(_ChunkContext(w.request_id, history[:, ctx - first : pos - first], ctx, pos))
            out.append(Code2WavWindow(w.request_id, history[:, pos - first : end - first], pos, end))
            pos = end
        self.tails[w.request_id] = history[:, -LEFT_CONTEXT_FRAMES:].clone()
        return out

    def _round(self, windows: list[Code2WavWindow]) -> list[torch.Tensor]:
        for w in windows:  # streams with room for the front's context; a chunk's fresh one
            if isinstance(w, _ChunkContext):
                start = w.start * self.frame_samples
                self.streams[w.request_id] = TtsStream(frames=w.start, origin=w.start, samples_start=start)
            else:
                self.streams.setdefault(w.request_id, TtsStream())
        return super()._round(windows)


def _modules(m: Any) -> Any:
    return m.modules() if isinstance(m, nn.Module) else (x for b in m for x in b.modules())
