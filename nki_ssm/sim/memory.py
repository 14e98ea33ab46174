"""SBUF / PSUM capacity accounting for one kernel launch.

The SDK simulator does not check capacity; the compiler does, by spilling or
failing. We are strict: every on-chip allocation counts against the target's
per-partition budget while the tensor's storage is alive, and an allocation
that does not fit raises :class:`NkiCapacityError` naming the tensor.

Accounting, per partition:

- SBUF: ``prod(shape[1:]) * itemsize`` rounded up to ``SBUF_ALIGN`` bytes,
  against ``Target.sbuf_usable_bytes`` (physical less the reserve stated in
  targets.py).
- PSUM: each tile takes ``ceil(bytes / 2048)`` whole 2 KiB banks (a matmul
  destination must sit in one bank, so tiles are not packed), at most
  ``Target.psum_num_banks`` (8) banks live.

A storage is freed when Python garbage-collects it (``Storage.__del__``):
rebinding a loop-local tile frees the previous one, which mirrors the
compiler's buffer rotation. (The old tile is still alive while the new one is
allocated, so a rebound tile counts twice at that moment — as with the
allocator's double buffering.) Each launch (and each program of an LNC grid)
gets a fresh tracker; outside a launch nothing is counted.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

from .errors import NkiCapacityError
from .targets import Target, current_target, psum_usable_banks

# Allocation granule for SBUF tiles. nl.tile_size.sbuf_min_align is not
# documented numerically; 64 B is our assumption (a DMA-friendly granule), so
# many tiny tiles cost what they would under a real aligned allocator.
SBUF_ALIGN = 64


class MemoryTracker:
    """Live on-chip bytes of one program of one launch."""

    def __init__(self, target: Target | None = None):
        self.target = target or current_target()
        self.sbuf_live = 0            # bytes per partition
        self.psum_banks_live = 0
        self.peak_sbuf = 0
        self.peak_psum_banks = 0
        self.closed = False
        self.psum_bank_limit = psum_usable_banks(self.target)
        # storage id -> (buffer, cost, description)
        self._live: dict[int, tuple[str, int, str]] = {}

    # cost of one storage on its buffer (bytes per partition, or banks)
    def cost(self, storage) -> int:
        per_partition = storage.bytes_per_partition
        if storage.buffer == "sbuf":
            return -(-per_partition // SBUF_ALIGN) * SBUF_ALIGN
        return max(1, math.ceil(per_partition / self.target.psum_bank_bytes))

    def _largest(self, buffer: str, n: int = 3) -> str:
        items = sorted((c, d) for b, c, d in self._live.values() if b == buffer)[::-1][:n]
        unit = "B" if buffer == "sbuf" else " bank(s)"
        return ", ".join(f"{d}: {c}{unit}" for c, d in items) or "none"

    def allocate(self, storage, description: str) -> None:
        """Count ``storage`` as live; raise NkiCapacityError if it does not fit."""
        if storage.buffer not in ("sbuf", "psum"):
            return
        cost = self.cost(storage)
        t = self.target
        if storage.buffer == "sbuf":
            limit = t.sbuf_usable_bytes
            if self.sbuf_live + cost > limit:
                raise NkiCapacityError(
                    f"SBUF capacity exceeded allocating {description}: {cost} bytes per "
                    f"partition, {self.sbuf_live} already live, limit {limit} bytes per "
                    f"partition on {t.name} ({t.sbuf_bytes_per_partition // 1024} KiB less "
                    f"{t.sbuf_reserved_bytes // 1024} KiB reserve); largest live: "
                    f"{self._largest('sbuf')}")
            self.sbuf_live += cost
            self.peak_sbuf = max(self.peak_sbuf, self.sbuf_live)
        else:
            limit = self.psum_bank_limit
            if self.psum_banks_live + cost > limit:
                raise NkiCapacityError(
                    f"PSUM capacity exceeded allocating {description}: "
                    f"{storage.bytes_per_partition} bytes per partition = {cost} bank(s) of "
                    f"{t.psum_bank_bytes} B, {self.psum_banks_live} bank(s) already live, "
                    f"limit {limit} banks on {t.name}; largest live: {self._largest('psum')}")
            self.psum_banks_live += cost
            self.peak_psum_banks = max(self.peak_psum_banks, self.psum_banks_live)
        self._live[storage.id] = (storage.buffer, cost, description)
        storage._tracker = self  # Storage.__del__ calls free()

    def free(self, storage_id: int) -> None:
        """Return a storage's capacity (called when it is garbage collected)."""
        entry = self._live.pop(storage_id, None)
        if entry is None or self.closed:
            return
        buffer, cost, _ = entry
        if buffer == "sbuf":
            self.sbuf_live -= cost
        else:
            self.psum_banks_live -= cost

    def usage(self) -> dict:
        """Current and peak usage, for reports."""
        return {"target": self.target.name, "sbuf_live": self.sbuf_live,
                "sbuf_peak": self.peak_sbuf, "sbuf_limit": self.target.sbuf_usable_bytes,
                "psum_banks_live": self.psum_banks_live, "psum_banks_peak": self.peak_psum_banks,
                "psum_banks_limit": self.psum_bank_limit}


_active: list[MemoryTracker] = []


def current() -> MemoryTracker | None:
    """The tracker of the running launch, or None outside a launch."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def launch(target: Target | None = None) -> Iterator[MemoryTracker]:
    """Count on-chip allocations made inside the block against ``target``."""
    tracker = MemoryTracker(target)
    _active.append(tracker)
    try:
        yield tracker
    finally:
        _active.remove(tracker)
        tracker.closed = True


def track(storage, description: str) -> None:
    """Register a new on-chip storage with the active tracker (if any)."""
    if _active:
        _active[-1].allocate(storage, description)


__all__ = ["MemoryTracker", "SBUF_ALIGN", "current", "launch", "track"]
