"""LNC=2: the two programs of ``kernel[2]`` run at once, in deterministic lock-step.

On trn2 / trn3 a logical NeuronCore of LNC=2 is two physical cores, each with
its own engines, SBUF, PSUM and registers, sharing HBM
(about-neuron/arch/neuron-features/logical-neuroncore-config.rst); a kernel
launched on it runs as an SPMD grid of two programs, ``nl.program_id(0)`` 0
and 1. The SDK simulator "spawns two Python threads that execute the kernel
concurrently, each with its own program_id. Input arrays use shared_hbm
buffers, so both threads can access shared memory. nki.isa.sendrecv and
nki.isa.core_barrier use thread-safe synchronization primitives"
(aws-neuron-sdk a3247f5, Neuron 2.32.0 / NKI 0.6.0, nki/guides/nki_simulator.rst
lines 207-210, "Execution").

Here too each program runs in its own thread, but only one runs at a time
and the order is fixed (:class:`Lockstep`): program 0 runs until it reaches a
synchronisation (``nisa.core_barrier``, ``nisa.sendrecv``) or ends, then
program 1 runs up to the same point; when both are there the synchronisation
takes effect (a ``sendrecv`` moves each program's ``src`` into the other's
``dst``), the epoch's HBM accesses are checked for races (``sim.races``) and
program 0 goes on. Thread hand-offs happen only there, never per
instruction. Results do not depend on thread timing, and a barrier really
orders the programs' HBM accesses: what program 0 wrote before it is there
for program 1 to read after it.

Per program (saved and restored at each hand-off, so every module keeps its
plain module-level state and hot paths stay as fast as at LNC=1): the
launch's ``program_id``, shared-allocation cursor and ``nl.rand`` generator
(``sim.jit``), the
runtime-loop state and effect suppression (``sim.control``), the SBUF/PSUM
capacity tracker (``sim.memory``), the lowering tags (``sim.trace``); the
engine registers are keyed by program (``sim.isa._state``). Shared: HBM, the
trace (one trace, every instruction tagged with its ``program_id``).

Errors (:class:`NkiSyncError`): a program reaches a synchronisation the other
never reaches (it ends first: on hardware the first one waits forever), or
the two reach different kinds of synchronisation, or a ``sendrecv`` pair
disagrees on partners or ``pipe_id``. An error in one program (any
exception) stops the launch; the other program's thread is unwound and the
error is raised in the caller's thread.

Simplifications: the k-th synchronisation of program 0 pairs with the k-th of
program 1 (both run the same control flow: release notes 0.3.0, known
issues, "identical control flow"); ``sendrecv``s with different ``pipe_id``
values may overlap on hardware ("Operations with different pipe_id values can
progress independently", nki.isa API page) but pair in order here, and every
synchronisation orders all HBM accesses of both programs (a ``core_barrier``
blocks only its own engine on hardware; the compiler orders the other
engines' accesses to ``data`` after it by dependency).
"""
from __future__ import annotations

import threading

import numpy as np

from . import control as _control
from . import memory as _memory
from . import races as _races
from . import trace as _trace
from .errors import NkiSyncError

# module-level lists whose contents are per program (swapped in place at a hand-off: other
# modules hold references to these very lists)
_PER_PROGRAM = (_control._state, _control.SUPPRESS_FLOOR, _control._register_undo,
                _memory._active, _trace._lowering)

_running: list = []     # the Lockstep of the running LNC launch (one at a time)


class _Aborted(BaseException):
    """Unwinds a program's thread after the other program failed."""


class Arrival:
    """One program at a synchronisation: what it asks for, filled in when both are there."""

    __slots__ = ("pid", "kind", "desc", "params", "sync_id")

    def __init__(self, pid: int, kind: str, desc: str, params: dict):
        self.pid, self.kind, self.desc, self.params = pid, kind, desc, params
        self.sync_id = -1


class Lockstep:
    """Runs ``body(pid)`` for every program of an LNC launch in lock-step epochs."""

    def __init__(self, launch, body):
        self.launch = launch
        self.n = launch.num_programs
        self.body = body
        self.cv = threading.Condition()
        self.turn = 0
        self.done = [False] * self.n
        self.waiting: list = [None] * self.n       # Arrival of a program stopped at a sync
        self.results: list = [None] * self.n
        self.error: BaseException | None = None
        self.syncs = 0                              # synchronisations completed (sync ids)
        self.flow_checked = 0                       # flow events equal on every program
        self.log = _races.HbmLog(self.n)
        self._base = [list(lst) for lst in _PER_PROGRAM]
        self._saved = [[list(b) for b in self._base] for _ in range(self.n)]
        self._cursor = [0] * self.n
        self._rng = [np.random.default_rng(0) for _ in range(self.n)]   # nl.rand, per core

    # -- per-program state
    def _install(self, pid: int) -> None:
        for lst, saved in zip(_PER_PROGRAM, self._saved[pid]):
            lst[:] = saved
        self.launch.program_id = pid
        self.launch.shared_cursor = self._cursor[pid]
        self.launch.rng = self._rng[pid]

    def _save(self, pid: int) -> None:
        self._saved[pid] = [list(lst) for lst in _PER_PROGRAM]
        self._cursor[pid] = self.launch.shared_cursor
        self._rng[pid] = self.launch.rng

    def _pass_to(self, pid: int, nxt: int) -> None:
        """(cv held) Hand the baton from ``pid`` to ``nxt`` and wait until it comes back."""
        self._save(pid)
        self.turn = nxt
        self.cv.notify_all()
        self.cv.wait_for(lambda: self.turn == pid)
        self._install(pid)
        if self.error is not None:
            raise _Aborted()

    def _next_live(self, pid: int):
        for k in range(1, self.n + 1):
            q = (pid + k) % self.n
            if not self.done[q]:
                return q
        return None

    # -- running
    def run(self) -> list:
        """Run every program; returns ``body``'s result per program, or raises the first
        error. The module-level per-program lists are as before afterwards."""
        _running.append(self)
        _races.ACTIVE.append(self.log)
        threads = [threading.Thread(target=self._program, args=(pid,), daemon=True,
                                    name=f"nki-program-{pid}") for pid in range(self.n)]
        try:
            for t in threads:
                t.start()
            with self.cv:
                self.cv.wait_for(lambda: all(self.done))
            for t in threads:
                t.join()
        finally:
            _races.ACTIVE.remove(self.log)
            _running.remove(self)
            for lst, base in zip(_PER_PROGRAM, self._base):
                lst[:] = base
            self.launch.program_id = 0
        if self.error is not None:
            raise self.error
        return self.results

    def _program(self, pid: int) -> None:
        try:
            with self.cv:
                self.cv.wait_for(lambda: self.turn == pid)
                self._install(pid)
                if self.error is not None:
                    raise _Aborted()
            result = self.body(pid)
        except _Aborted:
            self._finish(pid, None)
            return
        except BaseException as e:   # noqa: BLE001 - handed to the caller's thread
            self._finish(pid, e)
            return
        self.results[pid] = result
        self._finish(pid, None)

    def _finish(self, pid: int, error) -> None:
        with self.cv:
            if error is None and self.error is None:
                error = self._ended(pid)
            if error is not None and self.error is None:
                self.error = error
            self.done[pid] = True
            self._save(pid)
            nxt = self._next_live(pid)
            if nxt is None:
                self.cv.notify_all()
                return
            self.turn = nxt
            self.cv.notify_all()

    def _flows(self, pid: int) -> list:
        """(cv held, in program ``pid``'s thread) every program's control flow so far: a
        finished program's from its result (``body`` returns its ``control.flow_record()``
        last), a running one's from its loop state."""
        out = []
        base = len(self._base[0])
        for q in range(self.n):
            if self.done[q] or (q == pid and self.results[q] is not None):
                out.append(self.results[q][-1] if self.results[q] is not None else ([], {}, {}))
                continue
            states = _control._state if q == pid else self._saved[q][0]
            out.append(_control.flow_record(states[-1]) if len(states) > base
                       else ([], {}, {}))
        return out

    def _ended(self, pid: int):
        """(cv held) Program ``pid`` ended normally: a deadlock, the final race check, or
        None."""
        for q in range(self.n):
            w = self.waiting[q]
            if q != pid and w is not None:
                try:    # a deadlock from different control flow: say where the flows part
                    _control.check_same_flow(self._flows(pid), f" (program {q} waits at "
                                                                f"{w.desc})")
                except BaseException as e:   # noqa: BLE001
                    return e
                return NkiSyncError(
                    f"program {pid} of the LNC=2 grid ended while program {q} waits at {w.desc}: "
                    f"on hardware program {q} waits forever (both programs must reach every "
                    "nisa.core_barrier / nisa.sendrecv; their control flow must be identical)")
        if all(self.done[q] for q in range(self.n) if q != pid):
            try:
                self.log.end_epoch("the end of the kernel")
            except BaseException as e:   # noqa: BLE001
                return e
        return None

    # -- synchronisation (called by sim.isa.sync in the program's own thread)
    def arrive(self, arrival: Arrival) -> Arrival:
        """Program ``arrival.pid`` reached a synchronisation: wait for the other program
        there, let it take effect (``exchange`` for sendrecv), return with ``sync_id`` set."""
        pid = arrival.pid
        with self.cv:
            arrival.sync_id = self.syncs
            for q in range(self.n):
                if q != pid and self.done[q]:
                    # a hang from different control flow: say where the flows part
                    _control.check_same_flow(self._flows(pid), f" (program {q} ended while "
                                                                f"program {pid} waits at "
                                                                f"{arrival.desc})")
                    raise NkiSyncError(
                        f"program {pid} of the LNC=2 grid reached {arrival.desc}, but program "
                        f"{q} ended without reaching it: on hardware program {pid} waits forever "
                        "(both programs must reach every nisa.core_barrier / nisa.sendrecv)")
            others = [self.waiting[q] for q in range(self.n) if q != pid]
            if any(w is None for w in others):
                self.waiting[pid] = arrival
                self._pass_to(pid, self._next_live(pid))
                return arrival
            everyone = sorted([arrival, *others], key=lambda a: a.pid)
            flows = self._flows(pid)
            _control.check_same_flow(flows, f" before {arrival.desc}", self.flow_checked)
            self.flow_checked = len(flows[0][0])
            _match(everyone)
            if arrival.kind in _EXCHANGES:
                _exchange(everyone)
            self.log.end_epoch(f"{arrival.kind} #{arrival.sync_id} ({arrival.desc})")
            self.syncs += 1
            for q in range(self.n):
                self.waiting[q] = None
            if pid != 0:
                # deterministic: program 0 starts every epoch
                self._pass_to(pid, 0)
            return arrival


def _match(arrivals) -> None:
    """The programs' synchronisations must be of one kind (and agree, for sendrecv)."""
    a0 = arrivals[0]
    for a in arrivals[1:]:
        if a.kind != a0.kind:
            raise NkiSyncError(
                f"the programs of the LNC=2 grid reach different synchronisations: program "
                f"{a0.pid} {a0.desc}, program {a.pid} {a.desc} (the k-th synchronisation of "
                "each program must be the same instruction)")
    if a0.kind not in _EXCHANGES:
        return
    by_pid = {a.pid: a for a in arrivals}
    for a in arrivals:
        p = a.params
        src = by_pid.get(p["recv_from_rank"])
        if src is None or src.params["send_to_rank"] != a.pid:
            peer = src.params["send_to_rank"] if src is not None else None
            raise NkiSyncError(
                f"sendrecv: program {a.pid} receives from rank {p['recv_from_rank']} ({a.desc}) "
                f"but that program sends to rank {peer}: on hardware the transfer never "
                "completes")
        if src.params["pipe_id"] != p["pipe_id"]:
            raise NkiSyncError(
                f"sendrecv: program {a.pid} uses pipe_id {p['pipe_id']} ({a.desc}), its sender "
                f"program {src.pid} pipe_id {src.params['pipe_id']} ({src.desc})")
        s, d = src.params["src"], p["dst"]
        if tuple(s.shape) != tuple(d.shape) or s.dtype != d.dtype:
            raise NkiSyncError(
                f"sendrecv: program {src.pid} sends {tuple(s.shape)} {s.dtype} but program "
                f"{a.pid} receives into {tuple(d.shape)} {d.dtype} (same shape and dtype)")


_EXCHANGES = ("sendrecv", "sendrecv_compute")


def _exchange(arrivals) -> None:
    """Each program's ``dst`` receives its sender's ``src`` (every ``src`` read first: a swap
    is exact); ``sendrecv_compute`` writes ``reduce_op(own src, sender's src)`` instead."""
    srcs = {a.pid: a.params["src"].read() for a in arrivals}
    for a in arrivals:
        received = srcs[a.params["recv_from_rank"]]
        op = a.params.get("reduce_op")
        if op is not None:
            received = op.apply(srcs[a.pid].astype(np.float32), received.astype(np.float32))
        a.params["dst"].write(received)


def current() -> Lockstep | None:
    """The lock-step run of the running LNC=2 launch, or None (LNC=1 / outside a launch)."""
    return _running[-1] if _running else None


__all__ = ["Lockstep", "Arrival", "current"]
