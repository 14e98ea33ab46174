"""Data dependencies between traced instructions, indexed per storage.

``DependencyIndex.ready(inst, unit)`` is the earliest time ``inst`` may start
given every earlier instruction that touched overlapping regions:
read-after-write (the producer's end, plus ``same_engine_latency[unit]``
when the producer ran on the same compute engine, ``dma_completion_ns`` when
it is a DMA (the completion semaphore), else the producer engine's
``result_latency`` (its pipeline: the result is written that long after the
engine is free for its next instruction) plus ``cross_engine_ns``),
write-after-read and write-after-write (the earlier access's end, plus the
same semaphore latency when the engines differ).
``record`` adds an instruction's accesses once it is placed.

Programs (LNC=2): accesses are indexed per program id, so the two programs of
a logical core never wait on each other through a storage they share (they
touch disjoint bytes of an HBM tensor; the simulator rejects overlapping
accesses without a synchronisation between them, and ``model.py`` orders the
programs only at those synchronisations). A folded record (below) can span
bytes of both programs' work; keeping the programs apart also keeps it from
ordering one after the other. (Program 0's key is the storage id itself, the
common LNC=1 case; program p's is ``(p, storage id)``.)

Per storage the index keeps short lists of writes and reads. A new write
drops the entries it fully covers (later accesses depend on it, and it
already waited for them); a list longer than ``MAX_RECORDS`` folds its
oldest half into one covering record (conservative: it can only add
dependencies on old, long-finished work). Traces of ~1e5 instructions are
indexed in seconds.
"""
from __future__ import annotations

MAX_RECORDS = 48
LOWERED = "lowered"   # pseudo-unit of instructions absent from the compiler's lowering


class _Access:
    __slots__ = ("p0", "p1", "b0", "b1", "end", "idx", "unit")

    def __init__(self, p0, p1, b0, b1, end, idx, unit):
        self.p0, self.p1, self.b0, self.b1 = p0, p1, b0, b1
        self.end, self.idx, self.unit = end, idx, unit


def span(r):
    """(first partition, end partition, first byte, end byte) of a Region."""
    return r.partition_start, r.partition_start + r.num_partitions, r.byte_start, r.byte_stop


def _fold(records: list) -> None:
    """Merge the oldest half of ``records`` into one covering record (in place)."""
    half = len(records) // 2
    old = records[:half]
    last = max(old, key=lambda a: a.end)
    merged = _Access(min(a.p0 for a in old), max(a.p1 for a in old), min(a.b0 for a in old),
                     max(a.b1 for a in old), last.end, last.idx, last.unit)
    records[:half] = [merged]


class DependencyIndex:
    def __init__(self, same_engine_latency: dict, cross_engine_ns: float, dma_completion_ns: float = None,
                 result_latency: dict | None = None):
        self.same = same_engine_latency
        self.cross = cross_engine_ns
        self.result = result_latency or {}
        self.dma = cross_engine_ns if dma_completion_ns is None else dma_completion_ns
        self.writes: dict = {}
        self.reads: dict = {}

    def _sync(self, producer: str, consumer: str) -> float:
        """Semaphore latency between two different engines (a DMA signals completion).

        ``LOWERED`` marks an instruction the compiler does not emit (costs.absent_in_lowering):
        it passes its producer's value on at once, so the sync is paid once per real hop.
        """
        if producer == LOWERED:
            return 0.0
        return self.dma if producer == "dma" else self.cross

    def ready(self, inst, unit: str, program: int = 0) -> tuple[float, int]:
        """(earliest start, index of the instruction that sets it or -1), within ``program``."""
        ready, dep = 0.0, -1
        raw_same = self.same.get(unit, 0.0)
        for r in inst.reads:
            recs = self.writes.get(r.storage_id if program == 0 else (program, r.storage_id))
            if not recs:
                continue
            p0, p1, b0, b1 = span(r)
            for a in recs:
                if a.p0 < p1 and p0 < a.p1 and a.b0 < b1 and b0 < a.b1:
                    if a.unit == unit and unit != "dma":
                        t = a.end + raw_same
                    else:
                        t = a.end + self.result.get(a.unit, 0.0) + self._sync(a.unit, unit)
                    if t > ready:
                        ready, dep = t, a.idx
        for w in inst.writes:
            p0, p1, b0, b1 = span(w)
            for table in (self.reads, self.writes):
                for a in table.get(w.storage_id if program == 0 else (program, w.storage_id), ()):
                    if a.p0 < p1 and p0 < a.p1 and a.b0 < b1 and b0 < a.b1:
                        t = a.end + (0.0 if (a.unit == unit and unit != "dma") else self._sync(a.unit, unit))
                        if t > ready:
                            ready, dep = t, a.idx
        return ready, dep

    def record(self, inst, unit: str, t_end: float, idx: int, program: int = 0) -> None:
        for r in inst.reads:
            recs = self.reads.setdefault(r.storage_id if program == 0 else (program, r.storage_id), [])
            recs.append(_Access(*span(r), t_end, idx, unit))
            if len(recs) > MAX_RECORDS:
                _fold(recs)
        for w in inst.writes:
            p0, p1, b0, b1 = span(w)
            key = w.storage_id if program == 0 else (program, w.storage_id)
            for table in (self.reads, self.writes):
                recs = table.get(key)
                if recs:
                    # entries fully covered by this write are implied by it from now on
                    table[key] = [a for a in recs if not (
                        p0 <= a.p0 and a.p1 <= p1 and b0 <= a.b0 and a.b1 <= b1)]
            recs = self.writes.setdefault(key, [])
            recs.append(_Access(p0, p1, b0, b1, t_end, idx, unit))
            if len(recs) > MAX_RECORDS:
                _fold(recs)
