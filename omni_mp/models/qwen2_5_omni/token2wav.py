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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni_mp.engines.diffusion.model import DiffusionInputError, Window
from omni_mp.engines.diffusion.params import DiffusionParams
from omni_mp.models.checkpoint import load_prefixed
from omni_mp.models.qwen2_5_omni.speakers import load_speakers

SAMPLE_RATE = 24000  # BigVGAN output rate of Qwen2.5-Omni (480 samples per codec token, 50 tokens/s)
CFG_MIN = 1e-5  # transformers: guidance_scale below this runs no unconditional pass
_FAR = 1 << 30  # a block distance no layer attends over: masks padded keys


@dataclass(frozen=True, slots=True)
class Speaker:
    spk: torch.Tensor  # [enc_emb_dim]: `cond` of spk_dict.pt
    ecapa: torch.Tensor  # [enc_dim]: speaker encoder of `ref_mel`
    ecapa_uncond: torch.Tensor  # [enc_dim]: speaker encoder of zeros shaped like `ref_mel`


@dataclass(frozen=True, slots=True)
class Token2WavCond:
    codes: torch.Tensor  # int64 [n] on the device
    speaker: Speaker
    frames: int


@dataclass(frozen=True, slots=True)
class Token2WavBatch:
    code_embed: torch.Tensor  # [R, S, emb_dim]: conditional rows, then unconditional ones
    ecapa: torch.Tensor  # [R, S, enc_dim]
    spk: torch.Tensor  # [R, S, enc_emb_dim]
    block_diff: torch.Tensor  # [R or 1, 1, S, S]
    position_ids: torch.Tensor  # [R, S]
    cfg_rows: torch.Tensor  # indices (into the B conditional rows) that also have an unconditional row
    guidance: torch.Tensor  # [len(cfg_rows), 1, 1]


class Token2WavModel:
    """token2wav on one device, fp32 (as transformers runs it)."""

    def __init__(self, hf_token2wav: Any, speakers: dict[str, dict[str, Any]], device: torch.device) -> None:
        self.device = device
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
        self.speakers = {name: self._speaker(name, entry) for name, entry in speakers.items()}

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path, device: torch.device) -> Token2WavModel:
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
        return cls(hf, speakers, device)

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
            codes=window.ids.to(self.device),
            speaker=self.speakers[window.params.speaker],
            frames=window.ids.numel() * self.frames_per_input,
        )

    @torch.no_grad()
    def collate(self, conds: Sequence[Token2WavCond], guidance: torch.Tensor) -> Token2WavBatch:
        n = len(conds)
        s = max(c.frames for c in conds)
        cfg_rows = torch.nonzero(guidance >= CFG_MIN).flatten()
        rows = n + cfg_rows.numel()
        codes = torch.zeros(n, s // self.frames_per_input, dtype=torch.long, device=self.device)
        lengths = torch.tensor([c.frames for c in conds], device=self.device)
        for i, c in enumerate(conds):
            codes[i, : c.codes.numel()] = c.codes
        text_embed = self.dit.text_embed
        code_embed = text_embed(codes)  # [n, s, emb]; padded frames embed code 0, and are masked
        uncond = text_embed(codes[cfg_rows], drop_code=True)
        ecapa = torch.stack([c.speaker.ecapa for c in conds] + [conds[i].speaker.ecapa_uncond for i in cfg_rows])
        spk = torch.stack([c.speaker.spk for c in conds])
        spk = torch.cat([spk, torch.zeros_like(spk[cfg_rows])])
        lengths = torch.cat([lengths, lengths[cfg_rows]])
        pos = torch.arange(s, device=self.device)
        block = pos // self.block_size
        block_diff = (block[None, :] - block[:, None])[None]  # [1, S, S]: one pattern for every row
        if bool((lengths < s).any()):
            keep = (pos[None, None, :] < lengths[:, None, None]) | (pos[:, None] == pos[None, :])[None]
            block_diff = torch.where(keep, block_diff, _FAR)  # [R, S, S]
        return Token2WavBatch(
            code_embed=torch.cat([code_embed, uncond]),
            ecapa=ecapa[:, None].expand(rows, s, -1),
            spk=spk[:, None].expand(rows, s, -1),
            # [R or 1, 1, S, S]: the layers' masks broadcast over heads (and rows), so each layer
            # builds a mask of S^2 (x rows when padded) elements, not rows x heads x S^2.
            block_diff=block_diff[:, None],
            position_ids=pos[None].expand(rows, s),
            cfg_rows=cfg_rows,
            guidance=guidance[cfg_rows].to(self.device).view(-1, 1, 1),
        )

    @torch.no_grad()
    def velocity(self, batch: Token2WavBatch, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        dit = self.dit
        n = x.shape[0]
        rows = batch.code_embed.shape[0]
        x2 = torch.cat([x, x[batch.cfg_rows]]) if rows > n else x
        t2 = torch.cat([t, t[batch.cfg_rows]]) if rows > n else t
        time_embedding = dit.time_embed(t2)
        h = dit.input_embed.proj(torch.cat((x2, batch.ecapa, batch.code_embed, batch.spk), dim=-1))
        position_embeddings = dit.rotary_embed(h, batch.position_ids)
        for layer in dit.transformer_blocks:
            h = layer(h, time_embedding, position_embeddings=position_embeddings, block_diff=batch.block_diff)
        out = dit.proj_out(dit.norm_out(h, time_embedding))
        if rows == n:
            return out
        cond = out[:n]
        guided = cond[batch.cfg_rows]
        return cond.index_copy(0, batch.cfg_rows, guided + (guided - out[n:]) * batch.guidance)

    @torch.no_grad()
    def decode(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """BigVGAN per group of equal lengths (a convolution stack: no padding across rows)."""
        out: list[torch.Tensor | None] = [None] * len(states)
        groups: dict[int, list[int]] = {}
        for i, st in enumerate(states):
            groups.setdefault(st.shape[0], []).append(i)
        for idx in groups.values():
            mel = torch.stack([states[i] for i in idx]).permute(0, 2, 1)
            wav = self.vocoder(mel).reshape(len(idx), -1)  # clamped to [-1, 1], on the CPU
            for j, i in enumerate(idx):
                out[i] = wav[j].to(torch.float32)
        return out  # type: ignore[return-value]
