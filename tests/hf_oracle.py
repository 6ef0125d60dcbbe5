"""The correctness oracle: Hugging Face transformers' own generate() on the same checkpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch


@functools.cache
def _model(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # generate() fills unset fields from the model's generation config, EOS included; the
    # oracle mirrors vLLM's ignore_eos, so the model itself must have no EOS.
    model.generation_config.eos_token_id = None
    return model


def tokenize(model_dir: str | Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(model_dir)(text).input_ids)


def _generate(model_dir: str | Path, prompt_ids: list[int], n: int, **outputs: bool) -> Any:
    """Greedy generate() of exactly `n` tokens (fp32), like vLLM's `ignore_eos`: EOS does not
    stop generation but may still be generated (HF's `min_new_tokens` would instead mask EOS
    out, a different distribution)."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=n, do_sample=False, pad_token_id=0, return_dict_in_generate=True, **outputs)
    ids = torch.tensor([prompt_ids])
    # An explicit mask: otherwise HF masks out every prompt token equal to pad_token_id.
    out = _model(str(model_dir)).generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
    assert out.sequences.shape[1] == len(prompt_ids) + n
    return out


def greedy(model_dir: str | Path, prompt_ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """`n` greedy tokens and the top-1/top-2 logit margin at each step."""
    out = _generate(model_dir, prompt_ids, n, output_scores=True)
    margins = [float(v[0] - v[1]) for v in (s[0].topk(2).values for s in out.scores)]
    return out.sequences[0, len(prompt_ids) :].tolist(), margins


def assert_same_tokens(got: list[int], want: list[int], margins: list[float], what: str) -> None:
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert got == want, f"{what}: got {got} != transformers {want}; first difference at step {first}" + (
        f", where the transformers top-2 logit margin is {margins[first]:.2e}" if first is not None else ""
    )


def assert_close_audio(got: torch.Tensor, want: torch.Tensor) -> None:
    """A streamed waveform against transformers' one-shot one: float32, the same length, and a
    relative L2 error within the streamed-vs-one-shot tolerance of test_diffusion_engine."""
    assert got.dtype == torch.float32 and got.shape == want.shape, (got.shape, want.shape)
    rel = ((got - want).norm() / want.norm()).item()
    assert rel <= 1e-3, f"relative L2 error {rel:.2e} against transformers"


def greedy_hidden(model_dir: str | Path, prompt_ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """`n` greedy tokens and, per `output_hidden_states` index, the hidden states of every
    token the model computed: the prompt and the generated tokens but the last, [L+n-1, H]."""
    out = _generate(model_dir, prompt_ids, n, output_hidden_states=True)
    steps = out.hidden_states  # step 0: prefill [1, L, H] per layer; step j: [1, 1, H] of token j-1
    layers = [torch.cat([step[i][0] for step in steps]) for i in range(len(steps[0]))]
    return out.sequences[0, len(prompt_ids) :].tolist(), layers


def embed_rows(model_dir: str | Path, token_ids: list[int]) -> torch.Tensor:
    return _model(str(model_dir)).get_input_embeddings()(torch.tensor(token_ids)).detach()


@torch.no_grad()
def talker_greedy(
    model_dir: str | Path, prompt_embeds: torch.Tensor, step_embeds: torch.Tensor, n: int
) -> tuple[list[int], list[float]]:
    """The talker, by hand with transformers: prefill on `prompt_embeds`, then decode step k
    feeds embed(code_k) + step_embeds[k] (zeros once those rows are used up)."""
    model = _model(str(model_dir))
    embed = model.get_input_embeddings()
    out = model(inputs_embeds=prompt_embeds[None], use_cache=True)
    codes, margins = [], []
    for k in range(n):
        logits = out.logits[0, -1]
        top = logits.topk(2).values
        margins.append(float(top[0] - top[1]))
        codes.append(int(logits.argmax()))
        if k == n - 1:
            break
        extra = step_embeds[k] if k < step_embeds.shape[0] else torch.zeros(prompt_embeds.shape[1])
        x = embed(torch.tensor([[codes[-1]]])) + extra
        out = model(inputs_embeds=x, past_key_values=out.past_key_values, use_cache=True)
    return codes, margins


def reply_ids(model_dir: str | Path, text: str) -> list[int]:
    """A given reply's ids as transformers' tokenizer makes them: `text` as plain text (special-
    token strings in it stay text, no special tokens added), then the chat turn's end."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(text, add_special_tokens=False, split_special_tokens=True).input_ids
    return [*ids, tok.convert_tokens_to_ids("<|im_end|>")]


class ForceTokens:
    """A logits processor for generate(): step k can only choose `ids[k]` (a reply given, not
    generated: the model still computes every step as it would, fed these tokens)."""

    def __init__(self, ids: list[int], prompt_len: int) -> None:
        self.ids, self.prompt_len = ids, prompt_len

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        k = input_ids.shape[1] - self.prompt_len
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.ids[k]] = 0.0
        return forced


def forced_thinker(ids: list[int] | None, prompt_len: int) -> dict[str, Any]:
    """generate()'s thinker arguments that make its reply exactly `ids` (None: nothing)."""
    from transformers import LogitsProcessorList

    if ids is None:
        return {}
    return {"thinker_logits_processor": LogitsProcessorList([ForceTokens(ids, prompt_len)]),
            "thinker_max_new_tokens": len(ids)}  # fmt: skip


@functools.cache
def _omni(model_dir: str) -> Any:
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def token2wav(model_dir: str | Path, codes: list[int], p: Any) -> torch.Tensor:
    """transformers' Qwen2.5-Omni token2wav for DiffusionParams `p`; its noise comes from the
    global RNG, seeded with the request seed (the engine draws the same noise from its own
    generator)."""
    model = _omni(str(model_dir))
    spk = model.speaker_map[p.speaker]
    torch.manual_seed(p.seed)
    with torch.no_grad():
        return model.token2wav(
            torch.tensor([codes]),
            conditioning=spk["cond"].float(),
            reference_mel=spk["ref_mel"].float(),
            num_steps=p.num_steps,
            guidance_scale=p.guidance_scale,
            sway_coefficient=p.sway_coefficient,
        )


@dataclasses.dataclass(frozen=True)
class OmniResult:
    """One full Qwen2.5-Omni generate(): thinker -> talker -> token2wav."""

    prompt_ids: list[int]  # the processor's input_ids (placeholders expanded)
    thinker_ids: list[int]  # generated, EOS included if it stopped on it
    thinker_margins: list[float]  # top-1/top-2 margin of the processed scores, per thinker step
    codes: list[int]  # talker codec ids, cut before the first stop id
    code_margins: list[float]  # per talker step, the step that chose the stop id included
    stop_code: int | None  # the stop id that ended the talker, None if it hit its max
    mel: torch.Tensor  # DiT output [1, mel_dim, 2 * len(codes)]
    wav: torch.Tensor  # [480 * len(codes)]


@functools.cache
def _omni_processor(model_dir: str) -> Any:
    from transformers import Qwen2_5OmniProcessor

    return Qwen2_5OmniProcessor.from_pretrained(model_dir)


def omni_inputs(model_dir: str | Path, text: str, audio: Any = None, image: Any = None) -> Any:
    """The processor's tensors for `omni_prompt_text(text, ...)`; audio: float32 [n] at 16 kHz,
    image: uint8 [H, W, 3]."""
    from omni_mp.models.qwen2_5_omni.prompt import omni_prompt_text

    prompt = omni_prompt_text(text, n_audio=int(audio is not None), n_image=int(image is not None))
    return _omni_processor(str(model_dir))(
        text=prompt,
        audio=None if audio is None else [audio],
        images=None if image is None else [image],
        return_tensors="pt",
    )


def conversation_inputs(
    model_dir: str | Path, messages: list[dict[str, Any]], audios: list[Any], images: list[Any]
) -> Any:
    """The processor's tensors for a whole conversation: its chat template (`apply_chat_template`),
    then the processor on that text with the media in order."""
    proc = _omni_processor(str(model_dir))
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return proc(text=text, audio=audios or None, images=images or None, return_tensors="pt")


def _margin(scores: torch.Tensor) -> float:
    top = scores.topk(2).values
    return float(top[0] - top[1])


@contextlib.contextmanager
def _recording(module: torch.nn.Module, outputs: list[Any]) -> Any:
    """Have `module.generate` also return its processed scores (output_scores only records them)
    and keep its output; the caller still gets what it asked for."""
    original = module.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        as_dict = kwargs.get("return_dict_in_generate", False)
        out = original(*args, **{**kwargs, "output_scores": True, "return_dict_in_generate": True})
        outputs.append(out)
        return out if as_dict else out.sequences

    module.generate = generate
    try:
        yield
    finally:
        del module.generate


@torch.no_grad()
def omni_generate(
    model_dir: str | Path,
    text: str,
    *,
    audio: Any = None,
    image: Any = None,
    speaker: str = "Chelsie",
    seed: int = 0,
    thinker_max_new_tokens: int = 16,
    talker_max_new_tokens: int = 512,
    forced_reply: list[int] | None = None,
    inputs: Any = None,
) -> OmniResult:
    """transformers' full Qwen2.5-Omni generate() in fp32, greedy thinker and talker, the tiny
    codec stop ids. The token2wav noise comes from the global RNG, seeded with `seed` right
    before token2wav runs: the same noise as `torch.randn(..., generator=torch.Generator().
    manual_seed(seed))`, which is how the diffusion engine draws it. `forced_reply`: the
    thinker's reply is exactly these ids (ForceTokens)."""
    from omni_mp.models.qwen2_5_omni.tiny import CODEC_STOP_IDS

    model = _omni(str(model_dir))
    if inputs is None:
        inputs = omni_inputs(model_dir, text, audio, image)
    elif "pixel_values" in inputs:  # a conversation's, with images
        image = True
    thinker_out: list[Any] = []
    talker_out: list[Any] = []
    mels: list[torch.Tensor] = []
    hooks = [
        model.token2wav.register_forward_pre_hook(lambda *_: torch.manual_seed(seed) and None),
        model.token2wav.code2wav_bigvgan_model.register_forward_pre_hook(lambda _, args: mels.append(args[0])),
    ]
    extra = {"talker_pixel_values": None} if image is not None else {}  # generate() would pass them to the talker
    extra |= {"thinker_max_new_tokens": thinker_max_new_tokens}
    extra |= forced_thinker(forced_reply, inputs["input_ids"].shape[1])
    try:
        with _recording(model.thinker, thinker_out), _recording(model.talker, talker_out):
            _, wav = model.generate(
                **inputs,
                speaker=speaker,
                thinker_do_sample=False,
                talker_max_new_tokens=talker_max_new_tokens,
                talker_do_sample=False,
                talker_eos_token_id=list(CODEC_STOP_IDS),
                **extra,
            )
    finally:
        for h in hooks:
            h.remove()
    prompt_len = inputs["input_ids"].shape[1]
    (thinker,), (talker,) = thinker_out, talker_out
    steps = talker.sequences[0, prompt_len + 2 :].tolist()  # the talker prompt is L + 2 rows
    stop = next((i for i, c in enumerate(steps) if c in CODEC_STOP_IDS), None)
    return OmniResult(
        prompt_ids=inputs["input_ids"][0].tolist(),
        thinker_ids=thinker.sequences[0, prompt_len:].tolist(),
        thinker_margins=[_margin(s[0]) for s in thinker.scores],
        codes=steps if stop is None else steps[:stop],
        code_margins=[_margin(s[0]) for s in talker.scores],
        stop_code=None if stop is None else steps[stop],
        mel=mels[0],
        wav=wav,
    )
