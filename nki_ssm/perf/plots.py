"""Pictures of a modeled run (matplotlib, imported lazily by callers).

``timeline_png``: an engine Gantt chart like a hardware profiler's view, one
row per compute engine and per DMA queue, bars coloured by instruction; the
top row shows which instruction holds the critical path at each moment (each
step drawn from its predecessor's end to its own end).
``roofline_png``: every case on a roofline chart (arithmetic intensity vs
achieved FLOP/s, with the target's compute and DMA roofs).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from nki_ssm.perf.hardware import get_target
from nki_ssm.perf.timing import COMPUTE_ENGINES, Timing


def pyplot():
    """matplotlib.pyplot on the Agg backend, or an ImportError that says how to install it."""
    try:
        import matplotlib
    except ImportError as exc:   # the report extra is optional
        raise ImportError("plots need matplotlib: pip install 'matplotlib>=3.7' "
                          "(from a clone: pip install -e '.[report]')", name="matplotlib") from exc

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def timeline_png(timing_or_trace, path, *, title: str | None = None, window_ns=None,
                 target: str | None = None) -> str:
    """Save the engine timeline of a Timing (or a trace, modeled here) to ``path``.

    ``window_ns=(t0, t1)`` zooms to a time range. Returns ``path``.
    """
    if isinstance(timing_or_trace, Timing):
        timing = timing_or_trace
    else:
        from nki_ssm.perf.model import model

        timing = model(timing_or_trace, target=target)
    s = timing.schedule
    if s is None:
        raise ValueError("timing_or_trace: Timing has no schedule (modeled with keep_schedule=False)")
    plt = pyplot()
    ndma = len(timing.dma_queue_busy_ns) or 16
    rows = ["critical path"] + list(COMPUTE_ENGINES) + [f"DMA q{q}" for q in range(ndma)]
    row_of = {e: i for i, e in enumerate(rows)}
    bars = defaultdict(list)  # (row, op) -> [(x, width)]
    scale = 1e-3  # ns -> us
    for i, unit in enumerate(s.unit):
        if s.program_id[i] != 0:
            continue  # one core's view
        op = s.op[i]
        if unit == "dma":
            if s.issue_unit is not None and s.issue_unit[i] == "swdge":
                bars[(row_of["gpsimd"], "swdge descriptors")].append(
                    (s.issue_start[i] * scale, (s.issue_end[i] - s.issue_start[i]) * scale))
            x0, x1 = s.dma_data_start[i], s.end[i]
            mask = int(s.dma_mask[i])
            for q in range(ndma):
                if mask >> q & 1:
                    bars[(row_of[f"DMA q{q}"], op)].append((x0 * scale, (x1 - x0) * scale))
        else:
            bars[(row_of[unit], op)].append((s.start[i] * scale, (s.end[i] - s.start[i]) * scale))
    # top row: which engine the critical path is on at each moment
    crit = defaultdict(list)
    chain = s.critical_path()
    for k, i in enumerate(chain):
        t0 = s.end[chain[k - 1]] if k > 0 else 0.0
        crit[s.op[i]].append((t0 * scale, (s.end[i] - t0) * scale))
    ops = sorted({op for _, op in bars})
    # distinct hues first (tab10), then more (Dark2, Set1); tab20's light/dark pairs confuse ops
    palette = (list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("Dark2").colors)
               + list(plt.get_cmap("Set1").colors))
    color = {op: palette[k % len(palette)] for k, op in enumerate(ops)}
    fig, ax = plt.subplots(figsize=(14, 0.32 * len(rows) + 2.2))
    per_row = defaultdict(int)
    for (row, _), segs in bars.items():
        per_row[row] += len(segs)
    for (row, op), segs in bars.items():
        # thin white separators help on sparse rows but wash out dense ones
        edge = ("white", 0.4) if per_row[row] < 200 else ("none", 0.0)
        ax.broken_barh(segs, (row - 0.4, 0.8), facecolors=color[op], edgecolor=edge[0], linewidth=edge[1])
    for op, segs in crit.items():
        ax.broken_barh(segs, (-0.4, 0.8), facecolors=color.get(op, "black"), edgecolor="none")
    ax.axhline(0.5, color="black", lw=0.6)
    ax.set_yticks(range(len(rows)))
    labels = []
    for r in rows:
        if r == "critical path":
            labels.append("critical path")
            continue
        if r in timing.busy_ns:
            labels.append(f"{r} ({100 * timing.share.get(r, 0.0):.0f}%)")
        else:
            labels.append(r)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (us, modeled)")
    if window_ns is not None:
        ax.set_xlim(window_ns[0] * scale, window_ns[1] * scale)
    else:
        ax.set_xlim(0, max(timing.time_ns * scale, 1e-6))
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[op]) for op in ops]
    ax.legend(handles, ops, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(title or f"Engine timeline, modeled {timing.target}: {timing.time_us:.2f} us, "
                 f"binding {timing.binding_engine}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def roofline_png(points, path, *, target: str = "trn2", title: str | None = None) -> str:
    """Roofline chart. ``points``: dicts with ``label``, ``flops``, ``hbm_bytes``, ``time_ns``.

    x = arithmetic intensity (min FLOPs / min HBM bytes), y = achieved FLOP/s
    (min FLOPs / modeled time). Up to 12 points get one legend entry each
    (with their roofline fraction); more are grouped: colour = the label's
    first part (the op), marker = its second part (the model).
    """
    hw = get_target(target)
    plt = pyplot()
    peak = hw.bf16_peak_flops
    bw = hw.dma_bw_per_core * 1e9  # bytes/s
    fig, ax = plt.subplots(figsize=(12, 6.5))
    xs = np.logspace(-2, 4, 200)
    ax.loglog(xs, np.minimum(peak, xs * bw), "k-", lw=1.5,
              label=f"roof: {peak / 1e12:.0f} TFLOP/s bf16, {bw / 1e9:.0f} GB/s DMA")
    ax.axhline(hw.fp32_peak_flops, color="gray", ls=":", lw=1, label=f"fp32 {hw.fp32_peak_flops / 1e12:.0f} TFLOP/s")
    pts = [p for p in points if p["time_ns"] and p["time_ns"] > 0 and p["hbm_bytes"] > 0]
    ymin = 1e9
    palette = list(plt.get_cmap("tab10").colors)
    markers = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">"]
    few = len(pts) <= 12
    groups = sorted({p["label"].split("/")[0] for p in pts})
    models = sorted({(p["label"].split("/") + [""])[1] for p in pts})
    for k, p in enumerate(pts):
        ai = max(p["flops"], 1.0) / p["hbm_bytes"]
        y = max(max(p["flops"], 1.0) / (p["time_ns"] * 1e-9), ymin)
        parts = p["label"].split("/") + [""]
        if few:
            frac = p.get("roofline_fraction")
            lab = p["label"] + (f" ({100 * frac:.0f}% of roof)" if frac is not None else "")
            # 10 colours: the 11th and 12th points change marker so no two look alike
            ax.loglog([ai], [y], "o" if k < 10 else "s", color=palette[k % 10], ms=7, label=lab)
        else:
            ax.loglog([ai], [y], markers[models.index(parts[1]) % len(markers)],
                      color=palette[groups.index(parts[0]) % 10], ms=7, alpha=0.85)
    if not few:
        for g in groups:
            ax.plot([], [], "o", color=palette[groups.index(g) % 10], label=g)
        for m in models:
            ax.plot([], [], markers[models.index(m) % len(markers)], color="gray", label=m)
    ax.set_xlabel("arithmetic intensity (min FLOPs / min HBM bytes)")
    ax.set_ylabel("achieved FLOP/s (min FLOPs / modeled time)")
    ax.set_ylim(ymin, peak * 3)
    ax.set_title(title or f"Roofline, modeled {hw.name} (one NeuronCore)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(True, which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
