"""The goals of the project, each computed from a result next to its figure.

A :class:`Goal` names the judged case it is stated at (a
:class:`~simulate.cases.Case`, so ids are never typed twice), the figure, how to
compute it from the :class:`~simulate.run.CaseResult`, and the goal as a
comparison (``>=`` or ``<=`` a threshold). A performance goal is judged at its
case only; an accuracy, program-size or interval goal (``any_batch``) at every
batch of its case's model shape and layer configuration, so the default set's
2K-token cases are judged on them too. A goal with a ``base`` case compares two
results (a rate against another batch's, a forward + backward sum). A run judges
the goals it measured; every other goal is listed as "not measured" with the
command that measures it (:func:`unmeasured`).

Goals (all modeled for trn2, per NeuronCore, LNC=1, central figure, bf16
activations, float32 SSD / GDN state pools):
  * SSD, Mamba-2 2.7B: prefill 1 x 16K >= 4.8 M tokens/s (<= 3.41 ms); 8 x 2K
    ragged within 10 % of that rate (>= 0.90x); decode at 512 sequences >= 80 %
    of the core's DMA bandwidth; training step at 16K per trn2 chip >= 1.0x one
    H100 (forward + backward per core <= 8 x the H100's 4.324 ms = 34.6 ms) and
    the backward <= 31 ms.
  * GDN, Qwen3-Next: prefill TP1 1 x 16K >= 3.85 M tokens/s (<= 4.26 ms); TP1
    8 x 2K within 10 % of that rate; TP4 1 x 16K >= 13.5 M tokens/s (<= 1.21 ms);
    decode at 64 sequences >= 80 % of DMA bandwidth; training step at 16K per chip
    >= 1.0x one H100 (forward + backward <= 8 x 4.840 ms = 38.7 ms per core) and
    the backward <= 34 ms.
  * Qwen3-Next conv: prefill 1 x 16K >= 85 % of DMA bandwidth, 8 x 2K >= 70 %;
    forward + backward at 16K <= 7 ms with the backward >= 55 % of DMA bandwidth;
    decode (32, 512 sequences) within 2x of the bytes-moved bound.
  * Every judged shape: the 10-90 % interval's upper end <= 1.3x the central
    figure; LNC=2 / LNC=1 <= 0.55 where the work splits evenly (prefill and
    backward of the judged shapes, decode at >= 32 sequences; needs ``--lnc
    both``); program size (static instructions the compiler emits, each runtime
    loop body once; the larger of each launch's programs) <= 20,000; error vs
    float64 (relative Frobenius) of every forward output and state <= 3e-3
    (bf16 mode), of every gradient of the backwards <= 5e-3 (bf16 I/O; the worst
    one, and d_initial_states).

Figures: HBM fraction = minimal HBM bytes / modeled time / the core's DMA
bandwidth (``CaseResult.hbm_fraction``); x bytes-moved bound = 1 / HBM fraction;
one trn2 chip = 8 physical NeuronCores each running one launch, split perfectly
(``simulate.h100.chip_ns``), against one H100's measured forward + backward
(``simulate.h100.H100_TRAINING_NS``). The training-step table
(``simulate.training``) reports the same sums beside every backward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from simulate.cases import Case, judged_cases
from simulate.h100 import NEURONCORES_PER_CHIP, chip_ns, h100_training_for

PROGRAM_SIZE_LIMIT = 20_000      # static instructions of a compiled program
LNC2_RATIO_LIMIT = 0.55          # LNC=2 time / LNC=1 time where the work splits evenly
INTERVAL_LIMIT = 1.3             # the 10-90 % interval's upper end / the central figure
FORWARD_BF16_TOL = 3e-3          # forward output and state errors, bf16 (DESIGN.md Numerics)
# every gradient within 5e-3 of float64 with bfloat16 I/O (relative Frobenius)
BACKWARD_BF16_TOL = 5e-3
SAME_RATE = 0.90                 # "within 10 % of the 1 x 16K rate": a ragged batch's rate / 16K's


@dataclass(frozen=True)
class Goal:
    case: Case
    figure: str
    value: Callable                  # CaseResult -> float or None (base set: (result, base result))
    fmt: Callable                    # float -> str
    op: str                          # ">=" or "<="
    threshold: float
    context: Callable | None = None  # CaseResult -> str, shown after the value (base set: both)
    base: Case | None = None         # set: value(result, base case's result)
    any_batch: bool = False          # judged at every batch of the case's shape and config
    trn2_only: bool = True           # stated for trn2: "reported" on another target
    measured: Callable | None = None  # CaseResult -> bool: False = the run did not measure it
    note: str = ""                   # after the goal, e.g. the time a rate goal amounts to

    @property
    def name(self) -> str:
        """What the goal measures, e.g. "GDN prefill: tokens/s per NeuronCore" (the report's label)."""
        return f"{OP_LABELS[(self.case.family, self.case.entry)]}: {self.figure}"

    @property
    def goal_text(self) -> str:
        return f"{self.op} {self.fmt(self.threshold)}" + (f" ({self.note})" if self.note else "")

    def covers(self, r) -> bool:
        """Whether result ``r`` is judged on this goal: its case, or (``any_batch``) any case
        of the same op, model shape and layer configuration."""
        if not self.any_batch:
            return r.case_id == self.case.id
        return _shape_key(r.case_id) == _shape_key(self.case.id)

    def command(self) -> str:
        """The command that measures this goal: the judged set filtered to its case (and base
        case); an any-batch goal: the default set's cases of its shape."""
        if self.any_batch:
            op, model = self.case.id.split("/")[:2]
            return f"python -m simulate --case {op}/{model}/"
        ids = [self.case.id] + ([self.base.id] if self.base is not None else [])
        return "python -m simulate --set judged " + " ".join(
            f"--case {i.rsplit('/', 1)[0]}/" for i in ids)


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
    status: str                      # MET, MISSED (": the error"), "reported" or NOT_MEASURED

    def cells(self) -> list[str]:
        return [self.name, self.case_id, self.value, self.goal, self.status]


MET, MISSED, REPORTED, NOT_MEASURED = "met", "not met", "reported", "not measured"
HEADERS = ["what is measured", "case", "value (modeled)", "goal", "status"]
OP_LABELS = {("short_conv", "prefill"): "conv prefill", ("short_conv", "decode"): "conv decode",
             ("mamba2_ssd", "prefill"): "SSD prefill", ("mamba2_ssd", "decode"): "SSD decode",
             ("gated_delta", "prefill"): "GDN prefill", ("gated_delta", "decode"): "GDN decode",
             ("short_conv", "backward"): "conv backward", ("mamba2_ssd", "backward"): "SSD backward",
             ("gated_delta", "backward"): "GDN backward"}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _times(x: float) -> str:
    return f"{x:.2f}x"


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f} M tok/s"


def _err(x: float) -> str:
    return f"{x:.2e}"


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def _inv(x):
    return None if not x else 1.0 / x


def _ratio(a, b):
    return None if not a or not b else a / b


def _hbm_context(r) -> str:
    return (f"{r.bytes_per_s / 1e9:.0f} GB/s of {r.dma_bw_bytes_per_s / 1e9:.0f} GB/s, "
            f"{r.modeled_ns / 1e3:.1f} us")


def _prefill_context(r) -> str:
    return (f"{_ms(r.modeled_ns)}; binding {r.binding_engine}; roofline "
            f"{100 * r.roofline_fraction:.1f} % ({r.roofline_bound})")


def _rate_pair_context(r, rb) -> str:
    return f"{_rate(r.tokens_per_s)} vs {_rate(rb.tokens_per_s)}"


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


def _interval_ratio(r):
    """The 10-90 % interval's upper end / the central figure."""
    return _ratio(r.modeled_ns_p90, r.modeled_ns)


def _interval_context(r) -> str:
    from nki_ssm.perf.calibration import fmt_ns

    return f"{fmt_ns(r.modeled_ns_p90)} vs {fmt_ns(r.modeled_ns)}"


def _program_size(r):
    """Static instructions of the largest program the result's launches ran (LNC=1 and 2)."""
    sizes = [x.program_instructions for x in (r, r.lnc2) if x is not None and x.program_instructions is not None]
    return max(sizes) if sizes else None


def _worst_gradient(r) -> str:
    grads = {n: e for n, e in r.err_grads.items() if n != "d_initial_states"}
    return max(grads, key=grads.get) if grads else "—"


def _step_ns(r, rf):
    """Forward + backward per NeuronCore, LNC=1: the backward result ``r`` and its forward ``rf``."""
    if r.lnc != 1 or rf.lnc != 1 or r.modeled_ns is None or rf.modeled_ns is None:
        return None
    return rf.modeled_ns + r.modeled_ns


def _h100_over_chip(r, rf):
    """One H100's measured forward + backward / one trn2 chip's (8 cores at LNC=1, split
    perfectly): > 1, the chip is faster."""
    peer, step = h100_training_for(r.case_id), _step_ns(r, rf)
    return None if peer is None or step is None else peer[1] / chip_ns(step, 1)


def _step_context(r, rf) -> str:
    peer = h100_training_for(r.case_id)
    return (f"forward + backward {_ms(_step_ns(r, rf))} per NeuronCore ({_ms(rf.modeled_ns)} + "
            f"{_ms(r.modeled_ns)}), chip {_ms(chip_ns(_step_ns(r, rf), 1))}; H100 {_ms(peer[1])}")


def _step_sum_context(r, rf) -> str:
    return f"{_ms(rf.modeled_ns)} + {_ms(r.modeled_ns)}"


def lnc2_judged(c: Case) -> bool:
    """The judged cases where the work splits evenly over two programs (the LNC=2 goal)."""
    if c.entry == "decode":
        return c.num_seqs >= 32
    return (c.family == "short_conv" or (c.family == "mamba2_ssd" and c.model == "mamba2-2.7b")
            or (c.family == "gated_delta" and c.model in ("qwen3-next", "qwen3-next-tp4")))


def _error_goals(c: Case) -> list[Goal]:
    """Accuracy against float64 at every batch of ``c``'s shape and configuration."""
    kw = dict(any_batch=True, trn2_only=False)
    if c.entry == "backward":
        return [Goal(c, "rel err worst gradient (bf16 I/O)", lambda r: r.err_out, _err, "<=",
                     BACKWARD_BF16_TOL, context=_worst_gradient, **kw),
                Goal(c, "rel err d_initial_states (bf16 I/O)", lambda r: r.err_state, _err, "<=",
                     BACKWARD_BF16_TOL, **kw)]
    if c.family == "short_conv":
        return [Goal(c, "rel err y (bf16 I/O)", lambda r: r.err_out, _err, "<=", FORWARD_BF16_TOL, **kw)]
    return [Goal(c, "rel err y (bf16 mode)", lambda r: r.err_out, _err, "<=", FORWARD_BF16_TOL, **kw),
            Goal(c, "rel err state (bf16 mode)", lambda r: r.err_state, _err, "<=", FORWARD_BF16_TOL,
                 **kw)]


def _rate_goal(c: Case, rate: float) -> Goal:
    return Goal(c, "tokens/s per NeuronCore", lambda r: r.tokens_per_s, _rate, ">=", rate,
                context=_prefill_context, note=f"<= {_ms(c.num_tokens / rate * 1e9)}")


def _same_rate_goal(c: Case, base: Case) -> Goal:
    return Goal(c, f"tokens/s / {base.id.split('/')[2]}'s", lambda r, rb: _ratio(r.tokens_per_s, rb.tokens_per_s),
                _times, ">=", SAME_RATE, context=_rate_pair_context, base=base,
                note="within 10 % of its rate")


def _hbm_goal(c: Case, fraction: float, figure: str = "HBM bandwidth / core DMA bandwidth") -> Goal:
    return Goal(c, figure, lambda r: r.hbm_fraction, _pct, ">=", fraction, context=_hbm_context)


def _training_goals(c: Case, backward_ns: float) -> list[Goal]:
    """A 16K backward of SSD / GDN: the training step per trn2 chip >= one H100's, the backward's time."""
    fwd = c.forward()
    peer = h100_training_for(c.id)
    out = []
    if peer is not None:
        out.append(Goal(c, "training step: H100 forward + backward / one trn2 chip's (LNC=1)",
                        _h100_over_chip, _times, ">=", 1.0, context=_step_context, base=fwd,
                        note=f"forward + backward <= {_ms(NEURONCORES_PER_CHIP * peer[1])} per NeuronCore"))
    out.append(Goal(c, "time per NeuronCore", lambda r: r.modeled_ns, _ms, "<=", backward_ns))
    return out


def _performance_goals(c: Case, at: dict) -> list[Goal]:
    """The speed goals stated at judged case ``c`` (none for some judged cases); ``at``: the judged
    cases a goal refers to, by (family, model, layout)."""
    out, layout = [], c.id.split("/")[2]
    key = (c.family, c.entry, c.model, layout)
    if key == ("short_conv", "prefill", "qwen3-next", "1x16384"):
        out.append(_hbm_goal(c, 0.85))
    elif c.family == "short_conv" and c.entry == "prefill":
        out.append(_hbm_goal(c, 0.70))
    elif c.family == "short_conv" and c.entry == "decode":
        out.append(Goal(c, "modeled time / bytes-moved bound", lambda r: _inv(r.hbm_fraction), _times,
                        "<=", 2.0, context=_hbm_context))
    elif key == ("short_conv", "backward", "qwen3-next", "1x16384"):
        out.append(Goal(c, "forward + backward time per NeuronCore", _step_ns, _ms, "<=", 7e6,
                        context=_step_sum_context, base=c.forward()))
        out.append(_hbm_goal(c, 0.55))
    elif key == ("mamba2_ssd", "prefill", "mamba2-2.7b", "1x16384"):
        out.append(_rate_goal(c, 4.8e6))
    elif key == ("mamba2_ssd", "prefill", "mamba2-2.7b", "8x2048"):
        out.append(_same_rate_goal(c, at[("mamba2_ssd", "prefill", "mamba2-2.7b", "1x16384")]))
    elif key == ("mamba2_ssd", "decode", "mamba2-2.7b", "512seq"):
        out.append(_hbm_goal(c, 0.80, "bytes/s / core DMA bandwidth"))
    elif key == ("mamba2_ssd", "backward", "mamba2-2.7b", "1x16384"):
        out += _training_goals(c, 31e6)
    elif key == ("gated_delta", "prefill", "qwen3-next", "1x16384"):
        out.append(_rate_goal(c, 3.85e6))
    elif key == ("gated_delta", "prefill", "qwen3-next", "8x2048"):
        out.append(_same_rate_goal(c, at[("gated_delta", "prefill", "qwen3-next", "1x16384")]))
    elif key == ("gated_delta", "prefill", "qwen3-next-tp4", "1x16384"):
        out.append(_rate_goal(c, 13.5e6))
    elif key == ("gated_delta", "decode", "qwen3-next", "64seq"):
        out.append(_hbm_goal(c, 0.80, "bytes/s / core DMA bandwidth"))
    elif key == ("gated_delta", "backward", "qwen3-next", "1x16384"):
        out += _training_goals(c, 34e6)
    if lnc2_judged(c):
        out.append(Goal(c, "LNC=2 time / LNC=1 time", _lnc2_ratio, _times, "<=", LNC2_RATIO_LIMIT,
                        context=_lnc2_context, measured=lambda r: r.lnc2 is not None))
    return out


def goals() -> list[Goal]:
    """Every goal, stated at the cases of :func:`simulate.cases.judged_cases`."""
    cases = judged_cases()
    at = {(c.family, c.entry, c.model, c.id.split("/")[2]): c for c in cases}
    out, shapes = [], set()
    for c in cases:
        if (c.op, c.model, c.config) not in shapes:      # once per shape and configuration
            shapes.add((c.op, c.model, c.config))
            out += _error_goals(c)
            # one compiled program per shape bucket, small enough to compile
            out.append(Goal(c, "program size (static instructions)", _program_size,
                            lambda v: f"{v:,.0f}", "<=", PROGRAM_SIZE_LIMIT, any_batch=True,
                            trn2_only=False))
            # the cost model's uncertainty: the 10-90 % interval's upper end near the central figure
            out.append(Goal(c, "10-90 % interval's 90 % figure / central", _interval_ratio, _times,
                            "<=", INTERVAL_LIMIT, context=_interval_context, any_batch=True,
                            measured=lambda r: r.modeled_ns_p90 is not None))
        out += _performance_goals(c, at)
    return out


def evaluate(results, goal_list: list[Goal] | None = None, target: str | None = None) -> list[GoalRow]:
    """One row per goal and result it covers (:meth:`Goal.covers`): the goals this run
    measured, nothing about the others (:func:`unmeasured` lists those).

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


def unmeasured(results, goal_list: list[Goal] | None = None, target: str | None = None) -> list[GoalRow]:
    """One "not measured" row per goal no result of this run measured, its value cell the
    command that measures it (:meth:`Goal.command`)."""
    gl = goals() if goal_list is None else goal_list
    rows = []
    for g in gl:
        if evaluate(results, [g], target):
            continue
        rows.append(GoalRow(g.name, g.case.id, g.figure, f"— (`{g.command()}`)", g.goal_text, NOT_MEASURED))
    return rows


def _row(g: Goal, r, by_id: dict, target: str | None) -> GoalRow | None:
    """Goal ``g`` judged on result ``r``; None when the run did not measure it (a skipped case,
    no LNC=2 launch, no interval, or the base case of a comparison not in the run)."""
    goal_text = g.goal_text

    def row(value, status):
        return GoalRow(g.name, r.case_id, g.figure, value, goal_text, status)

    if r.status == "error":
        return row("—", f"{MISSED}: {r.error}")
    if r.status != "kernel" or (g.measured is not None and not g.measured(r)):
        return None
    if g.base is not None:
        rb = by_id.get(g.base.id)
        if rb is None or rb.status != "kernel":
            return None
        v = g.value(r, rb)
        if v is None:
            return None      # the pair does not give the figure (e.g. a forward + backward not at LNC=1)
        ctx = None if g.context is None else g.context(r, rb)
    else:
        v = g.value(r)
        ctx = None if g.context is None or v is None else g.context(r)
    if v is None or not np.isfinite(v):
        return row("—", f"{MISSED}: no value")
    value = g.fmt(v) + (f" ({ctx})" if ctx is not None else "")
    if g.trn2_only and (target or r.target) != "trn2":
        goal_text += " (stated for trn2)"
        return row(value, REPORTED)
    ok = v >= g.threshold if g.op == ">=" else v <= g.threshold
    return row(value, MET if ok else MISSED)


def verdict(rows: list[GoalRow]) -> tuple[int, int, list[GoalRow]]:
    """-> (goals met, goals judged, the rows with the missed ones first; "reported" and
    "not measured" last)."""
    judged = [r for r in rows if r.status not in (REPORTED, NOT_MEASURED)]
    met = sum(r.status == MET for r in judged)
    order = {MISSED: 0, MET: 1, REPORTED: 2, NOT_MEASURED: 3}
    return met, len(judged), sorted(rows, key=lambda r: order.get(r.status, 0))


def markdown(rows: list[GoalRow]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row.cells()) + " |")
    return "\n".join(lines)
