"""Process lifetime helpers: children die with their parent, even when it is SIGKILLed."""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

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


def exit_now(code: int) -> None:
    """End a process whose work is done and whose resources are released (sockets closed, files
    written): flush logs and standard streams, then exit without the interpreter's finalization.
    Measured on a stage process after a clean shutdown: 3-8 s of third-party exit work (atexit
    hooks importing Ray, native thread pools winding down) that releases nothing the OS does not."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class _Spawner:
    """Starts child processes from one thread that lives as long as this process.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process:
    a stage started from a short-lived thread of an embedding service (a request handler,
    an executor worker) would be SIGKILLed as soon as that thread ends. Forking from this
    thread instead keeps "dies with its parent" meaning the parent process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            job, fut = self._jobs.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(job())
                except BaseException as err:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(err)

    def call(self, job: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="omni-mp-spawner", daemon=True)
                self._thread.start()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        if threading.current_thread() is self._thread:
            return job()
        self._jobs.put((job, fut))
        return fut.result()


_SPAWNER = _Spawner()


def popen(cmd: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """subprocess.Popen, forked from the process-lifetime spawner thread (see _Spawner)."""
    return _SPAWNER.call(lambda: subprocess.Popen(cmd, **kwargs))
