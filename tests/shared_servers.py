"""Served pipelines shared by several test modules: one launcher (with `--http`) per shipped tiny
config, started by the first module that asks for it and stopped after the last one (CI time:
each start of a tiny omni pipeline costs 40-60 s of the 2 CPUs).

A module asks through the fixture `shared_<config>` (tests/conftest.py). The collection puts
the modules that use any shared server next to each other (`group_modules`), and a server stops
as soon as the next test's module does not use it (`release_unneeded`), so each starts once.
What each module needs from the config is merged here: voice aliases (test_http_speech) and
realtime bounds (test_http_realtime), which no other user of the same server depends on."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path

import pytest

from omni_mp.stage_configs import CONFIG_DIR
from tests.launcher import ServedPipeline
from tests.speech_checks import KEY, serve_http, serve_tiny_tts

# test_http_speech: one new name, one of OpenAI's remapped.
VOICE_ALIASES = {"narrator": "Ethan", "echo": "Chelsie"}
# test_http_realtime's bounds.
REALTIME_MAX_SESSIONS = 4
REALTIME_IDLE_S = 8.0
REALTIME_MAX_TURN_S = 5.0
REALTIME_HISTORY_TOKENS = 300  # more than any one-turn prompt of those tests
TTS_MAX_TOKENS = 24  # test_http_speech_qwen3_tts's answers: 23 frames (the YAML's 256 is long)


def _qwen2_5_omni(tmp: Path) -> AbstractContextManager[tuple[ServedPipeline, str]]:
    realtime = {"max_sessions": REALTIME_MAX_SESSIONS, "max_append_bytes": 64 << 10,
                "idle_timeout_s": REALTIME_IDLE_S, "max_turn_audio_s": REALTIME_MAX_TURN_S,
                "max_history_tokens": REALTIME_HISTORY_TOKENS}  # fmt: skip
    http = {"voice_aliases": VOICE_ALIASES, "realtime": realtime}
    return serve_http(CONFIG_DIR / "tiny_qwen2_5_omni.yaml", tmp, http=http)


# config name -> how its shared server starts (in a temp dir of its own); in the order the
# grouped modules use them (a module using two comes between those of each alone)
STARTS: dict[str, Callable[[Path], AbstractContextManager[tuple[ServedPipeline, str]]]] = {
    "tiny_qwen3_omni": lambda tmp: serve_http(CONFIG_DIR / "tiny_qwen3_omni.yaml", tmp),
    "tiny_qwen2_5_omni": _qwen2_5_omni,
    "tiny_qwen3_tts": lambda tmp: serve_tiny_tts(tmp, TTS_MAX_TOKENS),
}
FIXTURES = {f"shared_{name}": name for name in STARTS}


class SharedServers:
    """The shared servers that run now, each with what stops it."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[ExitStack, ServedPipeline, str]] = {}
        self.needed: dict[str, set[str]] = {}  # module node id -> the servers its tests use

    def get(self, name: str) -> tuple[ServedPipeline, str]:
        """The server of `name` (started now if it is not running): (pipeline, url)."""
        if name not in self._running:
            stack = ExitStack()
            tmp = Path(tempfile.mkdtemp(prefix=f"shared-{name}-"))
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            try:
                pipeline, url = stack.enter_context(STARTS[name](tmp))
            except BaseException:
                stack.close()
                raise
            self._running[name] = (stack, pipeline, url)
        _, pipeline, url = self._running[name]
        return pipeline, url

    def release_unneeded(self, next_item: pytest.Item | None) -> None:
        """Stop the servers that the next test's module does not use."""
        keep = set() if next_item is None else self.needed.get(_module_of(next_item), set())
        for name in [n for n in self._running if n not in keep]:
            stack, _, _ = self._running.pop(name)
            stack.close()

    def close_all(self) -> None:
        self.release_unneeded(None)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def group_modules(items: list[pytest.Item], shared: SharedServers) -> None:
    """Record which modules use which shared server, and move the modules that use any next to
    the first of them, ordered so that each server is used by a run of modules in a row (the
    order within each module and among the others is kept)."""
    for item in items:
        used = {FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURES}
        shared.needed.setdefault(_module_of(item), set()).update(used)
    modules = list(dict.fromkeys(_module_of(i) for i in items))
    index = {name: k for k, name in enumerate(STARTS)}
    users = [m for m in modules if shared.needed[m]]
    first = users[0] if users else None
    users.sort(key=lambda m: (max(index[n] for n in shared.needed[m]), min(index[n] for n in shared.needed[m])))
    order: list[str] = []
    for m in modules:
        if not shared.needed[m]:
            order.append(m)
        elif m == first:
            order += users
    rank = {m: k for k, m in enumerate(order)}
    items.sort(key=lambda i: rank[_module_of(i)])  # stable: each module's own order is kept


SHARED = SharedServers()

__all__ = ["KEY", "SHARED", "group_modules"]
