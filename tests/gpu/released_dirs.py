"""`python -m tests.gpu.released_dirs NAME`: the random-weight checkpoint dir at the released shapes
that the shipped config NAME (qwen2_5_omni, qwen3_omni, qwen_image) is tested on, written by the
project's own code (benchmarks.common) where it is not there yet; prints its path last. In a
process of its own: building the Qwen-Image dir on the GPU leaves no CUDA memory behind in the
test's process. The dirs are the benchmarks' (the same default work dirs), so a host that ran a
benchmark reuses them."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

TMP = Path(tempfile.gettempdir())


def released_dir(name: str) -> Path:
    if name == "qwen2_5_omni":  # benchmarks.omni_gpu's: the 7B shapes, tokenizer and processor
        from benchmarks.common.checkpoints import qwen2_5_omni_dir

        return qwen2_5_omni_dir(TMP / "omni_gpu-models")
    if name == "qwen3_omni":  # benchmarks.qwen3_omni_gpu's, with the processor files vllm-omni also reads
        from benchmarks.common.checkpoints import qwen3_omni_processor_dir

        return qwen3_omni_processor_dir(TMP / "qwen3_omni_gpu")
    if name == "qwen_image":  # benchmarks.image_gpu's (~42 GB: the DiT's and the VAE's tensors)
        from benchmarks.common.qwen_image_dir import build_qwen_image_dir

        path = TMP / "image_gpu-models" / "qwen_image_real"
        build_qwen_image_dir(path)
        return path
    raise ValueError(f"no released-shape checkpoint for {name!r}")


if __name__ == "__main__":
    print(released_dir(sys.argv[1]), flush=True)
