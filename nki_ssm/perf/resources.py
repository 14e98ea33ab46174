"""The shared resources of one NeuronCore the scheduler places work on.

* ``InOrderEngine``: an engine queue in program order (TensorE, VectorE,
  ScalarE, GpSimd; also a hardware DGE instance).
* ``DmaEngines``: the 16 DMA engines; a transfer piece may fill an earlier
  idle gap (each engine serves 16 queues, so a transfer ready early is not
  held behind one issued before it but ready late).
* ``BusyIntervals``: when a core moves HBM data (the two programs of an LNC=2
  core share their HBM bank's bandwidth while both do).
* ``BufferPool``: SBUF bytes per partition or PSUM banks; a tile is live from
  its first to its last access (the simulator frees a tile when the kernel
  drops it); a new tile that does not fit waits for dead tiles to be
  released, earliest releases first (the allocator's buffer rotation).
"""
from __future__ import annotations

import bisect
import heapq

import numpy as np


class InOrderEngine:
    """Free time and last instruction of one in-order queue."""

    __slots__ = ("free", "last")

    def __init__(self):
        self.free, self.last = 0.0, -1

    def place(self, ready: float, dep: int, dur: float, idx: int) -> tuple[float, int]:
        """-> (start, instruction that set the start or -1); occupies [start, start + dur)."""
        if ready > self.free:
            start, who = ready, dep
        else:
            start, who = self.free, self.last
        self.free, self.last = start + dur, idx
        return start, who


# How many later transfers of a queue a new piece may be slotted in front of (backfill).
# Bounds the search: a kernel issuing 1e5 DMAs ahead of their consumers would otherwise
# scan every queued interval for each new piece (quadratic).
MAX_BACKFILL = 64


class DmaEngines:
    """Busy intervals of one core's DMA engines."""

    def __init__(self, n: int):
        self.n = n
        self.starts = [[] for _ in range(n)]
        self.ends = [[] for _ in range(n)]
        self.owner = [[] for _ in range(n)]
        self.busy = np.zeros(n)

    def _fit(self, q: int, earliest: float, dur: float):
        starts, ends, owner = self.starts[q], self.ends[q], self.owner[q]
        k = bisect.bisect_right(ends, earliest)
        if len(starts) - k > MAX_BACKFILL:
            # too deep to search: queue behind the last transfer
            k = len(starts)
            return (ends[-1], k, owner[-1]) if ends[-1] > earliest else (earliest, k, -1)
        t, blocker = earliest, -1
        while k < len(starts):
            if starts[k] >= t + dur:
                break
            if ends[k] > t:
                t, blocker = ends[k], owner[k]
            k += 1
        return t, k, blocker

    def first_start(self, earliest: float, dur: float, engines: int) -> float:
        """When a transfer of ``engines`` pieces of ``dur`` would start (``place`` without placing)."""
        return min(self._fit(q, earliest, dur)[0] for q in range(self.n))

    def place(self, earliest: float, dur: float, engines: int, idx: int):
        """-> (first piece start, end, engine bit mask, instruction that delayed the last piece or -1)."""
        fits = [self._fit(q, earliest, dur) for q in range(self.n)]
        chosen = sorted(range(self.n), key=lambda q: (fits[q][0], q))[:engines]
        mask, first, last_q = 0, None, chosen[0]
        for q in chosen:
            t, k, _ = fits[q]
            self.starts[q].insert(k, t)
            self.ends[q].insert(k, t + dur)
            self.owner[q].insert(k, idx)
            self.busy[q] += dur
            mask |= 1 << q
            first = t if first is None else min(first, t)
            if t >= fits[last_q][0]:
                last_q = q
        t_last, _, blocker = fits[last_q]
        return first, t_last + dur, mask, (blocker if t_last > earliest else -1)


class BusyIntervals:
    """The union of busy intervals of one activity (e.g. a core's HBM-side transfers)."""

    def __init__(self):
        self.starts: list = []
        self.ends: list = []

    def overlaps(self, t0: float, t1: float) -> bool:
        """Whether [t0, t1) meets the union."""
        k = bisect.bisect_right(self.ends, t0)
        return k < len(self.starts) and self.starts[k] < t1

    def add(self, t0: float, t1: float) -> None:
        """Add [t0, t1), merging the intervals it meets (the lists stay sorted and disjoint)."""
        if t1 <= t0:
            return
        lo = bisect.bisect_left(self.ends, t0)
        hi = bisect.bisect_right(self.starts, t1)
        if lo < hi:
            t0, t1 = min(t0, self.starts[lo]), max(t1, self.ends[hi - 1])
        self.starts[lo:hi] = [t0]
        self.ends[lo:hi] = [t1]


class BufferPool:
    """On-chip capacity (SBUF bytes per partition or PSUM banks) of one core."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.live = 0
        self.dead: list = []      # heap of (release time, size, instruction)
        self.dead_total = 0

    def allocate(self, size: int) -> tuple[float, int]:
        """-> (time the tile can be used, instruction whose release it waited for or -1).

        If even every dead tile cannot make room (the kernel exceeds capacity,
        which the simulator rejects), no wait is added.
        """
        need = self.live + size + self.dead_total - self.capacity
        t, who = 0.0, -1
        while need > 0 and self.dead:
            rel, sz, idx = heapq.heappop(self.dead)
            need -= sz
            self.dead_total -= sz
            if rel > t:
                t, who = rel, idx
        self.live += size
        return (t, who) if need <= 0 else (0.0, -1)

    def release(self, size: int, when: float, who: int) -> None:
        self.live -= size
        self.dead_total += size
        heapq.heappush(self.dead, (when, size, who))


def lifetimes(insts, psum_bank_bytes: int):
    """On-chip storages: {first-use index: [ids]}, {last-use index: [ids]}, {id: [buffer, size]}.

    Size: SBUF bytes per partition (the largest byte offset touched, in 64 B
    granules as the simulator allocates); PSUM whole banks.
    """
    first, last, size = {}, {}, {}
    for i, inst in enumerate(insts):
        for r in inst.reads + inst.writes:
            if r.buffer not in ("sbuf", "psum"):
                continue
            sid = r.storage_id
            if sid not in first:
                first[sid] = i
                size[sid] = [r.buffer, 0]
            last[sid] = i
            if r.byte_stop > size[sid][1]:
                size[sid][1] = r.byte_stop
    for sid, (buf, nbytes) in size.items():
        if buf == "sbuf":
            size[sid][1] = -(-nbytes // 64) * 64
        else:
            size[sid][1] = max(1, -(-nbytes // psum_bank_bytes))
    first_use, dies_at = {}, {}
    for sid, i in first.items():
        first_use.setdefault(i, []).append(sid)
    for sid, i in last.items():
        dies_at.setdefault(i, []).append(sid)
    return first_use, dies_at, size
