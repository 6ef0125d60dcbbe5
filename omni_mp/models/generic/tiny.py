"""Tiny, deterministic Hugging Face checkpoints built locally (nothing comes from a hub).

A checkpoint is a real transformers architecture at toy size with random weights drawn
from a seeded generator, plus a byte-level BPE tokenizer trained here on a built-in
corpus. It is saved with ``save_pretrained`` into omni_mp's checkpoint cache
(omni_mp.models.cache), built once and reused by every later caller, test process or stage
process. Nothing at run time imports this module: a stage config names a built-in model and
omni_mp.models.registry imports its builder only then.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from omni_mp.models.cache import build_cached

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


class TinyQwen2Spec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tiny Qwen2ForCausalLM. head_dim = hidden/heads must be 32/64/128 for vLLM's CPU attention."""

    seed: int = 0
    vocab_size: int = 320  # the tokenizer is trained to exactly this size: every id decodes
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    # Weights at the usual std 0.02 give near-uniform logits, hence near-ties between argmax
    # candidates; a larger std gives decisive greedy choices that an fp32 oracle can match.
    init_std: float = 0.15


# Built-in models, addressable by name from a stage config's `model:` field.
BUILTIN_SPECS: dict[str, TinyQwen2Spec] = {
    "tiny-qwen2": TinyQwen2Spec(seed=0),
    "tiny-qwen2-b": TinyQwen2Spec(seed=1),
    # ~100M parameters: per-step costs closer to a real model's, for benchmarks.
    "small-qwen2": TinyQwen2Spec(
        seed=2,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        init_std=0.05,
    ),
}

# A small multilingual-ish corpus: enough for byte-level BPE merges of common words.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Omni models listen, look, think and speak: text, audio and images in; text and speech out.",
    "A thinker writes the reply; a talker turns it into codec tokens; a vocoder makes the wave.",
    "Hello world! How are you today? I am fine, thank you.",
    "Stages stream tensors to each other over sockets, one process per stage.",
    "def add(a, b):\n    return a + b\n",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828",
    "Bonjour le monde. Hallo Welt. Hola mundo. Ciao mondo.",
    "user: tell me a story about a robot who learned to sing.",
    "assistant: once upon a time, a small robot listened to the birds every morning.",
]


def _corpus() -> Iterator[str]:
    for i in range(40):
        for line in _CORPUS:
            yield line if i % 2 == 0 else line.lower()


def build_tokenizer(vocab_size: int, out_dir: Path) -> int:
    """Train a byte-level BPE tokenizer locally and save it; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=4096,
    )
    fast.save_pretrained(out_dir)
    return len(fast)


def init_weights(model: Any, seed: int, std: float) -> None:
    """Deterministic init independent of transformers' own init order: normal(0, std) for
    matrices, ones for norm weights, zeros for biases."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.ndim == 1:
                p.fill_(1.0 if "norm" in name else 0.0)
            else:
                p.normal_(0.0, std, generator=gen)


def _build_qwen2(spec: TinyQwen2Spec, out_dir: Path) -> None:
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    n_tok = build_tokenizer(spec.vocab_size, out_dir)
    if n_tok != spec.vocab_size:
        raise ValueError(f"tokenizer trained to {n_tok} tokens, spec asks for vocab_size {spec.vocab_size}")
    eos_id = SPECIAL_TOKENS.index("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        torch_dtype="float32",
        initializer_range=spec.init_std,
    )
    model = Qwen2ForCausalLM(config).eval()
    init_weights(model, spec.seed, spec.init_std)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id)
    model.save_pretrained(out_dir, safe_serialization=True)


def build_tiny_model(spec: TinyQwen2Spec, cache_dir: Path | None = None, *, verbose: bool = True) -> Path:
    """Return the dir of the checkpoint for `spec`, building it once (process- and thread-safe)."""
    return build_cached("qwen2", spec, lambda out: _build_qwen2(spec, out), cache_dir=cache_dir, verbose=verbose)


def build_named(name: str) -> Path:
    """The checkpoint dir of the built-in spec `name` (a key of BUILTIN_SPECS), built once."""
    return build_tiny_model(BUILTIN_SPECS[name])
