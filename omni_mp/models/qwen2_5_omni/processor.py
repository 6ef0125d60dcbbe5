"""Qwen2.5-Omni's thinker -> talker link, exactly as transformers' `generate()` builds it
(docs/qwen2_5_omni.md; verified against transformers 5.17.0).

Notation: prompt ids x (length L), thinker reply y_0..y_{N-1}, last-layer thinker hidden
states h (one row per token the thinker computed: the prompt and y_0..y_{N-2}; the last reply
token is never fed back), embed_t the thinker's token embedding (zero at the audio/image/video
placeholders of the prompt), r_j = embed_t(y_j) + h[L + j]. All rows are in the thinker's
width E, before the talker's `thinker_to_talker_proj` (which the talker model applies;
omni_mp.models.qwen2_5_omni.vllm_hooks_talker):
- prompt, L + 2 rows: embed_t(x_i) + h[i]; embed_t(speaker bos) + codec(pad);
  r_0 + codec(bos). Ready once the thinker has fed y_0 back (after its first decode step).
- decode step k adds s_k: r_{k+1} while the reply lasts (streamed as the thinker writes),
  then embed_t(tts_text_end), then embed_t(tts_text_pad) for every later step.
- the ids the repetition penalty counts: [codec_mask] * L + [codec_pad, codec_bos]; stop on
  codec_pad or codec_end (the reference's defaults); codec_bos is never sampled.
- positions: the thinker's M-RoPE prompt positions, then text positions + the thinker's offset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from omni_mp.models.checkpoint import load_tensors
from omni_mp.models.processor import (
    ProcessorError,
    RequestContext,
    StageInput,
    StageProcessor,
    UpstreamResult,
    single_upstream,
)
from omni_mp.models.qwen2_5_omni.speakers import load_speakers

if TYPE_CHECKING:
    from omni_mp.config.schema import StageConfig

DEFAULT_SPEAKER = "Chelsie"  # transformers' generate() default
THINKER_EMBED = "thinker.model.embed_tokens.weight"
CODEC_EMBED = "talker.model.embed_tokens.weight"


class Qwen25OmniTalkerInputs(StageProcessor):
    step_embeds_enabled = True
    prompt_embeds_enabled = True
    needs_hidden_states = True

    def bind(self, stage: StageConfig, model_dir: str) -> StageProcessor:
        return _BoundTalkerInputs(Path(model_dir), dummy=stage.engine_args.get("load_format") == "dummy")


class _BoundTalkerInputs(Qwen25OmniTalkerInputs):
    def __init__(self, model_dir: Path, *, dummy: bool) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        thinker, talker = config["thinker_config"], config["talker_config"]
        self.placeholder_ids = torch.tensor(
            [thinker[k] for k in ("audio_token_index", "image_token_index", "video_token_index") if k in thinker]
        )
        self.codec_pad = int(talker["tts_codec_pad_token_id"])
        self.codec_bos = int(talker["tts_codec_start_token_id"])
        self.codec_end = int(talker["tts_codec_end_token_id"])
        self.codec_mask = int(talker["tts_codec_mask_token_id"])
        if dummy:
            # Random weights (benchmarks at real sizes): tables of the real shapes, fixed seed.
            gen = torch.Generator().manual_seed(0)
            width = int(talker["embedding_size"])
            self.embed = torch.randn(int(thinker["text_config"]["vocab_size"]), width, generator=gen) * 0.02
            codec = torch.randn(int(talker["vocab_size"]), width, generator=gen) * 0.02
        else:
            tensors = load_tensors(model_dir, [THINKER_EMBED, CODEC_EMBED])
            self.embed, codec = tensors[THINKER_EMBED], tensors[CODEC_EMBED]
        # Copies, not views: `_table` may replace the table by one in another dtype.
        self.codec_pad_row = codec[self.codec_pad].clone()
        self.codec_bos_row = codec[self.codec_bos].clone()
        self.text_end_row = self.embed[int(talker["tts_text_end_token_id"])].clone()
        self.text_pad_row = self.embed[int(talker["tts_text_pad_token_id"])].clone()
        self.speaker_bos = {name: int(entry["bos_token"]) for name, entry in load_speakers(model_dir).items()}
        self.speakers = frozenset(self.speaker_bos)
        self.default_speaker = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else min(self.speakers)

    def _table(self, dtype: torch.dtype) -> torch.Tensor:
        """The thinker's embedding table in the dtype of its hidden states (converted once)."""
        if self.embed.dtype != dtype:
            self.embed = self.embed.to(dtype)
        return self.embed

    def _embed(self, ids: list[int], dtype: torch.dtype, *, prompt: int = 0) -> torch.Tensor:
        """embed_t(ids); among the first `prompt` rows (the thinker's prompt), media
        placeholders get zeros: transformers zeroes them where the media embeddings were merged
        in. Reply tokens keep their embedding whatever their id (a random thinker may reply
        with a placeholder id; the reference embeds it like any token)."""
        t = torch.tensor(ids, dtype=torch.long)
        if t.numel() and not 0 <= int(t.min()) <= int(t.max()) < self.embed.shape[0]:
            raise ProcessorError(f"thinker token ids outside the vocabulary of {self.embed.shape[0]}")
        rows = self._table(dtype)[t]
        if prompt:
            rows[:prompt][torch.isin(t[:prompt], self.placeholder_ids)] = 0
        return rows

    def prompt(self, upstream: Mapping[int, UpstreamResult], ctx: RequestContext) -> StageInput | None:
        up = single_upstream(upstream, "qwen2_5_omni_talker")
        if up.prompt_token_ids is None:
            return None
        n = len(up.prompt_token_ids)
        if up.hidden_rows < n + 1 or not up.output_token_ids:
            if up.finished:
                raise ProcessorError(
                    f"the thinker (stage {up.stage_id}) replied {len(up.output_token_ids)} token(s): "
                    "the talker needs a reply of at least 2 tokens"
                )
            return None
        speaker = ctx.speaker or self.default_speaker
        if speaker not in self.speaker_bos:
            raise ProcessorError(f"unknown speaker {speaker!r}; this model has {sorted(self.speakers)}")
        hidden = up.hidden_states(0, n + 1)
        ids = [*up.prompt_token_ids, self.speaker_bos[speaker], up.output_token_ids[0]]
        rows = self._embed(ids, hidden.dtype, prompt=n)
        rows[:n] += hidden[:n]
        rows[n] += self.codec_pad_row.to(hidden.dtype)
        rows[n + 1] += hidden[n] + self.codec_bos_row.to(hidden.dtype)
        positions = None
        if up.mrope_positions is not None:
            positions = (up.mrope_positions, up.mrope_delta)
        return StageInput(
            prompt_token_ids=[self.codec_mask] * n + [self.codec_pad, self.codec_bos],
            prompt_embeds=rows,
            positions=positions,
            step_fill=self.text_pad_row,
            stop_token_ids=[self.codec_pad, self.codec_end],
            suppress_token_ids=[self.codec_bos],
        )

    def step_embeds(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[torch.Tensor | None, bool]:
        up = single_upstream(upstream, "qwen2_5_omni_talker")
        n = len(up.prompt_token_ids or [])
        first = n + 1 + start  # s_k = r_{k+1}: hidden row L + k + 1 and reply token k + 1
        parts: list[torch.Tensor] = []
        if up.hidden_rows > first:
            hidden = up.hidden_states(first)
            ids = up.output_token_ids[first - n : first - n + hidden.shape[0]]
            if len(ids) == 1:
                # The streaming case: one new row per thinker step and request, handled on the
                # talker's engine thread for every request of every thinker step. One table row
                # (a view) + one add, instead of a gather, a cast and a mask (~4x less time).
                tok = ids[0]
                if not 0 <= tok < self.embed.shape[0]:
                    raise ProcessorError(f"thinker token id {tok} outside the vocabulary of {self.embed.shape[0]}")
                parts.append((self._table(hidden.dtype)[tok] + hidden[0])[None])
            else:
                parts.append(self._embed(ids, hidden.dtype) + hidden)
        if up.finished:
            # The reply's rows end at r_{N-2}; then the text-end and text-pad rows (the pad row
            # also fills every step after, see StageInput.step_fill).
            replied = max(0, up.hidden_rows - n - 1)
            tail = [self.text_end_row, self.text_pad_row][max(0, start - replied) :]
            if tail:
                dtype = parts[0].dtype if parts else self.text_end_row.dtype
                parts.append(torch.stack(tail).to(dtype))
        if not parts:
            return None, up.finished
        return (parts[0] if len(parts) == 1 else torch.cat(parts)), up.finished
