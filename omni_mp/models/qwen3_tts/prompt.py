"""The talker's input rows for one Qwen3-TTS request, as the reference's
`Qwen3TTSForConditionalGeneration.generate` (qwen-tts 0.1.1) builds them (docs/qwen3_tts.md, "The
prompt"): T(id) = text_projection(text_embedding(id)), C(id) = codec_embedding(id), float32.

- prompt rows: [T(instruction tokens)] + T(`<|im_start|>assistant\\n`) + the codec track (think
  or nothink tags, the language, the speaker) each + T(tts_pad), T(tts_bos) + C(codec_pad), then
  the text: all of it against C(codec_pad) + T(tts_eos), then T(tts_pad) + C(codec_bos)
  (`text_streaming=False`, the reference wrappers' default), or only its first token + C(codec_bos)
  (`text_streaming=True`: the rest is fed one token per frame, then T(tts_eos)).
- step rows: what each decode step adds beside the frame's codec embeddings; after them T(tts_pad).

CustomVoice (preset voices, instructions) and VoiceDesign (instructions, no voice) so far; Base
(cloning) needs the speaker encoder and the reference codes (not yet).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import torch
import torch.nn.functional as F

from omni_mp.engines.base import StageInput
from omni_mp.models.checkpoint import load_prefixed, load_tensors
from omni_mp.models.family import ChatPolicy

TEXT_EMBED = "talker.model.text_embedding.weight"
CODEC_EMBED = "talker.model.codec_embedding.weight"
ASSISTANT_HEAD = 3  # `<|im_start|>assistant\n`: the text ids before the text itself
TEXT_TAIL = 5  # `<|im_end|>\n<|im_start|>assistant\n`: the text ids after it
CODEC_SPECIAL_RANGE = 1024  # the top codec ids the reference never samples (but eos)


class TtsPromptError(ValueError):
    """A request this checkpoint cannot speak (unknown voice or language, empty text)."""


class TtsRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: str
    voice: str | None = None  # a preset voice (CustomVoice); None: no speaker row
    language: str = "auto"
    instructions: str = ""
    text_streaming: bool = False  # the reference's non_streaming_mode=False
    # Base, x-vector cloning: the reference clip's speaker embedding (omni_mp.models.qwen3_tts.speaker)
    # in the preset voice's place; a float32 [hidden] tensor.
    speaker_embedding: Any = None
    # Base, in-context cloning: the reference clip's text and its codes [frames, 16] (int64), with
    # `speaker_embedding` its x-vector; the whole-text mode only.
    ref_text: str | None = None
    ref_codes: Any = None


class TtsRows(msgspec.Struct, frozen=True):
    prompt: torch.Tensor  # [rows, hidden] float32
    steps: torch.Tensor  # [steps, hidden]: added at decode steps 0.. (then `pad`)
    pad: torch.Tensor  # [hidden]: T(tts_pad)


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruction_text(instructions: str) -> str:
    return f"<|im_start|>user\n{instructions}<|im_end|>\n"


class TtsPromptBuilder:
    """Tables and ids of one checkpoint; `rows(request)` gives a request's talker inputs."""

    def __init__(self, model_dir: str | Path, tokenizer: Any | None = None) -> None:
        model_dir = Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        talker = config["talker_config"]
        self.config, self.talker_config = config, talker
        tensors = load_tensors(model_dir, [TEXT_EMBED, CODEC_EMBED])
        self.text_embed = tensors[TEXT_EMBED].float()
        self.codec = tensors[CODEC_EMBED].float()
        proj = {k: v.float() for k, v in load_prefixed(model_dir, "talker.text_projection.").items()}
        self.proj = proj
        self.voices = {str(k).lower(): int(v) for k, v in (talker.get("spk_id") or {}).items()}
        self.dialects = {str(k).lower(): v for k, v in (talker.get("spk_is_dialect") or {}).items()}
        self.languages = {str(k).lower(): int(v) for k, v in (talker.get("codec_language_id") or {}).items()}
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self._cp_tables: list[torch.Tensor] | None = None  # the code predictor's embeddings (cloning)
        self.pad = self.text_rows([int(config["tts_pad_token_id"])])[0]
        self.bos = self.text_rows([int(config["tts_bos_token_id"])])[0]
        self.eos = self.text_rows([int(config["tts_eos_token_id"])])[0]

    def text_rows(self, ids: list[int]) -> torch.Tensor:
        """T of each id, [len(ids), hidden]."""
        x = self.text_embed[torch.tensor(ids, dtype=torch.long)]
        p = self.proj
        return F.linear(
            F.silu(F.linear(x, p["linear_fc1.weight"], p["linear_fc1.bias"])),
            p["linear_fc2.weight"],
            p["linear_fc2.bias"],
        )

    def codec_rows(self, ids: list[int]) -> torch.Tensor:
        return self.codec[torch.tensor(ids, dtype=torch.long)]

    def tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def _codec_track(self, req: TtsRequest) -> list[int]:
        """The codec ids of the tag rows and the speaker row (reference order)."""
        t = self.talker_config
        voice = (req.voice or "").lower()
        if voice and voice not in self.voices:
            raise TtsPromptError(f"unknown voice {req.voice!r}; this model has {sorted(self.voices)}")
        lang = req.language.lower()
        if lang != "auto" and lang not in self.languages:
            raise TtsPromptError(f"unknown language {req.language!r}; this model has {sorted(self.languages)}")
        lang_id = None if lang == "auto" else self.languages[lang]
        if voice and lang in ("chinese", "auto") and self.dialects.get(voice):
            lang_id = self.languages[str(self.dialects[voice]).lower()]  # a dialect voice speaks it
        if lang_id is None:
            tags = [t["codec_nothink_id"], t["codec_think_bos_id"], t["codec_think_eos_id"]]
        else:
            tags = [t["codec_think_id"], t["codec_think_bos_id"], lang_id, t["codec_think_eos_id"]]
        return tags + ([self.voices[voice]] if voice else [])

    def frame_rows(self, codes: torch.Tensor) -> torch.Tensor:
        """[frames, 16] codes -> the talker's input row of each frame: C(code 0) + the code
        predictor's embeddings of codes 1..15 (what a decode step feeds back)."""
        if self._cp_tables is None:
            n = int(self.talker_config["num_code_groups"]) - 1
            keys = [f"talker.code_predictor.model.codec_embedding.{i}.weight" for i in range(n)]
            got = load_tensors(self.model_dir, keys)
            self._cp_tables = [got[k].float() for k in keys]
        rows = self.codec[codes[:, 0]]
        for g, table in enumerate(self._cp_tables, start=1):
            rows = rows + table[codes[:, g]]
        return rows

    def _in_context(self, req: TtsRequest, text: list[int], bos: torch.Tensor) -> list[torch.Tensor]:
        """The reference's in-context rows (whole-text mode): T(reference text + text) + T(tts_eos)
        against C(codec_pad), then C(codec_bos) and each reference frame's row against T(tts_pad)."""
        if req.text_streaming:
            raise TtsPromptError("in-context cloning takes the whole text (text_streaming off)")
        if not req.ref_text:
            raise TtsPromptError("in-context cloning needs the reference clip's text")
        ref = self.tokens(f"<|im_start|>assistant\n{req.ref_text}<|im_end|>\n")[ASSISTANT_HEAD:-2]
        pad_row = self.codec_rows([self.talker_config["codec_pad_id"]])[0]
        texts = torch.cat([self.text_rows(ref + text), self.eos[None]]) + pad_row
        codes = torch.as_tensor(req.ref_codes, dtype=torch.long)
        frames = torch.cat([bos[None], self.frame_rows(codes)]) + self.pad
        return [texts, frames]

    def rows(self, req: TtsRequest) -> TtsRows:
        ids = self.tokens(assistant_text(req.text))
        text = ids[ASSISTANT_HEAD:-TEXT_TAIL]
        if not text:
            raise TtsPromptError("the text to speak is empty")
        t = self.talker_config
        parts: list[torch.Tensor] = []
        if req.instructions:
            parts.append(self.text_rows(self.tokens(instruction_text(req.instructions))))
        parts.append(self.text_rows(ids[:ASSISTANT_HEAD]))
        track = self._codec_track(req)
        track_rows = self.codec_rows(track)
        if req.speaker_embedding is not None:  # cloned: the x-vector is the speaker row
            if req.voice:
                raise TtsPromptError("a cloned voice and a preset voice at once")
            track_rows = torch.cat([track_rows, req.speaker_embedding.float()[None]])
        parts.append(self.pad + track_rows)
        parts.append((self.bos + self.codec_rows([t["codec_pad_id"]])[0])[None])
        bos = self.codec_rows([t["codec_bos_id"]])[0]
        if req.ref_codes is not None:  # in-context: the reference's text and codes lead the text
            parts += self._in_context(req, text, bos)
            return TtsRows(prompt=torch.cat(parts), steps=self.pad[None], pad=self.pad)
        if req.text_streaming:
            parts.append(self.text_rows(text[:1]) + bos)
            steps = torch.cat([self.text_rows(text[1:]), self.eos[None]]) if len(text) > 1 else self.eos[None]
        else:
            body = torch.cat([self.text_rows(text), self.eos[None]])
            parts.append(body + self.codec_rows([t["codec_pad_id"]]))
            parts.append((self.pad + bos)[None])
            steps = self.pad[None]
        return TtsRows(prompt=torch.cat(parts), steps=steps, pad=self.pad)


# ---- the entry stage's prompt format (`prompt_format: qwen3_tts`) --------------------------------
INSTRUCTIONS_PARAM = "instructions"  # Submit.params keys a request may set
LANGUAGE_PARAM = "language"


@functools.cache
def _builder(model_dir: str) -> TtsPromptBuilder:
    return TtsPromptBuilder(model_dir)


class TtsPromptFormat:
    """The talker stage's prompt format: the request's text is what to say, its speaker the preset
    voice (none given: the first preset by name), `params` its instructions and language; the
    stage's input is the talker's prompt rows (`embeds_prompt`: built here, not tokenized by the
    engine), every decode step then adding T(tts_pad) (the reference wrappers' whole-text mode)."""

    audio_rate = 24000
    reply_end = None
    chat = ChatPolicy()
    embeds_prompt = True  # the entry stage takes `stage_input`'s embeddings, not rendered text

    def max_audio_s(self, model_dir: str) -> float | None:
        return None

    def render(self, text: str, n_audio: int, n_image: int, system: str | None = None) -> str:
        return assistant_text(text)  # what the talker reads (as text: never a chat turn)

    def companions(self, params: Mapping[str, Any] | None) -> list[str]:
        return []

    def voices(self, model_dir: str) -> frozenset[str] | None:
        """The preset voices a request may name (None: a model without presets)."""
        return frozenset(_builder(model_dir).voices) or None

    def stage_input(self, model_dir: str, text: str, params: Mapping[str, Any] | None, voice: str | None) -> StageInput:
        """The talker's input for one request (TtsPromptError names what is wrong)."""
        params = params or {}
        unknown = sorted(set(params) - {INSTRUCTIONS_PARAM, LANGUAGE_PARAM})
        if unknown:
            raise TtsPromptError(
                f"unknown params {unknown}; Qwen3-TTS takes {INSTRUCTIONS_PARAM!r}, {LANGUAGE_PARAM!r}"
            )
        for key in (INSTRUCTIONS_PARAM, LANGUAGE_PARAM):
            if key in params and not isinstance(params[key], str):
                raise TtsPromptError(f"params[{key!r}] must be a string, got {type(params[key]).__name__}")
        b = _builder(model_dir)
        if voice is None and b.voices:
            voice = min(b.voices)  # the reference has no default preset: the first by name
        req = TtsRequest(
            text=text,
            voice=voice,
            language=params.get(LANGUAGE_PARAM, "auto"),
            instructions=params.get(INSTRUCTIONS_PARAM, ""),
        )
        rows = b.rows(req)
        t = b.talker_config
        vocab, eos = int(t["vocab_size"]), int(t["codec_eos_token_id"])
        return StageInput(
            prompt_token_ids=[int(t["codec_pad_id"])] * rows.prompt.shape[0],
            prompt_embeds=rows.prompt,
            step_fill=rows.pad,  # whole-text mode: every step adds T(tts_pad) (steps == [pad])
            stop_token_ids=[eos],
            suppress_token_ids=[i for i in range(vocab - CODEC_SPECIAL_RANGE, vocab) if i != eos],
        )


PROMPT_FORMAT = TtsPromptFormat()
