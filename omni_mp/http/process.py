"""The HTTP server as a child process of the launcher: started once the pipeline serves,
stopped (SIGTERM, then SIGKILL) with it; it also exits if the launcher dies. The launcher
owns the server's private directory (omni_mp.http.workers), so it is removed however the
server ended."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from omni_mp.http.__main__ import API_KEY_ENV, parse_listen

STOP_TIMEOUT_S = 15.0


def start_http(config: Path, endpoint: str, listen: str, api_key: str | None) -> subprocess.Popen[bytes]:
    """`python -m omni_mp.http` for the pipeline serving on `endpoint`; ValueError if `listen`
    is not HOST:PORT. Its output goes to the launcher's."""
    from omni_mp.utils.procs import popen

    parse_listen(listen)
    env = dict(os.environ)
    if api_key is not None:
        env[API_KEY_ENV] = api_key
    cmd = [sys.executable, "-m", "omni_mp.http", "--config", str(config), "--endpoint", endpoint]
    shared = tempfile.mkdtemp(prefix="omni_mp_http_")
    cmd += ["--listen", listen, "--parent-pid", str(os.getpid()), "--shared-dir", shared]
    proc = popen(cmd, env=env)
    _SHARED[proc.pid] = shared
    return proc


_SHARED: dict[int, str] = {}  # the private directory of each server this process started


def stop_http(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # uvicorn: finish what it can, close connections
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(_SHARED.pop(proc.pid, ""), ignore_errors=True)
