"""ZMQ endpoint names for one pipeline run.

`ipc` endpoints live in Linux's abstract socket namespace (`ipc://@name`): they vanish with
the last process that holds them, so no crash, not even a SIGKILL of everything, leaves a
socket file behind. `tcp` endpoints bind port 0 and the bound address is reported back.
"""

from __future__ import annotations

import os
import secrets
import sys

from omni_mp.config.schema import EndpointsConfig


def new_run_id() -> str:
    return f"omni_mp-{os.getpid()}-{secrets.token_hex(4)}"


class RunEndpoints:
    def __init__(self, cfg: EndpointsConfig, run_id: str) -> None:
        if cfg.transport == "ipc" and not sys.platform.startswith("linux"):
            raise RuntimeError("endpoints.transport 'ipc' uses Linux abstract sockets; use 'tcp' on this platform")
        self.cfg = cfg
        self.run_id = run_id

    def _name(self, what: str) -> str:
        if self.cfg.transport == "ipc":
            return f"ipc://@{self.run_id}-{what}"
        return f"tcp://{self.cfg.host}:*"

    def events(self) -> str:
        return self._name("events")

    def stage_input(self, stage_id: int, incarnation: int = 0, replica: int = 0) -> str:
        return self._name(f"stage{stage_id}.{replica}-{incarnation}")

    def client(self) -> str:
        return self._name("client")
