"""The guard of a pipeline's private MPS daemon (omni_mp.control.mps): runs
`nvidia-cuda-mps-control -f` with its pipe and log directories under `--root`, prints `ready`
once the daemon takes clients, then waits for its standard input to close (the coordinator
shut down or died) or for SIGTERM / SIGINT, and then quits the daemon and removes `--root`.

    python -m omni_mp.control.mps_guard --root DIR --control /usr/bin/nvidia-cuda-mps-control
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from types import FrameType

from omni_mp.control.mps import LOG_ENV, PIPE_ENV, READY_LINE, send_quit

READY_S = 20.0  # for the daemon's control socket to appear
QUIT_S = 15.0  # for `quit` to end the daemon (its server waits for clients to detach)


class _Stop(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def daemon_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[PIPE_ENV], env[LOG_ENV] = str(root / "pipe"), str(root / "log")
    # Without it the server sees every GPU under its own index, so a client's
    # CUDA_VISIBLE_DEVICES means what it means without MPS; set, the server would renumber the
    # devices it lists and a client's entries would point elsewhere. A client gets the
    # caller's entries for its stage's `devices` (omni_mp.utils.devices), never the bare indices.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _log_tail(root: Path, n: int = 5) -> str:
    try:
        with open(root / "log" / "control.log", errors="replace") as fh:
            return " | ".join(line.strip() for line in deque(fh, maxlen=n))
    except OSError:
        return "no control.log"


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _quit(control: str, env: dict[str, str], daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is not None:
        return
    failed = send_quit(control, env, QUIT_S)
    if failed is None:
        try:
            daemon.wait(QUIT_S)
            return
        except subprocess.TimeoutExpired:
            failed = f"it did not quit within {QUIT_S:.0f}s"
    print(f"mps_guard: {failed}; killing the daemon", file=sys.stderr)
    daemon.kill()
    daemon.wait(QUIT_S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--control", required=True)
    args = p.parse_args(argv)
    root: Path = args.root
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    env = daemon_env(root)
    (root / "pipe").mkdir(parents=True, exist_ok=True)
    (root / "log").mkdir(parents=True, exist_ok=True)
    daemon: subprocess.Popen[bytes] | None = None
    try:
        try:
            # Its own session: a terminal's Ctrl-C reaches the guard, which quits it in order.
            daemon = subprocess.Popen(
                [args.control, "-f"], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as err:
            _say(f"cannot run {args.control}: {err}")
            return 1
        deadline = time.monotonic() + READY_S
        while not (root / "pipe" / "control").exists():
            code = daemon.poll()
            if code is not None:
                _say(f"{args.control} -f exited with code {code} ({_log_tail(root)})")
                return 1
            if time.monotonic() > deadline:
                _say(f"no control socket after {READY_S:.0f}s ({_log_tail(root)})")
                return 1
            time.sleep(0.05)
        _say(READY_LINE)
        while sys.stdin.buffer.read(4096):  # until the coordinator closes it, or is gone
            pass
        return 0
    except _Stop:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up below must not be cut short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if daemon is not None:
            _quit(args.control, env, daemon)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
