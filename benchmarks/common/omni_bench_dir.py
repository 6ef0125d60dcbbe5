"""The Qwen2.5-Omni model dir that every system of benchmarks.omni_gpu runs (omni_mp,
transformers, vllm-omni via benchmarks.peer_vllm_omni): the config-only checkpoint of
omni_mp/models/qwen2_5_omni/shapes.py (its config.json, random token2wav tensors, spk_dict.pt,
generation_config.json, hard-linked or copied, byte-identical) plus what a text tokenizer and
processor need, which shapes.py does not write (omni_mp's thinker starts with
`skip_tokenizer_init`; vllm-omni's stages load the tokenizer and the thinker's processor):

- `tokenizer.json` / `tokenizer_config.json`: a byte-level BPE built here (nothing downloaded)
  with Qwen2.5's layout: 151643 regular tokens (the 256 byte symbols, then every pair, then
  triples), then the released tokenizer's 22 special tokens at their ids 151643..151664
  (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<|AUDIO|>` = 151646, ...,
  `<|vision_bos|>` = 151652, `<|IMAGE|>` = 151655, `<|VIDEO|>` = 151656, ...), so every special
  id in config.json names the same token as in the released checkpoint. The merges are
  synthetic: the ids a text maps to are not Qwen2.5's, which no benchmark here depends on
  (prompts go in as token ids).
- `preprocessor_config.json`, `processor_config.json`, `chat_template.jinja`:
  `Qwen2_5OmniProcessor` with Whisper features at 128 mel bins and Qwen2-VL image/video
  processors, as the released checkpoint's.

Cached next to the shapes dir (omni_mp.models.cache), keyed by the shapes dir's name.

Qwen3-Omni (`with_processor(dir, "qwen3_omni")`, for benchmarks.qwen3_omni_gpu's released dir and
vllm-omni's Qwen3-Omni pipeline): the same byte-level BPE of 151643 regular tokens with the
released Qwen3-Omni tokenizer's 33 special tokens at their ids 151643..151675 (`<|im_start|>` =
151644, `<|vision_start|>` = 151652, `<|image_pad|>` = 151655, `<|audio_start|>` = 151669,
`<tts_pad>` = 151671, `<|audio_pad|>` = 151675, ...: the ids of
omni_mp.models.qwen3_omni.tiny.RELEASED_TOKEN_IDS), and the processor, chat template and named
tokens that the tiny Qwen3-Omni checkpoint saves (tiny._save_processor: Qwen3OmniMoeProcessor,
Whisper features at 128 mel bins, Qwen2-VL image/video processors at patch 16).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import msgspec

# The released Qwen2.5-Omni tokenizer's special tokens, in id order from 151643.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
# The released Qwen3-Omni tokenizer's special tokens, in id order from 151643: Qwen3's, then
# the audio and TTS tokens of Qwen3-Omni.
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
REGULAR_TOKENS = 151643
NAMED_TOKENS = {
    "audio_token": "<|AUDIO|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}


class BenchDirSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    shapes: str  # the shapes dir's name (its cache key)
    layout: int = 3  # bumped when what is written here changes


def _byte_level_bpe(specials: tuple[str, ...] = SPECIAL_TOKENS) -> object:
    """A byte-level BPE with REGULAR_TOKENS tokens and `specials` after them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab: dict[str, int] = {s: i for i, s in enumerate(symbols)}
    merges: list[tuple[str, str]] = []

    def add(a: str, b: str) -> bool:
        if len(vocab) == REGULAR_TOKENS:
            return False
        vocab[a + b] = len(vocab)
        merges.append((a, b))
        return True

    pairs = [a + b for a in symbols for b in symbols]
    for a in symbols:
        for b in symbols:
            add(a, b)
    for ab in pairs:
        if not all(add(ab, c) for c in symbols):
            break
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def _write_processor(out: Path) -> None:
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5OmniProcessor,
        Qwen2Tokenizer,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
        WhisperFeatureExtractor,
    )

    from omni_mp.models.qwen2_5_omni.prompt import CHAT_TEMPLATE

    PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_bpe(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
    ).save_pretrained(out)
    tok = Qwen2Tokenizer.from_pretrained(
        out, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=32768, **NAMED_TOKENS
    )
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.convert_tokens_to_ids(t) != REGULAR_TOKENS + i:
            raise RuntimeError(f"tokenizer put {t} at {tok.convert_tokens_to_ids(t)}, not {REGULAR_TOKENS + i}")
    Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(),
        video_processor=Qwen2VLVideoProcessor(),
        feature_extractor=WhisperFeatureExtractor(feature_size=128),
        tokenizer=tok,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(out)
    _write_legacy(out, "Qwen2_5OmniProcessor", {})


def _write_legacy(out: Path, processor_class: str, image_kwargs: dict[str, int]) -> None:
    """The released checkpoints also have the legacy one-file form (feature extractor and image
    processor settings in one preprocessor_config.json), which older loaders read."""
    from transformers import Qwen2VLImageProcessor, WhisperFeatureExtractor

    legacy = {**Qwen2VLImageProcessor(**image_kwargs).to_dict(), **WhisperFeatureExtractor(feature_size=128).to_dict()}
    legacy["processor_class"] = processor_class
    (out / "preprocessor_config.json").write_text(json.dumps(legacy, indent=2, sort_keys=True, default=str))


def _write_qwen3_processor(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    from omni_mp.models.qwen3_omni.chat_template import NAMED_TOKENS
    from omni_mp.models.qwen3_omni.tiny import RELEASED_TOKEN_IDS, _save_processor

    kwargs = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "model_max_length": 65536}
    PreTrainedTokenizerFast(tokenizer_object=_byte_level_bpe(QWEN3_SPECIAL_TOKENS), **kwargs).save_pretrained(out)
    tok = Qwen2Tokenizer.from_pretrained(out, **kwargs, **NAMED_TOKENS)
    for i, t in enumerate(QWEN3_SPECIAL_TOKENS):
        if tok.convert_tokens_to_ids(t) != REGULAR_TOKENS + i:
            raise RuntimeError(f"tokenizer put {t} at {tok.convert_tokens_to_ids(t)}, not {REGULAR_TOKENS + i}")
    named = {  # config ids (tiny.RELEASED_TOKEN_IDS) -> the token each names in the released tokenizer
        "audio_token_id": "<|audio_pad|>", "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
        "audio_start_token_id": "<|audio_start|>", "vision_start_token_id": "<|vision_start|>",
        "im_start_token_id": "<|im_start|>", "im_end_token_id": "<|im_end|>", "tts_pad_token_id": "<tts_pad>",
        "tts_bos_token_id": "<tts_text_bos>", "tts_eos_token_id": "<tts_text_eod>",
    }  # fmt: skip
    for key, t in named.items():
        if tok.convert_tokens_to_ids(t) != RELEASED_TOKEN_IDS[key]:
            raise RuntimeError(f"{t} is {tok.convert_tokens_to_ids(t)}, the config's {key} {RELEASED_TOKEN_IDS[key]}")
    _save_processor(tok, out)  # the tiny checkpoint's processor and chat template, with this tokenizer
    _write_legacy(out, "Qwen3OmniMoeProcessor", {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2})


def _qwen3_role_ids(out: Path) -> None:
    """The config's role ids (system / user / assistant: the token after `<|im_start|>`, which
    the talker reads to find the turns) as this byte-level tokenizer writes them: it has no
    single tokens for those words at the released ids (8948, 872, 77091), so their first token
    stands for them. A new config.json: the linked one is the shapes dir's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    ids = {f"{role}_token_id": tok(f"<|im_start|>{role}\n").input_ids[1] for role in ("system", "user", "assistant")}
    if len(set(ids.values())) != 3:
        raise RuntimeError(f"the roles' first tokens collide: {ids}")
    config = json.loads((out / "config.json").read_text())
    config.update(ids)
    if "thinker_config" in config:
        config["thinker_config"]["user_token_id"] = ids["user_token_id"]
    (out / "config.json").unlink()
    (out / "config.json").write_text(json.dumps(config, indent=1))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def with_processor(shapes_dir: Path, family: str = "qwen2_5_omni") -> Path:
    """`shapes_dir`'s files plus tokenizer and processor files (of `family`: qwen2_5_omni or
    qwen3_omni), in a cached sibling dir."""
    from omni_mp.models.cache import build_cached

    write = {"qwen2_5_omni": _write_processor, "qwen3_omni": _write_qwen3_processor}[family]

    def build(out: Path) -> None:
        write(out)
        for f in sorted(shapes_dir.iterdir()):  # after: the shapes dir's config.json wins
            if f.is_file():
                if (out / f.name).exists():
                    (out / f.name).unlink()
                _link_or_copy(f, out / f.name)
        if family == "qwen3_omni":
            _qwen3_role_ids(out)

    spec = BenchDirSpec(shapes=shapes_dir.name)
    return build_cached(f"{family}-bench", spec, build, cache_dir=shapes_dir.parent)
