"""The Qwen2.5-Omni model dir that every system of benchmarks/omni_gpu.py runs (omni_mp,
transformers, vllm-omni via benchmarks/peer_vllm_omni.py): the config-only checkpoint of
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
    layout: int = 2  # bumped when what is written here changes


def _byte_level_bpe() -> object:
    """A byte-level BPE with REGULAR_TOKENS tokens and SPECIAL_TOKENS after them."""
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
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
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
    # The released checkpoint also has the legacy one-file form (feature extractor and image
    # processor settings in one preprocessor_config.json), which older loaders read.
    legacy = {**Qwen2VLImageProcessor().to_dict(), **WhisperFeatureExtractor(feature_size=128).to_dict()}
    legacy["processor_class"] = "Qwen2_5OmniProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(legacy, indent=2, sort_keys=True, default=str))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def with_processor(shapes_dir: Path) -> Path:
    """`shapes_dir`'s files plus tokenizer and processor files, in a cached sibling dir."""
    from omni_mp.models.cache import build_cached

    def build(out: Path) -> None:
        _write_processor(out)
        for f in sorted(shapes_dir.iterdir()):  # after: the shapes dir's config.json wins
            if f.is_file():
                if (out / f.name).exists():
                    (out / f.name).unlink()
                _link_or_copy(f, out / f.name)

    spec = BenchDirSpec(shapes=shapes_dir.name)
    return build_cached("qwen2_5_omni-bench", spec, build, cache_dir=shapes_dir.parent)
