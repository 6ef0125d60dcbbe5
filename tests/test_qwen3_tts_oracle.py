"""The tiny Qwen3-TTS checkpoints (omni_mp.models.qwen3_tts.tiny, built without the reference)
against the qwen-tts 0.1.1 reference in its own venv: it loads every tensor we write and no
other (the narrow-predictor one's `small_to_mtp_projection` too), reads the code predictor's
sampling settings from generation_config.json as our talker view does, and its greedy fp32
generation on them is deterministic, audible, and conditioned by the preset voice, the language
and the instructions (so a later code-for-code comparison of our engine against it can fail on
each of those)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from omni_mp.models.qwen3_tts.prompt import TtsPromptBuilder, TtsPromptError, TtsRequest, assistant_text
from omni_mp.models.qwen3_tts.talker_view import subtalker_sampling
from omni_mp.models.qwen3_tts.tiny import TINY_SPECS, build_tiny
from omni_mp.models.qwen3_tts.tiny_config import NUM_CODE_GROUPS
from tests.qwen3_tts_oracle import OracleRun, require_reference, run_reference

FRAME_SAMPLES = 1920  # 24 kHz / 12.5 Hz
MAX_NEW = 10  # talker steps; the reference returns MAX_NEW - 1 frames (the last code 0 is not expanded)

VOICE = {
    "kind": "custom_voice",
    "text": "hello there, how are you?",
    "speaker": "vivian",
    "language": "english",
    "instruct": "speak slowly and warmly",
    "max_new_tokens": MAX_NEW,
}


CUSTOM_REQUESTS = [
    VOICE,
    VOICE,  # same request again: deterministic
    {**VOICE, "instruct": ""},  # no instructions
    {**VOICE, "speaker": "ryan"},  # another preset voice
    {**VOICE, "language": "chinese"},  # another language tag
    {**VOICE, "non_streaming_mode": False},  # text fed one token per frame
]


@pytest.fixture(scope="module")
def custom_voice() -> tuple[Path, OracleRun]:
    require_reference()
    model_dir = build_tiny(TINY_SPECS["tiny-qwen3-tts-custom-voice"])
    return model_dir, run_reference(model_dir, CUSTOM_REQUESTS)


def _assert_loads_and_reads_as_we_do(model_dir: Path, report: dict) -> None:
    """Every tensor loaded, no other; the code predictor's sampling settings (generation_config.json
    over the generate wrappers' defaults) ours as the reference's."""
    assert report["errors"] == {}
    for part in ("model", "speech_tokenizer"):
        assert report[part] == {"missing": [], "unexpected": []}, part
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert msgspec.to_builtins(subtalker_sampling(generation)) == report["subtalker"]


def test_reference_loads_every_tensor_of_custom_voice(custom_voice: tuple[Path, OracleRun]) -> None:
    model_dir, run = custom_voice
    _assert_loads_and_reads_as_we_do(model_dir, run.report)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert not any(k.startswith("subtalker_") for k in generation)  # so both sides took their defaults
    assert run.report["versions"]["transformers"] == "4.57.3"


@pytest.mark.parametrize(
    "name", ["tiny-qwen3-tts-voice-design", "tiny-qwen3-tts-base", "tiny-qwen3-tts-narrow-predictor"]
)
def test_reference_loads_every_tensor(name: str) -> None:
    require_reference()
    model_dir = build_tiny(TINY_SPECS[name])
    requests = (
        [
            {
                "kind": "voice_design",
                "text": "good morning",
                "instruct": "a deep calm voice",
                "language": "english",
                "max_new_tokens": 4,
            }
        ]
        if "design" in name
        else []
    )
    run = run_reference(model_dir, requests)
    _assert_loads_and_reads_as_we_do(model_dir, run.report)
    if requests:
        assert run.codes[0].shape == (3, NUM_CODE_GROUPS)
        _assert_rows_equal(model_dir, requests, run)


@pytest.mark.parametrize(
    ("generation", "named"),
    [({"subtalker_top_k": "many"}, "subtalker_top_k"), ({"subtalker_top_p": 0.0}, "subtalker_top_p"),
     ({"subtalker_temperature": 0}, "subtalker_temperature"), ({"subtalker_dosample": "yes"}, "subtalker_dosample")],
)  # fmt: skip
def test_bad_subtalker_settings_are_named(generation: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"generation_config.json: .*{named}"):
        subtalker_sampling(generation)


def test_reference_generation_is_deterministic_audible_and_conditioned(custom_voice: tuple[Path, OracleRun]) -> None:
    run = custom_voice[1]
    base, again, no_instruct, other_voice, other_lang, streamed_text = run.codes
    assert base.shape == (MAX_NEW - 1, NUM_CODE_GROUPS)
    np.testing.assert_array_equal(base, again)
    np.testing.assert_array_equal(run.wavs[0], run.wavs[1])
    for other in (no_instruct, other_voice, other_lang, streamed_text):
        assert not np.array_equal(base, other)  # every prompt part reaches the codes
    wav = run.wavs[0]
    assert wav.shape == (base.shape[0] * FRAME_SAMPLES,)
    rms = float(np.sqrt(np.mean(wav**2)))
    assert 0.01 < rms < 0.9, rms  # audible and inside the clamp: a waveform comparison means something


def _request(req: dict) -> TtsRequest:
    return TtsRequest(
        text=req["text"],
        voice=req.get("speaker") if req["kind"] == "custom_voice" else None,
        language=req.get("language", "auto"),
        instructions=req.get("instruct") or "",
        text_streaming=not req.get("non_streaming_mode", True),
    )


XVEC_TOL = 1e-4  # x-vector and the rows with it: fp32 STFT, mel and convolutions in another order
ROW_TOL = 1e-5  # fp32, the same ops in another order: measured max |diff| ~1e-7


def _assert_rows_equal(model_dir: Path, requests: list[dict], run: OracleRun) -> None:
    builder = TtsPromptBuilder(model_dir)
    for i, req in enumerate(requests):
        rows = builder.rows(_request(req))
        ref = run.extras[i]
        assert builder.tokens(assistant_text(req["text"])) == ref["text_ids"].tolist(), i
        np.testing.assert_allclose(rows.prompt.numpy(), ref["inputs_embeds"], atol=ROW_TOL, rtol=0, err_msg=str(i))
        np.testing.assert_allclose(rows.steps.numpy(), ref["trailing_text_hidden"], atol=ROW_TOL, rtol=0)
        np.testing.assert_allclose(rows.pad.numpy(), ref["tts_pad_embed"][0], atol=ROW_TOL, rtol=0)


def test_prompt_rows_equal_the_reference_custom_voice(custom_voice: tuple[Path, OracleRun]) -> None:
    model_dir, run = custom_voice
    _assert_rows_equal(model_dir, CUSTOM_REQUESTS, run)


def test_prompt_rows_equal_the_reference_dialect_voice() -> None:
    require_reference()
    model_dir = build_tiny(TINY_SPECS["tiny-qwen3-tts-custom-voice"])
    requests = [
        {**VOICE, "speaker": "dylan", "language": "auto", "max_new_tokens": 3},
        {**VOICE, "speaker": "dylan", "language": "english", "max_new_tokens": 3},
    ]
    run = run_reference(model_dir, requests)
    _assert_rows_equal(model_dir, requests, run)
    assert not np.array_equal(run.extras[0]["inputs_embeds"][-20:], run.extras[1]["inputs_embeds"][-20:])


def test_unknown_voice_and_language_and_empty_text_are_named() -> None:
    builder = TtsPromptBuilder(build_tiny(TINY_SPECS["tiny-qwen3-tts-custom-voice"]))
    with pytest.raises(TtsPromptError, match="unknown voice 'nobody'"):
        builder.rows(TtsRequest(text="hi", voice="nobody"))
    with pytest.raises(TtsPromptError, match="unknown language 'klingon'"):
        builder.rows(TtsRequest(text="hi", voice="vivian", language="klingon"))
    with pytest.raises(TtsPromptError, match="empty"):
        builder.rows(TtsRequest(text="", voice="vivian"))


def test_clone_xvector_embedding_and_prompt_rows_equal_the_reference() -> None:
    """Base, x-vector cloning: our speaker encoder (transformers' ECAPA-TDNN with the checkpoint's
    weights, our log-mel) gives the reference's x-vector for a 24 kHz clip, and the prompt rows
    with it in the speaker slot are the reference's."""
    from omni_mp.models.qwen3_tts.speaker import SpeakerEncoder

    require_reference()
    model_dir = build_tiny(TINY_SPECS["tiny-qwen3-tts-base"])
    t = np.arange(24000 * 2) / 24000
    clip = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    req = {"kind": "clone_xvector", "text": "hello there, how are you?", "language": "english",
           "ref_audio": clip.tolist(), "max_new_tokens": 4}  # fmt: skip
    run = run_reference(model_dir, [req])
    assert run.report["errors"] == {}
    want = run.extras[0]["speaker_embedding"]
    got = SpeakerEncoder(model_dir).embed(torch.from_numpy(clip))
    assert float(np.abs(want).max()) > 0.01  # the x-vector is not trivially small
    np.testing.assert_allclose(got.numpy(), want, atol=XVEC_TOL, rtol=0)
    rows = TtsPromptBuilder(model_dir).rows(TtsRequest(text=req["text"], language="english", speaker_embedding=got))
    np.testing.assert_allclose(rows.prompt.numpy(), run.extras[0]["inputs_embeds"], atol=XVEC_TOL, rtol=0)


ICL_MODES = {  # in context: whole text; text streamed zipped with the clip's 26 codec rows,
    "whole-text": {},  # the text shorter (padded with T(tts_pad)) or longer (its excess fed per step)
    "streamed-short": {"non_streaming_mode": False},
    "streamed-long": {"non_streaming_mode": False, "text": "good morning to you, " * 4},
}


def test_clone_in_context_prompt_rows_equal_the_reference() -> None:
    """Base, in-context cloning: our codes of the clip are the reference's, and given them and its
    x-vector, our prompt and step rows (the clip's text and frames before the text: appended in the
    whole-text mode, zipped in the text-streaming mode) are the reference's."""
    require_reference()
    model_dir = build_tiny(TINY_SPECS["tiny-qwen3-tts-base"])
    t = np.arange(24000 * 2) / 24000
    clip = (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)
    req = {"kind": "clone_icl", "text": "good morning to you", "language": "auto", "ref_audio": clip.tolist(),
           "ref_text": "the quick brown fox", "max_new_tokens": 4}  # fmt: skip
    reqs = [req | mode for mode in ICL_MODES.values()]
    run = run_reference(model_dir, reqs)
    assert run.report["errors"] == {}
    ref = run.extras[0]
    assert ref["ref_codes"].shape == (25, NUM_CODE_GROUPS)  # 2 s at 12.5 Hz
    # our encode of the clip (transformers' MimiModel on the checkpoint's encoder weights) gives
    # the reference's codes, every one; and they are not constant (a real comparison)
    from omni_mp.models.qwen3_tts.clip_codes import ClipEncoder

    ours = ClipEncoder(model_dir).codes(torch.from_numpy(clip)).numpy()
    np.testing.assert_array_equal(ours, ref["ref_codes"])
    assert len(np.unique(ours)) > 16
    builder = TtsPromptBuilder(model_dir)
    for name, r, got in zip(ICL_MODES, reqs, run.extras, strict=True):
        rows = builder.rows(
            TtsRequest(
                text=r["text"],
                speaker_embedding=torch.from_numpy(got["speaker_embedding"]),
                ref_text=r["ref_text"],
                ref_codes=torch.from_numpy(got["ref_codes"]),
                text_streaming=not r.get("non_streaming_mode", True),
            )  # fmt: skip
        )
        assert rows.prompt.shape == got["inputs_embeds"].shape, name
        np.testing.assert_allclose(rows.prompt.numpy(), got["inputs_embeds"], atol=ROW_TOL, rtol=0, err_msg=name)
        np.testing.assert_allclose(rows.steps.numpy(), got["trailing_text_hidden"], atol=ROW_TOL, rtol=0)
    assert run.extras[2]["trailing_text_hidden"].shape[0] > 1  # the long text's excess is fed per step
