"""Same-host fast path: a bounded shared-memory pool per link, with credits for backpressure.

Why: pyzmq over ipc:// moves large buffers at a fraction of memcpy speed (see
docs/transport.md); copying a tensor once into memory the receiver already maps is close to
a single memcpy, and ZMQ then carries only a small descriptor (ShmRef).

Design, in short:
- The sender owns one segment: an anonymous memfd (never a name in /dev/shm), sealed
  against resizing. The receiver maps it by opening /proc/<sender pid>/fd/<fd> and checks
  it opened the right object (the memfd name is a random pool id carried in the ShmRef).
  Because the segment has no name, nothing can leak: the kernel frees it once the last
  process that maps it exits, whichever side crashes and whenever. This needs sender and
  receiver to be the same user in the same pid namespace (true for stages on one host).
- Credits live in the segment itself: a slot table of (state, generation). The sender marks
  a slot IN_USE when it fills a region; the receiver marks it RELEASED when the last tensor
  viewing the region is freed (or on an explicit early release); the sender reclaims
  released slots in allocation order (a ring). No back channel, so any number of senders
  can feed one receiver. A full pool blocks the sender (with a timeout): that is the
  backpressure. Generations make stale or duplicated descriptors harmless.
- Ordering: the sender fills a region before the ZMQ send (a syscall) publishes its
  descriptor; the receiver flips the state byte only once the last tensor over the region
  has been freed. The receiver only ever writes a state byte; the sender writes a slot's
  generation only while the slot is free, before it flips the state to IN_USE.
- One receiver per pool: credits assume a single consumer (a PUSH connected to several
  PULLs would need one pool per peer).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import struct
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable
from typing import NamedTuple, Self, TypeVar

import msgspec
import numpy as np

from omni_mp.wire.tensor_codec import PayloadError

_MAGIC = b"OMNIPOOL"
_VERSION = 1
# magic, version, closed flag, prefaulted flag, num_slots, data_offset, capacity
_HEADER = struct.Struct("<8sIBBxxQQQ")
# One slot: state byte, 3 pad bytes, generation (u32).
_SLOT = struct.Struct("<BxxxI")
_GEN = struct.Struct("<I")
_FREE, _IN_USE, _RELEASED = 0, 1, 2
_CLOSED_OFFSET = 12  # byte offset of the closed flag inside the header
ALIGN = 64  # region alignment: a cache line, enough for any dtype and SIMD loads
_POOL_NAME = re.compile(r"omni_mp-pool-[0-9a-f]{32}")
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_POLL_MIN_S, _POLL_MAX_S = 20e-6, 1e-3  # wait for credits: back off from 20 us to 1 ms
T = TypeVar("T")


class ShmRef(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """Where a tensor's bytes sit in a sender's pool; travels in the tensor header."""

    pool: str  # memfd name: proves /proc/<pid>/fd/<fd> is the intended segment
    pid: int
    fd: int
    slot: int
    gen: int
    offset: int  # from the start of the data area


class ShmPoolConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One link's pool. Tensors of at least `threshold_bytes` (and at most the capacity) go
    through the pool; smaller ones ride in the ZMQ message. The default threshold is pyzmq's
    copy threshold: below it ZMQ copies the frame anyway, cheaply, and the fixed cost of a
    slot and a descriptor does not pay off (benchmarks/transport.py --shm-threshold)."""

    capacity_bytes: int = 256 * 2**20
    num_slots: int = 1024
    threshold_bytes: int = 64 * 2**10
    # Touch every page up front (the sender writes, the receiver maps populated): a first
    # touch of shared memory costs more than the copy itself (measured here: 1.3 GB/s cold
    # vs 18 GB/s warm), so pay it once at start-up instead of on the first laps of the ring.
    # The pool is then resident from the start; it would be after one lap anyway.
    prefault: bool = True

    def __post_init__(self) -> None:
        for name in ("capacity_bytes", "num_slots", "threshold_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ShmPoolConfig.{name} must be > 0, got {getattr(self, name)}")


def _wait_for(attempt: Callable[[], T | None], timeout: float | None) -> T | None:
    """Retry `attempt` until it returns non-None or `timeout` (None: never) runs out. Credits
    come back through memory, not a socket, so waiting means polling; the backoff keeps a
    blocked sender cheap while adding at most ~1 ms once space is freed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = _POLL_MIN_S
    while (result := attempt()) is None:
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX_S)
    return result


def _memfd_link(name: str) -> str:
    """What /proc/<pid>/fd/<fd> reads for a memfd of this name."""
    return f"/memfd:{name} (deleted)"


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _layout(num_slots: int) -> int:
    """Offset of the data area: header plus slot table, rounded up to a page."""
    return (_HEADER.size + num_slots * _SLOT.size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


class _Live(NamedTuple):
    slot: int
    start: int
    size: int


class ShmPool:
    """Sender side of one link: owns the segment and allocates regions from it as a ring."""

    def __init__(self, config: ShmPoolConfig | None = None) -> None:
        self.config = config = config or ShmPoolConfig()
        self.name = f"omni_mp-pool-{uuid.uuid4().hex}"
        self.capacity = _align(config.capacity_bytes)
        data_offset = _layout(config.num_slots)
        self._fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        # Closes the fd even if close() is never called (the mapping goes with the object).
        self._close_fd = weakref.finalize(self, os.close, self._fd)
        os.ftruncate(self._fd, data_offset + self.capacity)
        fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, _SEALS)
        self._mm = mmap.mmap(self._fd, data_offset + self.capacity)
        _HEADER.pack_into(
            self._mm, 0, _MAGIC, _VERSION, 0, config.prefault, config.num_slots, data_offset, self.capacity
        )
        self._slots = memoryview(self._mm)[_HEADER.size : _HEADER.size + config.num_slots * _SLOT.size]
        self._data = np.frombuffer(memoryview(self._mm)[data_offset:], dtype=np.uint8)
        if config.prefault:
            self._data[:] = 0
        self._pid = os.getpid()
        self._gens = [0] * config.num_slots
        self._free_slots = list(range(config.num_slots - 1, -1, -1))
        self._live: deque[_Live] = deque()  # allocation order; its head is the ring's tail
        self._head = 0

    def accepts(self, nbytes: int) -> bool:
        """Whether a buffer of this size should travel through this pool."""
        return self.config.threshold_bytes <= nbytes <= self.capacity

    @property
    def bytes_in_use(self) -> int:
        return sum(live.size for live in self._live)

    def put(self, src: np.ndarray, timeout: float | None = None) -> ShmRef:
        """Copy a flat uint8 array (numpy, or what numpy reads without a copy) into a free
        region, waiting up to `timeout` seconds (None: forever) for the receiver to release
        space. Raises TimeoutError when the pool stays full: the receiver is not keeping up,
        or is holding on to tensors."""
        src = np.asarray(src)
        nbytes = src.size
        if not 0 < nbytes <= self.capacity:
            raise ValueError(f"{nbytes} bytes cannot go through a pool of {self.capacity} bytes")
        live = _wait_for(lambda: self._alloc(nbytes), timeout)
        if live is None:
            raise TimeoutError(
                f"shm pool {self.name} full: {nbytes} bytes wanted, {self.bytes_in_use} of "
                f"{self.capacity} held by {len(self._live)} unreleased regions"
            )
        self._data[live.start : live.start + nbytes] = src
        return ShmRef(self.name, self._pid, self._fd, live.slot, self._gens[live.slot], live.start)

    def free(self, ref: ShmRef) -> None:
        """Give back a region whose descriptor was never sent (a failed send)."""
        state, gen = _SLOT.unpack_from(self._slots, ref.slot * _SLOT.size)
        if ref.pool == self.name and state == _IN_USE and gen == ref.gen:
            self._slots[ref.slot * _SLOT.size] = _RELEASED

    def wait_drained(self, timeout: float) -> bool:
        """Wait until the receiver has released every region; False if not within timeout."""

        def drained() -> bool | None:
            self._reclaim()
            return True if not self._live else None

        return _wait_for(drained, timeout) is not None

    def _reclaim(self) -> None:
        while self._live and self._slots[self._live[0].slot * _SLOT.size] == _RELEASED:
            slot = self._live.popleft().slot
            self._slots[slot * _SLOT.size] = _FREE
            self._free_slots.append(slot)
        if not self._live:
            self._head = 0

    def _alloc(self, nbytes: int) -> _Live | None:
        self._reclaim()
        if not self._free_slots:
            return None
        size = _align(nbytes)
        head, cap = self._head, self.capacity
        if not self._live:
            start = 0
        else:
            tail = self._live[0].start
            if self._live[-1].start < tail:  # wrapped: the newest region lies before the oldest
                free_spans = [(head, tail)]
            else:
                free_spans = [(head, cap), (0, tail)]
            start = next((lo for lo, hi in free_spans if hi - lo >= size), None)
            if start is None:
                return None
        slot = self._free_slots.pop()
        self._gens[slot] = (self._gens[slot] + 1) & 0xFFFFFFFF
        # Generation first, then the state byte: a reader never sees IN_USE with a stale gen.
        _GEN.pack_into(self._slots, slot * _SLOT.size + 4, self._gens[slot])
        self._slots[slot * _SLOT.size] = _IN_USE
        self._head = start + size
        live = _Live(slot, start, size)
        self._live.append(live)
        return live

    def close(self) -> None:
        """Unmap and close. Receivers keep what they map until their last view dies."""
        if not self._close_fd.alive:
            return
        self._mm[_CLOSED_OFFSET] = 1  # lets receivers drop their mapping early
        del self._data
        self._slots.release()
        self._mm.close()
        self._close_fd()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShmRegion:
    """A receiver's claim on one region. Released when the last tensor viewing it is freed,
    or earlier by release() (then the caller promises those tensors are no longer used)."""

    __slots__ = ("_finalizer", "ref")

    def __init__(self, ref: ShmRef, finalizer: weakref.finalize) -> None:
        self.ref = ref
        self._finalizer = finalizer

    def release(self) -> None:
        self._finalizer()  # runs at most once, so early and automatic release never double up

    @property
    def released(self) -> bool:
        return not self._finalizer.alive


class _Attached:
    """One sender's segment as mapped by a receiver."""

    def __init__(self, ref: ShmRef, path: str) -> None:
        link, expected = f"/proc/{ref.pid}/fd/{ref.fd}", _memfd_link(ref.pool)
        try:
            # Look before opening: a forged descriptor must not make us open an arbitrary
            # file (a device, a tty) of some other process.
            if os.readlink(link) != expected:
                raise PayloadError(f"{path}: fd {ref.fd} of pid {ref.pid} is not shm pool {ref.pool}")
            fd = os.open(link, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise PayloadError(
                f"{path}: cannot open shm pool {ref.pool} of pid {ref.pid} ({exc.strerror}); "
                "the sender exited, or is another user / pid namespace"
            ) from None
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != expected:  # what we opened, race-free
                raise PayloadError(f"{path}: fd {ref.fd} of pid {ref.pid} is not shm pool {ref.pool}")
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
                # Unsealed, the segment could shrink under us and turn reads into SIGBUS.
                raise PayloadError(f"{path}: shm pool {ref.pool} is not sealed against resizing")
            size = os.fstat(fd).st_size
            if size < _HEADER.size:
                raise PayloadError(f"{path}: shm pool {ref.pool} is too small to be one")
            with mmap.mmap(fd, _HEADER.size, access=mmap.ACCESS_READ) as head:
                magic, version, _, prefaulted, num_slots, data_offset, capacity = _HEADER.unpack_from(head, 0)
            if (
                (magic, version) != (_MAGIC, _VERSION)
                or data_offset != _layout(num_slots)
                or (data_offset + capacity != size)
            ):
                raise PayloadError(f"{path}: shm pool {ref.pool} has a malformed header")
            # A prefaulted pool is resident: populating our page tables now is cheap and
            # keeps page faults out of the first tensors we read.
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | (mmap.MAP_POPULATE if prefaulted else 0))
        finally:
            os.close(fd)
        self.pid, self.fd, self.name = ref.pid, ref.fd, ref.pool
        self.num_slots, self.capacity = num_slots, capacity
        self.slots = memoryview(self.mm)[_HEADER.size : _HEADER.size + num_slots * _SLOT.size]
        self.data = memoryview(self.mm)[data_offset:]
        self.held: set[int] = set()  # slots with a live view here: one view per region

    def sender_gone(self) -> bool:
        if self.mm[_CLOSED_OFFSET]:
            return True
        try:
            return os.readlink(f"/proc/{self.pid}/fd/{self.fd}") != _memfd_link(self.name)
        except OSError:
            return True

    def release(self, slot: int, gen: int) -> None:
        self.held.discard(slot)
        state, current = _SLOT.unpack_from(self.slots, slot * _SLOT.size)
        if state == _IN_USE and current == gen:
            self.slots[slot * _SLOT.size] = _RELEASED


class ShmReader:
    """Receiver side: maps senders' pools on first sight and turns validated descriptors into
    buffers whose lifetime drives the credits."""

    def __init__(self) -> None:
        self._pools: dict[str, _Attached] = {}

    def _pool(self, ref: ShmRef, path: str) -> _Attached:
        pool = self._pools.get(ref.pool)
        if pool is None:
            if not _POOL_NAME.fullmatch(ref.pool):
                raise PayloadError(f"{path}: malformed shm pool name {ref.pool[:80]!r}")
            self._forget_gone()
            pool = self._pools[ref.pool] = _Attached(ref, path)
        elif (pool.pid, pool.fd) != (ref.pid, ref.fd):
            raise PayloadError(f"{path}: shm pool {ref.pool} moved from pid/fd {pool.pid}/{pool.fd}")
        return pool

    def _forget_gone(self) -> None:
        # Dropping a pool only drops our reference: live views keep the mapping alive (and
        # their finalizers keep the pool object), so this is safe at any time.
        for name in [n for n, p in self._pools.items() if p.sender_gone()]:
            del self._pools[name]

    def _checked(self, ref: ShmRef, nbytes: int, path: str) -> _Attached:
        pool = self._pool(ref, path)
        if not 0 <= ref.slot < pool.num_slots:
            raise PayloadError(f"{path}: shm slot {ref.slot} outside [0, {pool.num_slots})")
        if ref.offset < 0 or ref.offset % ALIGN or ref.offset + nbytes > pool.capacity:
            raise PayloadError(
                f"{path}: shm region [{ref.offset}, {ref.offset + nbytes}) outside the pool's "
                f"{pool.capacity} bytes or not {ALIGN}-aligned"
            )
        state, gen = _SLOT.unpack_from(pool.slots, ref.slot * _SLOT.size)
        if state != _IN_USE or gen != ref.gen or ref.slot in pool.held:
            raise PayloadError(f"{path}: shm slot {ref.slot} (generation {ref.gen}) is not an unclaimed region")
        return pool

    def view(self, ref: ShmRef, nbytes: int, path: str) -> tuple[memoryview, ShmRegion]:
        """Validate `ref` (pool identity, bounds, alignment, slot state) and return a buffer
        over the region and its claim. The claim is released when the buffer (and so every
        tensor made from it) is garbage: keep only tensors, never the buffer itself."""
        pool = self._checked(ref, nbytes, path)
        buffer = pool.data[ref.offset : ref.offset + nbytes]
        pool.held.add(ref.slot)
        finalizer = weakref.finalize(buffer, pool.release, ref.slot, ref.gen)
        finalizer.atexit = False  # at exit the sender no longer waits for credits
        return buffer, ShmRegion(ref, finalizer)

    def discard(self, ref: ShmRef) -> None:
        """Return the credit of a region from a rejected message, if the descriptor is valid."""
        try:
            pool = self._checked(ref, 0, "discard")
        except PayloadError:
            return
        pool.release(ref.slot, ref.gen)

    def close(self) -> None:
        self._pools.clear()
