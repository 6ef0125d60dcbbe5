"""vllm-omni as a peer, installed in a directory of its own (`--peer-site`, never the project's
environment): what every peer runner needs of that install (benchmarks.peer_vllm_omni,
benchmarks.peer_tts_serve)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

PEER_DIR = Path(__file__).resolve().parents[1] / "peer"  # our overlays of vllm-omni's deploy configs


def copy_overlays(base_yaml: str, overlays: list[str], peer_site: Path, run_dir: Path) -> dict[str, str]:
    """The installed package's deploy/`base_yaml` and our `overlays` (benchmarks/peer/) copied into
    run_dir, where vllm-omni resolves an overlay's base_config; returns each file's sha256."""
    base = peer_site / "vllm_omni" / "deploy" / base_yaml
    if not base.is_file():
        raise FileNotFoundError(f"{base} missing: is vllm-omni installed in --peer-site {peer_site}?")
    run_dir.mkdir(parents=True, exist_ok=True)
    shas = {}
    for src in [base, *(PEER_DIR / name for name in overlays)]:
        shutil.copyfile(src, run_dir / src.name)
        shas[src.name] = hashlib.sha256(src.read_bytes()).hexdigest()
    return shas


def installed_version(peer_site: Path) -> str:
    found = sorted(peer_site.glob("vllm_omni-*.dist-info"))
    return found[-1].name.removeprefix("vllm_omni-").removesuffix(".dist-info") if found else "not installed"


def child_env(peer_site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("VLLM_PLUGINS", None)  # vllm-omni needs its own vLLM plugin (model registration)
    env["PYTHONPATH"] = os.pathsep.join([str(peer_site), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    return env
