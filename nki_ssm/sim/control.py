"""Runtime control flow: the loops and conditionals the NKI compiler keeps as control flow.

On the real toolchain a kernel is a compiled program: every Python loop is
unrolled while the kernel is traced, and only the runtime loops —
``nl.dynamic_range`` (NKI 0.5), ``nl.fori_loop`` / ``nl.while_loop`` (0.6) —
become branch instructions on the engine sequencers, their body compiled
once (NKI language guide, "Compilation Model"; nki_spec.md §2 "Dynamic
loops"). The simulator executes such a loop eagerly, once per iteration,
and records which loop and iteration every instruction belongs to, so the
trace knows both sizes a user cares about:

- the **dynamic** instruction count (``len(trace)``: every iteration), which
  the cost model times, and
- the **program size** (``Trace.program_instructions()``): the static
  instructions the compiler emits, each loop body once.

A loop's static identity (``loop_id``) is its position in the program: the
enclosing runtime loop's id and the ordinal of the loop among the runtime
loops entered during one iteration of that enclosing loop (or of the kernel
body). A loop inside an unrolled Python loop therefore gets one id per
unrolled copy, as it would in the compiled program.

Because the body is compiled once, every iteration must issue the same
instructions: the simulator checks each iteration's instruction stream
(operation and engine, and the runtime loops it enters) against the first
one and rejects a body whose Python code behaves differently from one
iteration to the next (for example one that branches on a Python counter it
updates). Registers cannot drive Python control flow at all (see
``isa.registers``).

A loop whose trip count is 0 still has a body in the program: the compiler
compiles every body once, run or not. So the first time a loop is entered
with no iteration to run, its body is **traced once with its effects
suppressed** (``suppressed()``): writes to memory that existed before the
body began are dropped, registers the body writes get their old values back
afterwards, runtime offsets read as 0 (no out-of-bounds error from the
garbage a body that never runs would read), runtime loops inside it are
traced the same way, and its instructions go to ``Trace.unrun`` (counted by
``Trace.program_instructions()``, never timed) instead of
``Trace.instructions``. Static checks (shapes, engines, buffers, capacity)
apply in such a body as in any other: the compiler rejects them there too.

Rules enforced here, each from the docs, per targeted NKI version
(``sim.version``):

- ``step`` is a compile-time positive int; ``start`` / ``stop`` are ints,
  ``VirtualRegister`` s or (NKI 0.7.0+) 32-bit ``NkiScalar`` s
  (``nl.dynamic_range`` / ``nl.fori_loop`` API pages); an int bound still makes
  a runtime loop;
- ``nl.dynamic_range``'s induction variable is a frozen register (NKI 0.4.0
  release notes: writing it raises); ``nl.fori_loop`` passes it by value
  ("writing to ``i`` has no effect on the loop", ``fori_loop`` docstring), so
  each iteration gets a fresh register holding ``i`` -- an ``NkiScalar`` from NKI
  0.7.0 on, unless a bound is a register (fori_loop API page, SDK 2.33);
- no runtime loop inside ``nl.no_reorder()`` (``nl.no_reorder`` API page:
  dynamic loops are not supported in a no-reorder block);
- NKI 0.5.0: a runtime loop inside a runtime loop fails to compile
  (NCC_ICFG018, "do not support ... nested loops": aws-neuron-sdk issue
  #1346, reproduced by the maintainers on 2.31.0 / NKI 0.5.0, the repro
  compiles on 0.6.0); ``nl.fori_loop`` / ``nl.while_loop`` do not exist
  (``sim.language``);
- NKI 0.6.0: ``for i in nl.dynamic_range(...)`` and ``while reg:`` emit a
  ``DeprecationWarning`` (release-notes/components/nki.rst, 0.6.0, "Deprecated
  and Removed APIs"); a runtime loop nested in one traces, with an
  ``NkiKnownIssueWarning`` for the known issue carried forward from 0.5.0
  ("Nested nl.dynamic_range loops with loop-carried values fail to compile
  with a 'Could not find register' error");
- NKI 0.7.0: ``nl.dynamic_range`` and ``while reg:`` are removed (nki/migration,
  "Migrating from NKI 0.6.0 to NKI 0.7.0"); NKI 0.8.0: ``nl.while_loop`` takes an
  int or an ``nl.int32`` NkiScalar available on all engines (while_loop API page);
- ``nl.if_else`` (NKI 0.8.0, ``if_else``): a run-time condition is a compiled
  conditional; both callbacks are program, so the one not taken is traced with
  its effects suppressed the first time that side is reached (its
  instructions in ``Trace.unrun``), and a side that runs again must issue the
  stream it issued the first time; outcomes go to ``Trace.branches``;
- every program records its control flow (``program_flow``: each runtime-loop
  entry's trip count, each if_else outcome); under LNC=2 the programs' flows
  must be equal (``check_same_flow``; lnc.rst: "Dynamic control flow that
  differs between cores is undefined");
- a TensorE write to a PSUM tile allocated outside the runtime loop it runs in
  warns (``psum_from_outside``: weak evidence of a compile failure);
- tiles allocated inside a runtime loop body are live for the whole loop
  (NKI docs, dynamic loops: "all live tiles kept on chip for the loop's
  duration"); ``loop_stack()`` gives the memory tracker what it needs.

Not modelled: a body is executed, not traced once, so Python side effects in
a body (appending to a list, printing) happen once per iteration here (and
once for a body traced with its effects suppressed) and once in total on the
compiler.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from . import version
from .errors import NkiSyncError, NkiValidationError


class NkiKnownIssueWarning(UserWarning):
    """A construct the targeted NKI release documents as a known compile issue."""


@dataclass
class LoopFrame:
    """One runtime loop being executed."""

    loop_id: tuple              # static identity: (*parent loop_id, ordinal)
    kind: str                   # "dynamic_range" | "fori_loop" | "while_loop" | "while"
    iteration: int = -1
    children: int = 0           # runtime loops entered in the current iteration
    signature: list = field(default_factory=list)     # this iteration's stream
    first_signature: list | None = None               # iteration 0's stream
    begin_access: int = 0       # memory-access counter when the loop began (liveness)
    unrun: bool = False         # the body is traced with its effects suppressed (trip count 0)
    branches: int = 0           # nl.if_else reached in the current iteration
    first_storage: int = 0      # the id of the first storage allocated after the loop began


@dataclass
class _BranchSide:
    """One side (then / else) of an ``nl.if_else`` as first traced."""

    signature: list | None      # its instruction stream (inside a runtime loop)
    loops: int                  # runtime loops it enters (loop ordinals it takes)
    branches: int               # nl.if_else it reaches (branch ordinals it takes)


@dataclass
class _ProgramState:
    frames: list = field(default_factory=list)
    top_children: int = 0
    top_branches: int = 0
    no_reorder_depth: int = 0
    bodies: dict = field(default_factory=dict)   # loop_id -> the body's instruction stream
    sides: dict = field(default_factory=dict)    # (branch_id, taken) -> _BranchSide
    flow: list = field(default_factory=list)     # program_flow()
    sites: dict = field(default_factory=dict)    # loop_id / branch_id -> (kind, kernel line)
    psum_warned: set = field(default_factory=set)  # PSUM storages warned about (psum_from_outside)


_state: list[_ProgramState] = []

# Effect suppression (a body traced although its trip count is 0): one entry per suppressed
# body being traced, the first storage id allocated inside it (older storage is not written).
# sim.tensor and sim.isa read these lists directly on their hot paths.
SUPPRESS_FLOOR: list[int] = []
_register_undo: list[list] = []


def suppressed() -> bool:
    """True while a body whose loop runs zero times is traced (no effects, see module doc)."""
    return bool(SUPPRESS_FLOOR)


def note_register_write(reg) -> None:
    """Called before an instruction writes ``reg``: under suppression, remember its value."""
    if _register_undo:
        _register_undo[-1].append((reg, reg.value))


def begin_program() -> None:
    """Called by the launcher before each SPMD program runs."""
    _state.append(_ProgramState())


def end_program() -> None:
    if _state:
        _state.pop()


def _current() -> _ProgramState:
    if not _state:
        # kernels called outside a launch (unit tests of helpers): one implicit program
        _state.append(_ProgramState())
    return _state[-1]


def loop_stack() -> tuple:
    """The runtime loops being executed, outermost first (empty outside any)."""
    return tuple(_state[-1].frames) if _state else ()


def loop_path() -> tuple:
    """``((loop_id, iteration), ...)`` of the enclosing runtime loops, outermost first."""
    if not _state or not _state[-1].frames:
        return ()
    return tuple((f.loop_id, f.iteration) for f in _state[-1].frames)


def note_instruction(op: str, engine: str) -> None:
    """Record one instruction in the current iteration's stream (for the same-body check)."""
    if _state and _state[-1].frames:
        _state[-1].frames[-1].signature.append((op, engine))


_PSUM_OUTSIDE = (
    "released runtime-loop kernels allocate their PSUM tiles inside the loop body (nki-library "
    "d2ad3a5 core/moe/moe_cte/bwmm_shard_on_I.py l.573 ff.); third-party reports give "
    "NCC_IBIR092 from neuronx-cc 2.27 for a PSUM tile allocated outside a runtime loop and "
    "written inside it (weak evidence: the reports are not attributable)")


def psum_from_outside(inst: str, dst) -> None:
    """Called by TensorE instructions writing PSUM ``dst``: warn (once per tile) when ``dst``
    was allocated outside the innermost runtime loop being run (``NkiWeakEvidenceWarning``)."""
    st = _state[-1]
    frame = st.frames[-1]
    sid = dst.storage.id
    if sid < frame.first_storage and sid not in st.psum_warned:
        st.psum_warned.add(sid)
        from .errors import NkiWeakEvidenceWarning
        version.warn_in_kernel(
            f"nisa.{inst} writes PSUM tile {dst.storage.name or sid!r} inside runtime loop "
            f"{frame.loop_id} ({frame.kind}) but it was allocated before the loop began; "
            f"{_PSUM_OUTSIDE}: allocate it in the loop body", NkiWeakEvidenceWarning)


def enter_no_reorder() -> None:
    _current().no_reorder_depth += 1


def exit_no_reorder() -> None:
    st = _current()
    st.no_reorder_depth = max(0, st.no_reorder_depth - 1)


def _nesting_rules(kind: str, st: _ProgramState) -> None:
    if not st.frames:
        return
    outer = st.frames[-1].kind
    if not version.at_least("0.6.0"):
        raise NkiValidationError(
            f"nl.{kind} inside nl.{outer}: NKI {version.nki_version()} does not compile a "
            "runtime loop nested in a runtime loop ([NCC_ICFG018] \"Loop structures require "
            "exactly one internal back-edge as we currently do not support CONTINUE statements "
            "or nested loops\"; aws-neuron-sdk issue #1346, reproduced on Neuron 2.31.0 / NKI "
            "0.5.0): flatten into one runtime loop over a work list, or target NKI 0.6.0")
    warnings.warn(
        f"nl.{kind} inside nl.{outer}: a runtime loop nested in a runtime loop; NKI 0.6.0 "
        "carries forward the known issue that nested runtime loops with loop-carried values "
        "fail to compile (\"Could not find register\"; release-notes/components/nki.rst, "
        "0.5.0 Known Issues, Control Flow)", NkiKnownIssueWarning, stacklevel=_kernel_level())


def _kernel_level() -> int:
    """``warnings.warn`` stacklevel of the innermost caller outside the simulator (the
    kernel line that entered the loop)."""
    import sys
    f, level = sys._getframe(2), 2      # the frame that called warn's caller
    while f is not None and f.f_globals.get("__name__", "").startswith("nki_ssm.sim"):
        f, level = f.f_back, level + 1
    return level


def _new_frame(kind: str) -> LoopFrame:
    st = _current()
    if st.no_reorder_depth:
        raise NkiValidationError(f"nl.{kind}: runtime loops are not allowed inside nl.no_reorder() "
                                 "(nl.no_reorder API docs)")
    _nesting_rules(kind, st)
    if st.frames:
        parent = st.frames[-1]
        ordinal = parent.children
        parent.children += 1
        parent.signature.append(("loop", kind))
        loop_id = parent.loop_id + (ordinal,)
    else:
        ordinal = st.top_children
        st.top_children += 1
        loop_id = (ordinal,)
    from . import memory
    from .tensor import next_storage_id as tensor_ids
    tracker = memory.current()
    begin = tracker.access_count() if tracker is not None and hasattr(tracker, "access_count") else 0
    frame = LoopFrame(loop_id=loop_id, kind=kind, begin_access=begin,
                      first_storage=tensor_ids())
    st.frames.append(frame)
    if loop_id not in st.sites:
        st.sites[loop_id] = (f"nl.{kind}", memory._kernel_site())
    from . import trace
    tr = trace.current()
    if tr is not None:
        tr.loop_entered(loop_id, kind, _program_id())
    return frame


def _trace_unrun(frame: LoopFrame) -> bool:
    """Whether a loop entered with no iteration to run has its body traced (suppressed):
    the first time its body appears in this program, and never twice."""
    return frame.loop_id not in _current().bodies


def _next_iteration(frame: LoopFrame, unrun: bool = False) -> None:
    if frame.iteration >= 0:
        _check_same_body(frame)
    frame.iteration += 1
    frame.children = 0
    frame.branches = 0
    frame.signature = []
    if unrun:
        frame.unrun = True
        return
    from . import trace
    tr = trace.current()
    if tr is not None:
        tr.loop_iterated(frame.loop_id, frame.kind, _program_id())


def _check_same_body(frame: LoopFrame) -> None:
    if frame.first_signature is None:
        frame.first_signature = frame.signature
        # one compiled body per loop: every entry of the loop (each iteration of an enclosing
        # runtime loop) runs the same stream too
        first = _current().bodies.setdefault(frame.loop_id, frame.signature)
        if first is frame.signature:
            return
        which = "an earlier entry of this loop"
    else:
        first = frame.first_signature
        which = "iteration 0"
    if frame.signature != first:
        now = frame.signature
        k = next((i for i in range(min(len(first), len(now))) if first[i] != now[i]),
                 min(len(first), len(now)))
        a = first[k] if k < len(first) else "end of body"
        b = now[k] if k < len(now) else "end of body"
        raise NkiValidationError(
            f"{frame.kind}: iteration {frame.iteration} of a runtime loop issued a different "
            f"instruction stream than {which} (at position {k}: {b} instead of {a}); the "
            "compiler compiles the body once, so its Python code must not depend on values "
            "that change between iterations")


def _exit(frame: LoopFrame, completed: bool) -> None:
    if completed and frame.iteration >= 0:
        _check_same_body(frame)
    st = _current()
    if completed and not SUPPRESS_FLOOR:
        st.flow.append(("loop", frame.loop_id, 0 if frame.unrun else frame.iteration + 1))
    if st.frames and st.frames[-1] is frame:
        st.frames.pop()


class _Suppressed:
    """Context of a body traced with its effects suppressed (see the module doc)."""

    def __enter__(self):
        from .isa import _state
        from .tensor import next_storage_id
        self.engine_state = _state.snapshot()     # accumulators, PRNG lanes
        SUPPRESS_FLOOR.append(next_storage_id())
        _register_undo.append([])
        return self

    def __exit__(self, *exc):
        from .isa import _state
        SUPPRESS_FLOOR.pop()
        for reg, value in reversed(_register_undo.pop()):
            reg.value = value
        _state.restore(self.engine_state)
        return False


def _program_id() -> int:
    from .isa._core import _program_id as pid
    return pid()


def _check_bound(kind: str, arg: str, v):
    """An int bound (as int), a VirtualRegister or a 32-bit NkiScalar (NKI 0.7.0+; read
    later: not at all in an unrun body)."""
    from .isa.nki_scalar import NkiScalar
    from .isa.registers import VirtualRegister
    if isinstance(v, VirtualRegister):
        return v
    if isinstance(v, NkiScalar):
        # fori_loop bounds are 32-bit (nki.language.fori_loop API page, SDK 2.33 / 2.34)
        return v.require_32bit(f"nl.{kind} {arg}")
    if isinstance(v, bool) or not isinstance(v, int):
        import numpy as np
        if isinstance(v, np.integer) and not isinstance(v, np.bool_):
            return int(v)
        raise TypeError(f"nl.{kind}: {arg} must be an int, an NkiScalar or a VirtualRegister, "
                        f"got {type(v).__name__}")
    return int(v)


def _value(kind: str, arg: str, v) -> int:
    return v if isinstance(v, int) else v.runtime_value(f"nl.{kind} {arg}")


def _step(kind: str, step) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise NkiValidationError(f"nl.{kind}: step must be a compile-time positive int, got {step!r}")
    return step


def _iterations(kind, frame, lo, hi, st):
    """The induction values to run, or ``None`` for one suppressed pass (or ``()``)."""
    if SUPPRESS_FLOOR:
        # inside a body that never runs: its loops' bounds are garbage; trace each body once
        return None if _trace_unrun(frame) else ()
    values = range(_value(kind, "start", lo), _value(kind, "stop", hi), st)
    if not values and _trace_unrun(frame):
        return None
    return values


def _runtime_range(kind, start, stop, step, fresh_induction: bool):
    from .isa.nki_scalar import NkiScalar
    from .isa.registers import VirtualRegister
    if stop is None:
        start, stop = 0, start
    lo, hi, st = _check_bound(kind, "start", start), _check_bound(kind, "stop", stop), _step(kind, step)
    # the induction value: an NkiScalar from NKI 0.7.0 on, "or a VirtualRegister if a bound is
    # one" (nki.language.fori_loop API page, SDK 2.33); a VirtualRegister before
    scalar = (fresh_induction and version.at_least("0.7.0")
              and not isinstance(lo, VirtualRegister) and not isinstance(hi, VirtualRegister))
    make = NkiScalar if scalar else VirtualRegister
    frame = _new_frame(kind)
    completed = False
    try:
        values = _iterations(kind, frame, lo, hi, st)
        if values is None:
            _next_iteration(frame, unrun=True)
            with _Suppressed():
                if scalar:
                    yield NkiScalar(lo if isinstance(lo, int) else 0)
                else:
                    yield VirtualRegister(lo if isinstance(lo, int) else 0,
                                          frozen=not fresh_induction)
        else:
            induction = VirtualRegister(0, frozen=True)
            for v in values:
                _next_iteration(frame)
                if fresh_induction:
                    induction = make(v)
                else:
                    induction._set_runtime(v)
                yield induction
        completed = True
    finally:
        _exit(frame, completed)


def dynamic_range(start, stop=None, step=1):
    """``for i in nl.dynamic_range(...)``: a runtime loop; ``i`` is a frozen VirtualRegister."""
    return _runtime_range("dynamic_range", start, stop, step, fresh_induction=False)


def fori_loop(lower, upper, body_fun, step=1):
    """``nl.fori_loop`` (NKI 0.6.0): calls ``body_fun(i)``, ``i`` the iteration value passed
    by value (writing it does not change the loop): an NkiScalar from NKI 0.7.0 on unless a
    bound is a VirtualRegister, a VirtualRegister before."""
    if not callable(body_fun):
        raise TypeError(f"nl.fori_loop: body_fun must be a function (i) -> None, got "
                        f"{type(body_fun).__name__}")
    for i in _runtime_range("fori_loop", lower, upper, step, fresh_induction=True):
        body_fun(i)


def _while_iterations(kind: str, init, cond):
    """Yield once per iteration of a runtime loop that runs while the register / scalar
    ``cond()`` (``init`` at first) is non-zero, checked before each iteration."""
    frame = _new_frame(kind)
    completed = False
    try:
        if SUPPRESS_FLOOR or init.runtime_value(f"{kind} condition") == 0:
            if _trace_unrun(frame):
                _next_iteration(frame, unrun=True)
                with _Suppressed():
                    yield
        else:
            while cond().runtime_value(f"{kind} condition") != 0:
                _next_iteration(frame)
                yield
        completed = True
    finally:
        _exit(frame, completed)


def dynamic_while(reg, cond):
    """``while reg:`` with a register condition (``cond()`` re-reads it): a runtime loop
    (nki-dynamic-loops.rst, "Using while with a VirtualRegister"); deprecated by NKI 0.6.0."""
    if version.at_least("0.7.0"):
        # removed with the parser front end: the tracer evaluates the condition in Python
        # (nki/migration, "Migrating from NKI 0.6.0 to NKI 0.7.0"; the VirtualRegister API
        # page: a register in a Python while "raises TypeError")
        raise TypeError(f"'while reg:' with a VirtualRegister was removed in NKI 0.7.0; use "
                        f"nl.while_loop(init, body) ({version.ENV_VAR}={version.nki_version()})")
    if version.at_least("0.6.0"):
        warnings.warn(
            "dynamic 'while reg:' loops are deprecated in NKI 0.6.0 and will be removed in a "
            "future release; use nl.while_loop(init, body) (release-notes/components/nki.rst, "
            "0.6.0, Deprecated and Removed APIs)", DeprecationWarning, stacklevel=3)

    def checked():
        return _condition("while", cond(), "the loop condition")
    return _while_iterations("while", reg, checked)


def _condition(kind: str, r, what: str):
    """A while-loop condition: a VirtualRegister; from NKI 0.8.0 also a signed 32-bit NkiScalar
    available on all engines, or an int (nki.language.while_loop API page, SDK 2.34: "Both the
    initial and returned conditions must be signed 32-bit values and available on all engines.
    nl.uint32, 64-bit scalars and Python bool values are rejected")."""
    from .isa.nki_scalar import NkiScalar
    from .isa.registers import VirtualRegister
    if isinstance(r, VirtualRegister):
        return r
    if kind == "while_loop" and version.at_least("0.8.0"):
        if isinstance(r, NkiScalar):
            if r.dtype.name != "int32":
                raise NkiValidationError(f"nl.while_loop: {what} is a {r.dtype} NkiScalar; the "
                                         "condition must be a signed 32-bit value (nl.int32)")
            _all_engines(f"nl.while_loop: {what}", r)
            return r
        if isinstance(r, int) and not isinstance(r, bool):
            return NkiScalar(r)
        raise TypeError(f"nl.while_loop: {what} must be an nl.int32 NkiScalar or an int, got "
                        f"{type(r).__name__}")
    if kind == "while_loop":
        raise TypeError(f"nl.while_loop: {what} must be a VirtualRegister, got "
                        f"{type(r).__name__}")
    raise TypeError(f"{kind}: the loop condition must stay a VirtualRegister, got "
                    f"{type(r).__name__}")


def _all_engines(what: str, s) -> None:
    if s.engine is not None:
        raise NkiValidationError(
            f"{what} is bound to {s.engine}; a control-flow condition must be available on all "
            "engines (every sequencer runs the branch: nki.language.if_else / while_loop API "
            "pages, SDK 2.34): load it without engine=")


def while_loop(init, body_fun):
    """``nl.while_loop`` (NKI 0.6.0): runs ``r = body_fun(r)`` while ``r`` is non-zero (checked
    before each iteration), ``r`` passed by value; returns None, as documented. ``r``: a
    VirtualRegister, or from NKI 0.8.0 an nl.int32 NkiScalar or an int."""
    from .isa.registers import VirtualRegister
    kind = "while_loop"
    current = [_condition(kind, init, "init")]
    if not callable(body_fun):
        raise TypeError(f"nl.while_loop: body_fun must be a function (r) -> r, got "
                        f"{type(body_fun).__name__}")
    for _ in _while_iterations(kind, current[0], lambda: current[0]):
        # "The body receives the current condition value r ... passed by value"
        # (nl.while_loop docstring): a copy of a register (a scalar is immutable)
        r = current[0]
        nxt = body_fun(VirtualRegister(r.value) if isinstance(r, VirtualRegister) else r)
        if not version.at_least("0.8.0") and not isinstance(nxt, VirtualRegister):
            raise TypeError(f"nl.while_loop: body_fun must return a VirtualRegister (the next "
                            f"condition), got {type(nxt).__name__}")
        current[0] = _condition(kind, nxt, "body_fun's return value")


# ----------------------------------------------------------------- nl.if_else

def if_else(cond, then_fn, else_fn=None) -> None:
    """``nl.if_else`` (NKI 0.8.0): ``then_fn()`` when ``cond`` is non-zero, else ``else_fn()``.

    A Python bool / int is resolved now: only the selected callback runs, no control flow is
    emitted. A run-time ``cond`` (a 32-bit NkiScalar available on all engines) is a compiled
    conditional: both callbacks are compiled program, so the one not taken is traced too,
    with its effects suppressed, the first time this branch is reached in the program (as a
    loop body that runs zero times; see the module doc). The outcome is recorded in the
    trace (``Trace.branches``) and in the program's control flow (``program_flow``).
    Source: nki.language.if_else API page (SDK 2.34).
    """
    import numpy as np

    from .isa.nki_scalar import NkiScalar
    for arg, fn in (("then_fn", then_fn), ("else_fn", else_fn)):
        if (fn is not None or arg == "then_fn") and not callable(fn):
            raise TypeError(f"nl.if_else: {arg} must be a function () -> None, got "
                            f"{type(fn).__name__}")
    if isinstance(cond, (bool, int, np.integer, np.bool_)):
        fn = then_fn if cond else else_fn
        if fn is not None:
            fn()
        return None
    if not isinstance(cond, NkiScalar):
        raise TypeError(f"nl.if_else: cond must be a Python bool / int or a 32-bit NkiScalar "
                        f"(e.g. nisa.scalar_load(flag) > 0), got {type(cond).__name__}")
    cond.require_32bit("nl.if_else cond")
    _all_engines("nl.if_else: cond", cond)
    st = _current()
    frame = st.frames[-1] if st.frames else None
    if frame is not None:
        ordinal = frame.branches
        frame.branches += 1
        frame.signature.append(("if_else", ordinal))
        branch_id = frame.loop_id + ("if", ordinal)
    else:
        ordinal = st.top_branches
        st.top_branches += 1
        branch_id = ("if", ordinal)
    if branch_id not in st.sites:
        from .memory import _kernel_site
        st.sites[branch_id] = ("nl.if_else", _kernel_site())
    taken = None
    if not SUPPRESS_FLOOR:
        taken = cond.value != 0
        st.flow.append(("if_else", branch_id, int(taken)))
        from . import trace
        tr = trace.current()
        if tr is not None:
            tr.branch_reached(branch_id, taken, _program_id())
    for side, fn in ((True, then_fn), (False, else_fn)):
        if fn is None:
            continue
        if taken is side:
            _run_side(st, frame, branch_id, side, fn, suppress=False)
        elif (branch_id, side) not in st.sides:
            _run_side(st, frame, branch_id, side, fn, suppress=True)
        else:
            # compiled, not run: the ordinals its loops and branches took stay taken
            rec = st.sides[(branch_id, side)]
            if frame is not None:
                frame.children += rec.loops
                frame.branches += rec.branches
            else:
                st.top_children += rec.loops
                st.top_branches += rec.branches
    return None


def _run_side(st: _ProgramState, frame, branch_id, side: bool, fn, suppress: bool) -> None:
    """Run (or trace with effects suppressed) one side of an if_else; the compiler compiles
    it once, so every run must issue the instruction stream of the first."""
    loops0 = frame.children if frame is not None else st.top_children
    branches0 = frame.branches if frame is not None else st.top_branches
    outer = frame.signature if frame is not None else None
    if frame is not None:
        frame.signature = []
    try:
        if suppress:
            with _Suppressed():
                fn()
        else:
            fn()
    finally:
        sig = None
        if frame is not None:
            sig, frame.signature = frame.signature, outer
    loops = (frame.children if frame is not None else st.top_children) - loops0
    branches = (frame.branches if frame is not None else st.top_branches) - branches0
    rec = st.sides.get((branch_id, side))
    if rec is None:
        st.sides[(branch_id, side)] = _BranchSide(sig, loops, branches)
    elif rec.signature != sig or rec.loops != loops or rec.branches != branches:
        which = "then_fn" if side else "else_fn"
        raise NkiValidationError(
            f"nl.if_else: {which} of branch {branch_id} issued a different instruction stream "
            "than the first time it was traced; the compiler compiles each branch once, so its "
            "Python code must not depend on values that change between runs")


def program_flow() -> list:
    """The running program's control flow so far, in program order: ``("loop", loop_id,
    trips)`` for each completed entry of a runtime loop, ``("if_else", branch_id, taken)``
    for each run-time if_else (compared between the programs of an LNC=2 launch)."""
    return list(_current().flow)


def flow_record(state: _ProgramState | None = None) -> tuple:
    """``(program_flow(), {id: (construct, kernel line)}, {loop_id: iteration of the loops
    being run})`` of the running program (or of ``state``)."""
    st = _current() if state is None else state
    # the lists themselves, not copies: a caller compares them while the program waits
    return st.flow, st.sites, {f.loop_id: f.iteration for f in st.frames}


def check_same_flow(records: list, where: str = "", start: int = 0) -> None:
    """Raise unless every program of an LNC launch took the same control flow.

    ``records``: ``flow_record()`` per program; their flows are known to agree before
    position ``start``. "Dynamic control flow that differs between
    cores is undefined, and you will likely receive an error at runtime" (aws-neuron-sdk
    81ce03ae nki/get-started/about/lnc.rst l.141-149); the released runtime-loop kernels give
    both programs the same trip counts (nki-library d2ad3a5 core/moe/moe_cte/
    bwmm_shard_on_I.py l.573). Every runtime loop entry's trip count and every run-time
    ``nl.if_else`` outcome must match, in program order.
    """
    flow0, sites0, at0 = records[0]
    for pid in range(1, len(records)):
        flow, sites, at = records[pid]
        for k in range(start, max(len(flow0), len(flow))):
            a = flow0[k] if k < len(flow0) else None
            b = flow[k] if k < len(flow) else None
            if a == b:
                continue
            ref = a if a is not None else b
            construct, line = (sites0 if a is not None else sites).get(ref[1], ("?", "?"))

            def says(ev, p):
                if ev is None:
                    inside = (at0 if p == 0 else at).get(ref[1])
                    if inside is not None:
                        return (f"program {p} is still in it, in iteration {inside + 1} "
                                f"(index {inside})")
                    return f"program {p} has no such step (it stopped first)"
                if ev[1] != ref[1]:
                    return f"program {p} reaches {ev[0]} {ev[1]} instead"
                if ev[0] == "loop":
                    return f"program {p} runs {ev[2]} iteration{'s' if ev[2] != 1 else ''}"
                return f"program {p} takes the {'then' if ev[2] else 'else'} branch"

            n = sum(1 for e in flow0[:k] if e[1] == ref[1]) + 1
            raise NkiSyncError(
                f"LNC=2: programs 0 and {pid} take different control flow{where} at "
                f"{construct} {ref[1]} ({line}, its entry #{n}): {says(a, 0)}, {says(b, pid)}. "
                "Both programs must run the same runtime trip counts and branch outcomes "
                "(lnc.rst: \"Dynamic control flow that differs between cores is undefined\"); "
                "pad the work so each program does the same number of iterations")
        for lid in sorted(set(at0) | set(at), key=repr):
            if at0.get(lid) != at.get(lid):
                construct, line = {**sites, **sites0}.get(lid, ("?", "?"))

                def where_in(i):
                    return "outside it" if i is None else f"in its iteration index {i}"
                raise NkiSyncError(
                    f"LNC=2: programs 0 and {pid} take different control flow{where} at "
                    f"{construct} {lid} ({line}): program 0 is {where_in(at0.get(lid))}, program "
                    f"{pid} {where_in(at.get(lid))}. Both programs must run the same runtime "
                    "trip counts and branch outcomes (lnc.rst: \"Dynamic control flow that "
                    "differs between cores is undefined\")")


__all__ = ["dynamic_range", "fori_loop", "while_loop", "if_else", "loop_stack", "loop_path",
           "LoopFrame", "suppressed", "program_flow", "flow_record", "check_same_flow",
           "NkiKnownIssueWarning"]
