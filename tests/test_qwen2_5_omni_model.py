"""The tiny Qwen2.5-Omni checkpoint (omni_mp.models.qwen2_5_omni.tiny) and the oracle built on it
(tests.hf_oracle.omni_generate): a deterministic build, an offline reload, the processor's
placeholder counts, and the oracle's talker codes against an independent hand-written talker
loop (docs/qwen2_5_omni.md). No vLLM."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from omni_mp.models.qwen2_5_omni.prompt import omni_prompt_text
from omni_mp.models.qwen2_5_omni.tiny import (
    CODEC_BOS,
    CODEC_MASK,
    CODEC_PAD,
    CODEC_STOP_IDS,
    OMNI_SPECS,
    build_omni,
)
from omni_mp.models.registry import resolve_model
from tests.hf_oracle import omni_generate, omni_inputs
from tests.synthetic_media import pattern, tone

THINKER_TOKENS = 16
MIN_MARGIN = 1e-5  # below this a top-2 tie may flip on rounding alone


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(resolve_model("tiny-qwen2_5-omni"))


def test_build_is_deterministic(tmp_path: Path) -> None:
    spec = OMNI_SPECS["tiny-qwen2_5-omni"]
    a = build_omni(spec, cache_dir=tmp_path / "a", verbose=False)
    b = build_omni(spec, cache_dir=tmp_path / "b", verbose=False)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_reloads_offline_and_counts_placeholders(model_dir: Path) -> None:
    from transformers import Qwen2_5OmniForConditionalGeneration, Qwen2_5OmniProcessor

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, local_files_only=True)
    processor = Qwen2_5OmniProcessor.from_pretrained(model_dir, local_files_only=True)
    assert set(model.speaker_map) == {"Chelsie", "Ethan"}
    assert processor.feature_extractor.feature_size == 128
    tok = processor.tokenizer
    prompt = omni_prompt_text("What is this?", n_audio=1, n_image=1)
    inputs = processor(text=prompt, audio=[tone()], images=[pattern()], return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    assert ids.count(tok.convert_tokens_to_ids("<|AUDIO|>")) == 50  # 25 tokens per second
    assert ids.count(tok.convert_tokens_to_ids("<|IMAGE|>")) == 4  # 4x4 patches of 14 px, merged 2x2
    assert list(inputs["input_features"].shape) == [1, 128, 3000]
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]


@torch.no_grad()
def hand_talker(model_dir: Path, text: str, speaker: str, max_codes: int) -> tuple[list[int], list[int]]:
    """Thinker tokens and talker codes for a text prompt, from the thinker's own generate() and
    the talker's parts called one step at a time (§2), not from the omni generate()."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    inputs = omni_inputs(model_dir, text)  # the processor's tensors, as the oracle gets them
    prompt = inputs["input_ids"]
    out = model.thinker.generate(
        **inputs,
        max_new_tokens=THINKER_TOKENS,
        do_sample=False,
        output_hidden_states=True,
        return_dict_in_generate=True,
    )
    ys = out.sequences[0, prompt.shape[1] :]
    assert len(ys) >= 2  # generate() needs two thinker tokens
    embed_t = model.thinker.get_input_embeddings()
    talker = model.talker
    codec_embed = talker.model.get_input_embeddings()
    last = [step[-1][0] for step in out.hidden_states]  # post-norm last layer: [L, Ht], then [1, Ht] per token
    # r_j = embed_t(y_j) + h_last(y_j); y_{N-1} is never fed back, so r stops at N-2.
    r = embed_t(ys[:-1]) + torch.cat(last[1:])
    cfg = model.config.talker_config
    spk_bos = model.speaker_map[speaker]["bos_token"]
    prefill = torch.cat(
        [
            embed_t(prompt[0]) + last[0],
            embed_t(torch.tensor([spk_bos])) + codec_embed(torch.tensor([CODEC_PAD])),
            r[:1] + codec_embed(torch.tensor([CODEC_BOS])),
        ]
    )
    text_end = embed_t(torch.tensor([cfg.tts_text_end_token_id, cfg.tts_text_pad_token_id]))
    stream = torch.cat([r[1:], text_end])  # N rows; the last (tts_pad) repeats once used up
    history = [CODEC_MASK] * prompt.shape[1] + [CODEC_PAD, CODEC_BOS]
    x = talker.thinker_to_talker_proj(prefill)[None]
    past = None
    codes: list[int] = []
    for k in range(max_codes):
        step = talker.model(inputs_embeds=x, past_key_values=past, use_cache=True)
        past = step.past_key_values
        logits = talker.codec_head(step.last_hidden_state[0, -1])
        seen = torch.tensor(sorted(set(history)))
        penalised = logits[seen]
        logits[seen] = torch.where(penalised < 0, penalised * 1.05, penalised / 1.05)  # repetition penalty
        logits[CODEC_BOS] = -math.inf  # suppressed
        code = int(logits.argmax())
        if code in CODEC_STOP_IDS:
            break
        codes.append(code)
        history.append(code)
        x = talker.thinker_to_talker_proj(codec_embed(torch.tensor([code])) + stream[min(k, len(stream) - 1)])[None]
    return ys.tolist(), codes


def test_oracle_talker_matches_hand_loop(model_dir: Path) -> None:
    text, speaker = "Hello world! How are you today?", "Ethan"
    want = omni_generate(model_dir, text, speaker=speaker, thinker_max_new_tokens=THINKER_TOKENS)
    thinker_ids, codes = hand_talker(model_dir, text, speaker, max_codes=512)
    assert thinker_ids == want.thinker_ids
    assert codes == want.codes
    assert want.stop_code in CODEC_STOP_IDS and len(want.codes) >= THINKER_TOKENS // 2
    assert min(want.thinker_margins) > MIN_MARGIN and min(want.code_margins) > MIN_MARGIN
    assert want.mel.shape[-1] == 2 * len(want.codes) and want.wav.shape == (480 * len(want.codes),)
