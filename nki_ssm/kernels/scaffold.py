"""The run-time scaffolding every kernel repeats, in NKI 0.8 forms: trip counts and table
cells as device scalars, the work-list loop, compiled conditionals, the LNC split with one
control flow for both programs, and state round trips between HBM tensors.

Plain functions: NKI inlines the calls (never decorate them with ``nki.jit``). Everything
here is either traced kernel code (it issues instructions) or plain Python evaluated at
trace time and by the launchers (marked "trace time").

Contract
--------
Counts and cells (device scalars)
  ``trip_counts(counts)``
      ``counts`` int32 HBM ``[1, n]``: the launcher's ONE row of trip counts (and 0/1
      flags), read by every program of the launch. One DMA into a ``(1, n)`` SBUF tile,
      then one ``nisa.scalar_load`` per cell: returns the n values as ``NkiScalar`` s
      (int32, on every engine). Call it once, before the loops; a value is a
      ``nl.fori_loop`` bound, an ``nl.if_else`` condition (``flag > 0``) or an operand of
      scalar arithmetic (``stop - 1``).
  ``row_cells(table, row, first_row=0)``
      The cells of row ``first_row + row`` of an int32 HBM table ``[rows, w]`` as ``w``
      ``NkiScalar`` s: one DMA of the row (``row`` an ``NkiScalar`` as its
      ``scalar_offset``, or None for the static row ``first_row``) into a ``(1, w)`` SBUF
      tile, one ``scalar_load`` per cell. ``first_row`` (a Python int) is a program's
      block of rows. Each cell is the ``scalar_offset`` of the DMAs that use it
      (``at_row``) or an operand of scalar arithmetic.
  ``at_row(t, row, pattern, offset=0)``
      ``t.ap(pattern, offset, scalar_offset=row, indirect_dim=0)``: the access pattern
      ``pattern`` from element ``offset`` plus ``row`` (an ``NkiScalar``; None: static)
      rows of ``t``'s first dimension.

Loops and conditionals
  ``work_loop(trips, body, step=1)``
      ``nl.fori_loop(0, trips, ...)`` calling ``body(i)``, ``i`` the iteration value (an
      ``NkiScalar``: a ``scalar_offset``, or an operand). ``body`` is an inner ``def`` of
      the caller closing over its tiles; it must issue the same instructions in every
      iteration (the body is compiled once). PSUM tiles the body writes are allocated in
      the body; SBUF tiles allocated in the body live for the whole loop. No runtime loop
      inside ``body``.
  ``for_each_row(trips, table, body, first_row=0)``
      ``work_loop`` over the rows of a work table: ``body(i, cells)`` with ``cells =
      row_cells(table, i, first_row)``.
  ``run_if(flag, then_fn, else_fn=None)``
      ``nl.if_else(flag > 0, then_fn, else_fn)``: a compiled conditional on a run-time
      0/1 flag (an ``NkiScalar``); a Python bool / int is folded at trace time. Replaces a
      0/1-trip runtime loop used as a conditional. ``then_fn`` / ``else_fn`` take no
      arguments (inner ``def`` s) and, as a loop body, must issue one instruction stream.

The LNC split (two programs per logical core)
  ``lnc_grid()`` (trace time)
      ``(programs, pid)``: the launch's programs and this program's id, Python ints
      (``(1, 0)`` for a launch without a grid).
  ``program_share(n, programs, pid)`` (trace time)
      ``(first, count, real)``: program ``pid``'s units (heads, channel tiles, ...) of
      ``n`` independent ones. ``n % programs == 0``: ``count = n / programs`` from
      ``first = pid * count``, real. Otherwise program 0 takes all ``n`` (real) and every
      other program takes program 0's window with ``real`` False: it runs the same
      instructions and trip counts into dump destinations (``destination``).
  ``destination(t, real)``
      ``t`` for a program with real work; else a new ``nl.private_hbm`` tensor of ``t``'s
      shape and dtype (each program has its own: nothing another program reads or
      writes). A program without real work reads its state from and writes everything
      to such dumps (uninitialised: it computes on garbage that nothing reads).
  ``dump_rows(t, rows)``
      A new ``nl.private_hbm`` tensor of ``rows`` rows shaped like ``t``'s rows: the
      destination of a dump row when the real tensor is too large to copy whole (a pool):
      the program's table names rows ``0 .. rows-1`` of it.
  ``padded_split(n, programs)`` (trace time, for launchers)
      ``(trips, spans)``: ``n`` work rows in consecutive runs, ``spans[p] = (first,
      count)``, program 0 the larger; every program runs ``trips = ceil(n / programs)``
      iterations, rows past its ``count`` being dump rows the launcher writes into its
      tables (rows whose every write goes to a dump row, a zero block or a dump
      destination).

State round trips
  ``hbm_copy(dst, src, work)``
      HBM ``dst`` <- HBM ``src`` (views of equal element counts, e.g. a pool slot and a
      scratch block) through the float32 SBUF tile ``work``: the DMAs never convert; a
      side whose dtype is not ``work``'s is staged in its own dtype and converted by
      VectorE (round to nearest even).

The LNC rule: one control flow
------------------------------
Under LNC=2 both programs run the same runtime trip counts and the same ``if_else``
outcomes, in the same order. By construction here: every bound and condition comes from
``trip_counts`` of one counts row that both programs read, or from a Python int. What
differs between the programs is static (``pid`` is a Python int at trace time): the
first table row of their block, their heads or channels, their dump destinations. A
program with less real work runs dump rows; a program with none runs program 0's window
into ``destination`` dumps. No HBM byte is written by one program and read or written by
the other, so no synchronisation is needed.

Evidence (NKI 0.8.0 / Neuron SDK 2.34.0 documentation; released kernels where they use
the form)
---------------------------------------------------------------------------------------
- ``nisa.scalar_load`` of a 1x1 element of an internal SBUF tile that ``dma_copy`` filled
  (kernel arguments cannot be its source): RTD v2.34.0 nki/api/generated/
  nki.isa.scalar_load.html (and its example); nki/deep-dives/nki-scalar.rst (v2.34.0),
  "Loading and Storing".
- an ``NkiScalar`` as a ``nl.fori_loop`` bound (32-bit), as the loop's iteration value and
  as an access pattern's ``scalar_offset`` (int32 on SBUF / PSUM, signed on HBM), with
  traced ``+ - *``: RTD v2.34.0 nki.isa.NkiScalar.html (operations table); v2.33.0
  nki.language.fori_loop.html (the iteration value is an NkiScalar when neither bound is
  a register).
- ``nl.if_else(cond, then_fn, else_fn=None)`` with ``cond = nisa.scalar_load(flag) > 0``
  (an int32 0/1 scalar "available on all engines"): RTD v2.34.0
  nki.language.if_else.html; nki/deep-dives/nki-control-flow.html.
- one control flow for both programs: aws-neuron/aws-neuron-sdk 81ce03ae
  nki/get-started/about/lnc.rst l.141-149 ("Dynamic control flow that differs between
  cores is undefined"); released runtime-loop kernels give both programs the same trip
  count (aws-neuron/nki-library d2ad3a5 core/moe/moe_cte/bwmm_shard_on_I.py l.573).
- ``nl.program_id(0)`` / ``nl.num_programs(0)`` / ``nl.program_ndim()`` as Python ints
  (nki-library d2ad3a5 core/moe/moe_tkg/selective_expert_mx_impl.py l.117,
  core/attention/attention_bwd.py l.1134); a kernel-allocated ``nl.private_hbm`` tensor
  (core/moe/moe_cte/bwmm_shard_on_block.py l.1244).
- PSUM tiles allocated inside the runtime-loop body that writes them, and no
  cross-iteration SBUF prefetch inside a runtime loop (nki-library turns it off for
  dynamic loops: bwmm_shard_on_I_mx.py l.858-860, NKI-1582).
"""
from __future__ import annotations

from nki_ssm.backend import nl, nisa


# ----------------------------------------------------------------------- counts and cells

def trip_counts(counts):
    """Every cell of ``counts`` (int32 HBM ``[1, n]``, the one row all programs read) as an
    ``NkiScalar``, in order."""
    n = counts.shape[1]
    row = nl.ndarray((1, n), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=row, src=counts[0:1, 0:n])
    values = []
    for j in range(n):
        values.append(nisa.scalar_load(row[0:1, j:j + 1]))
    return values


def row_cells(table, row, first_row=0):
    """The cells of row ``first_row + row`` of the int32 HBM table ``[rows, w]`` as ``w``
    ``NkiScalar`` s (``row``: an ``NkiScalar``, or None for row ``first_row``)."""
    w = table.shape[1]
    cells = nl.ndarray((1, w), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=cells, src=at_row(table, row, [[w, 1], [1, w]], first_row * w))
    values = []
    for j in range(w):
        values.append(nisa.scalar_load(cells[0:1, j:j + 1]))
    return values


def at_row(t, row, pattern, offset=0):
    """``pattern`` of ``t`` from element ``offset``, plus ``row`` (an ``NkiScalar``; None:
    none) rows of ``t``'s first dimension."""
    if row == None:  # noqa: E711  (NKI has no `is`)
        return t.ap(pattern=pattern, offset=offset)
    return t.ap(pattern=pattern, offset=offset, scalar_offset=row, indirect_dim=0)


# ----------------------------------------------------------------- loops and conditionals

def work_loop(trips, body, step=1):
    """``body(i)`` for i = 0, step, .. < ``trips`` (an ``NkiScalar`` or an int): one top-level
    runtime loop."""
    def iteration(i):
        body(i)

    nl.fori_loop(0, trips, iteration, step=step)


def for_each_row(trips, table, body, first_row=0):
    """``body(i, cells)`` for the first ``trips`` rows of the work table ``table`` (from row
    ``first_row``), ``cells`` the row's values (``row_cells``)."""
    def iteration(i):
        body(i, row_cells(table, i, first_row))

    nl.fori_loop(0, trips, iteration)


def run_if(flag, then_fn, else_fn=None):
    """``then_fn()`` when ``flag`` (a run-time 0/1 ``NkiScalar``, or a Python int folded at
    trace time) is positive, else ``else_fn()``: a compiled conditional."""
    nl.if_else(flag > 0, then_fn, else_fn)


# ---------------------------------------------------------------------------- the LNC split

def lnc_grid():
    """(programs, pid) of this launch, Python ints at trace time; (1, 0) without a grid."""
    if nl.program_ndim() == 0:
        return (1, 0)
    return (nl.num_programs(0), nl.program_id(0))


def program_share(n, programs, pid):
    """(first, count, real): program ``pid``'s share of ``n`` independent units. An even
    split when ``programs`` divides ``n``; else program 0 takes all of them and the other
    programs take its window without real work (they write only to dumps)."""
    if n % programs == 0:
        count = n // programs
        return (pid * count, count, True)
    return (0, n, pid == 0)


def destination(t, real):
    """``t``, or for a program without real work a private dump of ``t``'s shape and dtype."""
    if real:
        return t
    return nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.private_hbm)


def dump_rows(t, rows):
    """A private dump of ``rows`` rows shaped like the rows of ``t`` (``t.shape[1:]``, its
    dtype): where a dump row's writes go when a program's work list addresses ``t`` by a
    table (its table names rows 0 .. rows-1 of the dump)."""
    shape = [rows]
    for d in t.shape[1:]:
        shape.append(d)
    return nl.ndarray(tuple(shape), dtype=t.dtype, buffer=nl.private_hbm)


def padded_split(n, programs):
    """(trips, spans): ``n`` work rows in ``programs`` consecutive runs ``spans[p] = (first,
    count)`` (program 0 the larger), each program running ``trips = ceil(n / programs)``
    iterations (rows past its count are dump rows)."""
    trips = (n + programs - 1) // programs
    spans = []
    first = 0
    for p in range(programs):
        count = min(trips, n - first)
        spans.append((first, count))
        first = first + count
    return (trips, spans)


# -------------------------------------------------------------------------- state round trips

def hbm_copy(dst, src, work):
    """HBM ``dst`` <- HBM ``src`` through the SBUF tile ``work`` (its dtype the working one):
    DMAs never convert; a side of another dtype is staged and converted by VectorE."""
    stage = work
    if src.dtype != work.dtype:
        stage = nl.ndarray(work.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=stage, src=src)
    if src.dtype != work.dtype:
        nisa.tensor_copy(dst=work, src=stage, engine=nisa.engine.vector)
    out = work
    if dst.dtype != work.dtype:
        out = nl.ndarray(work.shape, dtype=dst.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=work, engine=nisa.engine.vector)
    nisa.dma_copy(dst=dst, src=out)
