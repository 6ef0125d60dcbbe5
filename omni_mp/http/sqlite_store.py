"""What the HTTP server's SQLite stores share (the audio ids, omni_mp.http.audio_ids_sqlite; the
stored voices, omni_mp.http.voice_store): one file in the server's private directory, opened by
every worker process (`http.workers` > 1), WAL journal; each change is one `BEGIN IMMEDIATE`
transaction, so the bounds hold across processes; each store keeps its row count and byte total
in a one-row `totals` table updated in the same transaction as the rows (`delete_rows`, `add_row`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TOTALS = """
CREATE TABLE IF NOT EXISTS totals (one INTEGER PRIMARY KEY CHECK (one = 1), count INTEGER, bytes INTEGER);
INSERT OR IGNORE INTO totals VALUES (1, 0, 0);
"""


def open_db(path: str | Path, schema: str) -> sqlite3.Connection:
    """One connection for this process (used under the caller's lock): autocommit mode,
    transactions opened explicitly; the schema (and `totals`) created by whichever process is first."""
    db = sqlite3.connect(str(path), timeout=10.0, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # a crash may lose the last writes, not the file
    db.executescript(f"BEGIN IMMEDIATE; {schema} {TOTALS} COMMIT;")
    return db


@contextmanager
def transaction(db: sqlite3.Connection, lock: threading.Lock) -> Iterator[sqlite3.Connection]:
    with lock:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def delete_rows(db: sqlite3.Connection, table: str, where: str, args: tuple[object, ...]) -> None:
    """Delete the rows `where` selects from `table` (columns `id`, `size`) and take them off the totals."""
    for row_id, size in db.execute(f"SELECT id, size FROM {table} WHERE {where}", args).fetchall():
        db.execute(f"DELETE FROM {table} WHERE id = ?", (row_id,))
        db.execute("UPDATE totals SET count = count - 1, bytes = bytes - ?", (size,))


def added(db: sqlite3.Connection, size: int) -> None:
    """Count a row of `size` bytes just inserted."""
    db.execute("UPDATE totals SET count = count + 1, bytes = bytes + ?", (size,))


def over(db: sqlite3.Connection, size: int, max_entries: int, max_bytes: int) -> bool:
    """Would one more row of `size` bytes break a bound?"""
    count, total = db.execute("SELECT count, bytes FROM totals").fetchone()
    return bool(count >= max_entries or total + size > max_bytes)


def totals(db: sqlite3.Connection) -> tuple[int, int]:
    count, total = db.execute("SELECT count, bytes FROM totals").fetchone()
    return int(count), int(total)


class SqliteStore:
    """A store's connection: one per process, used under a lock (the server's event loop and,
    rarely, a caller on another thread)."""

    def __init__(self, path: str | Path, schema: str) -> None:
        self._lock = threading.Lock()
        with self._lock:
            self._db = open_db(path, schema)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def totals(self) -> tuple[int, int]:
        """(rows, bytes) kept."""
        with self._lock:
            return totals(self._db)
