"""A stream of per-position rows ([n, width] blocks, in position order): the one type for
hidden-state rows received from an upstream stage and extra embeddings fed to decode steps.

A stream may begin past position 0 (its first block's `start`): an upstream stage sends no rows
below the first position its readers read (e.g. a thinker that read its prefix cache up to a
talker's first media row). Asking for a row below it is a RowGap.

Blocks are kept as they arrive (no per-row unbinding, no re-stacking): `slice` touches only the
blocks that hold the asked rows, `row` is a view into one block.
"""

from __future__ import annotations

import bisect

import torch


class RowGap(ValueError):
    """Rows arrived out of order (a gap or an overlap in positions)."""


class RowStream:
    def __init__(self, fill: torch.Tensor | None = None) -> None:
        self._blocks: list[torch.Tensor] = []
        self._starts: list[int] = []  # row index of each block's first row
        self.first = 0  # position of the first row (set by the first block's `start`)
        self.rows = 0  # position after the last row received (rows received: rows - first)
        self.closed = False  # no more rows will come; later positions read `fill`
        self.fill = fill  # [width]: the row of every position past a closed stream's end

    def append(self, rows: torch.Tensor, start: int | None = None) -> None:
        """Add a [k, width] block; `start`, when given, must be the next row's position."""
        if rows.ndim != 2:
            raise RowGap(f"expected a 2-D block of rows, got shape {list(rows.shape)}")
        if start is not None and start != self.rows:
            if self._blocks or self.first or start < 0:  # only an empty stream may begin later
                raise RowGap(f"rows from position {start} after {self.rows} rows")
            self.first = self.rows = start
        if rows.shape[0] == 0:
            return
        self._blocks.append(rows)
        self._starts.append(self.rows)
        self.rows += rows.shape[0]

    def close(self) -> None:
        self.closed = True

    def slice(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows [start, end) (end None: all received)."""
        self._check_sent(start)
        end = self.rows if end is None else end
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        parts = []
        while i < len(self._blocks) and self._starts[i] < end:
            s0 = self._starts[i]
            parts.append(self._blocks[i][max(0, start - s0) : end - s0])
            i += 1
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def row(self, k: int) -> torch.Tensor | None:
        """Row k; `fill` past the end of a closed stream; None while it has not arrived."""
        if k < self.rows:
            self._check_sent(k)
            i = bisect.bisect_right(self._starts, k) - 1
            return self._blocks[i][k - self._starts[i]]
        return self.fill if self.closed else None

    def _check_sent(self, k: int) -> None:
        if k < self.first:
            raise RowGap(f"row {k} asked of a stream that begins at position {self.first}")

    def ready(self, k: int) -> bool:
        return k < self.rows or self.closed
