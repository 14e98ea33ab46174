"""Runtime control flow: the loops the NKI compiler keeps as loops.

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

- ``step`` is a compile-time positive int; ``start`` / ``stop`` are ints or
  ``VirtualRegister`` s (``nl.dynamic_range`` / ``nl.fori_loop`` API pages);
  an int bound still makes a runtime loop;
- ``nl.dynamic_range``'s induction variable is a frozen register (NKI 0.4.0
  release notes: writing it raises); ``nl.fori_loop`` passes it by value
  ("writing to ``i`` has no effect on the loop", ``fori_loop`` docstring), so
  each iteration gets a fresh register holding ``i``;
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
from .errors import NkiValidationError


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


@dataclass
class _ProgramState:
    frames: list = field(default_factory=list)
    top_children: int = 0
    no_reorder_depth: int = 0
    bodies: dict = field(default_factory=dict)   # loop_id -> the body's instruction stream


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
    tracker = memory.current()
    begin = tracker.access_count() if tracker is not None and hasattr(tracker, "access_count") else 0
    frame = LoopFrame(loop_id=loop_id, kind=kind, begin_access=begin)
    st.frames.append(frame)
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
    """An int bound (as int) or a VirtualRegister (read later: not at all in an unrun body)."""
    from .isa.registers import VirtualRegister
    if isinstance(v, VirtualRegister):
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np
            if isinstance(v, np.integer):
                return int(v)
        except ImportError:  # pragma: no cover
            pass
        raise TypeError(f"nl.{kind}: {arg} must be an int or a VirtualRegister, got {type(v).__name__}")
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
    from .isa.registers import VirtualRegister
    if stop is None:
        start, stop = 0, start
    lo, hi, st = _check_bound(kind, "start", start), _check_bound(kind, "stop", stop), _step(kind, step)
    frame = _new_frame(kind)
    completed = False
    try:
        values = _iterations(kind, frame, lo, hi, st)
        if values is None:
            _next_iteration(frame, unrun=True)
            with _Suppressed():
                yield VirtualRegister(lo if isinstance(lo, int) else 0, frozen=not fresh_induction)
        else:
            induction = VirtualRegister(0, frozen=True)
            for v in values:
                _next_iteration(frame)
                if fresh_induction:
                    induction = VirtualRegister(v)
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
    """``nl.fori_loop`` (NKI 0.6.0): calls ``body_fun(i)``, ``i`` a VirtualRegister holding
    the iteration value, passed by value (writing it does not change the loop)."""
    if not callable(body_fun):
        raise TypeError(f"nl.fori_loop: body_fun must be a function (i) -> None, got "
                        f"{type(body_fun).__name__}")
    for i in _runtime_range("fori_loop", lower, upper, step, fresh_induction=True):
        body_fun(i)


def _while_iterations(kind: str, init, cond):
    """Yield once per iteration of a runtime loop that runs while the register ``cond()``
    (``init`` at first) is non-zero, checked before each iteration."""
    frame = _new_frame(kind)
    completed = False
    try:
        if SUPPRESS_FLOOR or init.runtime_value(f"{kind} condition") == 0:
            if _trace_unrun(frame):
                _next_iteration(frame, unrun=True)
                with _Suppressed():
                    yield
        else:
            while _condition(kind, cond()).runtime_value(f"{kind} condition") != 0:
                _next_iteration(frame)
                yield
        completed = True
    finally:
        _exit(frame, completed)


def _condition(kind: str, r):
    from .isa.registers import VirtualRegister
    if not isinstance(r, VirtualRegister):
        raise TypeError(f"{kind}: the loop condition must stay a VirtualRegister, got "
                        f"{type(r).__name__}")
    return r


def dynamic_while(reg, cond):
    """``while reg:`` with a register condition (``cond()`` re-reads it): a runtime loop
    (nki-dynamic-loops.rst, "Using while with a VirtualRegister"); deprecated by NKI 0.6.0."""
    if version.at_least("0.6.0"):
        warnings.warn(
            "dynamic 'while reg:' loops are deprecated in NKI 0.6.0 and will be removed in a "
            "future release; use nl.while_loop(init, body) (release-notes/components/nki.rst, "
            "0.6.0, Deprecated and Removed APIs)", DeprecationWarning, stacklevel=3)
    return _while_iterations("while", reg, cond)


def while_loop(init, body_fun):
    """``nl.while_loop`` (NKI 0.6.0): runs ``r = body_fun(r)`` while register ``r`` is
    non-zero (checked before each iteration), ``r`` passed by value; returns None, as
    documented."""
    from .isa.registers import VirtualRegister
    kind = "while_loop"
    if not isinstance(init, VirtualRegister):
        raise TypeError(f"nl.while_loop: init must be a VirtualRegister, got {type(init).__name__}")
    if not callable(body_fun):
        raise TypeError(f"nl.while_loop: body_fun must be a function (r) -> VirtualRegister, "
                        f"got {type(body_fun).__name__}")

    current = [init]
    for _ in _while_iterations(kind, init, lambda: current[0]):
        # "The body receives the current condition value r as a VirtualRegister, passed by
        # value" (nl.while_loop docstring): a copy, which it may load and return
        nxt = body_fun(VirtualRegister(current[0].value))
        if not isinstance(nxt, VirtualRegister):
            raise TypeError(f"nl.while_loop: body_fun must return a VirtualRegister (the next "
                            f"condition), got {type(nxt).__name__}")
        current[0] = nxt


__all__ = ["dynamic_range", "fori_loop", "while_loop", "loop_stack", "loop_path", "LoopFrame",
           "suppressed", "NkiKnownIssueWarning"]
