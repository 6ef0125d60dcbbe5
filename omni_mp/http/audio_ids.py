"""Spoken answers by id: what `message.audio.id` resolves to when a client sends it back in an
assistant turn (OpenAI's way to continue a spoken conversation), until its `expires_at`.

An entry holds what the model needs to continue: the answer's transcript (the assistant turn's
text in the next prompt; neither family's prompt takes the assistant's audio back). The store
is bounded three ways: `max_entries`, `max_bytes` (transcripts and ids, counted in UTF-8
bytes) and `ttl_s`. Eviction: expired entries first (oldest first), then the least recently
used. An expired id is remembered as expired for another `ttl_s` (so the 400 can say so),
bounded by the same limits; after that it is unknown.

Sharing: ids carry the issuing store's `tag` (`audio_<tag>_<random>`), so an id of another
server is told apart from an unknown one. `MemoryAudioStore` serves a server of one process
(`http.workers: 1`): every connection and request shares the one instance (one event loop; the
lock only guards against a caller on another thread). A server of several worker processes
shares one `SqliteAudioStore` (omni_mp.http.audio_ids_sqlite) with one tag: an id issued by one
worker resolves in every other.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Protocol

import msgspec

ID_PREFIX = "audio_"
ENTRY_OVERHEAD = 96  # bytes counted per entry besides its id and transcript (bookkeeping)


class AudioEntry(msgspec.Struct, frozen=True):
    transcript: str
    expires_at: int  # unix seconds


class AudioIdError(ValueError):
    """An id that resolves to nothing: `reason` is 'unknown', 'expired' or 'foreign'."""

    def __init__(self, audio_id: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.audio_id = audio_id
        self.reason = reason


def check_id(audio_id: str, tag: str) -> None:
    """AudioIdError unless `audio_id` has the shape of an id issued by the store tagged `tag`."""
    if not audio_id.startswith(ID_PREFIX) or audio_id.count("_") != 2:
        raise AudioIdError(audio_id, "unknown", f"unknown audio id {audio_id!r}")
    if audio_id[len(ID_PREFIX) :].split("_", 1)[0] != tag:
        raise AudioIdError(
            audio_id,
            "foreign",
            f"audio id {audio_id!r} was issued by another server (this one's ids: {ID_PREFIX}{tag}_...)",
        )


class AudioStore(Protocol):
    """What the chat endpoint (and later the realtime session) needs of a store of answers."""

    tag: str
    ttl_s: int

    def new_id(self) -> str: ...

    def expiry(self) -> int: ...

    def put(self, audio_id: str, transcript: str, expires_at: int | None = None) -> AudioEntry:
        """Store an answer under an id of `new_id` until `expires_at` (unix seconds; None: ttl_s
        from now); returns the entry."""
        ...

    def get(self, audio_id: str) -> AudioEntry:
        """The live entry, or AudioIdError saying why not."""
        ...

    def close(self) -> None:
        """Release what the store holds open (its file); entries of a shared store stay."""
        ...


class MemoryAudioStore:
    """An in-process `AudioStore` (see the module docstring for its bounds and eviction)."""

    def __init__(
        self,
        *,
        max_entries: int = 10_000,
        max_bytes: int = 32 << 20,
        ttl_s: int = 3600,
        tag: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_s < 1:
            raise ValueError("max_entries, max_bytes and ttl_s must be >= 1")
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        self.tag = tag or secrets.token_hex(6)
        self._clock = clock
        self._entries: OrderedDict[str, AudioEntry] = OrderedDict()  # least recently used first
        self._expiry: deque[tuple[int, str]] = deque()  # (expires_at, id) in insertion order = expiry order
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def new_id(self) -> str:
        return f"{ID_PREFIX}{self.tag}_{secrets.token_hex(16)}"

    def close(self) -> None:
        pass  # nothing held open

    @staticmethod
    def _size(audio_id: str, entry: AudioEntry) -> int:
        return len(audio_id) + len(entry.transcript.encode()) + ENTRY_OVERHEAD

    def _drop(self, audio_id: str) -> None:
        entry = self._entries.pop(audio_id, None)
        if entry is not None:
            self._bytes -= self._size(audio_id, entry)

    def _purge(self, now: float) -> None:
        """Forget ids expired for longer than ttl_s (they are then unknown, not expired)."""
        while self._expiry and self._expiry[0][0] + self.ttl_s <= now:
            _, audio_id = self._expiry.popleft()
            self._drop(audio_id)

    def expiry(self) -> int:
        """The `expires_at` of an answer stored from now on (a stream states it before the end)."""
        return int(self._clock()) + self.ttl_s

    def put(self, audio_id: str, transcript: str, expires_at: int | None = None) -> AudioEntry:
        now = self._clock()
        entry = AudioEntry(transcript=transcript, expires_at=self.expiry() if expires_at is None else expires_at)
        size = self._size(audio_id, entry)
        if size > self.max_bytes:  # it could never be stored: keep the id unresolvable, say so at use
            return entry
        with self._lock:
            self._purge(now)
            self._drop(audio_id)
            # Expired entries go first (oldest first), then the least recently used.
            while self._expiry and (len(self._entries) >= self.max_entries or self._bytes + size > self.max_bytes):
                expires_at, oldest = self._expiry[0]
                if expires_at > now:
                    break
                self._expiry.popleft()
                self._drop(oldest)
            while self._entries and (len(self._entries) >= self.max_entries or self._bytes + size > self.max_bytes):
                self._drop(next(iter(self._entries)))
            self._entries[audio_id] = entry
            self._expiry.append((entry.expires_at, audio_id))
            self._bytes += size
            if len(self._expiry) > 2 * self.max_entries:  # ids dropped by LRU: their expiry records too
                self._expiry = deque((t, i) for t, i in self._expiry if i in self._entries)
        return entry

    def get(self, audio_id: str) -> AudioEntry:
        check_id(audio_id, self.tag)
        now = self._clock()
        with self._lock:
            self._purge(now)
            entry = self._entries.get(audio_id)
            if entry is None:
                raise AudioIdError(audio_id, "unknown", f"unknown audio id {audio_id!r} (never issued, or evicted)")
            if entry.expires_at <= now:
                raise AudioIdError(audio_id, "expired", f"audio id {audio_id!r} expired at {entry.expires_at}")
            self._entries.move_to_end(audio_id)
        return entry
