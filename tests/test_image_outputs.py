"""Image outputs on their own: the coordinator's per-request final image (`FinalImage`), the
image in `Finished` and in chunks through the real codec to the torch-free client helpers,
and PNG files (decoded back by Pillow, pixel for pixel)."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from PIL import Image

from omni_mp.media.image_io import png_bytes, write_png
from omni_mp.stage_configs import CONFIG_DIR
from omni_mp.wire.codec import NUMPY_ARRAYS, Limits, PayloadError, decode, encode
from omni_mp.wire.messages import IMAGE_KEY, IMAGE_STEP_KEY, Finished, StageOutputChunk, StageResult
from omni_mp.wire.outputs import FinalImage, ImageChunk, final_image, image_info
from omni_mp.wire.outputs import chunk_image as _chunk_image


def _pixels(h: int = 24, w: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_final_image_keeps_the_final_one_and_passes_over_previews() -> None:
    final = FinalImage(max_bytes=1 << 20)
    preview, last = _pixels(seed=1), _pixels(seed=2)
    final.add(image_info(preview, preview_step=5))
    assert final.pixels is None
    final.add({"audio": torch.zeros(3)})  # no image: nothing to keep
    final.add(image_info(last))
    assert final.pixels is not None and torch.equal(final.pixels, last)
    last.zero_()  # the kept image is a copy (a received tensor views its message's buffer)
    assert not torch.equal(final.pixels, last)


def test_final_image_refuses_a_second_final_image_and_oversize_and_malformed_ones() -> None:
    final = FinalImage(max_bytes=24 * 40 * 3)
    final.add(image_info(_pixels()))
    with pytest.raises(ValueError, match="second final image"):
        final.add(image_info(_pixels()))
    with pytest.raises(ValueError, match="exceeds max_tensor_bytes"):
        FinalImage(max_bytes=24 * 40 * 3 - 1).add(image_info(_pixels()))
    for bad in (torch.zeros(4, 4, 3), torch.zeros(4, 4, dtype=torch.uint8), torch.zeros(4, 4, 4, dtype=torch.uint8)):
        with pytest.raises(ValueError, match="uint8"):
            FinalImage(1 << 20).add({IMAGE_KEY: bad})
    with pytest.raises(ValueError, match="image_step"):
        FinalImage(1 << 20).add({IMAGE_KEY: _pixels(), IMAGE_STEP_KEY: -1})


def _through_the_wire(msg: object) -> object:
    limits = Limits()
    frames = [bytes(f) for f in encode(msg, limits)]  # type: ignore[arg-type]
    return decode(frames, limits, arrays=NUMPY_ARRAYS)


def test_the_image_reaches_the_client_as_numpy_uint8_hw3() -> None:
    pixels = _pixels(17, 33, seed=3)
    done = Finished(
        request_id="r1",
        outputs=[StageResult(stage_id=0, text="x"), StageResult(stage_id=1, image=pixels)],
        stage_timings=[],
        t_submit=0.0,
        t_finished=1.0,
    )
    got = _through_the_wire(done)
    assert isinstance(got, Finished)
    image = final_image(got)
    assert isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.shape == (17, 33, 3)
    assert np.array_equal(image, pixels.numpy())
    text_only = Finished(request_id="r2", outputs=[StageResult(stage_id=0)], stage_timings=[], t_submit=0, t_finished=0)
    with pytest.raises(ValueError, match="no final stage returned an image"):
        final_image(text_only)


def test_previews_and_the_final_image_in_chunks() -> None:
    pixels = _pixels(seed=4)
    preview = _through_the_wire(
        StageOutputChunk(request_id="r", stage_id=1, additional_information=image_info(pixels, preview_step=10))
    )
    assert isinstance(preview, StageOutputChunk)
    got = _chunk_image(preview)
    assert isinstance(got, ImageChunk) and got.step == 10 and np.array_equal(got.pixels, pixels.numpy())
    final = _chunk_image(StageOutputChunk(request_id="r", stage_id=1, additional_information=image_info(pixels)))
    assert final is not None and final.step is None
    assert _chunk_image(StageOutputChunk(request_id="r", stage_id=1, token_ids=[1])) is None
    with pytest.raises(ValueError, match="uint8"):
        _chunk_image(StageOutputChunk(request_id="r", stage_id=1, additional_information={IMAGE_KEY: np.zeros(3)}))


def test_an_image_over_the_tensor_limit_does_not_travel() -> None:
    limits = Limits(max_tensor_bytes=24 * 40 * 3 - 1)
    done = Finished(
        request_id="r", outputs=[StageResult(stage_id=1, image=_pixels())], stage_timings=[], t_submit=0, t_finished=0
    )
    with pytest.raises(PayloadError):
        encode(done, limits)


def test_png_files_hold_the_exact_pixels(tmp_path) -> None:
    pixels = _pixels(31, 17, seed=5)
    decoded = np.asarray(Image.open(io.BytesIO(png_bytes(pixels))))
    assert decoded.shape == (31, 17, 3) and np.array_equal(decoded, pixels.numpy())
    write_png(tmp_path / "x.png", pixels.numpy())
    with Image.open(tmp_path / "x.png") as im:
        assert im.format == "PNG" and im.size == (17, 31) and np.array_equal(np.asarray(im), pixels.numpy())
    for bad in (np.zeros((4, 4), np.uint8), np.zeros((4, 4, 3), np.float32), np.zeros((0, 4, 3), np.uint8)):
        with pytest.raises(ValueError, match="uint8"):
            png_bytes(bad)


def test_cli_image_flags_on_a_pipeline_without_images_exit_2_before_any_stage_starts() -> None:
    import subprocess
    import sys

    from tests.launcher import REPO

    cmd = [sys.executable, "-m", "omni_mp.launch", "--config", str(CONFIG_DIR / "tiny_chain.yaml"),
           "--prompt", "x", "--size", "64x48", "--seed", "3"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--size, --seed: pipeline 'tiny_chain' makes no images" in proc.stderr


def test_request_params_are_checked_by_the_client_naming_the_entry() -> None:
    from omni_mp.client.args import request_params

    assert request_params(None) is None
    got = request_params({"seed": np.int64(3), "true_cfg_scale": np.float32(4.0), "negative_prompt": " ", "x": None})
    assert got == {"seed": 3, "true_cfg_scale": 4.0, "negative_prompt": " ", "x": None}
    assert type(got["seed"]) is int  # numpy scalars travel as plain numbers
    for bad, where in (
        ({"seed": [1]}, "params['seed']"),
        ({"a" * 65: 1}, "params['aaaa"),
        ({"f": float("inf")}, "params['f']"),
        ({str(i): i for i in range(2000)}, "params"),
        ("height=64", "params"),
    ):
        with pytest.raises(ValueError, match=re.escape(where)):
            request_params(bad)  # type: ignore[arg-type]
