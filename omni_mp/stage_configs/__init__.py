"""The pipeline configs omni_mp ships (package data: present after `pip install`, not only in a
source checkout). `--config` takes a path or one of these names (`tiny_qwen3_omni`, or with
`.yaml`): tiny_* run on CPU with tiny random checkpoints built locally; the others serve the
released models on GPUs."""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT = "tiny_qwen2_5_omni"  # the demo's: Qwen2.5-Omni's three stages, tiny, on CPU


def shipped() -> list[str]:
    """The names of the shipped configs, sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def shipped_config(name: str) -> Path:
    """The file of a shipped config by name (with or without `.yaml`); ValueError listing them."""
    stem = name.removesuffix(".yaml")
    path = CONFIG_DIR / f"{stem}.yaml"
    if "/" in stem or not path.is_file():
        raise ValueError(f"no shipped config {name!r}; shipped: {shipped()}")
    return path


def resolve_config(spec: str | Path) -> Path:
    """`--config`'s value: an existing file as given, else a shipped config's name."""
    path = Path(spec)
    if path.is_file():
        return path
    if path.parent == Path(".") or path.parent == CONFIG_DIR:
        try:
            return shipped_config(path.name)
        except ValueError:
            pass
    raise ValueError(f"config {str(spec)!r}: no such file, and no shipped config of that name; shipped: {shipped()}")
