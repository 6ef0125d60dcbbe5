"""Qwen2.5-Omni token2wav as a `DiffusionModel`: transformers' DiT and BigVGAN modules, loaded
from the Hugging Face checkpoint layout (`token2wav.*` weights + `spk_dict.pt`).

The modules are transformers' own; what is ours is the batched forward around them
(`velocity`): it is `Qwen2_5OmniToken2WavDiTModel.forward` + the CFG combination of its
`sample`, for rows of different lengths, times and guidance scales in one call:
- padding, not packing: rows are padded to the longest state and padded keys are masked out
  of the block attention (every query keeps itself, so no row is fully masked). Attention is
  block-local, so packing would save only the padding of the last block of each row at the
  cost of per-row position ids and a block mask across rows; streaming windows have nearly
  equal lengths, so padding wastes little.
- the speaker encoder (ECAPA) depends only on the speaker: it runs once per speaker at load,
  for the conditional (`ref_mel`) and the unconditional (zeros) half of CFG.
- rows with guidance < 1e-5 get no unconditional half (transformers skips CFG there too).
- CUDA graphs (`graph_frame_step`, `use_graphs`; the engine's runner holds the machinery):
  `collate(..., pad_to=(rows, frames))` pads a step to a bucket (padded rows have no frames
  and attend only to themselves; every row gets an unconditional half, guidance 0 where CFG
  is off, which leaves the conditional output as it is), and the vocoder runs as
  `_vocode` (transformers' BigVGAN forward on the device, without its host copy) from one graph
  per (row bucket, frames); BigVGAN is a convolution stack, so its frames are never padded.
  After the runner's start-up warm-up (`warm_up_graphs`) the streamed window lengths are
  graphed; a window of another length (a stream's last) runs eagerly on its first use.
- no host syncs: codes, lengths and guidance are assembled on the CPU and copied once.
- precision (`diffusion.model_options`, `Token2WavOptions`): fp32 by default, as transformers
  runs it. `dit_dtype` / `vocoder_dtype: bfloat16` (opt-in) keep a bf16 copy of that module's
  weights and run it under bf16 autocast (norms and softmax stay fp32 there); the solver's
  state, the CFG combination and the waveform stay fp32. It changes the waveform beyond the
  streaming tolerance (measured by `benchmarks/omni_gpu.py`'s precision phase and
  tests/test_token2wav_precision.py), like TF32 matmuls, and halves the matmul time where the
  DiT is compute-bound (many requests in a step).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import msgspec
import torch

from omni_mp.engines.diffusion.model import DiffusionInputError, Window
from omni_mp.engines.diffusion.params import DiffusionParams
from omni_mp.models.checkpoint import load_prefixed
from omni_mp.models.qwen2_5_omni.speakers import load_speakers
from omni_mp.models.qwen2_5_omni.token2wav_fused import (
    AntialiasedSnake,
    amp_block,
    block_masks,
    dit_block,
    down_sample,
    final_norm,
    fuse_modulation,
    modulations,
    up_snake,
)

SAMPLE_RATE = 24000  # BigVGAN output rate of Qwen2.5-Omni (480 samples per codec token, 50 tokens/s)
CFG_MIN = 1e-5  # transformers: guidance_scale below this runs no unconditional pass
_FAR = 1 << 30  # a block distance no layer attends over: masks padded keys


def vocoder_reach(config: Any, probe_frames: int = 256) -> tuple[int, int]:
    """How many mel frames before / after its own frame a BigVGAN output sample depends on
    (plus one frame each side), found by probing a copy of the architecture: the same kernels,
    strides and dilations, the fewest channels, float64 on the CPU. A change of one input
    frame changes exactly the samples within reach, so the span of nonzero differences is the
    reach; channel widths and weights do not change it. Streaming decodes a chunk with this
    much context instead of the solver's (token2wav.decode_context)."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavBigVGANModel

    probe_config = copy.deepcopy(config)
    probe_config.upsample_initial_channel = 2 ** len(config.upsample_rates)
    with torch.device("cpu"):
        vocoder = Qwen2_5OmniToken2WavBigVGANModel(probe_config).double().eval()
    samples_per_frame = math.prod(config.upsample_rates)
    mel = torch.randn(1, config.mel_dim, probe_frames, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    hit = probe_frames // 2
    moved = mel.clone()
    moved[..., hit] += 1.0
    with torch.no_grad():
        changed = torch.nonzero(vocoder(moved) != vocoder(mel)).flatten()
    if changed.numel() == 0 or changed[0] == 0 or changed[-1] == probe_frames * samples_per_frame - 1:
        raise ValueError(f"vocoder reach: not found within {probe_frames} frames")
    # Output frame q depends on input frame `hit` for q in [first, last], so an output frame
    # needs `last - hit` input frames before it and `hit - first` after it.
    first, last = int(changed[0]) // samples_per_frame, int(changed[-1]) // samples_per_frame
    return last - hit + 1, hit - first + 1


@dataclass(frozen=True, slots=True)
class Speaker:
    spk: torch.Tensor  # [enc_emb_dim]: `cond` of spk_dict.pt
    ecapa: torch.Tensor  # [enc_dim]: speaker encoder of `ref_mel`
    ecapa_uncond: torch.Tensor  # [enc_dim]: speaker encoder of zeros shaped like `ref_mel`


@dataclass(frozen=True, slots=True)
class Token2WavCond:
    codes: torch.Tensor  # int64 [n] on the CPU
    speaker: Speaker
    frames: int


@dataclass(frozen=True, slots=True)
class Token2WavBatch:
    code_embed: torch.Tensor  # [R, S, emb_dim]: conditional rows, then unconditional ones
    ecapa: torch.Tensor  # [R, enc_dim] (expanded over frames in `velocity`)
    spk: torch.Tensor  # [R, enc_emb_dim]
    block_diff: torch.Tensor  # int32 [R or 1, 1, S, S]
    # RoPE's cos and sin, [1, S, head_dim] in the blocks' dtype (separate tensors: CUDA graphs
    # copy a batch's tensor fields into their inputs)
    cos: torch.Tensor
    sin: torch.Tensor
    cfg_rows: torch.Tensor  # indices (into the B conditional rows) that also have an unconditional row
    guidance: torch.Tensor  # [len(cfg_rows), 1, 1]
    all_cfg: bool  # cfg_rows is every row (no gather)


class Token2WavOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The `diffusion.model_options:` of a `model_type: qwen2_5_omni_token2wav` stage."""

    dit_dtype: Literal["float32", "bfloat16"] = "float32"  # bfloat16: opt-in, changes the waveform
    vocoder_dtype: Literal["float32", "bfloat16"] = "float32"
    # The DiT block / BigVGAN's activations fused into fewer kernels (token2wav_fused.py): the
    # block under torch.compile; the activations as Triton kernels on CUDA (vocoder_triton.py),
    # under torch.compile elsewhere. The same arithmetic (H200 one-shot waveform vs eager exact
    # fp32: relative L2 8.4e-6). Costs a compile at start-up, which the stage's graph warm-up
    # runs. None: on for a CUDA device, off elsewhere (on a CPU, inductor's C++ compile outlasts
    # a demo's run).
    compile_dit: bool | None = None
    compile_vocoder: bool | None = None


class Token2WavModel:
    """token2wav on one device, fp32 (as transformers runs it) unless `options` say otherwise."""

    def __init__(
        self,
        hf_token2wav: Any,
        speakers: dict[str, dict[str, Any]],
        device: torch.device,
        options: Token2WavOptions | None = None,
    ) -> None:
        self.device = device
        self.options = options or Token2WavOptions()
        self.hf = hf_token2wav.to(device=device, dtype=torch.float32).eval()
        self.dit = self.hf.code2wav_dit_model
        self.vocoder = self.hf.code2wav_bigvgan_model
        cfg = self.dit.config
        self.num_codes = cfg.num_embeds + 1  # DiTCodecEmbedding has num_embeds + 1 rows
        self.frames_per_input = cfg.repeats
        self.state_dim = cfg.mel_dim
        self.block_size = cfg.block_size
        if cfg.block_size % cfg.repeats:
            raise ValueError(f"token2wav block_size {cfg.block_size} is not a multiple of repeats {cfg.repeats}")
        self.window_align = cfg.block_size // cfg.repeats
        self.max_frames = cfg.max_position_embeddings
        frames_to_samples = 1
        for rate in self.vocoder.config.upsample_rates:
            frames_to_samples *= rate
        self.samples_per_input = frames_to_samples * cfg.repeats
        self.sample_rate = SAMPLE_RATE
        left, right = vocoder_reach(self.vocoder.config)
        self.decode_context = (-(-left // cfg.repeats), -(-right // cfg.repeats))  # in codes
        self.speakers = {name: self._speaker(name, entry) for name, entry in speakers.items()}  # fp32 encoder
        # Reduced precision after the speakers' fp32 encodings: a bf16 copy of the weights, run
        # under autocast so fp32 activations meet bf16 weights (norms and softmax stay fp32).
        self._dit_autocast = self._reduced(self.dit, self.options.dit_dtype)
        self._vocoder_autocast = self._reduced(self.vocoder, self.options.vocoder_dtype)
        self._modulation = fuse_modulation(self.dit)  # after the dtype move: the modules' weights become views
        self._dit_dtype = getattr(torch, self.options.dit_dtype)  # what the blocks compute in (autocast)
        self.graph_frame_step = cfg.block_size  # graph buckets: whole attention blocks
        # transformers' BigVGAN amplitude floor (-115 dB), made on the device once, as it makes it
        self._min_level = torch.exp(torch.tensor(-115 / 20.0 * math.log(10), device=device, dtype=torch.float32))
        self._vocoder_rows: tuple[int, ...] | None = None  # graph row buckets (use_graphs)
        self._vocoder_frames: frozenset[int] | None = None  # lengths warmed at start-up; None: no warm-up
        self._vocoder_seen: set[tuple[int, int]] = set()  # (rows, frames) of other lengths run eagerly once
        self._vocode_fn: Any = self._vocode
        # dynamic=True: one compiled graph serves every (rows, frames) bucket and every layer
        # (the layers' weights are its inputs), so start-up compiles once, not per bucket.
        compile_dit, compile_vocoder = (
            device.type == "cuda" if flag is None else flag
            for flag in (self.options.compile_dit, self.options.compile_vocoder)
        )
        self.compiled = (compile_dit, compile_vocoder)  # what runs compiled (shown by the benchmarks)
        self._block: Any = torch.compile(dit_block, dynamic=True) if compile_dit else dit_block
        # BigVGAN's activations, fused: empty = transformers' (cuDNN depthwise convolutions)
        self._acts: list[list[Callable[[torch.Tensor], torch.Tensor]]] = []
        if compile_vocoder:
            self.fuse_activations(self._fused_activation())

    def fuse_activations(self, fused: Callable[[AntialiasedSnake], Callable[[torch.Tensor], torch.Tensor]]) -> None:
        """Run every BigVGAN activation as `fused(AntialiasedSnake(activation))`."""
        self._acts = [[fused(AntialiasedSnake(a)) for a in block.activations] for block in self.vocoder.resblocks]
        self._act_post = fused(AntialiasedSnake(self.vocoder.activation_post))

    def _fused_activation(self) -> Callable[[AntialiasedSnake], Callable[[torch.Tensor], torch.Tensor]]:
        """How an `AntialiasedSnake` runs: on CUDA as two Triton kernels (vocoder_triton.py: 32-bit
        index arithmetic, where inductor's dynamic-shape kernels ran at a fifth of the memory
        bandwidth), elsewhere its functions under torch.compile."""
        if self.device.type == "cuda":
            from omni_mp.models.qwen2_5_omni.vocoder_triton import TritonSnake

            return TritonSnake
        fns = (torch.compile(up_snake, dynamic=True), torch.compile(down_sample, dynamic=True))
        return lambda act: partial(act, fns=fns)

    def _reduced(self, module: torch.nn.Module, dtype: str) -> Any:
        """A factory of the autocast context `module` runs in (bf16 weights), or of a no-op (fp32)."""
        if dtype == "float32":
            return nullcontext
        module.to(getattr(torch, dtype))
        device_type, cast = self.device.type, getattr(torch, dtype)
        return lambda: torch.autocast(device_type, dtype=cast)

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, device: torch.device, **options: Any) -> Token2WavModel:
        opts = msgspec.convert(options, Token2WavOptions)
        from transformers import Qwen2_5OmniConfig
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

        model_dir = Path(model_dir)
        speakers = load_speakers(model_dir)
        config = Qwen2_5OmniConfig.from_pretrained(model_dir).token2wav_config
        config._attn_implementation = "sdpa"
        with torch.device(device):
            hf = Qwen2_5OmniToken2WavModel._from_config(config, dtype=torch.float32)
        state = load_prefixed(model_dir, "token2wav.")
        if not state:
            raise ValueError(f"{model_dir}: no `token2wav.*` weights (is it a Qwen2.5-Omni checkpoint?)")
        missing, unexpected = hf.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{model_dir}: token2wav weights do not match: missing {missing}, unexpected {unexpected}")
        return cls(hf, speakers, device, opts)

    @torch.no_grad()
    def _speaker(self, name: str, entry: dict[str, Any]) -> Speaker:
        try:
            cond, ref_mel = entry["cond"], entry["ref_mel"]
        except (KeyError, TypeError):
            raise ValueError(f"spk_dict.pt: speaker {name!r} needs 'cond' and 'ref_mel'") from None
        ref_mel = ref_mel.to(self.device, torch.float32).reshape(1, -1, self.state_dim)
        encoder = self.dit.input_embed.spk_encoder
        return Speaker(
            spk=cond.to(self.device, torch.float32).reshape(-1),
            ecapa=encoder(ref_mel)[0],
            ecapa_uncond=encoder(torch.zeros_like(ref_mel))[0],
        )

    # ---- DiffusionModel -----------------------------------------------------------------------
    def check(self, params: DiffusionParams, ids: Sequence[int]) -> None:
        if params.speaker not in self.speakers:
            raise DiffusionInputError(f"unknown speaker {params.speaker!r}; known: {sorted(self.speakers)}")
        bad = next((c for c in ids if not 0 <= c < self.num_codes), None)
        if bad is not None:
            raise DiffusionInputError(f"codec id {bad} out of range [0, {self.num_codes})")

    def condition(self, window: Window) -> Token2WavCond:
        assert window.params.speaker is not None
        return Token2WavCond(
            codes=window.ids.to("cpu", torch.long),
            speaker=self.speakers[window.params.speaker],
            frames=window.ids.numel() * self.frames_per_input,
        )

    @torch.no_grad()
    def collate(
        self, conds: Sequence[Token2WavCond], guidance: torch.Tensor, pad_to: tuple[int, int] | None = None
    ) -> Token2WavBatch:
        """`guidance`: float32 [B] on the CPU. `pad_to` (rows, frames): a CUDA graph bucket."""
        n = len(conds)
        frames = [c.frames for c in conds]
        if pad_to is None:
            b, s = n, max(frames)
            cfg_rows = torch.nonzero(guidance >= CFG_MIN).flatten()
            g = guidance[cfg_rows]
        else:  # every row has an unconditional half: the graph's shapes do not depend on guidance
            b, s = pad_to
            if b < n or s < max(frames):
                raise ValueError(f"pad_to {pad_to} is smaller than the batch ({n} rows, {max(frames)} frames)")
            cfg_rows = torch.arange(b)
            g = torch.zeros(b)
            g[:n] = torch.where(guidance >= CFG_MIN, guidance, 0.0)
        fpi = self.frames_per_input
        codes = torch.zeros(b, s // fpi, dtype=torch.long)
        for i, c in enumerate(conds):
            codes[i, : c.codes.numel()] = c.codes
        lengths = torch.tensor(frames + [0] * (b - n))  # padded rows have no frames
        lengths = torch.cat([lengths, lengths[cfg_rows]])
        # A graph bucket always has the per-row mask, so one graph serves it whatever its
        # rows' lengths (the mask's values are those of the shared pattern where all are full).
        padded = pad_to is not None or bool((lengths < s).any())  # on the CPU: no device sync
        dev = self.device
        codes = codes.to(dev)
        cfg_dev = cfg_rows.to(dev)
        text_embed = self.dit.text_embed
        code_embed = text_embed(codes)  # [b, s, emb]; padded frames embed code 0, and are masked
        uncond = text_embed(codes[cfg_dev], drop_code=True)
        zeros = torch.zeros_like(conds[0].speaker.ecapa)
        ecapa = torch.stack(
            [c.speaker.ecapa for c in conds]
            + [zeros] * (b - n)
            + [conds[i].speaker.ecapa_uncond if i < n else zeros for i in cfg_rows.tolist()]
        )
        spk = torch.stack([c.speaker.spk for c in conds] + [torch.zeros_like(conds[0].speaker.spk)] * (b - n))
        spk = torch.cat([spk, torch.zeros_like(spk[cfg_dev])])
        pos = torch.arange(s, device=dev)
        # RoPE's cos and sin [1, S, head_dim] (broadcast over rows), in the blocks' dtype: the same
        # for every velocity call of the batch
        cos, sin = self.dit.rotary_embed(torch.empty(0, device=dev, dtype=self._dit_dtype), pos[None])
        block = pos // self.block_size
        block_diff = (block[None, :] - block[:, None]).to(torch.int32)[None]  # [1, S, S]: one pattern for every row
        if padded:
            lengths_dev = lengths.to(dev)
            keep = (pos[None, None, :] < lengths_dev[:, None, None]) | (pos[:, None] == pos[None, :])[None]
            block_diff = torch.where(keep, block_diff, _FAR)  # [R, S, S]
        return Token2WavBatch(
            code_embed=torch.cat([code_embed, uncond]),
            ecapa=ecapa,
            spk=spk,
            # [R or 1, 1, S, S]: the layers' masks broadcast over heads (and rows), so each layer
            # builds a mask of S^2 (x rows when padded) elements, not rows x heads x S^2.
            block_diff=block_diff[:, None],
            cos=cos,
            sin=sin,
            cfg_rows=cfg_dev,
            guidance=g.to(dev).view(-1, 1, 1),
            all_cfg=cfg_rows.numel() == b,
        )

    @torch.no_grad()
    def velocity(self, batch: Token2WavBatch, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        dit = self.dit
        n, s = x.shape[0], x.shape[1]
        rows = batch.code_embed.shape[0]
        if rows == n:
            x2, t2 = x, t
        elif batch.all_cfg:
            x2, t2 = torch.cat([x, x]), torch.cat([t, t])
        else:
            x2, t2 = torch.cat([x, x[batch.cfg_rows]]), torch.cat([t, t[batch.cfg_rows]])
        with self._dit_autocast():
            mods, final_mod = modulations(self._modulation, dit.time_embed(t2))
            ecapa = batch.ecapa[:, None].expand(rows, s, -1)
            spk = batch.spk[:, None].expand(rows, s, -1)
            h = dit.input_embed.proj(torch.cat((x2, ecapa, batch.code_embed, spk), dim=-1))
            block_diff = batch.block_diff
            if self.compiled[0]:  # one mask layout, per row, so no second graph for a shared one
                block_diff = block_diff.expand(rows, -1, -1, -1)
            masks = block_masks(block_diff, dit.transformer_blocks)
            if self.compiled[0]:  # a view as the first layer's input would guard on its
                h = h.clone()  # base: a second compiled graph for the other layers
            cos, sin = batch.cos, batch.sin
            for layer, mod, mask in zip(dit.transformer_blocks, mods, masks, strict=True):
                h = self._block(layer, h, mod, cos, sin, mask)
            out = dit.proj_out(final_norm(dit.norm_out, h, final_mod)).float()
        if rows == n:
            return out
        cond = out[:n]
        if batch.all_cfg:
            return cond + (cond - out[n:]) * batch.guidance
        guided = cond[batch.cfg_rows]
        return cond.index_copy(0, batch.cfg_rows, guided + (guided - out[n:]) * batch.guidance)

    # ---- vocoder --------------------------------------------------------------------------------
    def use_graphs(self, graphs: Any, row_buckets: Sequence[int]) -> None:
        """Run the vocoder from CUDA graphs of `graphs` (omni_mp.engines.diffusion.graphs.GraphSet)."""
        self._vocoder_rows = tuple(sorted(row_buckets))
        self._vocode_fn = graphs.wrap(self._vocode, "vocoder")

    @torch.no_grad()
    def warm_up_compiled(self, params: DiffusionParams) -> None:
        """Compile what runs compiled now, not in a request's step (a stage without CUDA graphs;
        with graphs, their warm-up compiles it): a velocity call with CFG, and the vocoder at one
        row and at two (PyTorch compiles size 1 apart from larger sizes)."""
        if not any(self.compiled):
            return
        n = self.window_align
        window = Window("compile-warm-up", torch.zeros(n, dtype=torch.long), 0, params)
        cond = self.condition(window)
        x = torch.zeros(1, cond.frames, self.state_dim, device=self.device)
        self.velocity(
            self.collate([cond], torch.tensor([max(params.guidance_scale, CFG_MIN)])),
            x,
            torch.zeros(1, device=self.device),
        )
        for rows in (1, 2):
            self._vocode(torch.zeros(rows, self.state_dim, cond.frames, device=self.device))

    @torch.no_grad()
    def warm_up_graphs(self, frames: Sequence[int], rows: Sequence[int]) -> int:
        """Capture the vocoder's graphs for windows of these lengths at these row buckets now.
        The vocoder takes each window at its own length (no padding), and a stream's last
        window has a length of its own; such a length then runs eagerly the first time it
        comes and is captured only when it comes again. Measured on an H200 (one 140-frame
        window): a new length costs about 180 ms eagerly (cuDNN plans each new shape), its
        capture after that 176 ms (two eager passes and the capture), then 52 ms eager vs
        15 ms replayed; a capture on first use would stall that step about 300 ms. Returns
        how many graphs are ready."""
        if self._vocoder_rows is None:
            return 0
        self._vocoder_frames = frozenset(frames)
        ready = 0
        for f in sorted(self._vocoder_frames, reverse=True):
            for r in sorted((b for b in self._vocoder_rows if b <= max(rows)), reverse=True):
                ready += bool(self._vocode_fn.ready(torch.zeros(r, self.state_dim, f, device=self.device)))
        return ready

    @torch.no_grad()
    def _vocode(self, mel: torch.Tensor) -> torch.Tensor:
        """transformers' `Qwen2_5OmniToken2WavBigVGANModel.forward` on [B, mel_dim, F], the same
        operations, leaving the waveform [B, samples] on the device (capture-safe)."""
        v = self.vocoder
        db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=self._min_level)) - 20
        with self._vocoder_autocast():
            h = v.conv_pre(v.normalize_spectrogram(db, 1, -115))
            for i in range(v.num_upsample_layers):
                h = v.ups[i][0](h)
                blocks = range(i * v.num_residual_blocks, (i + 1) * v.num_residual_blocks)
                res = sum(self._resblock(k, h) for k in blocks)
                h = res / v.num_residual_blocks
            wav = v.conv_post(self._act_post(h) if self._acts else v.activation_post(h)).float()
        return torch.clamp(wav, min=-1.0, max=1.0).reshape(mel.shape[0], -1)

    def _resblock(self, k: int, h: torch.Tensor) -> torch.Tensor:
        block = self.vocoder.resblocks[k]
        return amp_block(block, self._acts[k], h) if self._acts else block(h)

    @torch.no_grad()
    def decode(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """BigVGAN per group of equal lengths (a convolution stack: no padding across rows)."""
        out: list[torch.Tensor | None] = [None] * len(states)
        groups: dict[int, list[int]] = {}
        for i, st in enumerate(states):
            groups.setdefault(st.shape[0], []).append(i)
        for idx in groups.values():
            frames = states[idx[0]].shape[0]
            rows = None if self._vocoder_rows is None else next((b for b in self._vocoder_rows if b >= len(idx)), None)
            vocode = self._vocode_fn
            if rows is not None and self._vocoder_frames is not None and frames not in self._vocoder_frames:
                if (rows, frames) not in self._vocoder_seen:  # bounded: row buckets x max_frames
                    self._vocoder_seen.add((rows, frames))
                    vocode = self._vocode  # first time: eagerly, at the bucket's shape (see warm_up_graphs)
            mel = torch.stack([states[i] for i in idx])
            if rows is None:
                wav = self._vocode(mel.permute(0, 2, 1))
            else:  # a graph bucket of rows (padded rows: zero mel, dropped)
                mel = torch.cat([mel, mel.new_zeros(rows - len(idx), *mel.shape[1:])])
                wav = vocode(mel.permute(0, 2, 1).contiguous())
            wav = wav[: len(idx)].cpu()  # clamped to [-1, 1]
            for j, i in enumerate(idx):
                out[i] = wav[j].to(torch.float32)
        return out  # type: ignore[return-value]
