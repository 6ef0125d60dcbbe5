"""Qwen-Image (text encoder -> DiT): everything omni_mp knows of this family.

- `params`: `ImageParams`, what a client asks of one image (passed in `Submit.params`).
"""

from omni_mp.models.qwen_image.params import ImageParams, parse_params

__all__ = ["ImageParams", "parse_params"]
