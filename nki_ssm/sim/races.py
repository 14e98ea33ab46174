"""HBM race detection between the programs of an LNC=2 launch.

The two programs of ``kernel[2]`` run on two physical NeuronCores at once over
the same HBM (aws-neuron-sdk ``nki/guides/nki_simulator.rst``, "Execution":
"the simulator spawns two Python threads that execute the kernel
concurrently ... Input arrays use shared_hbm buffers, so both threads can
access shared memory"). Nothing orders one core's HBM accesses against the
other's except a synchronisation both reach: ``nisa.core_barrier`` ("a
synchronization point where all specified NeuronCores must reach before any
can proceed ... both cores can perform the write to data in HBM ... and then
signal to each other when the write operation is complete", nki.isa API page)
or ``nisa.sendrecv`` (its default DMA mode "Uses the standard DMA engine with
CoreBarrier synchronization", same page). So between two synchronisations (an
*epoch*) a byte one program writes and the other program writes or reads has
no defined value on hardware: the result depends on timing. The SDK
simulator does not report it (its threads interleave as the GIL schedules
them); this simulator runs the programs in deterministic lock-step
(``sim.lnc``), so it can, and it does, as an error: a race is a hardware bug
whatever order a CPU simulation happens to pick (DESIGN.md: the simulator
rejects what the hardware does not do reliably). Reads by both programs are
fine.

What is recorded, per program and per epoch: every HBM view an instruction
reads or writes (``sim.isa._core.emit`` passes its operands; the register
instructions pass theirs), with the kernel source line. A direct view is kept
as its offset/shape/strides, a ``scalar_offset`` view likewise with the
offset its register or index tile held when it ran, a ``vector_offset``
gather or scatter as the element indices it touched then (the index tile may
change later). Private HBM
(``nl.hbm``) allocations are per program and never shared, so they never
meet.

The check at the end of an epoch is byte-exact: per HBM storage both
programs touched and at least one wrote, first the covering byte spans
(cheap; disjoint rows never go further), then, where they intersect, a
per-unit mask (units of the greatest common itemsize of the views, so a
``.view(dtype)`` bitcast is still exact) over the intersecting span: direct
views mark it through strided NumPy views, indirect ones through their
element indices (a row gather's kept as its row starts and one row pattern); a span
over 128 Mi units is checked in windows to bound memory. The error
(:class:`NkiRaceError`) names the tensor,
both programs, the first overlapping element (as an index of the tensor's
shape), what each did (write/write or write/read) and both instructions with
their source lines.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import NkiRaceError
from .memory import _kernel_site as _site      # file:line of the kernel line issuing it

# one HbmLog while an LNC>1 launch runs (sim.isa._core.emit tests this list on its hot path)
ACTIVE: list = []

# the exact check's mask: one uint8 per unit over the intersecting span, marked through
# strided views of direct accesses, when the span is at most _WHOLE units (128 MiB); a
# larger span is checked in windows of _WINDOW units through index arrays
_WHOLE = 1 << 27
_WINDOW = 1 << 24


class _Access:
    """One HBM view an instruction read or wrote: its units are computed only when checked.

    A direct (or scalar-offset) view is kept as ``start`` (first element, offset included),
    ``shape`` and ``strides`` (the view's own tuples: no reference to the view or its
    caches); an indirect row gather/scatter as ``elems``, the element indices it touched.
    """

    __slots__ = ("write", "start", "shape", "strides", "elems", "itemsize", "lo", "hi", "op",
                 "site")

    def __init__(self, write, start, shape, strides, elems, itemsize, lo, hi, op, site):
        self.write, self.start, self.shape, self.strides = write, start, shape, strides
        self.elems, self.itemsize, self.lo, self.hi = elems, itemsize, lo, hi
        self.op, self.site = op, site

    def elements(self) -> np.ndarray:
        """Flat element indices (in units of ``itemsize``) of the storage it touched."""
        if isinstance(self.elems, tuple):           # compact rows: row start + one pattern
            rows, pattern = self.elems
            return (rows[:, None] + pattern[None, :]).reshape(-1)
        if self.elems is not None:
            return self.elems
        shape = self.shape
        e = np.full((1,) * len(shape), self.start, dtype=np.int64)
        for k, (n, s) in enumerate(zip(shape, self.strides)):
            if n > 1 and s != 0:
                shp = [1] * len(shape)
                shp[k] = n
                e = e + (np.arange(n, dtype=np.int64) * s).reshape(shp)
        return e.reshape(-1)

    def units(self, unit: int) -> np.ndarray:
        """Indices of the ``unit``-byte units it touched (each element is itemsize/unit)."""
        per = self.itemsize // unit
        e = self.elements() * per
        if per == 1:
            return e
        return (e[:, None] + np.arange(per, dtype=np.int64)[None, :]).reshape(-1)

    def describe(self) -> str:
        return f"{'write' if self.write else 'read'} by {self.op} at {self.site}"


class HbmLog:
    """HBM accesses of every program in the current epoch: {pid: {storage id: [_Access]}}."""

    def __init__(self, num_programs: int):
        self.num_programs = num_programs
        self.epoch = 0
        self.storages: dict = {}
        self.alloc_sites: dict = {}     # storage id -> where an unnamed shared tensor was made
        self._sites: dict = {}
        self._acc: list[dict] = [dict() for _ in range(num_programs)]

    def note(self, pid: int, op: str, reads=(), writes=()) -> None:
        """Record the HBM views instruction ``op`` of program ``pid`` reads and writes."""
        site = None
        for write, tensors in ((False, reads), (True, writes)):
            for t in tensors:
                if t is None:
                    continue
                st = t.storage
                if st.buffer != "hbm":
                    continue
                if site is None:
                    site = _site()
                    site = self._sites.setdefault(site, site)     # one copy per line
                isz = t.dtype.itemsize
                ind = t.indirection
                if ind is None:
                    r = t.region()
                    acc = _Access(write, t.offset, t.shape, t.strides, None, isz, r.byte_start,
                                  r.byte_stop, op, site)
                elif ind.kind == "scalar":
                    # the whole view moved by one run-time offset
                    if not ind.valid().all():
                        continue               # skipped (oob_mode.skip): touches nothing
                    shift = int(ind.offsets(clamp=True)[0])
                    lo, hi = t._span(0, indirect=False)
                    base = t.offset + shift
                    acc = _Access(write, base, t.shape, t.strides, None, isz, (base + lo) * isz,
                                  (base + hi + 1) * isz, op, site)
                else:
                    e = np.asarray(t.elements(clamp_oob=True)).reshape(t.shape[0], -1)
                    valid = ind.valid()
                    if ind.kind == "vector" and valid.shape[0] == e.shape[0] and not valid.all():
                        e = e[valid]           # skipped rows (oob_mode.skip) touch nothing
                    if not e.size:
                        continue
                    acc = _Access(write, 0, None, None, _compact(e), isz, int(e.min()) * isz,
                                  (int(e.max()) + 1) * isz, op, site)
                self.storages[st.id] = st
                self._acc[pid].setdefault(st.id, []).append(acc)

    # -- the check at a synchronisation (or at the end of the launch)
    def end_epoch(self, boundary: str) -> None:
        """Raise NkiRaceError if two programs' accesses of this epoch conflict; then forget
        them (``boundary`` says which synchronisation, or the end, closes the epoch)."""
        try:
            if self.num_programs == 2:
                a, b = self._acc
                for sid in a.keys() & b.keys():
                    self._check(sid, a[sid], b[sid], boundary)
        finally:
            self._acc = [dict() for _ in range(self.num_programs)]
            self.storages = {}
            self.epoch += 1

    def _check(self, sid, acc0, acc1, boundary) -> None:
        w0 = [x for x in acc0 if x.write]
        w1 = [x for x in acc1 if x.write]
        if not w0 and not w1:
            return                      # reads by both programs are fine
        spans = _conflict_spans(w0, acc1) + _conflict_spans(w1, acc0)
        if not spans:
            return
        lo = min(s[0] for s in spans)
        hi = max(s[1] for s in spans)
        unit = 0
        for x in (*acc0, *acc1):
            unit = math.gcd(unit, x.itemsize)
        u0, u1 = lo // unit, -(-hi // unit)
        whole = u1 - u0 <= _WHOLE
        step = u1 - u0 if whole else _WINDOW
        for start in range(u0, u1, step):
            stop = min(u1, start + step)
            hit = self._first_conflict(acc0, acc1, unit, start, stop, whole=whole)
            if hit is not None:
                self._raise(sid, acc0, acc1, unit, hit, boundary)

    @staticmethod
    def _first_conflict(acc0, acc1, unit, start, stop, whole=False):
        """The first unit in [start, stop) one program writes and the other touches
        (``whole``: [start, stop) covers every access that meets it)."""
        code = np.zeros(stop - start, dtype=np.uint8)
        lo_b, hi_b = start * unit, stop * unit
        for accs, wbit, rbit in ((acc0, 1, 2), (acc1, 4, 8)):
            for x in accs:
                if x.hi <= lo_b or x.lo >= hi_b:
                    continue
                if whole and x.elems is None and x.lo >= lo_b and x.hi <= hi_b:
                    # mark a direct access through a strided view of the mask (no index array)
                    per = x.itemsize // unit
                    m = np.lib.stride_tricks.as_strided(
                        code[x.start * per - start:], shape=(*x.shape, per),
                        strides=(*(st * per for st in x.strides), 1))
                    m |= wbit if x.write else rbit
                    continue
                u = x.units(unit)
                u = u[(u >= start) & (u < stop)] - start
                code[u] |= wbit if x.write else rbit
        bad = ((code & 1) != 0) & ((code & 12) != 0) | ((code & 4) != 0) & ((code & 3) != 0)
        idx = np.flatnonzero(bad)
        return None if not idx.size else start + int(idx[0])

    def _raise(self, sid, acc0, acc1, unit, hit, boundary):
        def culprit(accs, want_write):
            for x in accs:
                if (want_write is None or x.write == want_write) and x.lo <= hit * unit < x.hi \
                        and np.any(x.units(unit) == hit):
                    return x
            return None
        # prefer a write of program 0 against program 1's access, else the reverse
        a = culprit(acc0, True)
        b = culprit(acc1, None) if a is not None else None
        if b is None:
            b = culprit(acc1, True)
            a = culprit(acc0, None)
        st = self.storages[sid]
        name = repr(st.name) if st.name else (
            f"the shared_hbm tensor allocated at {self.alloc_sites.get(sid, '?')}")
        itemsize = st.dtype.itemsize
        flat = (hit * unit) // itemsize
        index = tuple(int(i) for i in np.unravel_index(flat, st.shape)) if flat < math.prod(
            st.shape) else (flat,)
        what = (f"program 0 {'writes' if a.write else 'reads'} and program 1 "
                f"{'writes' if b.write else 'reads'}")
        raise NkiRaceError(
            f"HBM race on {name} {tuple(st.shape)} {st.dtype} ({st.kind.value}) between the "
            f"programs of the LNC=2 grid: {what} element {index} (byte {hit * unit}) with no "
            f"nisa.core_barrier / nisa.sendrecv between them (epoch {self.epoch}, closed by "
            f"{boundary}). Program 0: {a.describe()}; program 1: {b.describe()}. The two "
            "physical cores run at once, so the value is timing-dependent on hardware: give "
            "each program disjoint HBM, or synchronise between the write and the other "
            "program's access")


def _compact(e: np.ndarray):
    """A gather/scatter's element indices ``e`` [rows, per row], kept small: ``(row starts,
    pattern)`` when every row is its start plus the same pattern (a row gather: rows x row
    length indices would be 8 bytes per element moved, GBs over a 512-sequence state pool),
    else the flat indices (a copy: the index tile may change later)."""
    if e.ndim == 2 and e.shape[1] > 1:
        rows = e[:, 0].copy()
        pattern = e[0] - e[0, 0]
        if np.array_equal(e - rows[:, None], np.broadcast_to(pattern, e.shape)):
            return rows, pattern.copy()
    return e.reshape(-1).copy()


def _merged(accs) -> list:
    spans = sorted((x.lo, x.hi) for x in accs)
    out: list = []
    for lo, hi in spans:
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    return out


def _conflict_spans(writes, others) -> list:
    """Byte spans where the covering spans of ``writes`` meet those of ``others``."""
    if not writes or not others:
        return []
    a, b = _merged(writes), _merged(others)
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def note_allocation(storage) -> None:
    """Remember where an ``nl.shared_hbm`` tensor was allocated (named in a race report)."""
    if ACTIVE:
        ACTIVE[-1].alloc_sites[storage.id] = _site()


def note(op: str, reads=(), writes=()) -> None:
    """Record an instruction's HBM operands in the running LNC launch's log (if any)."""
    if ACTIVE:
        from .isa._core import _program_id
        ACTIVE[-1].note(_program_id(), op, reads, writes)


__all__ = ["HbmLog", "ACTIVE", "note", "note_allocation"]
