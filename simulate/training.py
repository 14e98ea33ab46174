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


# ---- the training step at 16K per trn2 chip ----------------------------------------------
STEP_TOKENS = 16384
# the backward kernel of each family, whose design note (module docstring) must say the time is
# linear in the chunks before a smaller backward is scaled to 16K
BACKWARD_KERNEL_MODULES = {"short_conv": "nki_ssm.kernels.short_conv.backward",
                           "mamba2_ssd": "nki_ssm.kernels.mamba2_ssd.chunk_backward",
                           "gated_delta": "nki_ssm.kernels.gated_delta.chunk_backward"}
_LINEAR = r"linear\s+in\s+the\s+chunks"
# a smaller backward is scaled only from whole 128-token chunks (every kernel chunk <= 128 divides them)
STEP_CHUNK = 128

STEP_HEADERS = ["op", "model", "forward at 16K (LNC=1)", "backward at 16K (LNC=1)",
                "forward + backward per NeuronCore", "one trn2 chip (8 cores, LNC=1)",
                "one H100, measured forward + backward", "H100 / chip (> 1: chip faster)"]

STEP_NOTE = (
    "The training step of one layer at 16K tokens (one sequence) from the cases this run measured: the "
    "16K forward's modeled time + the 16K backward's, per NeuronCore at LNC=1, and one trn2 chip = that / 8 "
    "(8 cores, perfect split) against one H100's measured forward + backward. Where the run has the backward "
    "only at a smaller size, it is scaled linearly in the chunks (16,384 / its tokens, whole 128-token "
    "chunks) only if the backward kernel's design note says its time is linear in the chunks, and the row "
    "says \"extrapolated from\" that case; the goals are judged on measured figures only. A figure the run "
    "lacks is named with the command that measures it.")


def design_note_says_linear(family: str) -> bool:
    """Whether the backward kernel's design note (its module docstring) says its time is linear in
    the chunks. Read from the source, nothing imported."""
    import ast
    import importlib.util
    import re

    spec = importlib.util.find_spec(BACKWARD_KERNEL_MODULES[family])
    if spec is None or spec.origin is None:
        return False
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return re.search(_LINEAR, doc) is not None


def _same_layer(r, case) -> bool:
    """A result of ``case``'s op, model and layer configuration (any batch)."""
    a, b = r.case_id.split("/"), case.id.split("/")
    return a[:2] == b[:2] and a[3:] == b[3:]


def step_16k(results: list, linear=design_note_says_linear) -> list[dict]:
    """The training step at 16K of each judged backward (``simulate.cases.backward_judged_cases``)
    whose op family ran in this run: ``{"case", "forward_ns", "backward_ns", "backward_from",
    "extrapolated", "step_ns", "chip_ns", "h100", "h100_over_chip", "missing"}`` (``missing``: what
    the run lacks, with the command that measures it; None when the step was formed).
    ``linear(family)``: whether the backward's design note says it is linear in the chunks."""
    from simulate.cases import backward_judged_cases

    ok = [r for r in results if r.status == "kernel" and r.lnc == 1 and r.modeled_ns]
    rows = []
    for case in backward_judged_cases():
        fwd_case = case.forward()
        # a row where the run has a prefill or backward of the layer (any batch)
        if not any(_same_layer(r, c) for r in results for c in (case, fwd_case)):
            continue
        row = dict(case=case.id, forward=fwd_case.id, forward_ns=None, backward_ns=None, backward_from=None,
                   extrapolated=False, step_ns=None, chip_ns=None, h100=None, h100_over_chip=None,
                   missing=None)
        fwd = next((r for r in ok if r.case_id == fwd_case.id), None)
        bwd = next((r for r in ok if r.case_id == case.id), None)
        missing = []
        if fwd is not None:
            row["forward_ns"] = fwd.modeled_ns
        else:
            missing.append(f"the 16K forward (`python -m simulate --set judged --case "
                           f"{fwd_case.id.rsplit('/', 1)[0]}/`)")
        if bwd is not None:
            row["backward_ns"], row["backward_from"] = bwd.modeled_ns, bwd.case_id
        else:
            smaller = [r for r in ok if _same_layer(r, case) and r.num_seqs == 1
                       and r.num_tokens < STEP_TOKENS and r.num_tokens % STEP_CHUNK == 0]
            src = max(smaller, key=lambda r: r.num_tokens, default=None)
            command = f"`python -m simulate --set judged --case {case.id.rsplit('/', 1)[0]}/`"
            if src is not None and linear(case.family):
                row["backward_ns"] = src.modeled_ns * STEP_TOKENS / src.num_tokens
                row["backward_from"], row["extrapolated"] = src.case_id, True
            elif src is not None:
                missing.append(f"the 16K backward ({command}; {src.case_id} is not scaled: the kernel's "
                               "design note does not say it is linear in the chunks)")
            else:
                missing.append(f"the 16K backward ({command})")
        peer = h100_training_for(case.id)
        if peer is not None:
            row["h100"] = peer
        if missing:
            row["missing"] = "; ".join(missing)
            rows.append(row)
            continue
        row["step_ns"] = row["forward_ns"] + row["backward_ns"]
        row["chip_ns"] = chip_ns(row["step_ns"], 1)
        if peer is not None:
            row["h100_over_chip"] = peer[1] / row["chip_ns"]
        rows.append(row)
    return rows


def step_cells(row: dict) -> list[str]:
    op, model = row["case"].split("/")[:2]
    bwd = _fmt(row["backward_ns"])
    if row["extrapolated"]:
        bwd += f" (extrapolated from {row['backward_from']}, linear in the chunks)"
    if row["missing"] is not None:
        return [op, model, _fmt(row["forward_ns"]), bwd,
                f"not measured: this run lacks {row['missing']}", "—", _h100_cell(row, None), "—"]
    return [op, model, _fmt(row["forward_ns"]), bwd, _fmt(row["step_ns"]), _fmt(row["chip_ns"]),
            _h100_cell(row, row["chip_ns"]),
            "—" if row["h100_over_chip"] is None else f"{row['h100_over_chip']:.2f}x"]


def _h100_cell(row: dict, chip) -> str:
    if row["h100"] is None:
        op, model, layout = row["case"].split("/")[:3]
        return (f"missing: simulate/h100.py has no measured forward + backward for ({op}, {model}, "
                f"{layout}); nothing derived")
    name, ns = row["h100"]
    return f"{fmt_ns(ns)} ({name})"


def step_markdown(results: list) -> str:
    """The 16K training-step table ("" when the run has no case of a family with a backward)."""
    rows = step_16k(results)
    if not rows:
        return ""
    lines = ["| " + " | ".join(STEP_HEADERS) + " |", "|" + "---|" * len(STEP_HEADERS)]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in step_cells(row)) + " |")
    return "\n".join(lines)


def step_lines(results: list) -> list[str]:
    """One plain line per family whose 16K step this run formed (the terminal summary)."""
    out = []
    for row in step_16k(results):
        if row["missing"] is not None:
            continue
        op, model = row["case"].split("/")[:2]
        vs = "" if row["h100_over_chip"] is None else f", {row['h100_over_chip']:.2f}x one H100"
        how = " (backward extrapolated)" if row["extrapolated"] else ""
        out.append(f"Training step 16K, {op} {model}: {_fmt(row['step_ns'])} per NeuronCore, "
                   f"{_fmt(row['chip_ns'])} per trn2 chip{vs}{how}.")
    return out
