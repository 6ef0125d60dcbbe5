"""Cloned voices by id (POST /v1/audio/voices, OpenAI's custom-voice shape): what a later
`/v1/audio/speech` names as `voice: {"id": ...}` (or the id as the `voice` string) to speak in it.

A voice holds its clip as decoded (mono float32 samples and their rate), its text (in-context
cloning) and mode: a request by id sends exactly what the inline clip sends, so both give the same
audio. What makes reuse cheap is on the entry stage: each stage process keeps the last prompts
(the x-vector, the clip's codes) it computed, keyed by a digest of the clip, rate and mode
(omni_mp.models.qwen3_tts.clone), so a stored voice runs neither encoder again while cached.

Bounded by `max_entries` and `max_bytes` (the samples' bytes plus the text and a fixed overhead
per voice); a new voice that does not fit evicts the least recently used ones (used: created or
spoken), and one larger than `max_bytes` alone is refused. One SQLite file in the server's private
directory, shared by its worker processes (omni_mp.http.sqlite_store); a server of one process
keeps it in memory.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import msgspec
import numpy as np

from omni_mp.http.sqlite_store import SqliteStore, added, delete_rows, over, transaction

ID_PREFIX = "voice_"
ENTRY_OVERHEAD = 256  # bytes counted per voice besides its samples and text

_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL, rate INTEGER NOT NULL,
    samples BLOB NOT NULL, ref_text TEXT, x_vector_only INTEGER NOT NULL, used REAL NOT NULL, size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS voices_used ON voices (used);
"""


class StoredVoice(msgspec.Struct, frozen=True):
    id: str
    name: str
    created_at: int
    rate: int
    samples: np.ndarray  # mono float32
    ref_text: str | None
    x_vector_only: bool


class ClonedVoice(msgspec.Struct):
    """OpenAI's `audio.voice` object, with the cloning mode."""

    id: str
    name: str
    created_at: int
    object: str = "audio.voice"
    mode: str = "x_vector"  # or "in_context" (a reference text was given)


class VoiceStoreError(ValueError):
    pass


class VoiceStore(SqliteStore):
    def __init__(self, path: str | Path = ":memory:", *, max_entries: int = 1000, max_bytes: int = 256 << 20) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be >= 1")
        self.max_entries, self.max_bytes = max_entries, max_bytes
        super().__init__(path, _SCHEMA)

    def put(self, name: str, samples: np.ndarray, rate: int, ref_text: str | None, x_vector_only: bool) -> ClonedVoice:
        blob = np.ascontiguousarray(samples, dtype=np.float32).tobytes()
        size = len(blob) + len(name.encode()) + len((ref_text or "").encode()) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            raise VoiceStoreError(f"audio_sample: {size} bytes to store > the voice store's max_bytes {self.max_bytes}")
        now = time.time()
        x_vector_only = x_vector_only or not ref_text  # no text: the x-vector alone
        mode = "x_vector" if x_vector_only else "in_context"
        info = ClonedVoice(id=f"{ID_PREFIX}{secrets.token_hex(16)}", name=name, created_at=int(now), mode=mode)
        with transaction(self._db, self._lock) as db:
            while over(db, size, self.max_entries, self.max_bytes):  # each pass evicts one: bounded
                delete_rows(db, "voices", "1 ORDER BY used LIMIT 1", ())
            row = (info.id, name, info.created_at, rate, blob, ref_text, int(x_vector_only), now, size)
            db.execute("INSERT INTO voices VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            added(db, size)
        return info

    def get(self, voice_id: str) -> StoredVoice | None:
        """The voice (marked used), or None: never made here, or evicted."""
        if not voice_id.startswith(ID_PREFIX):
            return None
        with transaction(self._db, self._lock) as db:
            row = db.execute(
                "SELECT id, name, created_at, rate, samples, ref_text, x_vector_only FROM voices WHERE id = ?",
                (voice_id,),
            ).fetchone()
            if row is not None:
                db.execute("UPDATE voices SET used = ? WHERE id = ?", (time.time(), voice_id))
        if row is None:
            return None
        samples = np.frombuffer(row[4], dtype=np.float32).copy()
        return StoredVoice(row[0], row[1], row[2], row[3], samples, row[5], bool(row[6]))

    def listing(self) -> list[ClonedVoice]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, name, created_at, ref_text, x_vector_only FROM voices ORDER BY created_at"
            ).fetchall()
        return [
            ClonedVoice(id=r[0], name=r[1], created_at=r[2], mode="in_context" if r[3] and not r[4] else "x_vector")
            for r in rows
        ]
