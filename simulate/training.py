"""The report's training-step table: our forward + backward against one H100's.

A backward case's row adds the modeled time of its forward (the prefill case of
the same shape, batch and dtypes, ``CaseResult.forward_id``; it must be in the
same run) to the backward's, per NeuronCore at LNC=1 and per logical core at
LNC=2, and per trn2 chip (8 physical cores at LNC=1, 4 logical at LNC=2, the
work split perfectly: ``simulate.h100.chip_ns``), beside one H100's measured
forward + backward (``simulate.h100.H100_TRAINING_NS``) at the same model and
batch. Each gradient's relative Frobenius error against float64 and the
backward's static program size and roofline fraction sit beside them.
"""
from __future__ import annotations

from nki_ssm.perf.calibration import fmt_ns
from simulate.h100 import FLA_HOPPER_NOTE, TRAINING_SOURCE, chip_ns, h100_training_for

HEADERS = ["op", "model", "batch", "forward + backward per NeuronCore, LNC=1 (forward + backward)",
           "tokens/s per NeuronCore", "per logical core, LNC=2", "one trn2 chip: LNC=1 (8 cores) / LNC=2 (4)",
           "one H100, measured forward + backward", "H100 / chip (> 1: chip faster), LNC=1 / LNC=2",
           "gradient errors vs float64 (worst)", "backward program size (LNC=1 / LNC=2)",
           "backward roofline (bound)"]

NOTE = (
    "Forward + backward = the forward case's modeled time + the backward case's (both in this run; "
    "the backward recomputes what the forward does not save, so nothing else runs in a training step "
    "of the layer). Per chip: the launch's time / 8 at LNC=1, / 4 at LNC=2, assuming a perfect split. "
    "Backward FLOPs for the roofline: 2 x the forward's minimum (`simulate/cases.py`). "
    f"H100 figures: {TRAINING_SOURCE}. GDN: {FLA_HOPPER_NOTE}.")


def _fmt(ns) -> str:
    return "—" if ns is None else fmt_ns(ns)


def _lnc2_ns(r):
    x = r if r.lnc == 2 else r.lnc2
    return None if x is None else x.modeled_ns


def _lnc1_ns(r):
    return r.modeled_ns if r.lnc == 1 else None


def _sum(a, b):
    return None if a is None or b is None else a + b


def _errors(r) -> str:
    if not r.err_grads:
        return "—"
    worst = max((n for n in r.err_grads if n != "d_initial_states"), key=lambda n: r.err_grads[n])
    cells = ", ".join(f"{n} {e:.1e}" for n, e in r.err_grads.items())
    return f"{cells} (worst {worst})"


def _program(r) -> str:
    sizes = [x.program_instructions for x in (r, r.lnc2) if x is not None]
    return " / ".join("—" if s is None else f"{s:,}" for s in sizes) or "—"


def cells(r, by_id: dict) -> list[str]:
    """One backward result's row; ``by_id``: every result of the run by case id."""
    op, model, layout = (r.case_id.split("/") + ["", "", ""])[:3]
    fwd = by_id.get(r.forward_id)
    if r.modeled_ns is None:
        status = r.status if r.error is None else f"{r.status}: {r.error}"
        return [op, model, layout, status] + ["—"] * (len(HEADERS) - 4)
    f1 = None if fwd is None else _lnc1_ns(fwd)
    f2 = None if fwd is None else _lnc2_ns(fwd)
    t1, t2 = _sum(f1, _lnc1_ns(r)), _sum(f2, _lnc2_ns(r))
    if fwd is None:
        step1 = f"forward not in this run (add `--op {r.forward_id.split('/')[0]}`); backward {_fmt(_lnc1_ns(r))}"
    else:
        step1 = f"{_fmt(t1)} ({_fmt(f1)} + {_fmt(_lnc1_ns(r))})"
    rate = "—" if not t1 else f"{r.num_tokens / (t1 * 1e-9) / 1e6:.3g} M"
    step2 = "—" if t2 is None else f"{_fmt(t2)} ({_fmt(f2)} + {_fmt(_lnc2_ns(r))})"
    chips = {n: (None if t is None else chip_ns(t, n)) for n, t in ((1, t1), (2, t2))}
    chip = " / ".join(_fmt(chips[n]) for n in (1, 2))
    peer = h100_training_for(r.case_id)
    if peer is None:
        h100, vs = "— (not measured at this shape)", "—"
    else:
        name, ns = peer
        h100 = f"{fmt_ns(ns)}, {r.num_tokens / (ns * 1e-9) / 1e6:.3g} M tok/s ({name})"
        vs = " / ".join("—" if chips[n] is None else f"{ns / chips[n]:.2f}x" for n in (1, 2))
    roof = "—" if r.roofline_fraction is None else f"{100 * r.roofline_fraction:.1f} % ({r.roofline_bound})"
    return [op, model, layout, step1, rate, step2, chip, h100, vs, _errors(r), _program(r), roof]


def markdown(results: list) -> str:
    """The table over the run's backward results ("" when there are none)."""
    backward = [r for r in results if r.entry == "backward"]
    if not backward:
        return ""
    by_id = {r.case_id: r for r in results}
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for r in backward:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells(r, by_id)) + " |")
    return "\n".join(lines)
