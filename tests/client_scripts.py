"""Running the stock clients' scripts (tests/clients/NAME.py) in the clients' own virtualenv
(LiveKit Agents and pipecat pin packages of their own; scripts/setup.sh builds it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.launcher import REPO

CLIENTS_PY = Path(os.environ.get("OMNI_MP_CLIENTS_VENV", REPO / ".venv-clients")) / "bin" / "python"


def client_script(name: str, *args: str) -> dict[str, Any]:
    """Run tests/clients/NAME.py with `args` (the last: its OUT.json) and return what it wrote;
    `pcm`: the int16 samples of OUT.json.pcm where the script writes audio."""
    if not CLIENTS_PY.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{CLIENTS_PY} is missing: scripts/setup.sh builds it")
        pytest.skip(f"{CLIENTS_PY} is missing (scripts/setup.sh builds it)")
    out = Path(args[-1])
    proc = subprocess.run([str(CLIENTS_PY), str(REPO / "tests" / "clients" / f"{name}.py"), *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    info: dict[str, Any] = json.loads(out.read_text())
    pcm = Path(f"{out}.pcm")
    if pcm.is_file():
        info["pcm"] = np.frombuffer(pcm.read_bytes(), dtype="<i2")
    return info
