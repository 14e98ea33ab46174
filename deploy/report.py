"""Measured vs modeled: the table and the plot of a deploy.bench results.json.

Every time in the table says what it is: "measured" (neuron-explorer,
on-device p50 / p90 over the timed executions) or "modeled" (nki_ssm.perf,
central figure and its range, for the same target).
"""
from __future__ import annotations

import math
from pathlib import Path

from deploy.bench.results import load
from nki_ssm.perf.calibration import fmt_ns


def _t(ns) -> str:
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return "—"
    return fmt_ns(ns)


def _e(x) -> str:
    return "—" if x is None else f"{x:.2e}"


HEADERS = ["case", "status", "compile", "NEFF", "rel err out / state (tol)", "pool",
           "measured p50 / p90", "modeled [range]", "measured / modeled", "in range"]


def row_cells(m: dict) -> list[str]:
    status = m["status"] + (f": {m['error']}" if m.get("error") and m["status"] not in ("passed", "compiled")
                            else "")
    meas = (f"{_t(m['measured_ns_p50'])} / {_t(m['measured_ns_p90'])} (measured, {m.get('runs')} runs)"
            if m.get("measured_ns_p50") is not None else
            (f"not timed: {m['timing_error']}" if m.get("timing_error") else "—"))
    model = ("—" if m.get("modeled_ns") is None else
             f"{_t(m['modeled_ns'])} [{_t(m.get('modeled_ns_low'))}–{_t(m.get('modeled_ns_high'))}] "
             f"(modeled, {m['target']})")
    ratio = "—" if m.get("ratio") is None else f"{m['ratio']:.2f}"
    inr = {True: "yes", False: "no", None: "—"}[m.get("within_range")]
    errs = ("—" if m.get("err_out") is None else
            f"{_e(m['err_out'])} / {_e(m.get('err_state'))} ({m.get('tol'):g})")
    pool = {True: "untouched", False: "CHANGED", None: "—"}[m.get("pool_untouched")]
    return [m["case_id"], status[:200], "—" if m.get("compile_s") is None else f"{m['compile_s']:.1f} s",
            "—" if m.get("neff_bytes") is None else f"{m['neff_bytes'] / 1024:.0f} KiB", errs, pool, meas,
            model, ratio, inr]


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for m in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row_cells(m)) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path, title: str) -> str:
    """Log-log: measured p50 (p50..p90 bar) against the modeled central figure (range bar)."""
    from nki_ssm.perf.plots import pyplot   # an ImportError naming the install without matplotlib

    plt = pyplot()

    pts = [m for m in rows if m.get("measured_ns_p50") and m.get("modeled_ns")]
    fig, ax = plt.subplots(figsize=(7.5, 6))
    if pts:
        x = [m["modeled_ns"] / 1e3 for m in pts]
        y = [m["measured_ns_p50"] / 1e3 for m in pts]
        xerr = [[(m["modeled_ns"] - (m.get("modeled_ns_low") or m["modeled_ns"])) / 1e3 for m in pts],
                [((m.get("modeled_ns_high") or m["modeled_ns"]) - m["modeled_ns"]) / 1e3 for m in pts]]
        yerr = [[0.0] * len(pts), [((m.get("measured_ns_p90") or m["measured_ns_p50"])
                                    - m["measured_ns_p50"]) / 1e3 for m in pts]]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", capsize=3)
        for xi, yi, m in zip(x, y, pts):
            ax.annotate(m["case_id"].split("/")[0] + "/" + m["case_id"].split("/")[2], (xi, yi),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")
        lo = min(min(x), min(y)) / 2
        hi = max(max(x), max(y)) * 2
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = modeled")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no case has both a measured and a modeled time", ha="center",
                va="center", transform=ax.transAxes)
    ax.set_xlabel("modeled time (us): central figure, bar = range")
    ax.set_ylabel("measured time (us): p50, bar to p90")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


REPORT_NAME = "report.md"
PLOT_NAME = "measured_vs_modeled.png"


def write(results, out_dir=None) -> dict:
    """report.md + measured_vs_modeled.png next to results.json (or in ``out_dir``)."""
    data = load(results)
    src = Path(results)
    src = src / "results.json" if src.is_dir() else src
    out = Path(out_dir) if out_dir else src.parent
    out.mkdir(parents=True, exist_ok=True)
    rows = data["measured"]
    where = data.get("instance_type") or "this host"
    title = f"deploy.bench: measured on {where} vs modeled for {data.get('target')}"
    png = plot(rows, out / PLOT_NAME, title)
    tc = data.get("toolchain") or {}
    n = {s: sum(m["status"] == s for m in rows) for s in
         ("passed", "compiled", "failed", "compile_error", "run_error", "no_kernel", "error")}
    md = [f"# {title}", "",
          f"Command: `{data.get('command')}`  ",
          f"Mode: {data.get('mode')}; {len(rows)} cases: " + ", ".join(f"{v} {k}" for k, v in n.items() if v)
          + "  ",
          f"Toolchain: SDK {tc.get('sdk_release')} pins; installed {tc.get('pip')}; "
          f"mismatches: {tc.get('mismatches') or 'none'}", "",
          "## Measured vs modeled", "", markdown_table(rows), "",
          "![measured vs modeled](measured_vs_modeled.png)", "",
          "Measured: on-device time of one kernel execution (neuron-explorer summary `total_time`), "
          "p50 / p90 over the timed executions after the warm-up. Modeled: nki_ssm.perf on the "
          "simulator's trace of the same case, central figure with its range (optimistic to "
          "conservative ends of the documented constants). Error: relative Frobenius error against "
          "float64; pool: every slot the batch does not name is bit-identical after the call.", ""]
    warn = [m for m in rows if m.get("warnings")]
    if warn:
        md += ["## Compiler warnings", ""]
        for m in warn:
            md += [f"### {m['case_id']}", "", "```", *m["warnings"][:20], "```", ""]
    bad = [m for m in rows if m["status"] not in ("passed", "compiled", "no_kernel")]
    if bad:
        md += ["## Failures", ""]
        for m in bad:
            md += [f"* `{m['case_id']}`: {m['status']}: {m.get('error')}"]
        md.append("")
    path = out / REPORT_NAME
    path.write_text("\n".join(md))
    return {"report": str(path), "plot": png, "json": str(src)}


def summary_text(results) -> str:
    return markdown_table(load(results)["measured"])
