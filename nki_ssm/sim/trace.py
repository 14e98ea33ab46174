"""Instruction trace: what the simulator records and the cost model times.

Every `nki.isa` instruction the simulator executes appends one
`Instruction` to the active `Trace` (if any). The record says which engine
ran it, what it read and wrote (as `Region`s, so the cost model can derive
read-after-write, write-after-read and write-after-write dependencies) and
the sizes the engine cost depends on.

Usage::

    from nki_ssm.sim.trace import record
    with record() as trace:
        y = simulate(kernel)(x)
    trace.instructions   # list[Instruction] in program order

This module is the contract between `nki_ssm.sim` (producer) and
`nki_ssm.perf` (consumer); it imports nothing from either.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

# Engines an instruction can be charged to. "dma" covers every DMA queue;
# the cost model spreads DMA instructions over the core's DMA engines.
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass(frozen=True, slots=True)
class Region:
    """A contiguous span of memory an instruction reads or writes.

    On-chip (``buffer`` "sbuf" or "psum"): partitions
    ``[partition_start, partition_start + num_partitions)`` and, within each
    of them, bytes ``[byte_start, byte_stop)`` of that storage's partition
    row. HBM: ``partition_start = 0``, ``num_partitions = 1`` and the byte
    span is within the tensor's flat storage. Strided accesses are recorded
    as the smallest span that covers every byte touched (conservative for
    dependencies).
    """

    buffer: str
    storage_id: int
    partition_start: int
    num_partitions: int
    byte_start: int
    byte_stop: int

    def overlaps(self, other: "Region") -> bool:
        if self.storage_id != other.storage_id:
            return False
        p0, p1 = self.partition_start, self.partition_start + self.num_partitions
        q0, q1 = other.partition_start, other.partition_start + other.num_partitions
        if p1 <= q0 or q1 <= p0:
            return False
        return self.byte_start < other.byte_stop and other.byte_start < self.byte_stop


@dataclass(slots=True)
class Instruction:
    """One executed ISA instruction.

    ``free_size`` is the number of elements per partition the engine
    streams: for VectorE/ScalarE/GpSimd the main input's elements per
    partition; for ``nc_matmul`` the moving free size N; for DMA the
    elements per partition of the destination. ``num_inputs`` counts tensor
    (not scalar) data inputs. ``nbytes`` is the bytes moved for DMA and the
    bytes written otherwise. ``attrs`` carries op-specific facts the cost
    model needs, with these keys where they apply:

    - nc_matmul / nc_transpose on TensorE: ``K``, ``M``, ``N``, ``fp32``
      (a float32 operand: quarter rate; tfloat32 with tfloat32 streams at the bf16
      rate), ``onezero``, ``is_transpose``,
      ``perf_mode``;
    - DMA: ``partitions`` (SBUF-side partition count, or 0 for HBM->HBM),
      ``bytes_per_partition``, ``dge_mode``, ``indirect`` (bool),
      ``transpose`` (bool);
    - VectorE/ScalarE/GpSimd: ``all_16bit`` (every tensor operand is a
      2-byte float), ``psum_operand`` (any operand in PSUM), ``contiguous``
      (innermost free stride is 1 for every operand), ``reduce`` (bool);
    - synchronisations between the programs of an LNC=2 grid (``op``
      "core_barrier" on its ``engine=``, default "gpsimd"; "sendrecv" on
      "dma"): ``sync`` (the op name), ``sync_id`` (int: the k-th
      synchronisation of the launch, 0-based, the same on both programs' copies
      of it, so the cost model can start each program's instructions after it
      no earlier than the later of the two arrivals; -1 when it synchronises
      nothing: a barrier of one core at LNC=1, or one in a loop body that never
      ran), ``cores`` (core_barrier: the tuple of cores); sendrecv also
      ``send_to_rank``, ``recv_from_rank``, ``pipe_id``, ``dma_engine``
      ("dma" / "gpsimd_dma") and the DMA keys above (its ``nbytes`` are the
      bytes it sends; its ``writes`` region is the local ``dst`` the other
      program's data lands in).

    ``program_id`` is the SPMD program (0, or 0 / 1 under LNC=2) that issued it.
    """

    index: int
    op: str
    engine: str
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]
    num_partitions: int
    free_size: int
    num_inputs: int
    nbytes: int
    dtypes: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, tuple] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    name: str | None = None
    program_id: int = 0
    # ((loop_id, iteration), ...) of the enclosing runtime loops, outermost first (sim.control)
    loop_path: tuple = ()


@dataclass
class Loop:
    """A runtime loop of the program (``nl.dynamic_range`` / ``fori_loop`` / ``while_loop``).

    ``loop_id`` is its static identity (see ``nki_ssm.sim.control``); ``entries`` counts how
    often the loop was started (once per iteration of its enclosing loop), ``iterations``
    the iterations run over all entries (0 for a loop whose trip count was 0 every time).
    """

    loop_id: tuple
    kind: str
    program_id: int = 0
    entries: int = 0
    iterations: int = 0


@dataclass
class Branch:
    """A run-time ``nl.if_else`` of the program (NKI 0.8.0).

    ``branch_id`` is its static identity (``nki_ssm.sim.control``: the enclosing runtime
    loop's ``loop_id`` + ``("if", ordinal)``); ``outcomes`` the condition each time it was
    reached, in program order (True: ``then_fn`` ran); ``entries`` / ``taken`` count them.
    """

    branch_id: tuple
    program_id: int = 0
    outcomes: list = field(default_factory=list)

    @property
    def entries(self) -> int:
        return len(self.outcomes)

    @property
    def taken(self) -> int:
        return sum(self.outcomes)


@dataclass
class Trace:
    """Instructions in program order, for one target.

    An LNC=2 launch records both programs in one trace, each instruction tagged with its
    ``program_id``: the programs run in lock-step epochs (``sim.lnc``), so the list holds
    program 0's instructions up to its first synchronisation, then program 1's up to the
    same one, and so on; within one program the order is program order.
    ``program_instructions(pid)``, ``loops`` and ``branches`` (keyed by program) and
    ``unrun`` (tagged) are per program.
    """

    target: str = "trn2"
    instructions: list[Instruction] = field(default_factory=list)
    loops: dict = field(default_factory=dict)     # (program_id, loop_id) -> Loop
    branches: dict = field(default_factory=dict)  # (program_id, branch_id) -> Branch
    # instructions of loop bodies that never ran (trip count 0), traced once with their
    # effects suppressed (sim.control): in the program, never executed, not timed
    unrun: list[Instruction] = field(default_factory=list)

    def append(self, inst: Instruction) -> None:
        inst.index = len(self.instructions)
        if _lowering:
            # the convenience op (nki.language) that emitted it: the cost model prices the
            # compiler's lowering of that op, not every instruction the simulator uses
            inst.attrs = dict(inst.attrs or {}, lowering=_lowering[-1])
        self.instructions.append(inst)

    def append_unrun(self, inst: Instruction) -> None:
        inst.index = -1
        self.unrun.append(inst)

    # -- runtime loops (called by nki_ssm.sim.control)
    def loop_entered(self, loop_id: tuple, kind: str, program_id: int = 0) -> None:
        key = (program_id, loop_id)
        lp = self.loops.get(key)
        if lp is None:
            lp = self.loops[key] = Loop(loop_id, kind, program_id)
        lp.entries += 1

    def loop_iterated(self, loop_id: tuple, kind: str, program_id: int = 0) -> None:
        key = (program_id, loop_id)
        lp = self.loops.get(key)
        if lp is None:   # the trace started inside the loop
            lp = self.loops[key] = Loop(loop_id, kind, program_id, entries=1)
        lp.iterations += 1

    def branch_reached(self, branch_id: tuple, taken: bool, program_id: int = 0) -> None:
        key = (program_id, branch_id)
        br = self.branches.get(key)
        if br is None:
            br = self.branches[key] = Branch(branch_id, program_id)
        br.outcomes.append(bool(taken))

    def program_instructions(self, program_id: int = 0) -> int:
        """Static instructions of one SPMD program: what the compiler emits, each runtime
        loop body once, run or not (the largest iteration of each loop; a body that never
        ran, and an ``nl.if_else`` callback not taken, is in ``unrun``)."""
        top = 0
        per_iter: dict = {}
        for inst in (*self.instructions, *self.unrun):
            if inst.program_id != program_id:
                continue
            path = inst.loop_path
            if not path:
                top += 1
            else:
                # the whole path: a nested loop's iteration i is a different body run in
                # every iteration of the loops around it
                key = path
                per_iter[key] = per_iter.get(key, 0) + 1
        body: dict = {}
        for path, n in per_iter.items():
            loop_id = path[-1][0]
            if n > body.get(loop_id, 0):
                body[loop_id] = n
        return top + sum(body.values())

    def __len__(self) -> int:
        return len(self.instructions)

    def by_engine(self) -> dict[str, list[Instruction]]:
        out: dict[str, list[Instruction]] = {e: [] for e in ENGINES}
        for inst in self.instructions:
            out.setdefault(inst.engine, []).append(inst)
        return out


_active: list[Trace] = []
_lowering: list[str] = []


@contextlib.contextmanager
def lowering(op: str) -> Iterator[None]:
    """Tag every instruction recorded inside the block with ``attrs["lowering"] = op``."""
    _lowering.append(op)
    try:
        yield
    finally:
        _lowering.pop()


def current() -> Trace | None:
    """The innermost trace being recorded, or None (the simulator then records nothing)."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def record(target: str | None = None) -> Iterator[Trace]:
    """Record every instruction executed inside the block into a new Trace.

    ``target`` defaults to the simulator's current target name, filled in by
    the simulator on the first instruction if left None here.
    """
    trace = Trace(target=target or "")
    _active.append(trace)
    try:
        yield trace
    finally:
        _active.remove(trace)
