"""One calibration row and the Markdown table of rows: shared by ``calibration`` (published
kernels and micro kernels) and ``measured`` (deploy.bench runs on a trn instance).

A row compares a modeled figure with a published (or measured) one:
``modeled / published`` on the central figure. ``kind`` is "check" when no
model constant was set from the row, "fit" when one was; each kind has its
band (``CHECK_BAND``, ``FIT_BAND``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

CHECK_BAND = (0.77, 1.30)
FIT_BAND = (0.9, 1.1)

MEASURES = {
    "kernel": "modeled kernel time (time_ns) against the figure as recorded (e.g. deploy.bench p50)",
    "kernel+launch": "modeled kernel time + launch_ns (a device profile / benchmark of one call)",
    "span": "first DMA trigger to last DMA completion (the profile's timeline of the kernel body)",
    "transfer": "one DMA engine's data-transfer bar of the first load",
    "instruction": "the profiler's bar of one compute instruction: its engine occupancy plus the engine's "
                   "pipeline latency (costs.raw_latency_ns; the bar ends when the result is written)",
    "constant": "the model constant itself",
    "chain_ii": "initiation interval of a dependent instruction chain",
    "slope": "kernel time per added work item: the difference of the modeled times at two sizes divided by "
             "the items added, against the same difference of the published figures (a fixed harness "
             "overhead in them cancels)",
}


@dataclass
class CalibrationRow:
    name: str
    target: str
    workload: str
    published_ns: float
    source: str
    kind: str                       # "check" or "fit"
    note: str
    dtype: str = ""
    regime: str = ""                # what binds on hardware: tensor / dma / vector / scalar / latency
    measure: str = "kernel"         # what is compared (see MEASURES)
    origin: str = "own"             # "published" (their kernel file), "own" (micro kernel), "measured"
    modeled_ns: float | None = None
    p10_ns: float | None = None     # 10-90 % interval of the modeled figure (sampled constants)
    p90_ns: float | None = None
    low_ns: float | None = None     # every constant at its fast / slow end
    high_ns: float | None = None
    error: str | None = None        # why the row could not run
    wall_s: float | None = None
    binding_engine: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return None if self.modeled_ns is None else self.modeled_ns / self.published_ns

    @property
    def within_band(self) -> bool | None:
        if self.ratio is None:
            return None
        lo, hi = CHECK_BAND if self.kind == "check" else FIT_BAND
        return lo <= self.ratio <= hi

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["within_band"] = self.within_band
        return d


def off_regimes(rows: list) -> dict:
    """regime -> [check rows outside the band]: where the model is off (empty when it fits)."""
    out: dict = {}
    for r in rows:
        if r.kind == "check" and r.ratio is not None and not r.within_band:
            out.setdefault(f"{r.target} {r.regime}", []).append(r.name)
    return out


def fmt_ns(ns: float | None) -> str:
    """A time in ns as ns / us / ms text ("—" for None); also used by simulate/'s report."""
    if ns is None:
        return "—"
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.4g} us"
    return f"{ns:.4g} ns"


def _source_cell(r: CalibrationRow, tags: dict) -> str:
    """[TAG] plus what the row adds to the tagged source (the legend under the table)."""
    for tag, text in tags.items():
        if r.source.startswith(text):
            rest = r.source[len(text):].strip()
            return f"[{tag}]" + (f" {rest}" if rest else "")
    return r.source


def _modeled_cell(r: CalibrationRow) -> str:
    if r.modeled_ns is None:
        return "—"
    if r.p10_ns is not None:
        return f"{fmt_ns(r.modeled_ns)} ({fmt_ns(r.p10_ns)}–{fmt_ns(r.p90_ns)})"
    return fmt_ns(r.modeled_ns)


def table_markdown(rows: list, tags: dict | None = None, notes=()) -> str:
    """The rows as Markdown: check rows, then fit rows apart; then the band, ``notes``, the
    legend of what is compared and of the source ``tags`` ({tag: source text})."""
    tags = tags or {}
    head = ["| row | target | dtype | binds | published | modeled, central (10-90 %) | modeled / published "
            "| compares | binding (model) | origin | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines = []
    for kind, title in (("check", "Check rows (no constant was set from them)"),
                        ("fit", "Fit rows (a constant was read off them; not checks)")):
        lines += ["", f"**{title}**", ""] + head
        for r in rows:
            if r.kind != kind:
                continue
            ratio = "not run: " + (r.error or "?") if r.ratio is None else f"{r.ratio:.2f}"
            lines.append(
                f"| {r.name} | {r.target} | {r.dtype} | {r.regime} | {fmt_ns(r.published_ns)} "
                f"{_source_cell(r, tags)} | {_modeled_cell(r)} modeled, {r.target} | {ratio} | {r.measure} | "
                f"{r.binding_engine or '—'} | {r.origin} | {r.note} |")
    checks = [r for r in rows if r.kind == "check" and r.ratio is not None]
    inside = sum(bool(r.within_band) for r in checks)
    lo, hi = CHECK_BAND
    lines += ["", f"Band: check rows {lo}-{hi} (modeled / published, central figure): {inside} of "
                  f"{len(checks)} inside; fit rows {FIT_BAND[0]}-{FIT_BAND[1]}."]
    off = off_regimes(rows)
    if off:
        lines.append("Outside the band (model error, by regime): " +
                     "; ".join(f"{k}: {', '.join(v)}" for k, v in off.items()))
    lines += list(notes)
    lines.append("Compares: " + "; ".join(f"{k} = {v}" for k, v in MEASURES.items()) + ".")
    if tags:
        lines.append("Sources: " + "; ".join(f"[{k}] {v}" for k, v in tags.items()) + ".")
    return "\n".join(lines).lstrip()
