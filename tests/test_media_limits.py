"""Media limits are the model's: an entry stage takes at most the audio its checkpoint's
processor takes whole (longer is refused with both lengths, never cut), by default exactly that."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from transformers import WhisperFeatureExtractor

from omni_mp.config.schema import MediaLimits, PipelineConfig
from omni_mp.config.validate import load_config
from omni_mp.media.limits import MediaError, check_media_sizes, resolve_media_limits, stage_media_limits
from omni_mp.models.registry import prompt_format, resolve_model
from omni_mp.stage_configs import CONFIG_DIR

REPO = Path(__file__).resolve().parent.parent
CONFIG = CONFIG_DIR / "tiny_qwen2_5_omni.yaml"


def window_s(model_dir: str | Path) -> float:
    """The oracle: transformers' own feature extractor of the checkpoint."""
    fe = WhisperFeatureExtractor.from_pretrained(model_dir)
    return fe.n_samples / fe.sampling_rate


def tiny_omni(max_audio_s: float | None = None) -> PipelineConfig:
    cfg = load_config(CONFIG, check_engine_args=False)
    entry = cfg.stages[0]
    media = msgspec.structs.replace(entry.media, max_audio_s=max_audio_s)
    return msgspec.structs.replace(cfg, stages=[msgspec.structs.replace(entry, media=media), *cfg.stages[1:]])


def test_the_qwen_prompt_format_reads_the_feature_extractors_window(tmp_path: Path) -> None:
    fmt = prompt_format("qwen2_5_omni")
    built = resolve_model("tiny-qwen2_5-omni")  # transformers 5 layout: processor_config.json
    assert fmt.max_audio_s(built) == window_s(built)
    # Hugging Face's layout (preprocessor_config.json), with a window other than the default.
    WhisperFeatureExtractor(feature_size=128, chunk_length=12).save_pretrained(tmp_path)
    assert (tmp_path / "preprocessor_config.json").is_file()
    assert fmt.max_audio_s(str(tmp_path)) == window_s(tmp_path) == 12


def test_max_audio_s_defaults_to_the_checkpoints_and_may_not_exceed_it() -> None:
    model_s = window_s(resolve_model("tiny-qwen2_5-omni"))
    resolved = resolve_media_limits(tiny_omni())
    assert resolved.stages[0].media.max_audio_s == model_s
    assert resolved.stages[1:] == tiny_omni().stages[1:]  # only entry stages have media limits
    assert stage_media_limits(tiny_omni(model_s / 2).stages[0]).max_audio_s == model_s / 2
    with pytest.raises(ValueError) as err:
        resolve_media_limits(tiny_omni(model_s * 10))
    assert f"{model_s * 10:g} s" in str(err.value) and f"at most {model_s:g} s" in str(err.value)


def test_audio_past_the_limit_is_refused_with_both_lengths() -> None:
    limits = stage_media_limits(tiny_omni().stages[0])
    assert limits.max_audio_s is not None
    rate = 44_100
    whole = int(limits.max_audio_s * rate)
    check_media_sizes(0, limits, [(whole, rate)], [])  # exactly the window: taken
    with pytest.raises(MediaError) as err:
        check_media_sizes(0, limits, [(whole, rate), (whole + rate, rate)], [])
    message = str(err.value)
    assert message.startswith("audios[1]: ") and "max_audio_s" in message
    assert f"{(whole + rate) / rate:.2f} s of audio" in message and f"at most {limits.max_audio_s:g} s" in message


@pytest.mark.parametrize(
    ("audios", "images", "message"),
    [
        ([(16_000, 16_000)] * 5, [], "5 audios: stage 3 takes at most 4"),
        ([], [(2, 2)] * 5, "5 images: stage 3 takes at most 4"),
        ([], [(4097, 4096)], "images[0]: 4097x4096 pixels > max_image_pixels=16777216"),
    ],
)
def test_counts_and_pixels_are_checked(
    audios: list[tuple[int, int]], images: list[tuple[int, int]], message: str
) -> None:
    limits = MediaLimits(max_audios=4, max_images=4, max_audio_s=30.0, max_image_pixels=4096 * 4096)
    with pytest.raises(MediaError) as err:
        check_media_sizes(3, limits, audios, images)
    assert str(err.value) == message
