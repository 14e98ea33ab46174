"""SBUF / PSUM capacity by access liveness, for one program of one launch.

The SDK simulator does not check capacity; the compiler does, by allocating
every on-chip tensor and spilling or failing when they do not fit. It
allocates by use, not by Python lifetime: a tile occupies memory from the
first instruction that accesses it to the last (a tile that no instruction
touches takes nothing). Two rules from the NKI docs shape the ranges:

- dynamic loops (``nki/deep-dives/nki-dynamic-loops.rst``, "Register
  Allocation Implications"): "Inside a dynamic_range loop the compiler must
  keep all live tensors in on-chip memory (SBUF/PSUM) for the entire duration
  of the loop", and "Tensors allocated inside the loop body are allocated
  once and reused across iterations". So a tile live at any point of a
  runtime loop is live for the whole loop, and the k-th allocation of every
  iteration of one loop body is ONE buffer (not one per iteration);
- everything else (Python loops, ``nl.affine_range`` ...) is unrolled, so a
  tile allocated per unrolled iteration is its own buffer, live only while
  it is used (the allocator rotates buffers; NKI performance guide, "declare
  buffers inside the loop body").

Because an eager simulator only knows a tile's last use at the end, the
tracker records each allocation's first and last access (by instruction
index of this program) while the kernel runs and checks capacity when the
body has finished, before anything is written back: a failed launch changes
nothing. The error names the instruction that needed one more buffer, the
tile it needed and the tiles live at that point.

Accounting, per partition (unchanged granules):

- SBUF: ``prod(shape[1:]) * itemsize`` rounded up to ``SBUF_ALIGN`` bytes,
  against ``Target.sbuf_usable_bytes`` (physical less the reserve stated in
  targets.py);
- PSUM: each tile takes ``ceil(bytes / 2048)`` whole 2 KiB banks (a matmul
  destination must sit in one bank, so tiles are not packed), at most
  ``psum_usable_banks`` (8; 7 with the PE-transpose reservation) live.

Access = any read or write of the tensor's data (``NkiTensor.read`` /
``write`` / ``elements``: every instruction operand, an index tensor an
indirect access reads, the fill of ``nl.zeros``) plus the operands an
instruction lists in the trace. Instruction ``k`` of a program stamps its
accesses with ``k``.
"""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Iterator

from .errors import NkiCapacityError
from .targets import Target, current_target, psum_usable_banks

# Allocation granule for SBUF tiles. nl.tile_size.sbuf_min_align is not
# documented numerically; 64 B is our assumption (a DMA-friendly granule), so
# many tiny tiles cost what they would under a real aligned allocator.
SBUF_ALIGN = 64

# how many live tiles an overflow message lists (largest first)
_LIST_LIVE = 12

_stack_fn = None


def _loop_stack() -> tuple:
    """Active runtime loop frames, outermost first (``sim.control.loop_stack``; () if the
    simulator has no runtime loops)."""
    global _stack_fn
    if _stack_fn is None:
        try:
            from .control import loop_stack as fn
        except ImportError:  # pragma: no cover - control is part of the simulator
            def fn():
                return ()
        _stack_fn = fn
    return _stack_fn()


def _kernel_site() -> str:
    """``file:line`` of the innermost frame outside the simulator (the kernel line)."""
    f = sys._getframe(1)
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if not mod.startswith("nki_ssm.sim") and not mod.startswith("contextlib"):
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return "?"


class _Alloc:
    """One on-chip allocation: cost and first/last access (instruction index)."""

    __slots__ = ("buffer", "cost", "desc", "first", "last", "site", "key")

    def __init__(self, buffer, cost, desc, key):
        self.buffer = buffer
        self.cost = cost
        self.desc = desc
        self.first = -1
        self.last = -1
        self.site = ""
        self.key = key


class _Buffer:
    """A buffer the allocator places: one allocation, or the allocations of one loop-body
    position (every iteration), with the union of their live ranges."""

    __slots__ = ("buffer", "cost", "desc", "start", "end", "site", "count", "first")

    def __init__(self, a: _Alloc, start: int, end: int):
        self.buffer, self.cost, self.desc = a.buffer, a.cost, a.desc
        self.start, self.end, self.site, self.count = start, end, a.site, 1
        self.first = a.first            # its own first access (start may be a loop's start)

    def merge(self, a: _Alloc, start: int, end: int) -> None:
        self.cost = max(self.cost, a.cost)
        self.start = min(self.start, start)
        if a.first < self.first:
            self.first, self.site = a.first, a.site
        self.end = max(self.end, end)
        self.count += 1

    def label(self, unit: str) -> str:
        per = f", one buffer for {self.count} loop iterations" if self.count > 1 else ""
        return f"{self.desc}: {self.cost}{unit}, live #{self.start}..#{self.end}{per}"


class MemoryTracker:
    """First/last access of every on-chip allocation of one program of one launch."""

    def __init__(self, target: Target | None = None):
        self.target = target or current_target()
        self.psum_bank_limit = psum_usable_banks(self.target)
        self.clock = 0                      # instructions issued so far in this program
        self.closed = False
        self._allocs: dict[int, _Alloc] = {}
        self._ops: list[str] = []           # op name of instruction k
        self._op_sites: dict[int, str] = {}
        # outermost runtime loop entries: id(frame) -> [frame, first, last instruction]
        self._entries: dict[int, list] = {}
        # innermost loop entry -> [iteration, allocations made in it]
        self._ordinals: dict[int, list] = {}
        self._result = None
        self._result_at = None

    # -- cost of one storage on its buffer (bytes per partition, or banks)
    def cost(self, storage) -> int:
        per_partition = storage.bytes_per_partition
        if storage.buffer == "sbuf":
            return -(-per_partition // SBUF_ALIGN) * SBUF_ALIGN
        return max(1, math.ceil(per_partition / self.target.psum_bank_bytes))

    def access_count(self) -> int:
        """The index the next instruction will get (sim.control records it at loop entry)."""
        return self.clock

    # -- recording
    def allocate(self, storage, description: str) -> None:
        """Record a new on-chip storage; it costs nothing until an instruction accesses it."""
        if storage.buffer not in ("sbuf", "psum"):
            return
        key = storage.id
        stack = _loop_stack()
        if stack:
            inner = stack[-1]
            slot = self._ordinals.setdefault(id(inner), [inner, None, 0])
            it = getattr(inner, "iteration", None)
            if slot[1] != it:
                slot[1], slot[2] = it, 0
            # the k-th allocation of every iteration of one loop body is one buffer
            key = ("loop", getattr(inner, "loop_id", id(inner)), slot[2])
            slot[2] += 1
        self._allocs[storage.id] = _Alloc(storage.buffer, self.cost(storage), description, key)
        self._result = None
        storage._tracker = self

    def touch(self, storage_id: int) -> None:
        """An access of the storage at the current instruction."""
        a = self._allocs.get(storage_id)
        if a is None:
            return
        self._stamp(a)
        stack = _loop_stack()
        if stack:
            self._note_loop(stack[0], self.clock)

    def _stamp(self, a: _Alloc) -> None:
        c = self.clock
        if a.first < 0:
            a.first = c
            a.site = _kernel_site()
        a.last = c
        self._result = None

    def instruction(self, op: str, tensors=()) -> None:
        """Instruction ``clock`` was issued, accessing ``tensors``; the clock moves on."""
        allocs = self._allocs
        for t in tensors:
            if t is None:
                continue
            a = allocs.get(t.storage.id)
            if a is not None:
                self._stamp(a)
            ind = t.indirection
            if ind is not None:
                st = getattr(ind.index, "storage", None)
                a = allocs.get(st.id) if st is not None else None
                if a is not None:
                    self._stamp(a)
        stack = _loop_stack()
        if stack:
            self._note_loop(stack[0], self.clock)
        self._ops.append(op)
        self.clock += 1
        self._result = None

    def _note_loop(self, frame, c: int) -> None:
        e = self._entries.get(id(frame))
        if e is None:
            begin = getattr(frame, "begin_access", c)
            self._entries[id(frame)] = [frame, min(begin, c), c]
        elif c > e[2]:
            e[2] = c

    # -- analysis
    def _buffers(self) -> list[_Buffer]:
        spans = sorted((e[1], e[2]) for e in self._entries.values())
        out: dict = {}
        for a in self._allocs.values():
            if a.first < 0:
                continue        # never accessed: the compiler allocates nothing for it
            r0, r1 = a.first, a.last
            for b, e in spans:  # live during a runtime loop -> live for the whole loop
                if b <= r1 and e >= r0:
                    r0, r1 = min(r0, b), max(r1, e)
            buf = out.get(a.key)
            if buf is None:
                out[a.key] = _Buffer(a, r0, r1)
            else:
                buf.merge(a, r0, r1)
        return list(out.values())

    def _sweep(self, buffers: list[_Buffer], limit: int):
        """(peak, first overflow time or None) of the buffers' summed cost over time."""
        events = []
        for b in buffers:
            events.append((b.start, 1, b))
            events.append((b.end + 1, 0, b))     # 0 sorts frees before allocations
        events.sort(key=lambda e: (e[0], e[1]))
        live = peak = 0
        overflow = None
        i = 0
        while i < len(events):
            t = events[i][0]
            while i < len(events) and events[i][0] == t:
                _, kind, b = events[i]
                live += b.cost if kind else -b.cost
                i += 1
            if live > peak:
                peak = live
            if overflow is None and live > limit:
                overflow = t
        return peak, overflow

    def analyse(self) -> dict:
        """Peak SBUF bytes / PSUM banks per partition and the first overflow of each."""
        if self._result is not None:
            return self._result
        bufs = self._buffers()
        res = {}
        for kind, limit in (("sbuf", self.target.sbuf_usable_bytes), ("psum", self.psum_bank_limit)):
            mine = [b for b in bufs if b.buffer == kind]
            peak, over = self._sweep(mine, limit)
            res[kind] = (peak, over, mine)
        self._result = res
        return res

    def check(self) -> None:
        """Raise NkiCapacityError at the first instruction whose buffers do not fit."""
        res = self.analyse()
        errors = []
        for kind in ("sbuf", "psum"):
            _, over, bufs = res[kind]
            if over is not None:
                errors.append((over, kind, bufs))
        if not errors:
            return
        over, kind, bufs = min(errors, key=lambda e: e[0])
        raise NkiCapacityError(self._message(kind, over, bufs))

    def _message(self, kind: str, t: int, bufs: list[_Buffer]) -> str:
        tg = self.target
        live = [b for b in bufs if b.start <= t <= b.end]
        new = [b for b in live if b.start == t]
        old = sorted((b for b in live if b.start != t), key=lambda b: -b.cost)
        used = sum(b.cost for b in old)
        need = sum(b.cost for b in new)
        op = self._ops[t] if t < len(self._ops) else "an access after the last instruction"
        unit = " B" if kind == "sbuf" else " bank(s)"
        if new and all(b.first > t for b in new):
            where = (f"instruction #{t} ({op}), the first instruction of a runtime loop: the "
                     "tiles used inside the loop are live for the whole loop")
        else:
            where = f"instruction #{t} ({op}, {new[0].site if new else '?'})"
        needed = "; ".join(f"{b.desc} ({b.cost}{unit}, first access #{b.first} at {b.site})"
                           for b in new[:_LIST_LIVE])
        if len(new) > _LIST_LIVE:
            needed += f"; and {len(new) - _LIST_LIVE} more"
        if kind == "sbuf":
            head = (f"SBUF capacity exceeded at {where}; it needs {need} bytes per partition "
                    f"more ({needed}) while {used} bytes per partition are live; limit "
                    f"{tg.sbuf_usable_bytes} bytes per partition on {tg.name} "
                    f"({tg.sbuf_bytes_per_partition // 1024} KiB less "
                    f"{tg.sbuf_reserved_bytes // 1024} KiB reserve)")
        else:
            head = (f"PSUM capacity exceeded at {where}; it needs {need} more bank(s) of "
                    f"{tg.psum_bank_bytes} B ({needed}) while {used} bank(s) are live; limit "
                    f"{self.psum_bank_limit} banks on {tg.name} (each PSUM tile takes whole banks)")
        shown = old[:_LIST_LIVE]
        more = f"; and {len(old) - len(shown)} more" if len(old) > len(shown) else ""
        listed = "; ".join(b.label(unit) for b in shown) or "none"
        return (f"{head}. Live at that point (first..last access, by instruction index): "
                f"{listed}{more}. Tiles are live from their first to their last access (whole "
                f"runtime loops for tiles used inside one)")

    def usage(self) -> dict:
        """Peak usage by liveness, for reports (``*_live``: what is still live at the end)."""
        res = self.analyse()
        end = self.clock
        live = {k: sum(b.cost for b in res[k][2] if b.start <= end <= b.end) for k in res}
        return {"target": self.target.name, "sbuf_live": live["sbuf"],
                "sbuf_peak": res["sbuf"][0], "sbuf_limit": self.target.sbuf_usable_bytes,
                "psum_banks_live": live["psum"], "psum_banks_peak": res["psum"][0],
                "psum_banks_limit": self.psum_bank_limit, "instructions": self.clock}


_active: list[MemoryTracker] = []


def current() -> MemoryTracker | None:
    """The tracker of the running launch, or None outside a launch."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def launch(target: Target | None = None) -> Iterator[MemoryTracker]:
    """Record on-chip allocations and accesses made inside the block; when the block ends
    without an error, raise NkiCapacityError if they did not fit ``target``."""
    tracker = MemoryTracker(target)
    _active.append(tracker)
    ok = False
    try:
        yield tracker
        ok = True
    finally:
        _active.remove(tracker)
        tracker.closed = True
    if ok:
        tracker.check()


def track(storage, description: str) -> None:
    """Register a new on-chip storage with the active tracker (if any)."""
    if _active:
        _active[-1].allocate(storage, description)


def instruction(op: str, tensors=()) -> None:
    """Called by every ISA instruction (sim.isa._core.emit) with the tensors it accesses."""
    if _active:
        _active[-1].instruction(op, tensors)


__all__ = ["MemoryTracker", "SBUF_ALIGN", "current", "launch", "track", "instruction"]
