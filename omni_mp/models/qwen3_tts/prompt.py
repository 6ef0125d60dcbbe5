"""The talker's input rows for one Qwen3-TTS request, as the reference's
`Qwen3TTSForConditionalGeneration.generate` (qwen-tts 0.1.1) builds them (docs/qwen3_tts.md, "The
prompt"): T(id) = text_projection(text_embedding(id)), C(id) = codec_embedding(id), float32.

- prompt rows: [T(instruction tokens)] + T(`<|im_start|>assistant\\n`) + the codec track (think
  or nothink tags, the language, the speaker) each + T(tts_pad), T(tts_bos) + C(codec_pad), then
  the text: all of it against C(codec_pad) + T(tts_eos), then T(tts_pad) + C(codec_bos)
  (`text_streaming=False`: the reference's non_streaming_mode=True), or only its first token +
  C(codec_bos) (`text_streaming=True`: the rest is fed one token per frame, then T(tts_eos)).
  In context (cloning), the clip's text and the text against C(codec_bos) and the clip's frames:
  appended (whole text) or zipped row by row (text streaming; the text's excess fed per frame).
- step rows: what each decode step adds beside the frame's codec embeddings; after them T(tts_pad).

CustomVoice (preset voices, instructions), VoiceDesign (instructions, no voice) and Base (cloning:
the clip's x-vector in the voice's place; in context, the clip's text and codes too).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
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
TEXT_ROWS_CACHE_BYTES = 64 << 20  # T(id) rows kept (float32): 8192 tokens at the released 2048
TEXT_ROWS_BLOCK = 16  # T(id) rows projected together (TtsPromptBuilder.text_rows)


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
    # `speaker_embedding` its x-vector.
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
        # T(id) by text token id, least recently used first; at most TEXT_ROWS_CACHE_BYTES
        self._rows: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._rows_lock = threading.Lock()
        self._width = int(self.proj["linear_fc2.bias"].shape[0])  # the talker's hidden size
        self._rows_max = max(1, TEXT_ROWS_CACHE_BYTES // (4 * self._width))
        self.pad = self.text_rows([int(config["tts_pad_token_id"])])[0]
        self.bos = self.text_rows([int(config["tts_bos_token_id"])])[0]
        self.eos = self.text_rows([int(config["tts_eos_token_id"])])[0]

    def text_rows(self, ids: list[int]) -> torch.Tensor:
        """T of each id, [len(ids), hidden]: computed once, then from a bounded cache.

        Why a cache: the projection is two [hidden x hidden] matmuls a token on the CPU; on an
        H200 host building the prompt took 8.3 of a request's 10 ms of preparation (the
        first-audio breakdown in docs/qwen3_tts.md), and a voice agent's texts reuse their
        tokens (benchmarks/tts_prompt_rows.py, one core: 10.7 ms a request in one matmul pair,
        0.11 ms cached).
        Why fixed blocks: tokens not cached yet are projected TEXT_ROWS_BLOCK at a time (a short
        block padded with its first id), so a row's sums run in one order whichever tokens
        shared its matmul, and whatever requests came before (checked bitwise on 1 and 2 threads:
        tests/test_qwen3_tts_prompt_rows.py); a batch of another size sums in another order
        (about 1e-8 apart). One token alone would be 4.5x slower a row (a matrix-vector product)."""
        with self._rows_lock:
            missing = [i for i in dict.fromkeys(ids) if i not in self._rows]
            for at in range(0, len(missing), TEXT_ROWS_BLOCK):
                block = missing[at : at + TEXT_ROWS_BLOCK]
                for i, row in zip(block, self._project(block), strict=True):
                    self._rows[i] = row.clone()  # not a view: an evicted row frees its memory
            for i in ids:
                self._rows.move_to_end(i)
            rows = [self._rows[i] for i in ids]
            while len(self._rows) > self._rows_max:
                self._rows.popitem(last=False)
        return torch.stack(rows) if rows else self.text_embed.new_zeros(0, self._width)

    def _project(self, block: list[int]) -> torch.Tensor:
        """T of a block of ids, padded to TEXT_ROWS_BLOCK rows with its first id."""
        bad = [i for i in block if not 0 <= i < self.text_embed.shape[0]]
        if bad:
            raise TtsPromptError(f"text token ids {bad} are outside the text vocabulary")
        x = self.text_embed[torch.tensor(block + block[:1] * (TEXT_ROWS_BLOCK - len(block)), dtype=torch.long)]
        p = self.proj
        return F.linear(
            F.silu(F.linear(x, p["linear_fc1.weight"], p["linear_fc1.bias"])),
            p["linear_fc2.weight"],
            p["linear_fc2.bias"],
        )[: len(block)]

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

    def _in_context(self, req: TtsRequest, text: list[int], bos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's in-context rows and step rows. Texts T(reference text + text) + T(tts_eos),
        codecs C(codec_bos) and each reference frame's row. Whole text: the texts against C(codec_pad),
        then the codecs against T(tts_pad). Text streaming: texts and codecs summed row by row, the
        shorter padded with T(tts_pad) when it is the texts, else the texts' excess fed per step."""
        if not req.ref_text:
            raise TtsPromptError("in-context cloning needs the reference clip's text")
        ref = self.tokens(f"<|im_start|>assistant\n{req.ref_text}<|im_end|>\n")[ASSISTANT_HEAD:-2]
        texts = torch.cat([self.text_rows(ref + text), self.eos[None]])
        codecs = torch.cat([bos[None], self.frame_rows(torch.as_tensor(req.ref_codes, dtype=torch.long))])
        if not req.text_streaming:
            pad_row = self.codec_rows([self.talker_config["codec_pad_id"]])[0]
            return torch.cat([texts + pad_row, codecs + self.pad]), self.pad[None]
        n = codecs.shape[0]
        if texts.shape[0] > n:
            return texts[:n] + codecs, texts[n:]
        padded = torch.cat([texts, self.pad.expand(n - texts.shape[0], -1)])
        return padded + codecs, self.pad[None]

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
            icl, steps = self._in_context(req, text, bos)
            return TtsRows(prompt=torch.cat([*parts, icl]), steps=steps, pad=self.pad)
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
TASK_TYPE_PARAM = "task_type"  # vllm-omni's: CustomVoice | VoiceDesign | Base, checked against the checkpoint
REF_TEXT_PARAM = "ref_text"  # the reference clip's text: in-context cloning (Base)
XVECTOR_ONLY_PARAM = "x_vector_only_mode"  # true: the clip's x-vector only, its text ignored
# vllm-omni's and the reference's: true, the whole text in the prompt; false, a token per frame.
# Absent: the reference wrapper's default (generate_voice_clone: false; the others: true).
NON_STREAMING_PARAM = "non_streaming_mode"
_STR_PARAMS = (INSTRUCTIONS_PARAM, LANGUAGE_PARAM, TASK_TYPE_PARAM, REF_TEXT_PARAM)
_BOOL_PARAMS = (XVECTOR_ONLY_PARAM, NON_STREAMING_PARAM)
_PARAMS = (*_STR_PARAMS, *_BOOL_PARAMS)
TASK_TYPES = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
CLIP_CODES_KEY = "qwen3_tts_clip_codes"  # the talker's first chunk -> the decoder: [frames, 16] int64


@functools.cache
def _builder(model_dir: str) -> TtsPromptBuilder:
    return TtsPromptBuilder(model_dir)


@functools.cache
def _variant(model_dir: str) -> str:
    return str(json.loads((Path(model_dir) / "config.json").read_text()).get("tts_model_type"))


@functools.cache
def _cloner(model_dir: str) -> Any:
    from omni_mp.models.qwen3_tts.clone import VoiceCloner

    return VoiceCloner(model_dir)


def _check_params(params: Mapping[str, Any]) -> None:
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise TtsPromptError(f"unknown params {unknown}; Qwen3-TTS takes {list(_PARAMS)}")
    for key in _STR_PARAMS:
        if key in params and not isinstance(params[key], str):
            raise TtsPromptError(f"params[{key!r}] must be a string, got {type(params[key]).__name__}")
    for key in _BOOL_PARAMS:
        if key in params and not isinstance(params[key], bool):
            raise TtsPromptError(f"params[{key!r}] must be true or false")


def _clone_mode(variant: str, params: Mapping[str, Any], clip: Any) -> bool | None:
    """None: no cloning; else whether in context (a reference text, x_vector_only_mode not set).
    Refuses cloning fields on a checkpoint that is not Base, and Base without a clip."""
    task = params.get(TASK_TYPE_PARAM)
    if task is not None and task != TASK_TYPES.get(variant):
        raise TtsPromptError(
            f"task_type {task!r}: this model is a {TASK_TYPES.get(variant, variant)} checkpoint "
            f"(task types: {sorted(TASK_TYPES.values())})"
        )
    fields = [k for k in (REF_TEXT_PARAM, XVECTOR_ONLY_PARAM) if k in params] + (["ref_audio"] if clip else [])
    if variant != "base":
        if fields:
            raise TtsPromptError(
                f"{fields}: voice cloning needs a Base checkpoint; this model is {TASK_TYPES[variant]}"
            )
        return None
    if clip is None:
        raise TtsPromptError("this Base model speaks a cloned voice only: give ref_audio (or a stored voice's id)")
    xvec_only = params.get(XVECTOR_ONLY_PARAM)
    ref_text = (params.get(REF_TEXT_PARAM) or "").strip()
    if xvec_only is False and not ref_text:
        raise TtsPromptError("ref_text: in-context cloning (x_vector_only_mode false) needs the clip's text")
    return bool(ref_text) and not xvec_only


def text_streaming(variant: str, params: Mapping[str, Any]) -> bool:
    """Whether the text is fed a token per frame: `non_streaming_mode` false, or absent on Base (the
    reference's `generate_voice_clone` default and vllm-omni's; the other wrappers' is true)."""
    non_streaming = params.get(NON_STREAMING_PARAM)
    return variant == "base" if non_streaming is None else not non_streaming


class TtsPromptFormat:
    """The talker stage's prompt format: the request's text is what to say, its speaker the preset
    voice (none given: the first preset by name), `params` its instructions, language and text mode,
    and for Base a reference clip (the request's one audio) with its text; the stage's input is the
    talker's prompt rows (`embeds_prompt`: built here, not tokenized by the engine) and the rows its
    decode steps add (`step_rows`: the text's rest in the text-streaming mode), then T(tts_pad)."""

    audio_rate = 24000
    reply_end = None
    chat = ChatPolicy()
    embeds_prompt = True  # the entry stage takes `stage_input`'s embeddings, not rendered text

    def max_audio_s(self, model_dir: str) -> float | None:
        from omni_mp.models.qwen3_tts.clone import MAX_CLIP_S

        return MAX_CLIP_S if self.task_type(model_dir) == "Base" else None

    def render(self, text: str, n_audio: int, n_image: int, system: str | None = None) -> str:
        return assistant_text(text)  # what the talker reads (as text: never a chat turn)

    def companions(self, params: Mapping[str, Any] | None) -> list[str]:
        return []

    def voices(self, model_dir: str) -> frozenset[str] | None:
        """The preset voices a request may name (None: a model without presets)."""
        return frozenset(_builder(model_dir).voices) or None

    def task_type(self, model_dir: str) -> str:
        """The checkpoint's variant as vllm-omni's `task_type` names it (Base: cloning); reads
        config.json only (the HTTP server and the coordinator ask: no tables loaded)."""
        variant = _variant(str(model_dir))
        return TASK_TYPES.get(variant, variant)

    def stage_input(
        self,
        model_dir: str,
        text: str,
        params: Mapping[str, Any] | None,
        voice: str | None,
        clip: tuple[Any, int] | None = None,
    ) -> StageInput:
        """The talker's input for one request; `clip`: the reference clip (mono float32 samples,
        rate) of a Base request. TtsPromptError (or CloneError) names what is wrong."""
        params = params or {}
        _check_params(params)
        b = _builder(model_dir)
        variant = _variant(model_dir)
        in_context = _clone_mode(variant, params, clip)
        if voice is None and b.voices:
            voice = min(b.voices)  # the reference has no default preset: the first by name
        clone = None if in_context is None else _cloner(model_dir).prompt(clip[0], clip[1], in_context)  # type: ignore[index]
        req = TtsRequest(
            text=text,
            voice=None if clone is not None else voice,
            language=params.get(LANGUAGE_PARAM, "auto"),
            instructions=params.get(INSTRUCTIONS_PARAM, ""),
            text_streaming=text_streaming(variant, params),
            speaker_embedding=None if clone is None else clone.speaker_embedding,
            ref_text=params.get(REF_TEXT_PARAM) if in_context else None,
            ref_codes=None if clone is None else clone.ref_codes,
        )
        rows = b.rows(req)
        t = b.talker_config
        vocab, eos = int(t["vocab_size"]), int(t["codec_eos_token_id"])
        return StageInput(
            prompt_token_ids=[int(t["codec_pad_id"])] * rows.prompt.shape[0],
            prompt_embeds=rows.prompt,
            step_rows=rows.steps,  # the text's rest a token per step (whole text: [T(tts_pad)])
            step_fill=rows.pad,  # then T(tts_pad)
            stop_token_ids=[eos],
            suppress_token_ids=[i for i in range(vocab - CODEC_SPECIAL_RANGE, vocab) if i != eos],
            # in context: the decoder decodes the clip's codes first (the reference's waveform)
            first_chunk_info=None if req.ref_codes is None else {CLIP_CODES_KEY: req.ref_codes},
        )


PROMPT_FORMAT = TtsPromptFormat()
