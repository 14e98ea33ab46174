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

Rules enforced here, each from the docs:

- ``step`` is a compile-time positive int; ``start`` / ``stop`` are ints or
  ``VirtualRegister`` s (``nl.dynamic_range`` API page);
- the induction variable is a frozen register (NKI 0.4.0 release notes:
  writing it raises);
- no runtime loop inside ``nl.no_reorder()`` (``nl.no_reorder`` API page:
  dynamic loops are not supported in a no-reorder block);
- tiles allocated inside a runtime loop body are live for the whole loop
  (NKI docs, dynamic loops: "all live tiles kept on chip for the loop's
  duration"); ``loop_stack()`` gives the memory tracker what it needs.

Not modelled: a body is executed, not traced once, so Python side effects in
a body (appending to a list, printing) happen once per iteration here and
once in total on the compiler; a loop that runs zero times adds nothing to
this run's program size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import NkiValidationError


@dataclass
class LoopFrame:
    """One runtime loop being executed."""

    loop_id: tuple              # static identity: (*parent loop_id, ordinal)
    kind: str                   # "dynamic_range" | "fori_loop" | "while_loop"
    iteration: int = -1
    children: int = 0           # runtime loops entered in the current iteration
    signature: list = field(default_factory=list)     # this iteration's stream
    first_signature: list | None = None               # iteration 0's stream
    begin_access: int = 0       # memory-access counter when the loop began (liveness)


@dataclass
class _ProgramState:
    frames: list = field(default_factory=list)
    top_children: int = 0
    no_reorder_depth: int = 0


_state: list[_ProgramState] = []


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


def _new_frame(kind: str) -> LoopFrame:
    st = _current()
    if st.no_reorder_depth:
        raise NkiValidationError(f"nl.{kind}: runtime loops are not allowed inside nl.no_reorder() "
                                 "(nl.no_reorder API docs)")
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


def _next_iteration(frame: LoopFrame) -> None:
    if frame.iteration >= 0:
        _check_same_body(frame)
    frame.iteration += 1
    frame.children = 0
    frame.signature = []
    from . import trace
    tr = trace.current()
    if tr is not None:
        tr.loop_iterated(frame.loop_id, frame.kind, _program_id())


def _check_same_body(frame: LoopFrame) -> None:
    if frame.first_signature is None:
        frame.first_signature = frame.signature
        return
    if frame.signature != frame.first_signature:
        first, now = frame.first_signature, frame.signature
        k = next((i for i in range(min(len(first), len(now))) if first[i] != now[i]),
                 min(len(first), len(now)))
        a = first[k] if k < len(first) else "end of body"
        b = now[k] if k < len(now) else "end of body"
        raise NkiValidationError(
            f"{frame.kind}: iteration {frame.iteration} of a runtime loop issued a different "
            f"instruction stream than iteration 0 (at position {k}: {b} instead of {a}); the "
            "compiler compiles the body once, so its Python code must not depend on values "
            "that change between iterations")


def _exit(frame: LoopFrame, completed: bool) -> None:
    if completed and frame.iteration >= 0:
        _check_same_body(frame)
    st = _current()
    if st.frames and st.frames[-1] is frame:
        st.frames.pop()


def _program_id() -> int:
    from .isa._core import _program_id as pid
    return pid()


def _bound(kind: str, arg: str, v) -> int:
    from .isa.registers import VirtualRegister
    if isinstance(v, VirtualRegister):
        return v.runtime_value(f"nl.{kind} {arg}")
    if isinstance(v, bool) or not isinstance(v, int):
        try:
            import numpy as np
            if isinstance(v, np.integer):
                return int(v)
        except ImportError:  # pragma: no cover
            pass
        raise TypeError(f"nl.{kind}: {arg} must be an int or a VirtualRegister, got {type(v).__name__}")
    return int(v)


def _step(kind: str, step) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise NkiValidationError(f"nl.{kind}: step must be a compile-time positive int, got {step!r}")
    return step


def _runtime_range(kind, start, stop, step):
    from .isa.registers import VirtualRegister
    if stop is None:
        start, stop = 0, start
    lo, hi, st = _bound(kind, "start", start), _bound(kind, "stop", stop), _step(kind, step)
    frame = _new_frame(kind)
    induction = VirtualRegister(lo, frozen=True)
    completed = False
    try:
        for v in range(lo, hi, st):
            _next_iteration(frame)
            induction._set_runtime(v)
            yield induction
        completed = True
    finally:
        _exit(frame, completed)


def dynamic_range(start, stop=None, step=1):
    """``for i in nl.dynamic_range(...)``: a runtime loop; ``i`` is a frozen VirtualRegister."""
    return _runtime_range("dynamic_range", start, stop, step)


def fori_loop(lower, upper, body_fun, step=1):
    """``nl.fori_loop`` (NKI 0.6.0): calls ``body_fun(i)`` with a frozen VirtualRegister ``i``."""
    for i in _runtime_range("fori_loop", lower, upper, step):
        body_fun(i)


def while_loop(init, body_fun):
    """``nl.while_loop`` (NKI 0.6.0): runs ``r = body_fun(r)`` while register ``r`` is non-zero."""
    from .isa.registers import VirtualRegister
    kind = "while_loop"
    if not isinstance(init, VirtualRegister):
        raise TypeError(f"nl.while_loop: init must be a VirtualRegister, got {type(init).__name__}")
    frame = _new_frame(kind)
    r = init
    completed = False
    try:
        while r.runtime_value("nl.while_loop condition") != 0:
            _next_iteration(frame)
            r = body_fun(r)
            if not isinstance(r, VirtualRegister):
                raise TypeError(f"nl.while_loop: body_fun must return a VirtualRegister (the next "
                                f"condition), got {type(r).__name__}")
        completed = True
    finally:
        _exit(frame, completed)
    return r


__all__ = ["dynamic_range", "fori_loop", "while_loop", "loop_stack", "loop_path", "LoopFrame"]
