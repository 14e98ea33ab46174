"""Write the main job's report folder: report.md, results.json, timeline / roofline PNGs."""
from __future__ import annotations

import json
import math
import platform
import sys
from pathlib import Path

from nki_ssm.perf.calibration import fmt_ns
from simulate.goals import MISSED, unmeasured, verdict
from simulate.goals import evaluate as evaluate_goals
from simulate.goals import markdown as goals_markdown
from simulate.h100 import NEURONCORES_PER_CHIP, chip_ns, h100_for
from simulate.h100 import SOURCE as H100_SOURCE
from simulate import training
from simulate.run import COUNT_CHUNK, ENGINES, NO_KERNEL, CaseResult


def _si(x: float | None, unit: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


fmt_time = fmt_ns   # one formatter for the report and the calibration table


def _err(x: float | None) -> str:
    return "—" if x is None else f"{x:.2e}"


def throughput(r: CaseResult) -> str:
    """tokens/s for prefill, bytes/s (of the minimal HBM traffic) for decode."""
    if r.modeled_ns is None:
        return "—"
    if r.entry == "decode":
        return _si(r.bytes_per_s, "B/s")
    return _si(r.tokens_per_s, "tok/s")


def row_cells(r: CaseResult) -> list[str]:
    status = f"{r.status}: {r.error}" if r.status in ("error", "skipped") else r.status
    roof = "—" if r.roofline_fraction is None else f"{100 * r.roofline_fraction:.1f}% ({r.roofline_bound})"
    share = ", ".join(f"{e[:3]} {100 * v:.0f}%" for e, v in r.share.items() if v >= 0.005) or "—"
    time_cell = "—" if r.modeled_ns is None else f"{fmt_time(r.modeled_ns)} (modeled, {r.target})"
    if r.modeled_ns_p10 is not None and r.modeled_ns_p90 is not None and r.modeled_ns:
        time_cell += f" [{interval(r)}]"
    if r.lnc != 1:
        time_cell += lnc_label(r)
    return [r.case_id, status, _err(r.err_out), _err(r.err_state), time_cell, throughput(r),
            hbm_cell(r), roof, r.binding_engine or "—", share, instructions_cell(r), lnc2_cell(r)]


def lnc2_cell(r: CaseResult) -> str:
    """The LNC=2 launch beside an LNC=1 result: time (programs), ratio, its errors and program size."""
    x = r.lnc2
    if x is None:
        return "—"
    if x.modeled_ns is None:
        return lnc2_time(r)
    size = "—" if x.program_instructions is None else f"{x.program_instructions:,}"
    return (f"{lnc2_time(r)}; {lnc2_ratio(r)}; err {_err(x.err_out)} / {_err(x.err_state)}; "
            f"program {size}")


def interval(r: CaseResult) -> str:
    """The 10-90 % interval of the modeled time (constants drawn within their ranges)."""
    return f"{fmt_time(r.modeled_ns_p10)}–{fmt_time(r.modeled_ns_p90)}"


SUMMARY_HEADERS = ["op", "model", "batch", "time per NeuronCore, modeled (10-90 %)", "throughput per NeuronCore",
                   "roofline", "binding engine", "error vs float64 (out / state)",
                   f"one trn2 chip ({NEURONCORES_PER_CHIP} NeuronCores)",
                   "LNC=2: time per logical core (programs)", "LNC=2 / LNC=1",
                   f"one trn2 chip at LNC=2 ({NEURONCORES_PER_CHIP // 2} logical cores)",
                   "one H100, measured", "chip / H100"]


def lnc_label(r: CaseResult) -> str:
    """" (LNC=2)" for a result whose main figures are of a two-program launch, else ""."""
    return "" if r.lnc == 1 else f" (LNC={r.lnc})"


def lnc2_time(r: CaseResult) -> str:
    """The LNC=2 launch's time and each program's end (the result's own when it ran at LNC=2)."""
    x = r if r.lnc == 2 else r.lnc2
    if x is None:
        return "— (--lnc both)"
    if x.modeled_ns is None:
        return x.status if x.error is None else f"{x.status}: {x.error}"
    programs = " / ".join(fmt_time(t) for t in x.program_ns)
    return f"{fmt_time(x.modeled_ns)} ({programs})"


def lnc2_ratio(r: CaseResult) -> str:
    """LNC=2 time / LNC=1 time (< 1: the two programs gain)."""
    if r.lnc != 1 or r.lnc2 is None or not r.lnc2.modeled_ns or not r.modeled_ns:
        return "—"
    return f"{r.lnc2.modeled_ns / r.modeled_ns:.2f}x"


def _chip_cell(r: CaseResult, ns: float, lnc: int) -> str:
    chip = chip_ns(ns, lnc)
    if r.entry == "decode":
        # the minimal HBM traffic over the chip's time
        rate = r.bytes_per_s * r.modeled_ns / chip if r.bytes_per_s and r.modeled_ns else None
        return f"{fmt_time(chip)}, {_si(rate, 'B/s')}" if rate else fmt_time(chip)
    return f"{fmt_time(chip)}, {_si(r.num_tokens / (chip * 1e-9), 'tok/s')}"


def summary_cells(r: CaseResult) -> list[str]:
    """One op at one model shape, as a user asks about it: time with its interval, throughput,
    roofline, binding engine, error, and one trn2 chip against one H100 (time ratio: > 1 = the chip
    is faster)."""
    op, model, layout = (r.case_id.split("/") + ["", "", ""])[:3]
    if r.modeled_ns is None:
        status = r.status if r.error is None else f"{r.status}: {r.error}"
        return [op, model, layout, status] + ["—"] * (len(SUMMARY_HEADERS) - 4)
    roof = "—" if r.roofline_fraction is None else f"{100 * r.roofline_fraction:.1f} % ({r.roofline_bound})"
    # chip figures at each LNC that ran: (lnc, time of one launch)
    at = {r.lnc: r.modeled_ns}
    if r.lnc2 is not None and r.lnc2.modeled_ns:
        at[2] = r.lnc2.modeled_ns
    chip1 = _chip_cell(r, at[1], 1) if 1 in at else "—"
    chip2 = _chip_cell(r, at[2], 2) if 2 in at else "—"
    peer = h100_for(r.case_id)
    if r.entry == "backward":
        h100_cell, vs = "— (forward + backward: the training-step table)", "—"
    elif peer is None:
        h100_cell, vs = "— (not measured at this shape)", "—"
    else:
        name, ns = peer
        rate = "" if r.entry == "decode" else f", {_si(r.num_tokens / (ns * 1e-9), 'tok/s')}"
        h100_cell = f"{fmt_time(ns)}{rate} ({name})"
        vs = " / ".join(f"LNC={n}: {ns / chip_ns(t, n):.2f}x" for n, t in sorted(at.items()))
    return [op, model, layout, f"{fmt_time(r.modeled_ns)} ({interval(r)}){lnc_label(r)}", throughput(r), roof,
            r.binding_engine or "—", f"{_err(r.err_out)} / {_err(r.err_state)}", chip1, lnc2_time(r),
            lnc2_ratio(r), chip2, h100_cell, vs]


def md_table(headers: list[str], rows) -> str:
    """A Markdown table of ``rows`` (lists of cells; a "|" in a cell becomes "/")."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in rows]
    return "\n".join(lines)


def summary_markdown(results: list[CaseResult]) -> str:
    return md_table(SUMMARY_HEADERS, map(summary_cells, results))


SUMMARY_NOTE = (
    "Times are **modeled** by `nki_ssm.perf` for one NeuronCore (no Trainium was used): the central figure "
    "(every constant at its central value; goals are judged on it) and the 10-90 % interval of the same trace "
    "modeled with each uncertain constant drawn independently within its documented range "
    "(`nki_ssm/perf/README.md`). Throughput: tokens/s for prefill, bytes/s of the minimal HBM traffic "
    "for decode. One trn2 chip = 8 physical NeuronCores (4 logical cores of 2 at LNC=2: the same "
    "silicon); its figure is the per-core time / 8 at LNC=1, the per-logical-core time / 4 at LNC=2, "
    "**assuming the cores split the work perfectly**. LNC=2: the kernel launched as two programs on the "
    "two physical cores of a logical core (`--lnc`), timed as both running at once and sharing their HBM "
    "bank (central figure only); \"LNC=2 / LNC=1\" < 1 is what the second core gains. "
    f"\"chip / H100\" = the H100's time / the chip's (> 1: the chip is faster). H100 figures: {H100_SOURCE}.")


def instructions_cell(r: CaseResult) -> str:
    """Executed instructions / static program instructions (runtime loop bodies counted once)."""
    if r.instructions is None:
        return "—"
    prog = "—" if r.program_instructions is None else f"{r.program_instructions:,}"
    cell = f"{r.instructions:,} / {prog}"
    if r.loop_iterations:
        cell += f"; {r.loop_iterations:,} loop iterations ({fmt_time(r.loop_overhead_ns)} sync charged)"
    return cell


def hbm_cell(r: CaseResult) -> str:
    """Achieved HBM bandwidth (minimal bytes / modeled time) and its share of the core's DMA bandwidth."""
    if r.hbm_fraction is None:
        return "—"
    return f"{_si(r.bytes_per_s, 'B/s')} ({100 * r.hbm_fraction:.1f}%)"


HEADERS = ["case", "status", "rel err out", "rel err state", "time [10-90 %]", "throughput",
           "HBM B/s (% of DMA bw)", "roofline", "binding", "busy share", "instructions executed / program",
           "LNC=2: time (programs); / LNC=1; errors; program"]


def markdown_table(results: list[CaseResult]) -> str:
    return md_table(HEADERS, map(row_cells, results))


OP_SHORT = {"short_conv_prefill": "conv prefill", "short_conv_decode": "conv decode",
            "ssd_prefill": "SSD prefill", "ssd_decode": "SSD decode",
            "gated_delta_prefill": "GDN prefill", "gated_delta_decode": "GDN decode",
            "short_conv_backward": "conv backward", "ssd_backward": "SSD backward",
            "gated_delta_backward": "GDN backward"}
COMPACT_HEADERS = ["op", "model", "batch", "time per NeuronCore (10-90 %)", "throughput", "roofline",
                   "error vs float64", "LNC=2 / LNC=1", "trn2 chip / H100 (LNC=1 / 2)"]


def _vs_h100(r: CaseResult) -> str:
    """The H100's time over one trn2 chip's (> 1: the chip is faster), at LNC=1 and LNC=2."""
    peer = h100_for(r.case_id)
    if peer is None or r.entry == "backward" or not r.modeled_ns:
        return "—"
    at = [(1, r.modeled_ns)] + ([(2, r.lnc2.modeled_ns)] if r.lnc2 is not None and r.lnc2.modeled_ns else [])
    return " / ".join(f"{peer[1] / chip_ns(t, n):.2f}x" for n, t in at)


CHUNK_HEADERS = ["case", f"{COUNT_CHUNK}-token chunks"] + list(ENGINES) + ["all engines", "at LNC=2 (both programs)"]

CHUNK_NOTE = (
    f"Executed instructions per {COUNT_CHUNK}-token chunk on each engine, LNC=1: every instruction the "
    f"launch ran on the engine (its fixed set-up and tail included) / the case's {COUNT_CHUNK}-token chunks "
    f"(each sequence's tokens / {COUNT_CHUNK}, a partial chunk counted as one), whatever chunk the "
    "kernel itself uses. \"dma\" counts DMA instructions (each may move many descriptors). The last "
    "column is the same sum at LNC=2 over both programs. Counts per case: results.json "
    "`engine_instructions`, `instructions_per_chunk`.")


def _per_chunk(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def chunk_cells(r: CaseResult) -> list[str]:
    """One prefill / backward case's executed instructions per 128-token chunk on each engine."""
    per = r.instructions_per_chunk
    cells = [r.case_id, f"{r.chunks:,}"] + [_per_chunk(per.get(e, 0.0)) for e in ENGINES]
    cells.append(_per_chunk(sum(per.values())))
    x = r.lnc2
    if x is not None and x.instructions_per_chunk:
        cells.append(_per_chunk(sum(x.instructions_per_chunk.values())))
    else:
        cells.append("—")
    return cells


def chunk_markdown(results: list[CaseResult]) -> str:
    """The per-chunk counts of every prefill / backward case that ran its kernel ("" when none)."""
    rows = [chunk_cells(r) for r in results if r.chunks and r.instructions_per_chunk]
    return md_table(CHUNK_HEADERS, rows) if rows else ""


def compact_cells(r: CaseResult) -> list[str]:
    """One op at one model shape, what a user asks first (the report's first table)."""
    op, model, layout = (r.case_id.split("/") + ["", "", ""])[:3]
    op = OP_SHORT.get(op, op)
    if r.modeled_ns is None:
        status = r.status if r.error is None else f"{r.status}: {r.error.splitlines()[0][:80]}"
        return [op, model, layout, status] + ["—"] * (len(COMPACT_HEADERS) - 4)
    roof = "—" if r.roofline_fraction is None else f"{100 * r.roofline_fraction:.1f} % ({r.roofline_bound})"
    return [op, model, layout, f"{fmt_time(r.modeled_ns)} ({interval(r)}){lnc_label(r)}", throughput(r),
            roof, f"{_err(r.err_out)} / {_err(r.err_state)}", lnc2_ratio(r), _vs_h100(r)]


def compact_markdown(results: list[CaseResult]) -> str:
    return md_table(COMPACT_HEADERS, map(compact_cells, results))


COMPACT_NOTE = (
    "Times are **modeled** by the cost model (`nki_ssm.perf`) for one NeuronCore; no Trainium was used. "
    "The central figure comes first (goals are judged on it), then the 10-90 % interval over the cost "
    "constants' documented ranges. Throughput: tokens/s for prefill and backward, bytes/s of the minimal "
    "HBM traffic for decode. Error: relative Frobenius norm against float64, output / state (backward: "
    "worst gradient / initial-state gradient). LNC=2 / LNC=1 < 1 is what the second physical core of a "
    "logical core gains. trn2 chip / H100: one H100's measured time for the best GPU kernel at the same "
    "shape over one trn2 chip's (8 NeuronCores at LNC=1, 4 logical cores at LNC=2, assuming the cores "
    "split the work perfectly); > 1: the chip is faster. The per-op details below give each figure.")


# what the default set leaves to the judged set (time and memory measured on 2 idle cores)
JUDGED_SET_NOTE = ("The speed goals stated at 16K tokens, 8 x 2K batches and 64 / 512 sequences are judged by "
                   "python -m simulate --set judged (roughly 40 minutes on 2 idle cores, more than 12 GB "
                   "of memory).")

# the terminal summary: what fits in 100 columns
TERMINAL_COLUMNS = 100
_TERM = (("op", 13), ("model", 14), ("batch", 7), ("modeled", 9), ("throughput", 12), ("roofline", 8),
         ("error", 8), ("LNC2/1", 6), ("vs H100", 7))


def _terminal_row(cells) -> str:
    return "  ".join(f"{str(c)[:w]:<{w}}" for c, (_, w) in zip(cells, _TERM)).rstrip()


def _wrap(text: str, indent: str = "  ") -> list[str]:
    import textwrap

    return textwrap.wrap(text, TERMINAL_COLUMNS, initial_indent=indent, subsequent_indent=indent + "  ")


def verdict_lines(results: list[CaseResult], target: str, case_set: str) -> list[str]:
    """The verdict in plain lines of at most 100 columns: goals met, then each missed goal."""
    met, judged, rows = verdict(evaluate_goals(results, target=target))
    if not judged:
        lines = [f"No goal is judged on this run's cases (times modeled for {target})."]
    else:
        lines = [f"{met} of {judged} goals met (times modeled for {target}, per NeuronCore)."]
    missed = [g for g in rows if g.status.startswith(MISSED)]
    if missed:
        lines.append("Missed:")
        for g in missed:
            op, model, layout = (g.case_id.split("/") + ["", "", ""])[:3]
            lines += _wrap(f"{g.name} at {model} {layout}: {g.value} (goal {g.goal})")
    for line in training.step_lines(results):
        lines += _wrap(line, indent="")
    not_measured = unmeasured(results, target=target)
    if not_measured:
        lines += _wrap(f"{len(not_measured)} goals not measured by this run (report.md lists each with "
                       "the command that measures it).", indent="")
    if case_set == "default":
        lines += _wrap(JUDGED_SET_NOTE, indent="")
    return lines


def terminal_summary(results: list[CaseResult], *, target: str, case_set: str, calibration_rows=None) -> str:
    """The verdict, one line per case and the calibration in one line: at most 100 columns."""
    lines = verdict_lines(results, target, case_set) + [""]
    lines.append(_terminal_row(name for name, _ in _TERM))
    for r in results:
        op, model, layout = (r.case_id.split("/") + ["", "", ""])[:3]
        if r.modeled_ns is None:
            lines.append(_terminal_row([OP_SHORT.get(op, op), model, layout, r.status]))
            continue
        roof = "—" if r.roofline_fraction is None else f"{100 * r.roofline_fraction:.1f} %"
        h100 = _vs_h100(r).split(" / ")[0]
        lines.append(_terminal_row([OP_SHORT.get(op, op), model, layout, fmt_time(r.modeled_ns),
                                    throughput(r), roof, _err(r.err_out).replace("e-0", "e-"),
                                    lnc2_ratio(r), h100]))
    if calibration_rows is not None:
        lines += [""] + _wrap(calibration_line(calibration_rows), indent="")
    return "\n".join(line[:TERMINAL_COLUMNS] for line in lines)


def calibration_line(rows) -> str:
    """The calibration table in one sentence."""
    checks = [r for r in rows if r.kind == "check" and r.ratio is not None]
    inside = sum(bool(r.within_band) for r in checks)
    worst = max(checks, key=lambda r: abs(math.log(r.ratio)), default=None)
    text = (f"Calibration: {inside} of {len(checks)} check rows within their band of the published "
            f"timings")
    if worst is not None:
        text += f" (furthest: {worst.name}, modeled / published {worst.ratio:.2f})"
    failed = [r.name for r in rows if r.ratio is None]
    if failed:
        text += f"; without a figure: {', '.join(failed)}"
    return text + "."


_NOTES = """\
## Notes

* Every time is **modeled** by `nki_ssm.perf` for the named target, per NeuronCore
  (LNC=1) unless marked LNC=2 (per logical core: both physical cores, each
  running its program with its own engines and DMA queues, the two sharing
  their HBM bank's bandwidth); no Trainium was used. The model list-schedules the simulator's
  instruction trace over in-order TensorE / VectorE / ScalarE / GpSimd queues and
  the 16 DMA engines, with read-after-write, write-after-read and write-after-write
  dependencies through the memory regions each instruction touches. Every cost
  constant and its published source: `nki_ssm/perf/hardware.py`.
* On-chip capacity is modelled: a new SBUF tile or PSUM bank waits until the
  tile it reuses is dead and its last access has finished (buffer rotation).
* Dynamic DMAs (hwdge, swdge, vector-offset gathers) spend ~600 ns generating
  descriptors (2 hardware DGE blocks per trn2/trn3 core, or GpSimd time for
  software DGE) before their data moves.
* Every instruction pays a fixed cost on top of its streaming cycles (on trn2
  read off the published NxD Inference DeltaNet kernel's per-chunk time: the
  calibration's fit row deltanet_fused_slope); a consumer on another engine
  waits for the producer's result to be written (its pipeline latency; TensorE's
  array drain) and then a semaphore latency (DMA completions their own); VectorE
  bf16 perf modes apply to the instructions the Trainium2 architecture guide
  names (tensor_copy, tensor_scalar, tensor_tensor); ScalarE loads an
  activation table when the function changes; DMA efficiency is keyed on each
  descriptor's contiguous run, at a sustained rate below the peak; fp32 matmul
  weights load unhidden; each runtime-loop iteration pays a cross-engine
  boundary (barrier + branch). Kernel launch (~16 us) is its own line, not in
  the time. Sources and ranges: `nki_ssm/perf/hardware.py`, `nki_ssm/perf/README.md`.
* GpSimd elementwise throughput is taken from the one documented figure
  (rsqrt 4x slower than ScalarE on v2/v3); VectorE fp32 is 1 element per
  partition per cycle per input on trn2 (the documented range is 1-2): the two
  largest uncertainties for VectorE/GpSimd-bound kernels.
* "time [10-90 %]": the central figure (goals are judged on it) and the 10th-90th
  percentile of the same trace modeled with each uncertain constant drawn
  independently within its documented (or estimated) range, 12 seeded stratified draws
  (`nki_ssm.perf.hardware.sampled`, `nki_ssm.perf.model_range`); results.json also
  keeps the extremes (every constant at its fast / slow end at once).
* "instructions executed / program": dynamic instructions run in this call and
  the static program the compiler emits (runtime loop bodies counted once).
* Not modelled: compiler reordering beyond in-order engine queues.
* Error = relative Frobenius norm against the float64 reference (chunked form for
  prefill), for the output and for the updated state-pool slots; "max" is
  max |err| / max |ref|. Backward cases: "out" is the worst gradient (every one is in
  results.json `err_grads` and the training-step table), "state" d_initial_states;
  the float64 reference gradients run in pieces (`simulate/backward_reference.py`).
* Roofline = max(min FLOPs / TensorE bf16 peak, min HBM bytes / core DMA
  bandwidth); the fraction is roofline time / modeled time. FLOP and byte models:
  `simulate/cases.py` docstring. Decode throughput and the "HBM B/s" column are
  the minimal HBM traffic divided by the modeled time (the % is of the core's
  DMA bandwidth: for a memory-bound case it equals the roofline fraction).
* Case ids carry the layer configuration: dtype of x, conv weight dtype, conv
  bias or not, state-pool dtype (conv: model dtype and bias as in the model;
  SSD / GDN: float32 state). The SSD prefill reference runs the float64 chunked
  form with chunk 64 (exact for any chunk size, faster in NumPy than 128).
* Binding engine: the engine owning the largest part of the critical path
  (`nki_ssm/perf/timing.py`).
* One H100 (the first table) is the yardstick: the best GPU kernel for the layer,
  measured at the same shapes (`simulate/h100.py` holds the figures and their source).
"""


def write_report(out_dir, results: list[CaseResult], *, target: str, case_set: str, command: str,
                 wall_s: float, calibration_rows=None, timeline_timing=None, timeline_case=None,
                 plots: bool = True) -> dict:
    """Write report.md, results.json and (``plots``: matplotlib installed) the PNGs into
    ``out_dir``; returns {name: path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    if plots:
        paths.update(_plots(out, results, target, timeline_timing, timeline_case))

    cal_md = None
    if calibration_rows is not None:
        from nki_ssm.perf.calibration import table_markdown

        cal_md = table_markdown(calibration_rows)
    n_kernel = sum(r.status == "kernel" for r in results)
    goal_rows = evaluate_goals(results, target=target)
    met, judged, ordered = verdict(goal_rows)
    title = (f"{met} of {judged} goals met" if judged else "no goal judged on these cases")
    md = [f"# nki_ssm main job: {title} (times modeled for {target})", ""]
    missed = [g for g in ordered if g.status.startswith(MISSED)]
    if missed:
        md += ["**Missed** (the figure, then the goal):", ""]
        md += [f"* {g.name}, `{g.case_id}`: {g.value}; goal {g.goal}" for g in missed]
        md.append("")
    elif judged:
        md += ["Every goal this run measured is met.", ""]
    if case_set == "default":
        md += [JUDGED_SET_NOTE, ""]
    md += [f"Command: `{command}`; {case_set} set, {len(results)} cases ({n_kernel} kernels, "
           f"{sum(r.status == 'error' for r in results)} errors, "
           f"{sum(r.status == 'skipped' for r in results)} skipped, "
           f"{sum(r.status == NO_KERNEL for r in results)} reference only); {wall_s / 60:.1f} min wall "
           f"on {platform.node() or 'this machine'} ({platform.machine()}, Python {platform.python_version()}"
           f"{_load()}).", ""]
    md += ["## Per op and model shape", "", COMPACT_NOTE, "", compact_markdown(results), ""]
    not_measured = unmeasured(results, target=target)
    if goal_rows or not_measured:
        md += ["## Goals", "",
               f"Every goal, missed ones first: {met} of {judged} measured by this run met, "
               f"{len(not_measured)} not measured (each with the command that measures it). Speed goals "
               "are stated for trn2, per NeuronCore (LNC=1), on the central figure, at the case named; "
               "accuracy, program-size and interval goals at every batch of the model shape "
               "(`simulate/goals.py`).", "",
               goals_markdown(ordered + not_measured), ""]
    train_md, step_md = training.markdown(results), training.step_markdown(results)
    if train_md or step_md:
        md += ["## Training step: forward + backward per NeuronCore and per trn2 chip against one H100", ""]
    if step_md:
        md += ["### At 16K tokens", "", training.STEP_NOTE, "", step_md, ""]
    if train_md:
        md += ["### Every backward case of this run", "", training.NOTE, "", train_md, ""]
    md += ["## Per op: one trn2 chip against one H100, LNC=2", "",
           SUMMARY_NOTE, "", summary_markdown(results), ""]
    chunk_md = chunk_markdown(results)
    if chunk_md:
        md += [f"## Per op: instructions per {COUNT_CHUNK}-token chunk on each engine", "",
               CHUNK_NOTE, "", chunk_md, ""]
    md += ["## Results",
           "",
           markdown_table(results),
           ""]
    if "timeline" in paths:
        md += [f"## Engine timeline: {timeline_case}", "",
               "![timeline](timeline.png)", "", "![timeline zoom](timeline_zoom.png)", ""]
    kernels = [r for r in results if r.status == "kernel"]
    if kernels:
        md += ["## Where the time goes (busy time of the top engine:op pairs, modeled)", "",
               "| case | top instructions (count, busy time) |", "|---|---|"]
        for r in kernels:
            tops = "; ".join(f"{name} x{cnt}: {fmt_time(ns)}" for name, cnt, ns in r.top_ops)
            md.append(f"| {r.case_id} | {tops} |")
        md.append("")
    if "engines" in paths:
        md += ["## Engine busy share per case", "", "![engines](engines.png)", ""]
    if "roofline" in paths:
        md += ["## Roofline", "", "![roofline](roofline.png)", ""]
    if cal_md is not None:
        md += ["## Calibration (modeled / published)", "", cal_md, ""]
    errors = [r for r in results if r.status == "error"]
    if errors:
        md += ["## Kernel errors", ""]
        for r in errors:
            md += [f"### {r.case_id}", "", "```", (r.traceback or r.error or "").strip(), "```", ""]
    md.append(_NOTES)
    (out / "report.md").write_text("\n".join(md))
    paths["report"] = str(out / "report.md")
    from dataclasses import asdict

    from nki_ssm.perf.hardware import CALIBRATED, SOURCES, get_target

    spec = get_target(target)
    payload = {
        "target": target, "case_set": case_set, "command": command, "wall_s": wall_s,
        "hardware": {k: v for k, v in asdict(spec).items() if k != "extra"},
        "hardware_sources": SOURCES[spec.name], "calibrated_constants": CALIBRATED,
        "time_unit": "ns (modeled)", "cases": [r.to_dict() for r in results],
        "training_step_16k": training.step_16k(results),
        "calibration": [c.to_dict() for c in calibration_rows] if calibration_rows is not None else None,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=json_default))
    paths["json"] = str(out / "results.json")
    return paths


def _load() -> str:
    """The machine's load at the end of the run (a shared machine stretches the wall time)."""
    import os

    try:
        return f", {os.cpu_count()} cores, load average {os.getloadavg()[1]:.1f} over 5 min"
    except (AttributeError, OSError):
        return ""


def _plots(out: Path, results, target: str, timeline_timing, timeline_case) -> dict:
    """The roofline, timeline and engine-share PNGs -> {name: path} (needs matplotlib)."""
    from nki_ssm.perf.plots import roofline_png, timeline_png

    paths = {}
    points = [dict(label=r.case_id, flops=r.min_flops, hbm_bytes=r.min_hbm_bytes,
                   time_ns=r.modeled_ns, roofline_fraction=r.roofline_fraction)
              for r in results if r.modeled_ns]
    paths["roofline"] = roofline_png(points, out / "roofline.png", target=target,
                                     title=f"Roofline of all kernel cases, modeled {target} (one NeuronCore)"
                                     + ("" if points else " — no kernel case ran"))
    if timeline_timing is not None:
        paths["timeline"] = timeline_png(timeline_timing, out / "timeline.png",
                                         title=f"{timeline_case}: engine timeline, modeled {target}, "
                                               f"{timeline_timing.time_us:.1f} us, binding "
                                               f"{timeline_timing.binding_engine}")
        # zoom on the start so individual instructions are visible
        span = _zoom_window(timeline_timing)
        paths["timeline_zoom"] = timeline_png(timeline_timing, out / "timeline_zoom.png", window_ns=span,
                                              title=f"{timeline_case}: first {span[1] / 1e3:.1f} us "
                                                    f"(zoom), modeled {target}")
    kernels = [r for r in results if r.status == "kernel"]
    if kernels:
        paths["engines"] = _engine_share_png(kernels, out / "engines.png", target)
    return paths


def _engine_share_png(kernels: list, path, target: str) -> str:
    """Grouped bars: busy share of each engine per kernel case (binding engine marked)."""
    import numpy as np

    from nki_ssm.perf.plots import pyplot

    plt = pyplot()

    engines = ["tensor", "vector", "scalar", "gpsimd", "dma"]
    n = len(kernels)
    if n > 10:
        return _engine_share_heatmap(kernels, engines, path, target, plt, np)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * n + 3), 5))
    width = 0.8 / len(engines)
    x = np.arange(n)
    colors = plt.get_cmap("tab10").colors
    for k, e in enumerate(engines):
        vals = [100 * r.share.get(e, 0.0) for r in kernels]
        bars = ax.bar(x + (k - 2) * width, vals, width, label=e, color=colors[k])
        for j, r in enumerate(kernels):
            if r.binding_engine == e:
                bars[j].set_edgecolor("black")
                bars[j].set_linewidth(1.5)
    ax.set_xticks(x)
    ax.set_xticklabels([_wrap_case_id(r.case_id) for r in kernels], fontsize=7)
    ax.set_ylabel("busy share of modeled time (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"Engine busy share per kernel case, modeled {target} (black edge: binding engine)",
                 fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in range(len(engines))]
    ax.legend(handles, engines, fontsize=8, ncol=5, loc="upper center")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _wrap_case_id(case_id: str, width: int = 18) -> str:
    """One line per id part (op, model, layout), the config wrapped at commas to ``width``."""
    *head, config = case_id.split("/")
    lines, cur = [], ""
    for item in config.split(","):
        if cur and len(cur) + 1 + len(item) > width:
            lines.append(cur + ",")
            cur = item
        else:
            cur = f"{cur},{item}" if cur else item
    return "\n".join(head + lines + [cur])


def _engine_share_heatmap(kernels, engines, path, target, plt, np) -> str:
    """Many cases: one row per case, one column per engine, busy share in %; binding boxed."""
    vals = np.array([[100 * r.share.get(e, 0.0) for e in engines] for r in kernels])
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(kernels) + 1.8))
    im = ax.imshow(vals, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    for i, r in enumerate(kernels):
        for j, e in enumerate(engines):
            ax.text(j, i, f"{vals[i, j]:.0f}", ha="center", va="center", fontsize=7,
                    color="white" if vals[i, j] < 60 else "black")
            if r.binding_engine == e:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=1.8))
    ax.set_xticks(range(len(engines)))
    ax.set_xticklabels(engines)
    ax.set_yticks(range(len(kernels)))
    ax.set_yticklabels([r.case_id for r in kernels], fontsize=7)
    ax.set_title(f"Engine busy share (%) per kernel case, modeled {target} (red box: binding engine)",
                 fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.03)
    # long case ids: grow the canvas to every label (tight_layout alone clipped them)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return str(path)


def _zoom_window(timing) -> tuple[float, float]:
    s = timing.schedule
    n = len(s.unit)
    k = min(n - 1, 400)
    end = float(s.end[: k + 1].max()) if n else 1.0
    return (0.0, max(end, 1.0))


def json_default(o):
    """json.dumps ``default=``: NumPy scalars and arrays as Python values, anything else as str."""
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    return str(o)
