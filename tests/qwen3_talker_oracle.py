"""transformers' `Qwen3OmniMoeForConditionalGeneration.generate` (5.17.0) on the tiny Qwen3-Omni
checkpoint, fp32, greedy thinker, talker and code predictor (no repetition penalty), recording
what the talker stage needs to be compared with it: the thinker's outputs as the thinker stage
streams them (omni_mp.models.qwen3_omni.exports), the talker's inputs as generate builds them,
and the 16 codes of every frame."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch

from omni_mp.engines.base import Extension
from omni_mp.engines.rows import RowStream
from omni_mp.models.processor import RequestContext, UpstreamResult
from omni_mp.models.qwen3_omni.codes import NO_CODE, codes_of_rows
from omni_mp.models.registry import resolve_model
from omni_mp.wire.messages import SamplingParamsMsg
from tests.launcher import start_request
from tests.synthetic_media import pattern, tone


@functools.cache
def omni_model(model_dir: str) -> Any:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


@functools.cache
def omni_processor(model_dir: str) -> Any:
    from transformers import Qwen3OmniMoeProcessor

    return Qwen3OmniMoeProcessor.from_pretrained(model_dir)


@dataclasses.dataclass
class OmniRun:
    prompt_ids: list[int]  # x, media placeholders expanded
    reply_ids: list[int]  # y, as the thinker generated it
    layer_rows: torch.Tensor  # thinker hidden_states[accept_hidden_layer] of x and y[:-1]
    mrope: tuple[torch.Tensor, int]  # the thinker's prompt positions [3, L] and delta
    talker_prompt: torch.Tensor  # [P, hidden]: generate's talker inputs_embeds
    talker_steps: torch.Tensor  # [K, hidden]: trailing_text_hidden
    talker_fill: torch.Tensor  # [hidden]: tts_pad_embed
    codes: torch.Tensor  # [frames, 16]
    talker_tokens: list[int]  # group-0 codes as sampled, the stop code included


@torch.no_grad()
def run_omni(
    model_dir: str,
    text: str,
    *,
    audio: Any = None,
    image: Any = None,
    speaker: str = "Ethan",
    thinker_tokens: int = 12,
    talker_tokens: int = 80,
) -> OmniRun:
    from omni_mp.models.qwen3_omni.prompt import omni_prompt_text

    model = omni_model(model_dir)
    prompt = omni_prompt_text(text, n_audio=int(audio is not None), n_image=int(image is not None))
    inputs = omni_processor(model_dir)(
        text=prompt,
        audio=None if audio is None else [audio],
        images=None if image is None else [image],
        return_tensors="pt",
    )
    captured: dict[str, Any] = {}
    thinker_generate, talker_generate = model.thinker.generate, model.talker.generate

    def thinker(**kw: Any) -> Any:
        captured["thinker"] = out = thinker_generate(**kw)
        return out

    def talker(**kw: Any) -> Any:
        captured["talker_kw"] = kw
        captured["talker"] = out = talker_generate(**kw)
        return out

    model.thinker.generate, model.talker.generate = thinker, talker
    try:
        model.generate(
            **inputs,
            speaker=speaker,
            thinker_max_new_tokens=thinker_tokens,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_repetition_penalty=1.0,
            talker_max_new_tokens=talker_tokens,
        )
    finally:
        del model.thinker.generate, model.talker.generate
    th, kw, tk = captured["thinker"], captured["talker_kw"], captured["talker"]
    x = inputs["input_ids"][0].tolist()
    layer = model.config.talker_config.accept_hidden_layer
    layer_rows = torch.cat([step[layer][0] for step in th.hidden_states])
    rope_kwargs = {k: inputs[k] for k in ("image_grid_thw", "video_grid_thw") if k in inputs}
    if "feature_attention_mask" in inputs:
        rope_kwargs["audio_seqlens"] = inputs["feature_attention_mask"].sum(-1)
    ids = inputs["input_ids"]
    pos, delta = model.thinker.get_rope_index(ids, attention_mask=torch.ones_like(ids), **rope_kwargs)
    codes = torch.stack([h[-1] for h in tk.hidden_states if h[-1] is not None], dim=1)[0]
    return OmniRun(
        prompt_ids=x,
        reply_ids=th.sequences[0, len(x) :].tolist(),
        layer_rows=layer_rows,
        mrope=(pos[:, 0], int(delta[0, 0])),
        talker_prompt=kw["inputs_embeds"][0],
        talker_steps=kw["trailing_text_hidden"][0],
        talker_fill=kw["tts_pad_embed"][0, 0],
        codes=codes,
        talker_tokens=tk.sequences[0].tolist(),
    )


CKPT = "tiny-qwen3-omni"
TEXTS = ["Hello world! How are you today?", "tell me a story about a robot", "The quick brown fox"]
CASES = {
    "text": {},
    "image": {"image": pattern(64)},
    "audio": {"audio": tone(1.0)},
}


@functools.cache
def model_dir() -> str:
    return resolve_model(CKPT)


@functools.cache
def oracle(case: str, text: str = TEXTS[0], speaker: str = "Ethan") -> OmniRun:
    return run_omni(model_dir(), text, speaker=speaker, **CASES[case])


@functools.cache
def processor() -> Any:
    from omni_mp.models.qwen3_omni.processor import _BoundTalkerInputs

    return _BoundTalkerInputs(Path(model_dir()), dummy=False)


def upstream(run: OmniRun, n_reply: int | None = None) -> UpstreamResult:
    """The thinker stage's stream as the talker stage holds it after `n_reply` reply tokens
    (None: finished)."""
    layer = processor().layer
    n = len(run.reply_ids) if n_reply is None else n_reply
    up = UpstreamResult(
        stage_id=0, prompt_token_ids=run.prompt_ids, output_token_ids=run.reply_ids[:n], finished=n_reply is None
    )
    rows = RowStream()
    rows.append(run.layer_rows[: len(run.prompt_ids) + max(0, n - 1)])
    up.layers = {layer: rows}
    up.mrope_positions, up.mrope_delta = run.mrope
    return up


class Talk:
    """One talker request fed as the stage loop feeds it: the prompt once the processor has
    one, then the per-step rows as the thinker's reply grows (`thinker_step` tokens at a time)."""

    def __init__(
        self, engine: Any, rid: str, run: OmniRun, speaker: str, streamed: bool, temperature: float = 0.0
    ) -> None:
        self.engine, self.rid, self.run, self.speaker = engine, rid, run, speaker
        self.temperature = temperature
        self.n_reply = 0 if streamed else None
        self.started = False
        self.rows_sent = 0
        self.closed = False
        self.tokens: list[int] = []
        self.rows: list[torch.Tensor] = []
        self.prompt_len = 0
        self.finished = False

    def feed(self) -> None:
        """Advance the thinker by one token (streamed) and hand the talker what is new."""
        if self.n_reply is not None and self.n_reply < len(self.run.reply_ids):
            self.n_reply += 1
            if self.n_reply == len(self.run.reply_ids):
                self.n_reply = None
        up = {0: upstream(self.run, self.n_reply)}
        proc = processor()
        if not self.started:
            inp = proc.prompt(up, RequestContext(speaker=self.speaker))
            if inp is None:
                return
            self.prompt_len = inp.prompt_embeds.shape[0]
            sampling = SamplingParamsMsg(
                max_tokens=80, stop_token_ids=inp.stop_token_ids, temperature=self.temperature, seed=7
            )
            start_request(
                self.engine,
                self.rid,
                sampling,
                prompt_embeds=inp.prompt_embeds,
                prompt_token_ids=inp.prompt_token_ids,
                positions=inp.positions,
                step_embeds=True,
                step_fill=inp.step_fill,
                suppress_token_ids=inp.suppress_token_ids,
            )
            self.started = True
        if not self.closed:
            rows, closed = proc.step_embeds(up, self.rows_sent)
            if rows is not None:
                self.rows_sent += rows.shape[0]
            if rows is not None or closed:
                self.engine.extend(self.rid, Extension(step_rows=rows, closed=closed))
            self.closed = closed

    def take(self, out: Any) -> None:
        self.tokens += out.new_token_ids
        if out.hidden is not None:
            self.rows.append(out.hidden.last)
        self.finished = self.finished or out.finished

    def check(self) -> None:
        rows = torch.cat(self.rows)
        codes = codes_of_rows(rows)
        want = self.run.codes
        assert self.tokens == self.run.talker_tokens, (self.rid, self.tokens, self.run.talker_tokens)
        assert rows.shape[0] == self.prompt_len + want.shape[0]
        assert bool((codes[: self.prompt_len] == NO_CODE).all())
        assert torch.equal(codes[self.prompt_len :], want), (self.rid, codes[self.prompt_len :], want)
