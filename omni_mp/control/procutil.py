"""Process lifetime helpers: children die with their parent, even when it is SIGKILLed."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """Make this process exit when `parent_pid` goes away.

    Linux: PR_SET_PDEATHSIG delivers SIGKILL when the parent dies (checked against a race
    where the parent died before the call). Everywhere: a daemon thread that watches
    getppid(), as a fallback.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:
            pass
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
