"""The goals of the project, each computed from a result next to its figure.

A :class:`Goal` names the judged case it is stated at (a
:class:`~simulate.cases.Case`, so ids are never typed twice), the figure, how to
compute it from the :class:`~simulate.run.CaseResult`, and the goal as a
comparison (``>=`` or ``<=`` a threshold). A performance goal is judged at its
case only; an accuracy or program-size goal (``any_batch``) at every batch of its
case's model shape and layer configuration, so the default set's 2K-token cases are
judged on them too. A run lists the goals it measured, nothing else.

Figures (all modeled for the run's target, per NeuronCore):
  * HBM fraction = minimal HBM bytes / modeled time / the core's DMA
    bandwidth (``CaseResult.hbm_fraction``); conv prefill >= 70 %, SSD
    decode at 512 sequences >= 60 %.
  * x bytes-moved bound = modeled time / (minimal HBM bytes / DMA bandwidth)
    = 1 / HBM fraction; conv decode <= 2.
  * tokens/s: SSD prefill >= 2 M per NeuronCore; GDN prefill at Qwen3-Next TP1
    16K >= 2 M, and the TP4 shard's rate >= 3.5 x TP1's (a goal with a ``base``
    case: its value compares two results).
  * program size (static instructions the compiler emits, each runtime loop
    body once) <= 20,000.
  * LNC=2 / LNC=1: the modeled time of the launch as two programs on one
    logical core (``CaseResult.lnc2``, ``python -m simulate --lnc both``)
    over one program on one physical core, <= 0.55 where the work splits
    evenly: conv prefill, SSD prefill Mamba-2 2.7B, GDN prefill Qwen3-Next
    TP1 and TP4, decode at >= 32 sequences.
  * errors vs float64 (relative Frobenius): SSD and GDN bf16 mode <= 3e-3 for
    the output and the states; conv bf16 I/O "within the rounding of a bfloat16
    output": <= 2^-8, bfloat16's unit roundoff (a rounded value is within 2^-8
    relative of the exact one, so is the Frobenius norm of the rounding); the
    backwards with bf16 I/O: every gradient <= 5e-3 (the worst one, and
    d_initial_states). The forward + backward time against one H100 is
    reported in its own table (``simulate.training``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np

from simulate.cases import Case, judged_cases

PROGRAM_SIZE_LIMIT = 20_000      # static instructions of a compiled program
LNC2_RATIO_LIMIT = 0.55          # LNC=2 time / LNC=1 time where the work splits evenly
BF16_UNIT_ROUNDOFF = float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) / 2   # 2^-8


@dataclass(frozen=True)
class Goal:
    case: Case
    figure: str
    value: Callable                  # CaseResult -> float or None
    fmt: Callable                    # float -> str
    op: str                          # ">=" or "<="
    threshold: float
    context: Callable | None = None  # CaseResult -> str, shown after the value
    base: Case | None = None         # set: value(result, base case's result)
    any_batch: bool = False          # judged at every batch of the case's shape and config

    @property
    def name(self) -> str:
        """What the goal measures, e.g. "GDN prefill: tokens/s per NeuronCore" (the report's label)."""
        return f"{OP_LABELS[(self.case.family, self.case.entry)]}: {self.figure}"

    @property
    def goal_text(self) -> str:
        return f"{self.op} {self.fmt(self.threshold)}"

    def covers(self, r) -> bool:
        """Whether result ``r`` is judged on this goal: its case, or (``any_batch``) any case
        of the same op, model shape and layer configuration."""
        if not self.any_batch:
            return r.case_id == self.case.id
        return _shape_key(r.case_id) == _shape_key(self.case.id)


def _shape_key(case_id: str) -> tuple:
    """A case id without its batch: op, model and layer configuration."""
    parts = case_id.split("/")
    return tuple(parts[:2] + parts[3:])


@dataclass(frozen=True)
class GoalRow:
    name: str                        # what is measured (Goal.name)
    case_id: str
    figure: str
    value: str
    goal: str
    status: str                      # MET, MISSED (": the error" when the kernel failed) or "reported"

    def cells(self) -> list[str]:
        return [self.name, self.case_id, self.value, self.goal, self.status]


MET, MISSED = "met", "not met"
HEADERS = ["what is measured", "case", "value (modeled)", "goal", "status"]
OP_LABELS = {("short_conv", "prefill"): "conv prefill", ("short_conv", "decode"): "conv decode",
             ("mamba2_ssd", "prefill"): "SSD prefill", ("mamba2_ssd", "decode"): "SSD decode",
             ("gated_delta", "prefill"): "GDN prefill", ("gated_delta", "decode"): "GDN decode",
             ("short_conv", "backward"): "conv backward", ("mamba2_ssd", "backward"): "SSD backward",
             ("gated_delta", "backward"): "GDN backward"}
# every gradient within 5e-3 of float64 with bfloat16 I/O (relative Frobenius)
BACKWARD_BF16_TOL = 5e-3


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _times(x: float) -> str:
    return f"{x:.2f}x"


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f} M tok/s"


def _err(x: float) -> str:
    return f"{x:.2e}"


def _inv(x):
    return None if not x else 1.0 / x


def _ratio(a, b):
    return None if not a or not b else a / b


def _hbm_context(r) -> str:
    return (f"{r.bytes_per_s / 1e9:.0f} GB/s of {r.dma_bw_bytes_per_s / 1e9:.0f} GB/s, "
            f"{r.modeled_ns / 1e3:.1f} us")


def _ssd_prefill_context(r) -> str:
    return (f"binding {r.binding_engine}; roofline {100 * r.roofline_fraction:.1f} % "
            f"({r.roofline_bound}); {r.modeled_ns / 1e3:.1f} us")


def _lnc2_ratio(r):
    """LNC=2 time / LNC=1 time of one result run at both (None: no LNC=2 figure)."""
    other = r.lnc2
    if other is None or other.status != "kernel" or r.lnc != 1:
        return None
    return _ratio(other.modeled_ns, r.modeled_ns)


def _lnc2_context(r) -> str:
    other = r.lnc2
    programs = " / ".join(f"{t / 1e3:.1f}" for t in other.program_ns)
    return f"{other.modeled_ns / 1e3:.1f} us (programs {programs} us) vs {r.modeled_ns / 1e3:.1f} us"


def _program_size(r):
    """Static instructions of the largest program the result's launches ran (LNC=1 and 2)."""
    sizes = [x.program_instructions for x in (r, r.lnc2) if x is not None and x.program_instructions is not None]
    return max(sizes) if sizes else None


def _worst_gradient(r) -> str:
    grads = {n: e for n, e in r.err_grads.items() if n != "d_initial_states"}
    return max(grads, key=grads.get) if grads else "—"


def lnc2_judged(c: Case) -> bool:
    """The judged cases where the work splits evenly over two programs (the LNC=2 goal)."""
    if c.entry == "decode":
        return c.num_seqs >= 32
    if c.entry == "backward":
        return False   # its LNC=2 time is reported; no ratio is set for it
    return (c.family == "short_conv" or (c.family == "mamba2_ssd" and c.model == "mamba2-2.7b")
            or (c.family == "gated_delta" and c.model in ("qwen3-next", "qwen3-next-tp4")))


def _error_goals(c: Case) -> list[Goal]:
    """Accuracy against float64 at every batch of ``c``'s shape and configuration."""
    if c.entry == "backward":
        return [Goal(c, "rel err worst gradient (bf16 I/O)", lambda r: r.err_out, _err, "<=",
                     BACKWARD_BF16_TOL, context=_worst_gradient, any_batch=True),
                Goal(c, "rel err d_initial_states (bf16 I/O)", lambda r: r.err_state, _err, "<=",
                     BACKWARD_BF16_TOL, any_batch=True)]
    if c.family == "short_conv":
        return [Goal(c, "rel err y (bf16 rounding)", lambda r: r.err_out, _err, "<=",
                     BF16_UNIT_ROUNDOFF, any_batch=True)]
    return [Goal(c, "rel err y (bf16 mode)", lambda r: r.err_out, _err, "<=", 3e-3, any_batch=True),
            Goal(c, "rel err state (bf16 mode)", lambda r: r.err_state, _err, "<=", 3e-3,
                 any_batch=True)]


def _performance_goals(c: Case, tp1_16k: Case) -> list[Goal]:
    """The speed goals stated at judged case ``c`` (none for some judged cases)."""
    out = []
    if c.family == "short_conv" and c.entry == "prefill":
        out.append(Goal(c, "HBM bandwidth / core DMA bandwidth", lambda r: r.hbm_fraction, _pct,
                        ">=", 0.70, context=_hbm_context))
    elif c.family == "short_conv" and c.entry == "decode":
        out.append(Goal(c, "modeled time / bytes-moved bound", lambda r: _inv(r.hbm_fraction), _times,
                        "<=", 2.0, context=_hbm_context))
    elif c.family == "mamba2_ssd" and c.entry == "prefill":
        out.append(Goal(c, "tokens/s per NeuronCore", lambda r: r.tokens_per_s, _rate, ">=", 2e6,
                        context=_ssd_prefill_context))
    elif c.family == "mamba2_ssd" and c.entry == "decode" and c.num_seqs == 512:
        out.append(Goal(c, "bytes/s / core DMA bandwidth", lambda r: r.hbm_fraction, _pct, ">=",
                        0.60, context=_hbm_context))
    elif c == tp1_16k:
        out.append(Goal(c, "tokens/s per NeuronCore", lambda r: r.tokens_per_s, _rate, ">=", 2e6,
                        context=_ssd_prefill_context))
    elif c.family == "gated_delta" and c.entry == "prefill" and c.model == "qwen3-next-tp4":
        out.append(Goal(c, "tokens/s / Qwen3-Next TP1 16K's",
                        lambda r, rb: _ratio(r.tokens_per_s, rb.tokens_per_s), _times, ">=", 3.5,
                        base=tp1_16k))
    if lnc2_judged(c):
        out.append(Goal(c, "LNC=2 time / LNC=1 time", _lnc2_ratio, _times, "<=", LNC2_RATIO_LIMIT,
                        context=_lnc2_context))
    return out


def goals() -> list[Goal]:
    """Every goal, stated at the cases of :func:`simulate.cases.judged_cases`."""
    cases = judged_cases()
    tp1_16k = next(c for c in cases if c.family == "gated_delta" and c.model == "qwen3-next"
                   and c.seqlens == (16384,))
    out, shapes = [], set()
    for c in cases:
        if (c.op, c.model, c.config) not in shapes:      # once per shape and configuration
            shapes.add((c.op, c.model, c.config))
            out += _error_goals(c)
            # one compiled program per shape bucket, small enough to compile
            out.append(Goal(c, "program size (static instructions)", _program_size,
                            lambda v: f"{v:,.0f}", "<=", PROGRAM_SIZE_LIMIT, any_batch=True))
        out += _performance_goals(c, tp1_16k)
    return out


def evaluate(results, goal_list: list[Goal] | None = None, target: str | None = None) -> list[GoalRow]:
    """One row per goal and result it covers (:meth:`Goal.covers`): the goals this run
    measured, nothing about the others.

    The performance goals are stated for trn2: on another target their rows are
    "reported" only (accuracy and program size are judged on every target).
    """
    rows = []
    by_id = {r.case_id: r for r in results}
    for g in goals() if goal_list is None else goal_list:
        for r in results:
            row = _row(g, r, by_id, target) if g.covers(r) else None
            if row is not None:
                rows.append(row)
    return rows


def _row(g: Goal, r, by_id: dict, target: str | None) -> GoalRow | None:
    """Goal ``g`` judged on result ``r``; None when the run did not measure it (a skipped case,
    no LNC=2 launch, or the base case of a ratio not in the run)."""
    goal_text = g.goal_text

    def row(value, status):
        return GoalRow(g.name, r.case_id, g.figure, value, goal_text, status)

    if r.status == "error":
        return row("—", f"{MISSED}: {r.error}")
    if r.status != "kernel" or (g.value is _lnc2_ratio and r.lnc2 is None):
        return None
    if g.base is not None:
        rb = by_id.get(g.base.id)
        if rb is None or rb.status != "kernel":
            return None
        v = g.value(r, rb)
    else:
        v = g.value(r)
    if v is None or not np.isfinite(v):
        return row("—", f"{MISSED}: no value")
    value = g.fmt(v) + (f" ({g.context(r)})" if g.context is not None else "")
    if not g.any_batch and (target or r.target) != "trn2":
        goal_text += " (stated for trn2)"
        return row(value, "reported")
    ok = v >= g.threshold if g.op == ">=" else v <= g.threshold
    return row(value, MET if ok else MISSED)


def verdict(rows: list[GoalRow]) -> tuple[int, int, list[GoalRow]]:
    """-> (goals met, goals judged, the rows with the missed ones first; "reported" last)."""
    judged = [r for r in rows if r.status != "reported"]
    met = sum(r.status == MET for r in judged)
    order = {MISSED: 0, MET: 1, "reported": 2}
    return met, len(judged), sorted(rows, key=lambda r: order.get(r.status, 0))


def markdown(rows: list[GoalRow]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row.cells()) + " |")
    return "\n".join(lines)
