"""The audio-id stores (omni_mp.http.audio_ids): the in-process one and the SQLite one that the
HTTP server's worker processes share, held to one contract (bounds, eviction order, expiry,
foreign ids), and the shared one across real processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path

import pytest

from omni_mp.http.audio_ids import AudioIdError, AudioStore, MemoryAudioStore
from omni_mp.http.audio_ids_sqlite import SqliteAudioStore

Make = Callable[..., AudioStore]


@pytest.fixture(params=["memory", "sqlite"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    def build(**kw: object) -> AudioStore:
        if request.param == "memory":
            return MemoryAudioStore(**kw)  # type: ignore[arg-type]
        tag = kw.pop("tag", None) or f"t{len(list(tmp_path.iterdir()))}"
        return SqliteAudioStore(tmp_path / f"{tag}.sqlite3", tag=tag, **kw)  # type: ignore[arg-type]

    return build


def _reason(store: AudioStore, audio_id: str) -> str:
    with pytest.raises(AudioIdError) as err:
        store.get(audio_id)
    assert audio_id in str(err.value)
    return err.value.reason


def test_bounds_expiry_and_foreign_ids(make: Make) -> None:
    now = [1000.0]
    store = make(max_entries=3, max_bytes=10_000, ttl_s=60, clock=lambda: now[0])
    ids = [store.new_id() for _ in range(4)]
    for i, audio_id in enumerate(ids[:3]):
        now[0] += 1
        store.put(audio_id, f"answer {i}")
    now[0] += 1
    store.get(ids[0])  # most recently used now: the LRU victim is ids[1]
    now[0] += 1
    store.put(ids[3], "answer 3")
    assert store.count == 3  # type: ignore[attr-defined]
    assert _reason(store, ids[1]) == "unknown"
    assert store.get(ids[0]).transcript == "answer 0"
    now[0] += 61  # past expires_at: said expired (not unknown) for another ttl
    assert _reason(store, ids[3]) == "expired"
    now[0] += 60
    assert _reason(store, ids[3]) == "unknown"
    assert store.count == 0  # type: ignore[attr-defined]
    assert _reason(store, make(tag="other").new_id()) == "foreign"
    assert _reason(store, "audio_nonsense") == "unknown"


def test_expired_entries_are_evicted_before_the_least_recently_used(make: Make) -> None:
    now = [1000.0]
    store = make(max_entries=2, max_bytes=10_000, ttl_s=60, clock=lambda: now[0])
    old, fresh, new = store.new_id(), store.new_id(), store.new_id()
    store.put(old, "old", expires_at=1010)  # expires first although used last
    store.put(fresh, "fresh")
    now[0] += 20
    store.put(new, "new")
    assert store.get(fresh).transcript == "fresh" and store.get(new).transcript == "new"
    assert _reason(store, old) == "unknown"


def test_the_byte_bound_evicts_and_an_entry_too_big_is_never_stored(make: Make) -> None:
    small = make(max_bytes=400)
    ids = [small.new_id() for _ in range(10)]
    for audio_id in ids:
        small.put(audio_id, "x" * 100)
    assert small.bytes <= 400 and 0 < small.count < 10  # type: ignore[attr-defined]
    assert small.get(ids[-1]).transcript == "x" * 100
    huge = small.new_id()
    small.put(huge, "y" * 1000)
    assert _reason(small, huge) == "unknown"


def _worker(path: str, tag: str, n: int, start: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = SqliteAudioStore(path, tag=tag, max_entries=50)
    ids = []
    for i in range(n):
        audio_id = store.new_id()
        store.put(audio_id, f"answer {start + i}")
        ids.append(audio_id)
    out.put((start, ids))


def test_the_sqlite_store_is_one_store_for_several_processes(tmp_path: Path) -> None:
    """Two processes write at once into one file: every id resolves in a third process's view
    as long as the count bound allows, and the bound holds over both."""
    path, tag = str(tmp_path / "ids.sqlite3"), "shared"
    SqliteAudioStore(path, tag=tag, max_entries=50).close()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, tag, 40, k * 100, out)) for k in range(2)]
    for p in procs:
        p.start()
    batches = dict(out.get(timeout=300) for _ in procs)  # start -> that process's ids, in put order
    ids = list(batches.values())
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    reader = SqliteAudioStore(path, tag=tag, max_entries=50)
    assert reader.count == 50
    resolved = 0
    for batch in ids:
        for audio_id in batch:
            try:
                assert reader.get(audio_id).transcript.startswith("answer ")
                resolved += 1
            except AudioIdError as err:
                assert err.reason == "unknown"  # evicted by the bound, never corrupted
    assert resolved == 50
    # The put made last of all (one of the two processes' last) is never the one evicted.
    last = {f"answer {start + 39}": batch[-1] for start, batch in batches.items()}
    assert any(_transcript(reader, audio_id) == want for want, audio_id in last.items())


def _transcript(store: AudioStore, audio_id: str) -> str | None:
    try:
        return store.get(audio_id).transcript
    except AudioIdError:
        return None
