"""The cloned-voice store (omni_mp.http.voice_store): bounded by count and bytes, the least
recently used evicted first, a voice larger than the byte bound refused, the clip and mode kept
exactly, and one store for two connections to one file (the HTTP server's workers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omni_mp.http.voice_store import ENTRY_OVERHEAD, VoiceStore, VoiceStoreError


def _clip(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 0.1


def test_a_voice_comes_back_exactly_with_its_mode(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "v.sqlite3")
    clip = _clip(24000, 0)
    icl = store.put("a", clip, 24000, "the text", False)
    xvec = store.put("b", clip, 16000, "the text", True)
    plain = store.put("c", clip, 24000, None, False)  # no text: the x-vector alone
    assert (icl.mode, xvec.mode, plain.mode) == ("in_context", "x_vector", "x_vector")
    got = store.get(icl.id)
    assert got is not None and got.rate == 24000 and got.ref_text == "the text" and not got.x_vector_only
    np.testing.assert_array_equal(got.samples, clip)
    assert store.get(plain.id).x_vector_only  # type: ignore[union-attr]
    assert store.get("voice_nope") is None and store.get("alloy") is None
    assert [v.id for v in store.listing()] == [icl.id, xvec.id, plain.id]


def test_count_and_byte_bounds_evict_the_least_recently_used() -> None:
    size = 1000 * 4 + 1 + ENTRY_OVERHEAD  # one voice's bytes
    store = VoiceStore(max_entries=3, max_bytes=10 * size)
    ids = [store.put(str(i), _clip(1000, i), 24000, None, True).id for i in range(3)]
    assert store.get(ids[0]) is not None  # used: now the most recent
    fourth = store.put("3", _clip(1000, 3), 24000, None, True).id
    assert store.get(ids[1]) is None  # the least recently used went
    assert all(store.get(i) is not None for i in (ids[0], ids[2], fourth))
    assert store.totals == (3, 3 * size)
    small = VoiceStore(max_entries=100, max_bytes=2 * size + 10)
    kept = [small.put(str(i), _clip(1000, i), 24000, None, True).id for i in range(3)]
    assert small.get(kept[0]) is None and small.totals == (2, 2 * size)
    with pytest.raises(VoiceStoreError, match="max_bytes"):
        small.put("big", _clip(10_000, 9), 24000, None, True)


def test_one_file_is_one_store_for_every_worker(tmp_path: Path) -> None:
    path = tmp_path / "voices.sqlite3"
    one, two = VoiceStore(path, max_entries=2), VoiceStore(path, max_entries=2)
    a = one.put("a", _clip(100, 1), 24000, None, True)
    b = two.put("b", _clip(100, 2), 24000, "text", False)
    assert two.get(a.id) is not None and one.get(b.id) is not None
    c = one.put("c", _clip(100, 3), 24000, None, True)  # the bound holds across both: `a` (least recent) goes
    assert two.get(a.id) is None and two.get(c.id) is not None and one.totals[0] == two.totals[0] == 2
    one.close()
    two.close()
