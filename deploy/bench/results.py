"""results.json of the bench: simulate's schema (``cases``: the modeled CaseResult rows of
the same cases) plus ``measured``: one row per case with what the device said and the
cost model's central figure and range beside it."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simulate.report import json_default  # the main job's results.json schema and encoding

SCHEMA = "nki_ssm.deploy.bench/1"


@dataclass
class MeasuredRow:
    case_id: str
    op: str
    target: str
    instance_type: str | None
    lnc: int = 2   # NEURON_LOGICAL_NC_CONFIG of the launches (the kernel ran as this many programs)
    status: str = "error"   # compiled, compile_error, passed, failed, run_error, no_kernel, error
    error: str | None = None
    compile_s: float | None = None     # NEFF written - launch
    call_s: float | None = None        # the whole op call (compile + load + run)
    neff_bytes: int | None = None      # program size on disk
    warnings: list = field(default_factory=list)
    tol: float | None = None
    err_out: float | None = None       # rel Frobenius vs float64, as simulate
    err_state: float | None = None
    max_abs_out: float | None = None
    pool_untouched: bool | None = None  # slots no sequence names stayed bit-identical
    padding_zero: bool | None = None    # output rows of padding sequences (slot -1) are 0
    measured_ns_p50: float | None = None
    measured_ns_p90: float | None = None
    measured_ns_min: float | None = None
    measured_ns_mean: float | None = None
    runs: int | None = None
    warmup: int | None = None
    timing_error: str | None = None
    profile_summary: dict = field(default_factory=dict)   # neuron-explorer summary of the median run
    profile_files: list = field(default_factory=list)
    modeled_ns: float | None = None        # cost model, central figure
    modeled_ns_low: float | None = None    # range: optimistic end
    modeled_ns_high: float | None = None   # range: conservative end
    modeled_instructions: int | None = None

    @property
    def ratio(self) -> float | None:
        """measured p50 / modeled central."""
        if self.measured_ns_p50 is None or not self.modeled_ns:
            return None
        return self.measured_ns_p50 / self.modeled_ns

    @property
    def within_range(self) -> bool | None:
        if self.measured_ns_p50 is None or self.modeled_ns_low is None or self.modeled_ns_high is None:
            return None
        return self.modeled_ns_low <= self.measured_ns_p50 <= self.modeled_ns_high

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["within_range"] = self.within_range
        return d


def modeled_figures(case_row: dict | None) -> tuple:
    """(central, low, high, instructions) of a simulate CaseResult dict.

    Central = ``modeled_ns``. Range = ``modeled_ns_low`` / ``modeled_ns_high`` when the
    cost model gives them, else [``modeled_ns_optimistic``, ``modeled_ns``] (the main
    figure takes the conservative end of every documented constant, the optimistic
    one the fast end: nki_ssm/perf/README.md, "Bracket").
    """
    if not case_row or case_row.get("modeled_ns") is None:
        return None, None, None, None
    central = float(case_row["modeled_ns"])
    low = case_row.get("modeled_ns_low", case_row.get("modeled_ns_optimistic"))
    high = case_row.get("modeled_ns_high", central)
    low = central if low is None else float(low)
    high = central if high is None else float(high)
    return central, min(low, high), max(low, high), case_row.get("instructions")


def measured_row(case, worker: dict, timing: dict | None, modeled: dict | None, *, target: str,
                 instance_type: str | None, lnc: int = 2, extra_warnings=()) -> MeasuredRow:
    central, low, high, instr = modeled_figures(modeled)
    neffs = worker.get("neffs") or []
    row = MeasuredRow(
        case_id=case.id, op=case.op, target=target, instance_type=instance_type, lnc=lnc,
        status=worker.get("status") or "error",
        error="; ".join(filter(None, [worker.get("error"), worker.get("hint")])) or None,
        compile_s=worker.get("compile_s"), call_s=worker.get("call_s"),
        neff_bytes=sum(n["bytes"] for n in neffs) if neffs else None,
        warnings=list(worker.get("warnings") or []) + list(extra_warnings),
        tol=worker.get("tol"), err_out=worker.get("err_out"), err_state=worker.get("err_state"),
        max_abs_out=worker.get("max_abs_out"), pool_untouched=worker.get("pool_untouched"),
        padding_zero=worker.get("padding_zero"),
        modeled_ns=central, modeled_ns_low=low, modeled_ns_high=high, modeled_instructions=instr)
    if timing:
        if "error" in timing:
            row.timing_error = timing["error"]
        else:
            row.measured_ns_p50, row.measured_ns_p90 = timing["p50_ns"], timing["p90_ns"]
            row.measured_ns_min, row.measured_ns_mean = timing["min_ns"], timing["mean_ns"]
            row.runs, row.warmup = timing["runs"], timing["warmup"]
            row.profile_summary = timing.get("summary", {})
            row.profile_files = timing.get("ntff", [])
    return row


def write(out_dir, *, payload: dict) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(payload, indent=1, default=json_default))
    return path


def load(path) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    data = json.loads(p.read_text())
    if "measured" not in data:
        raise ValueError(f"{p}: not a deploy.bench results file (no 'measured' rows)")
    return data
