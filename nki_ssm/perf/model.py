"""List scheduling of a simulator trace onto one NeuronCore's engines.

Resources: TensorE, VectorE, ScalarE and GpSimd each run their instructions
in program order; DMA transfers go to the core's 16 DMA engines. A transfer
over P SBUF partitions uses ``min(16, ceil(P / 8))`` engines, taken as the
ones that can start it earliest (a piece may fill an earlier idle gap: each
engine serves 16 queues, so a transfer ready early is not held behind one
issued before it but ready late); its data moves for
``bytes / (engines * BW * eff)`` and
it starts no earlier than ``ready + dma_fixed_ns`` (descriptor and
semaphore-to-start latency, overlappable with earlier transfers on the same
queue since queues prefetch descriptors).

An instruction starts when its engine is free and every instruction it
depends on has finished. Dependencies come from overlapping ``Region``s:
read-after-write (wait for the producer's end), write-after-read (the writer
may not start before the reader ends) and write-after-write. Extra latency
on a dependency: ``raw_latency_ns`` when a Vector/Scalar instruction reads
what the same engine just wrote (the documented ~100-cycle static overhead
of dependent instructions), ``semaphore_ns`` across engines (0 by default,
see hardware.SOURCES).

Dependency lookup is indexed per ``storage_id``: writes and reads are kept
in short per-storage lists; a new write drops the entries it fully covers
(later accesses depend on it, and it already waited for them), and a list
longer than ``_MAX_RECORDS`` folds its oldest half into one covering record
(conservative: it can only add dependencies on old, long-finished work).

On-chip capacity: an SBUF tile (bytes per partition) or PSUM tile (whole
banks) is live from its first to its last access in program order; a new
tile that does not fit waits until enough dead tiles have been released
(``_Pool``), which bounds DMA prefetch depth and makes TensorE wait for PSUM
evictions once 8 banks are in use.

Descriptor generation: a DMA with dynamic descriptors (``dge_mode`` hwdge,
or swdge / vector-offset gathers; see ``costs.dge_mode``) first occupies a
hardware DGE instance (hwdge, 2 per core on trn2/trn3) or the in-order GpSimd
queue (swdge) for ~600 ns; its data moves no earlier than the end of that.

Not modelled (said in the report): compiler reordering beyond the in-order
engine queues, kernel launch overhead.
"""
from __future__ import annotations

import bisect
import heapq
from collections import Counter

import numpy as np

from nki_ssm.perf import costs
from nki_ssm.perf.hardware import HardwareSpec, get_target
from nki_ssm.perf.timing import COMPUTE_ENGINES, ENGINE_ORDER, Schedule, Timing

_MAX_RECORDS = 48


class _Access:
    __slots__ = ("p0", "p1", "b0", "b1", "end", "idx", "unit")

    def __init__(self, p0, p1, b0, b1, end, idx, unit):
        self.p0, self.p1, self.b0, self.b1 = p0, p1, b0, b1
        self.end, self.idx, self.unit = end, idx, unit


def _span(r):
    return r.partition_start, r.partition_start + r.num_partitions, r.byte_start, r.byte_stop


def _fold(records: list) -> None:
    """Merge the oldest half of ``records`` into one covering record (in place)."""
    half = len(records) // 2
    old = records[:half]
    last = max(old, key=lambda a: a.end)
    merged = _Access(min(a.p0 for a in old), max(a.p1 for a in old), min(a.b0 for a in old),
                     max(a.b1 for a in old), last.end, last.idx, last.unit)
    records[:half] = [merged]


def _instructions(trace_or_list):
    return trace_or_list.instructions if hasattr(trace_or_list, "instructions") else list(trace_or_list)


def model(trace, target: "str | HardwareSpec | None" = None, *, keep_schedule: bool = True) -> Timing:
    """Time a trace (``trace.Trace`` or a list of ``trace.Instruction``) on ``target``.

    ``target`` None uses the trace's own target (if it names one) else trn2.
    """
    insts = _instructions(trace)
    if target is None:
        target = getattr(trace, "target", None) or None
    hw = get_target(target)
    n = len(insts)
    start = np.zeros(n)
    end = np.zeros(n)
    data_start = np.zeros(n)
    pred = np.full(n, -1, dtype=np.int64)
    dma_mask = np.zeros(n, dtype=np.int64)
    pids = np.zeros(n, dtype=np.int64)
    units: list = [None] * n
    ops: list = [None] * n

    engine_free: dict = {}   # (pid, engine) -> (time, last index)
    dge_free: dict = {}      # pid -> [[free time, last index] per hardware DGE instance]
    issue_start = np.full(n, np.nan)
    issue_end = np.full(n, np.nan)
    issue_unit: list = [None] * n
    dma_free: dict = {}      # pid -> (np.array free times, np.array last index)
    writes: dict = {}
    reads: dict = {}
    busy = dict.fromkeys(ENGINE_ORDER, 0.0)
    op_time: dict = {}       # "engine:op" -> busy ns (DMA: transfer time)
    dma_bytes = dma_transfers = flops = 0
    raw_lat = {e: costs.raw_latency_ns(e, hw) for e in COMPUTE_ENGINES}
    sem = hw.semaphore_ns
    first_use, dies_at, size_of = _lifetimes(insts, hw)
    pools: dict = {}         # (pid, buffer) -> _Pool
    last_end: dict = {}      # storage id -> (latest end of an access, that instruction)

    for i, inst in enumerate(insts):
        unit = inst.engine
        pid = int(getattr(inst, "program_id", 0) or 0)
        units[i], ops[i], pids[i] = unit, inst.op, pid
        ready, dep = 0.0, -1
        # read-after-write
        for r in inst.reads:
            recs = writes.get(r.storage_id)
            if not recs:
                continue
            p0, p1, b0, b1 = _span(r)
            for a in recs:
                if a.p0 < p1 and p0 < a.p1 and a.b0 < b1 and b0 < a.b1:
                    t = a.end + (raw_lat.get(unit, 0.0) if a.unit == unit else sem)
                    if t > ready:
                        ready, dep = t, a.idx
        # write-after-read and write-after-write
        for w in inst.writes:
            p0, p1, b0, b1 = _span(w)
            for table in (reads, writes):
                for a in table.get(w.storage_id, ()):
                    if a.p0 < p1 and p0 < a.p1 and a.b0 < b1 and b0 < a.b1:
                        t = a.end + (0.0 if a.unit == unit else sem)
                        if t > ready:
                            ready, dep = t, a.idx

        # a new on-chip tile waits until the buffer it reuses is released
        for sid in first_use.get(i, ()):
            buf = size_of[sid][0]
            pool = pools.get((pid, buf))
            if pool is None:
                cap = hw.sbuf_bytes_per_partition if buf == "sbuf" else hw.psum_banks
                pool = pools[(pid, buf)] = _Pool(cap)
            t, blocker = pool.allocate(size_of[sid][1])
            if t > ready:
                ready, dep = t, blocker

        if unit == "dma":
            n_eng, xfer = costs.dma_plan(inst, hw)
            if pid not in dma_free:
                dma_free[pid] = _DmaEngines(hw.dma_engines)
            earliest, early_dep = ready + hw.dma_fixed_ns, dep
            dge = costs.dge_mode(inst, hw)
            if dge is not None:
                # descriptors are generated (after the DMA's inputs are ready) before data can move
                if dge == "hwdge":
                    slots = dge_free.setdefault(pid, [[0.0, -1] for _ in range(hw.hwdge_instances)])
                    slot = min(slots, key=lambda x: x[0])
                    t_iss = max(ready, slot[0])
                    who = slot[1] if slot[0] > ready else dep
                    slot[0], slot[1] = t_iss + hw.hwdge_issue_ns, i
                    t_iss_end = slot[0]
                else:
                    gkey = (pid, "gpsimd")
                    g_free, g_last = engine_free.get(gkey, (0.0, -1))
                    t_iss = max(ready, g_free)
                    who = g_last if g_free > ready else dep
                    t_iss_end = t_iss + hw.swdge_issue_ns
                    engine_free[gkey] = (t_iss_end, i)
                    busy["gpsimd"] += hw.swdge_issue_ns
                    okey = "gpsimd:swdge descriptors"
                    op_time[okey] = op_time.get(okey, 0.0) + hw.swdge_issue_ns
                issue_start[i], issue_end[i], issue_unit[i] = t_iss, t_iss_end, dge
                if t_iss_end > earliest:
                    earliest, early_dep = t_iss_end, who
            t0, t1, mask, blocker = dma_free[pid].place(earliest, xfer, n_eng, i)
            pred[i] = early_dep if blocker < 0 else blocker
            dma_mask[i] = mask
            start[i], data_start[i], end[i] = ready, t0, t1
            dma_bytes += int(inst.nbytes)
            dma_transfers += 1
            key = "dma:" + inst.op
            op_time[key] = op_time.get(key, 0.0) + (t1 - t0)
        else:
            dur = costs.compute_ns(inst, hw)
            key = (pid, unit)
            free_t, last_i = engine_free.get(key, (0.0, -1))
            if ready > free_t:
                t0, pred[i] = ready, dep
            else:
                t0, pred[i] = free_t, last_i
            t1 = t0 + dur
            engine_free[key] = (t1, i)
            start[i], data_start[i], end[i] = t0, t0, t1
            busy[unit] += dur
            key = unit + ":" + inst.op
            op_time[key] = op_time.get(key, 0.0) + dur
            flops += costs.matmul_flops(inst)

        t_end = end[i]
        for r in inst.reads + inst.writes:
            prev = last_end.get(r.storage_id)
            if prev is None or t_end > prev[0]:
                last_end[r.storage_id] = (t_end, i)
        for sid in dies_at.get(i, ()):
            t_rel, who = last_end[sid]
            pools[(pid, size_of[sid][0])].release(size_of[sid][1], t_rel, who)
        for r in inst.reads:
            recs = reads.setdefault(r.storage_id, [])
            recs.append(_Access(*_span(r), t_end, i, unit))
            if len(recs) > _MAX_RECORDS:
                _fold(recs)
        for w in inst.writes:
            p0, p1, b0, b1 = _span(w)
            for table in (reads, writes):
                recs = table.get(w.storage_id)
                if recs:
                    # entries fully covered by this write are implied by it from now on
                    table[w.storage_id] = [a for a in recs if not (
                        p0 <= a.p0 and a.p1 <= p1 and b0 <= a.b0 and a.b1 <= b1)]
            recs = writes.setdefault(w.storage_id, [])
            recs.append(_Access(p0, p1, b0, b1, t_end, i, unit))
            if len(recs) > _MAX_RECORDS:
                _fold(recs)

    total = float(end.max()) if n else 0.0
    busy["dma"] = _union_length(data_start, end, [u == "dma" for u in units])
    critical = dict.fromkeys(ENGINE_ORDER, 0.0)
    if n:
        i = int(np.argmax(end))
        while i >= 0:
            p = int(pred[i])
            critical[units[i]] = critical.get(units[i], 0.0) + end[i] - (end[p] if p >= 0 else 0.0)
            i = p
    binding = max(critical, key=lambda e: critical[e]) if n else "none"
    busiest = max(busy, key=lambda e: busy[e]) if n else "none"
    queue_busy = np.zeros(hw.dma_engines)
    for engines in dma_free.values():
        queue_busy += engines.busy
    num_cores = max(1, len(set(pids.tolist()))) if n else 1
    sched = Schedule(start=start, end=end, unit=units, op=ops, dma_mask=dma_mask,
                     dma_data_start=data_start, program_id=pids, pred=pred,
                     issue_start=issue_start, issue_end=issue_end, issue_unit=issue_unit) if keep_schedule else None
    return Timing(
        target=hw.name, time_ns=total, busy_ns=busy, critical_ns=critical,
        binding_engine=binding, busiest_engine=busiest, dma_queue_busy_ns=queue_busy.tolist(),
        dma_bytes=dma_bytes, dma_transfers=dma_transfers, matmul_flops=flops,
        num_instructions=n, op_counts=dict(Counter(f"{u}:{o}" for u, o in zip(units, ops))),
        op_time_ns=op_time, bf16_peak_flops=hw.bf16_peak_flops,
        dma_bw_bytes_per_ns=hw.dma_bw_per_core, num_cores=num_cores, schedule=sched)


def _lifetimes(insts, hw: HardwareSpec):
    """On-chip storages: first-use index, last-use index and (buffer, size) of each.

    Size: SBUF bytes per partition (the largest byte offset touched, in 64 B
    granules as the simulator allocates); PSUM whole 2 KiB banks.
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
            size[sid][1] = max(1, -(-nbytes // hw.psum_bank_bytes))
    first_use, dies_at = {}, {}
    for sid, i in first.items():
        first_use.setdefault(i, []).append(sid)
    for sid, i in last.items():
        dies_at.setdefault(i, []).append(sid)
    return first_use, dies_at, size


class _Pool:
    """On-chip capacity (SBUF bytes per partition or PSUM banks) of one core.

    Tiles are live from their first to their last access in program order
    (the simulator frees a tile when the kernel drops it). A new tile that
    does not fit waits for enough dead tiles to be released (their last
    access finished), earliest releases first — the allocator's buffer
    rotation. If even that cannot make room (the kernel exceeds capacity,
    which the simulator rejects), no wait is added.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.live = 0
        self.dead: list = []      # heap of (release time, size, instruction)
        self.dead_total = 0

    def allocate(self, size: int):
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


class _DmaEngines:
    """Busy intervals of one core's DMA engines; a transfer piece may fill an earlier gap.

    Each engine serves 16 queues (nki_spec §8.2), so a transfer that becomes
    ready late does not hold back a later-issued one that is ready early:
    pieces are placed at the earliest gap that fits (backfilling), not
    behind the last placed transfer.
    """

    def __init__(self, n: int):
        self.n = n
        self.starts = [[] for _ in range(n)]
        self.ends = [[] for _ in range(n)]
        self.owner = [[] for _ in range(n)]
        self.busy = np.zeros(n)

    def _fit(self, q: int, earliest: float, dur: float):
        starts, ends, owner = self.starts[q], self.ends[q], self.owner[q]
        k = bisect.bisect_right(ends, earliest)
        t, blocker = earliest, -1
        while k < len(starts):
            if starts[k] >= t + dur:
                break
            if ends[k] > t:
                t, blocker = ends[k], owner[k]
            k += 1
        return t, k, blocker

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


def _union_length(t0: np.ndarray, t1: np.ndarray, select: list) -> float:
    """Total length of the union of intervals [t0, t1) where select is True."""
    sel = np.asarray(select, dtype=bool)
    if not sel.any():
        return 0.0
    a, b = t0[sel], t1[sel]
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    total, cur0, cur1 = 0.0, a[0], b[0]
    for s, e in zip(a[1:], b[1:]):
        if s > cur1:
            total += cur1 - cur0
            cur0, cur1 = s, e
        elif e > cur1:
            cur1 = e
    return float(total + cur1 - cur0)
