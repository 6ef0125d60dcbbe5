"""`python -m tests.gpu.mps_owner`: a process that starts an MPS daemon (omni_mp.control.mps.MpsDaemon,
what the coordinator does) and a CUDA client on it, prints {"pipe", "client", "clients"} as
one JSON line, and waits to be SIGKILLed (tests/gpu/test_mps.py kills it); and `daemon_clients`,
what a daemon says of its clients."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def daemon_clients(pipe: str) -> list[int]:
    """PIDs of the clients of every server the daemon at `pipe` runs."""
    from omni_mp.control.mps import PIPE_ENV, control_program

    env = {**os.environ, PIPE_ENV: pipe}

    def ask(command: str) -> list[int]:
        out = subprocess.run([control_program()], input=command.encode(), env=env, capture_output=True, timeout=30)
        return [int(tok) for tok in out.stdout.split() if tok.isdigit()]

    return [pid for server in ask("get_server_list\n") for pid in ask(f"get_client_list {server}\n")]


def main() -> int:
    from omni_mp.control.mps import PIPE_ENV, MpsDaemon

    daemon = MpsDaemon.start(Path(tempfile.gettempdir()) / "mps_check_guard.log")
    code = "import torch, sys, time; torch.ones(1, device='cuda'); print('client up', flush=True); time.sleep(600)"
    preexec = None
    if sys.platform.startswith("linux"):
        import ctypes

        def preexec() -> None:  # dies with this process, as stage processes do (omni_mp.utils.procs)
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL, 0, 0, 0)

    client = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, PIPE_ENV: daemon.pipe}, stdout=subprocess.PIPE,
        preexec_fn=preexec,
    )  # fmt: skip
    assert client.stdout is not None
    client.stdout.readline()
    print(json.dumps({"pipe": daemon.pipe, "client": client.pid, "clients": daemon_clients(daemon.pipe)}), flush=True)
    time.sleep(600)
    return 1


if __name__ == "__main__":
    sys.exit(main())
