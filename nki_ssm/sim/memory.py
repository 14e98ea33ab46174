"""SBUF / PSUM capacity by access liveness, for one program of one launch.

The SDK simulator does not check capacity; the compiler does, by allocating
every on-chip tensor and spilling or failing when they do not fit. It
allocates by use, not by Python lifetime: a tile occupies memory from the
first instruction that accesses it to the last (a tile that no instruction
touches takes nothing). Runtime loops (``nl.dynamic_range``, ``fori_loop``,
``while_loop``) are compiled once and re-executed, and the NKI docs say
(``nki/deep-dives/nki-dynamic-loops.rst``, "Register Allocation
Implications"): "Inside a dynamic_range loop the compiler must keep all live
tensors in on-chip memory (SBUF/PSUM) for the entire duration of the loop
... Tensors allocated inside the loop body are allocated once and reused
across iterations." The tracker reads that as:

- a tile allocated outside a runtime loop and accessed inside it is live for
  the whole loop (from the loop's first instruction to its last: the body may
  run again and read it);
- a tile allocated inside the body is one buffer reused by every iteration,
  live from its first to its last access within the iteration (the body's
  own tiles share memory by use, as in straight-line code).

The stricter reading (every tile allocated in the body live for the whole
loop) is available as ``WHOLE_LOOP_BODY_TILES = True`` but is not the
default: released nki-library code contradicts it. ``bwmm_shard_on_I.py``
(aws-neuron/nki-library, ``blockwise_mm_baseline_shard_intermediate_hybrid``,
line 573) runs ``compute_one_block`` inside ``nl.dynamic_range``, and that
body allocates one PSUM bank per transposed hidden-state tile
(``transpose_hidden_states_allocated``, line 770: ``H / 128`` of them, 32 at
``H = 4096``), far more than PSUM's 8 banks if all were live at once.
Everything outside runtime loops (Python loops, ``nl.affine_range`` ...) is
unrolled, so a tile allocated per unrolled iteration is its own buffer, live
only while it is used (the allocator rotates buffers; NKI performance guide,
"declare buffers inside the loop body").

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

# Which reading of nki-dynamic-loops.rst the tracker applies to tiles allocated inside a
# runtime loop body (see the module docstring). False (default): by use inside the body,
# one buffer reused by every iteration. True: live for the whole loop.
WHOLE_LOOP_BODY_TILES = False

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

    __slots__ = ("buffer", "cost", "desc", "first", "last", "site", "key", "depth", "loops")

    def __init__(self, buffer, cost, desc, key, depth):
        self.buffer = buffer
        self.cost = cost
        self.desc = desc
        self.first = -1
        self.last = -1
        self.site = ""
        self.key = key
        self.depth = depth      # runtime loops enclosing the allocation
        self.loops = None       # id() of loop entries (not enclosing it) it was accessed in


class _Buffer:
    """A buffer the allocator places: one allocation, or (``WHOLE_LOOP_BODY_TILES``) the
    allocations of one loop-body position in every iteration, with their joint live range."""

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
        # runtime loop entries: id(frame) -> [frame, first, last instruction, depth]
        self._entries: dict[int, list] = {}
        # innermost loop entry -> [iteration, allocations made in it]
        self._ordinals: dict[int, list] = {}
        self._result = None

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
        self._allocs[storage.id] = _Alloc(storage.buffer, self.cost(storage), description, key,
                                          len(stack))
        self._result = None
        storage._tracker = self

    def touch(self, storage_id: int) -> None:
        """An access of the storage at the current instruction."""
        a = self._allocs.get(storage_id)
        if a is None:
            return
        stack = _loop_stack()
        self._stamp(a, stack)
        if stack:
            self._note_loops(stack, self.clock)

    def _stamp(self, a: _Alloc, stack) -> None:
        c = self.clock
        if a.first < 0:
            a.first = c
            a.site = _kernel_site()
        a.last = c
        if len(stack) > a.depth:
            # accessed inside a runtime loop that does not enclose its allocation: live for
            # that whole loop (the outermost such loop)
            if a.loops is None:
                a.loops = set()
            a.loops.add(id(stack[a.depth]))
        self._result = None

    def instruction(self, op: str, tensors=()) -> None:
        """Instruction ``clock`` was issued, accessing ``tensors``; the clock moves on."""
        allocs = self._allocs
        stack = _loop_stack()
        for t in tensors:
            if t is None:
                continue
            a = allocs.get(t.storage.id)
            if a is not None:
                self._stamp(a, stack)
            ind = t.indirection
            if ind is not None:
                st = getattr(ind.index, "storage", None)
                a = allocs.get(st.id) if st is not None else None
                if a is not None:
                    self._stamp(a, stack)
        if stack:
            self._note_loops(stack, self.clock)
        self._ops.append(op)
        self.clock += 1
        self._result = None

    def _note_loops(self, stack, c: int) -> None:
        for depth, frame in enumerate(stack):
            e = self._entries.get(id(frame))
            if e is None:
                begin = getattr(frame, "begin_access", c)
                self._entries[id(frame)] = [frame, min(begin, c), c, depth]
            elif c > e[2]:
                e[2] = c

    # -- analysis
    def _buffers(self) -> list[_Buffer]:
        whole = WHOLE_LOOP_BODY_TILES
        outer = sorted((e[1], e[2]) for e in self._entries.values() if e[3] == 0)
        out: dict = {}
        for a in self._allocs.values():
            if a.first < 0:
                continue        # never accessed: the compiler allocates nothing for it
            r0, r1 = a.first, a.last
            if whole:           # live during a runtime loop -> live for the whole loop
                for b, e in outer:
                    if b <= r1 and e >= r0:
                        r0, r1 = min(r0, b), max(r1, e)
                key = a.key     # and one buffer per loop-body allocation
            else:               # live across a loop it is used in, by use inside its own body
                for loop in a.loops or ():
                    _, b, e, _ = self._entries[loop]
                    r0, r1 = min(r0, b), max(r1, e)
                key = id(a)     # iterations' copies never overlap: each one counts alone
            buf = out.get(key)
            if buf is None:
                out[key] = _Buffer(a, r0, r1)
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
            where = (f"instruction #{t} ({op}), the first instruction of a runtime loop: tiles "
                     "used inside a loop they were allocated outside of are live for the whole "
                     "loop")
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
