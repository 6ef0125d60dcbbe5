"""Qwen3-Omni's thinker -> talker link (`processor: qwen3_omni_talker`), exactly as
transformers' `Qwen3OmniMoeForConditionalGeneration.generate` (5.17.0) builds the talker's
inputs, from what the thinker stage streams (omni_mp.models.qwen3_omni.exports).

Notation: thinker prompt x (L ids), reply y_0..y_{N-1}; T(id) = text_projection(embed_t(id))
(the thinker's token embedding through the talker's text MLP), M(p) =
hidden_projection(thinker layer `accept_hidden_layer` at prompt position p), C(id) the
talker's codec embedding. All rows are in the talker's hidden width. The projections run here,
in float32, on the stage's GPU when it has one: T is a table over the whole thinker vocabulary,
computed once when the stage binds (a prompt or a step then only gathers rows; measured on
2 CPU cores at the released sizes, the text MLP took 354 ms for a 2500-token prompt and
1.2 ms per single decode row, all on the talker's host thread); M runs once per prompt.
- prompt, U + 9 rows: for each position p of the user turn(s) (exports.ThinkerTurns), M(p) at
  media placeholders, else T(x_p); then the assistant part over s = x[a:] + y (a = the
  generation prompt's `<|im_start|>`): T(s_0), T(s_1), T(s_2) (`<|im_start|>assistant\\n`),
  T(tts_pad) + C(nothink), T(tts_pad) + C(think_bos), T(tts_pad) + C(think_eos),
  T(tts_pad) + C(speaker), T(tts_bos) + C(codec_pad), T(s_3) + C(codec_bos). Ready once y_0
  (and, with media, the thinker's prompt rows) arrived.
- decode step k adds T(s_{4+k}) while s_{4+k} is not the reply's last token (which the
  thinker never feeds back: the row waits for the next token or the end), then T(tts_eos),
  then T(tts_pad) for every later step (`step_fill`). The talker model adds the codec and
  code-predictor embeddings of the frame itself (omni_mp.models.qwen3_omni.vllm_hooks_talker).
- a tool call is never spoken (omni_mp.models.qwen3_omni.tool_cut): the text rows end where
  the answer's first `<tool_call>` starts (then T(tts_eos)); an answer that opens with one
  has nothing to speak (the request ends here SILENT, and code2wav's with it).
- sampling: stop on `codec_eos_token_id`; the top 1024 codec ids but eos are never sampled
  (generate's `suppress_tokens`); the prompt's bookkeeping ids are `codec_pad` (itself
  suppressed, so a repetition penalty counts generated codes only, as generate's does).
- positions: text-only prompts take vLLM's (arange; the same as transformers' rope index);
  with media, the thinker's M-RoPE positions of the user turn, each contiguous run shifted to
  start right after the previous one, then the assistant rows as text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from omni_mp.models.checkpoint import load_prefixed, load_tensors
from omni_mp.models.processor import (
    SILENT,
    ProcessorError,
    RequestContext,
    Silent,
    StageInput,
    StageProcessor,
    UpstreamResult,
    single_upstream,
)
from omni_mp.models.qwen3_omni.exports import THINKER_EMBED, ThinkerTurns, TurnIds, accept_hidden_layer
from omni_mp.models.qwen3_omni.tool_cut import ToolCallCut

if TYPE_CHECKING:
    from omni_mp.config.schema import StageConfig

DEFAULT_SPEAKER = "ethan"  # transformers' generate() default ("Ethan", matched lower-cased)
CODEC_EMBED = "talker.model.codec_embedding.weight"
CODEC_SPECIAL_RANGE = 1024  # the top codec ids generate() suppresses (but eos)
ASSISTANT_HEAD = 3  # `<|im_start|>assistant\n`: rows of the assistant part before the codec specials


TABLE_CHUNK = 8192  # vocabulary rows per MLP call while the T table is built (bounded scratch)


def _projection_device() -> torch.device:
    """The stage's GPU when it has one (its process sees only its own devices), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class _Mlp:
    """The talker's ResizeMLP (fc1 -> SiLU -> fc2, with biases), in float32 on `device`;
    inputs and outputs on the host."""

    def __init__(self, state: dict[str, torch.Tensor], device: torch.device) -> None:
        self.device = device
        self.w1, self.b1 = (state[f"linear_fc1.{k}"].to(device, torch.float32) for k in ("weight", "bias"))
        self.w2, self.b2 = (state[f"linear_fc2.{k}"].to(device, torch.float32) for k in ("weight", "bias"))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, torch.float32)
        return F.linear(F.silu(F.linear(x, self.w1, self.b1)), self.w2, self.b2).cpu()

    def table(self, embed: torch.Tensor) -> torch.Tensor:
        """The MLP of every row of `embed` (float32, host), TABLE_CHUNK rows per call."""
        out = torch.empty(embed.shape[0], self.w2.shape[0], dtype=torch.float32)
        for a in range(0, embed.shape[0], TABLE_CHUNK):
            out[a : a + TABLE_CHUNK] = self(embed[a : a + TABLE_CHUNK])
        return out


class Qwen3OmniTalkerInputs(StageProcessor):
    step_embeds_enabled = True
    prompt_embeds_enabled = True
    needs_hidden_states = True
    # The thinker's layer rows are read at the prompt's media placeholders only; text rows come
    # from the T table by id, so the thinker reads its prefix cache up to the first media position.
    prompt_rows = "media"

    def bind(self, stage: StageConfig, model_dir: str) -> StageProcessor:
        return _BoundTalkerInputs(Path(model_dir), dummy=stage.engine_args.get("load_format") == "dummy")


def _random_mlp(gen: torch.Generator, width_in: int, inner: int, width_out: int, device: torch.device) -> _Mlp:
    return _Mlp(
        {
            "linear_fc1.weight": torch.randn(inner, width_in, generator=gen) * 0.02,
            "linear_fc1.bias": torch.zeros(inner),
            "linear_fc2.weight": torch.randn(width_out, inner, generator=gen) * 0.02,
            "linear_fc2.bias": torch.zeros(width_out),
        },
        device,
    )


class _BoundTalkerInputs(Qwen3OmniTalkerInputs):
    def __init__(self, model_dir: Path, *, dummy: bool) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        talker = config["talker_config"]
        text_cfg = talker["text_config"]
        self.turn_ids = TurnIds.from_config(config)
        self.layer = accept_hidden_layer(config)
        vocab = int(text_cfg["vocab_size"])
        self.codec_eos = int(talker["codec_eos_token_id"])
        self.codec_pad = int(talker["codec_pad_id"])
        self.suppress = [i for i in range(vocab - CODEC_SPECIAL_RANGE, vocab) if i != self.codec_eos]
        self.speaker_ids = {str(k).lower(): int(v) for k, v in (talker.get("speaker_id") or {}).items()}
        if not self.speaker_ids:
            raise ValueError(f"{model_dir}: talker_config has no speaker_id")
        # The voices a request may pick: the config's names (lower-case in the released config;
        # the stage loop checks a request's name against these; the processor matches it
        # lower-cased, as generate does).
        self.speakers = frozenset(self.speaker_ids)
        self.default_speaker = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speaker_ids else min(self.speaker_ids)
        device = _projection_device()
        if dummy:
            # Random weights (benchmarks at real sizes): tables of the real shapes, fixed seed.
            gen = torch.Generator().manual_seed(0)
            width, inner = int(talker["thinker_hidden_size"]), int(text_cfg["intermediate_size"])
            hidden = int(text_cfg["hidden_size"])
            thinker_vocab = int(config["thinker_config"]["text_config"]["vocab_size"])
            embed = (torch.randn(thinker_vocab, width, generator=gen) * 0.02).to(torch.bfloat16)
            codec = torch.randn(vocab, hidden, generator=gen) * 0.02
            text_mlp = _random_mlp(gen, width, inner, hidden, device)
            self.hidden_mlp = _random_mlp(gen, width, inner, hidden, device)
        else:
            tensors = load_tensors(model_dir, [THINKER_EMBED, CODEC_EMBED])
            embed, codec = tensors[THINKER_EMBED], tensors[CODEC_EMBED].float()
            text_mlp = _Mlp(load_prefixed(model_dir, "talker.text_projection."), device)
            self.hidden_mlp = _Mlp(load_prefixed(model_dir, "talker.hidden_projection."), device)
        # T(id) for every thinker token id, float32 on the host: vocabulary x talker width (the
        # released model: 151936 x 1024, 622 MB; ~1.9 TFLOP, a fraction of a second on a GPU).
        self.text_table = text_mlp.table(embed)
        del text_mlp, embed
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the text MLP and its scratch (the engine has sized its KV cache already)
        tts_pad = self.text_row(int(config["tts_pad_token_id"]))
        self.tts_bos = self.text_row(int(config["tts_bos_token_id"]))
        self.tts_eos = self.text_row(int(config["tts_eos_token_id"]))
        self.tts_pad = tts_pad
        specials = [talker[k] for k in ("codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id")]
        self.codec_think = codec[torch.tensor(specials)]  # [3, hidden]
        self.codec_speaker = {name: codec[i].clone() for name, i in self.speaker_ids.items()}
        self.codec_pad_row = codec[self.codec_pad].clone()
        self.codec_bos_row = codec[int(talker["codec_bos_id"])].clone()
        self.tool_cut = ToolCallCut.load(model_dir)  # None: the checkpoint has no tool-call token

    # ---- rows ---------------------------------------------------------------------------------
    def text_row(self, token: int) -> torch.Tensor:
        """T(token), float32 [hidden]."""
        return self.text_rows([token])[0]

    def text_rows(self, tokens: list[int]) -> torch.Tensor:
        """T of each token, float32 [len(tokens), hidden] (rows of the table)."""
        ids = torch.tensor(tokens, dtype=torch.long)
        vocab = self.text_table.shape[0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            bad = [t for t in tokens if not 0 <= t < vocab]
            raise ProcessorError(f"thinker token ids {bad[:4]} outside the vocabulary of {vocab}")
        return self.text_table[ids]

    # ---- the prompt ---------------------------------------------------------------------------
    def prompt(self, upstream: Mapping[int, UpstreamResult], ctx: RequestContext) -> StageInput | Silent | None:
        up = single_upstream(upstream, "qwen3_omni_talker")
        x = up.prompt_token_ids
        if x is None or not up.output_token_ids:
            return None
        if self.tool_cut is not None:
            # A tool call is never spoken: an answer that opens with one has nothing to say, and
            # a first token that may open one waits for the next.
            cut, safe = self.tool_cut.scan(up.output_token_ids, 0, final=up.finished)
            if cut == 0:
                return SILENT
            if cut is None and safe == 0 and not up.finished:
                return None
        try:
            turns = ThinkerTurns.of(x, self.turn_ids)
        except ValueError as err:
            raise ProcessorError(str(err)) from None
        if turns.media:
            stream = up.layers.get(self.layer)
            if stream is None or stream.rows <= max(turns.media):
                if up.finished:
                    raise ProcessorError(f"the thinker streamed no layer-{self.layer} rows for the prompt's media")
                return None
        speaker = (ctx.speaker or self.default_speaker).lower()
        if speaker not in self.speaker_ids:
            raise ProcessorError(f"unknown speaker {ctx.speaker!r}; this model has {sorted(self.speakers)}")
        s = list(x[turns.assistant_start :]) + list(up.output_token_ids)
        if len(s) <= ASSISTANT_HEAD:
            return None
        user = self.text_rows([x[p] for p in turns.user])
        if turns.media:
            media = turns.media_mask()
            first = turns.media[0]  # the thinker's rows may begin there (prompt_rows "media")
            hidden = up.layer_states(self.layer, first, turns.media[-1] + 1)
            user[media] = self.hidden_mlp(hidden[torch.tensor(turns.media) - first])
        head = self.text_rows(s[: ASSISTANT_HEAD + 1])
        pad = self.tts_pad[None].expand(3, -1)
        assistant = torch.cat(
            [
                head[:ASSISTANT_HEAD],
                pad + self.codec_think,
                (self.tts_pad + self.codec_speaker[speaker])[None],
                (self.tts_bos + self.codec_pad_row)[None],
                (head[ASSISTANT_HEAD] + self.codec_bos_row)[None],
            ]
        )
        rows = torch.cat([user, assistant])
        return StageInput(
            prompt_token_ids=[self.codec_pad] * rows.shape[0],
            prompt_embeds=rows,
            positions=self._positions(up, turns, rows.shape[0]),
            step_fill=self.tts_pad,
            stop_token_ids=[self.codec_eos],
            suppress_token_ids=self.suppress,
        )

    def _positions(self, up: UpstreamResult, turns: ThinkerTurns, n_rows: int) -> tuple[torch.Tensor, int] | None:
        """Text-only: None (vLLM's arange is transformers' rope index). With media: the thinker's
        positions of each contiguous run of user positions, runs laid end to end, then text."""
        if not turns.media:
            return None
        if up.mrope_positions is None:
            raise ProcessorError("the thinker sent no M-RoPE positions for a prompt with media")
        thinker = up.mrope_positions
        parts: list[torch.Tensor] = []
        nxt = 0
        run_start = 0
        user = turns.user
        for i in range(1, len(user) + 1):
            if i == len(user) or user[i] != user[i - 1] + 1:
                run = thinker[:, user[run_start] : user[i - 1] + 1]
                run = run - run[:, :1] + nxt
                parts.append(run)
                nxt = int(run.max()) + 1
                run_start = i
        tail = n_rows - len(user)
        parts.append(torch.arange(nxt, nxt + tail, dtype=torch.int64).expand(3, tail))
        pos = torch.cat(parts, dim=1).to(torch.int64)
        return pos, nxt + tail - n_rows

    # ---- per-step rows ------------------------------------------------------------------------
    def step_embeds(self, upstream: Mapping[int, UpstreamResult], start: int) -> tuple[torch.Tensor | None, bool]:
        up = single_upstream(upstream, "qwen3_omni_talker")
        x, y = up.prompt_token_ids or [], up.output_token_ids
        a = self._assistant_start(x)
        s = x[a:]  # the assistant part's prompt tokens; s continues with y
        first = ASSISTANT_HEAD + 1  # s index of step row 0
        n_text = max(0, len(s) + len(y) - 1 - first)  # rows T(s_4..s_{len-2}): the last token waits
        ended = up.finished
        if self.tool_cut is not None:
            # The text ends where a tool call starts (row k reads y[first + k - len(s)]); tokens
            # that may open one wait until they do or do not.
            cut, safe = self.tool_cut.scan(y, max(0, start + first - len(s)), final=up.finished)
            if cut is not None:
                n_text, ended = min(n_text, max(0, cut - first + len(s))), True
            else:
                n_text = min(n_text, max(0, safe - first + len(s)))
        parts: list[torch.Tensor] = []
        if start < n_text:
            ids = [s[i] if i < len(s) else y[i - len(s)] for i in range(start + first, n_text + first)]
            parts.append(self.text_rows(ids))
        if ended and start <= n_text:
            parts.append(self.tts_eos[None])
        if not parts:
            return None, ended
        return (parts[0] if len(parts) == 1 else torch.cat(parts)), ended

    def _assistant_start(self, x: list[int]) -> int:
        """The last `<|im_start|>assistant` of the prompt (scanned from its end: a few tokens)."""
        ids = self.turn_ids
        for i in range(len(x) - 2, -1, -1):
            if x[i] == ids.im_start and x[i + 1] == ids.assistant:
                return i
        raise ProcessorError("the thinker prompt has no '<|im_start|>assistant' turn to speak")
