"""The main job: every op at model shapes, checked against float64, timed by the cost model.

    python -m simulate                      # default set (a few minutes), trn2, report in reports/<timestamp>
    python -m simulate --set judged         # the 16K, 8 x 2K and 64 / 512-sequence shapes the speed goals are stated at
    python -m simulate --target trn3 --model qwen3 --op gated_delta
    python -m simulate --full               # 16K / 64K tokens, 512-sequence decode, every shape
    python -m simulate --smoke --out /tmp/r # tiny shapes (seconds)
    python -m simulate --lnc 1              # one program per launch only (default: LNC=1 and 2)
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time
from pathlib import Path

# One BLAS thread (set before NumPy loads): the float64 references multiply small matrices,
# and OpenBLAS's thread pool spends more CPU waiting than computing, most of all on a shared
# machine (the 2K-token Gated DeltaNet reference: 7.6 CPU-s with two threads, 2.6 with one).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m simulate", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="trn2", choices=["trn2", "trn3"],
                   help="target the times are modeled for (default trn2)")
    p.add_argument("--model", action="append", default=None,
                   help="only cases whose model key contains this (repeatable), e.g. qwen3, mamba2, granite")
    p.add_argument("--op", action="append", default=None,
                   help="only these ops or families (repeatable), e.g. ssd_prefill, gated_delta, decode")
    p.add_argument("--case", action="append", default=None,
                   help="only cases whose id contains this (repeatable), e.g. ssd_prefill/mamba2-2.7b/8x2048/ "
                        "(the report's goal rows name the command that measures each goal)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--set", dest="case_set", default=None, choices=["smoke", "judged", "default", "full"],
                   help="case set (default: default = every op at the judged model shapes, 2K-token prefill, "
                        "decode at 32 / 64 sequences, backward at 512 tokens)")
    g.add_argument("--full", action="store_true", help="the full set (16K/64K tokens, every shape); = --set full")
    g.add_argument("--smoke", action="store_true", help="tiny shapes, for tests; = --set smoke")
    p.add_argument("--lnc", default="both", choices=["1", "2", "both"],
                   help="programs per launch (NEURON_LOGICAL_NC_CONFIG): 1 = one physical core, 2 = the two "
                        "physical cores of a logical core, both (default) = LNC=1 with its 10-90 %% interval "
                        "and LNC=2's central figure beside it")
    p.add_argument("--range-samples", type=int, default=None,
                   help="constant tables drawn for the 10-90 %% interval (default "
                        "nki_ssm.perf.hardware.RANGE_SAMPLES = 12; each is one scheduling pass of every trace: "
                        "fewer make the run faster and the interval coarser)")
    p.add_argument("--out", default=None, help="report folder (default reports/<timestamp>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-calibration", action="store_true", help="skip the calibration table")
    p.add_argument("--calibration-full", action="store_true",
                   help="kept for compatibility: the published-kernel rows come from "
                        "nki_ssm/perf/calibration_published.json (regenerate with python -m "
                        "nki_ssm.perf.calibration --kernels-from DIR)")
    p.add_argument("--timeline", default=None,
                   help="case id substring whose kernel gets the timeline plot (default: an SSD, else GDN, "
                        "else conv prefill case)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="skip cases with more tokens than this (the full set's 64K cases take long)")
    p.add_argument("--max-pool-gb", type=float, default=1.5,
                   help="skip cases whose state pool exceeds this many GB (the float64 reference and "
                        "the simulator hold several copies; default 1.5)")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    return p.parse_args(argv)


# optional packages the main job uses: (module, what needs it, how to install it)
OPTIONAL = (("matplotlib", "the report's plots (timeline, engines, roofline)",
             "pip install 'matplotlib>=3.7'  (or: pip install -e '.[report]')"),)


def missing_optional() -> list[tuple[str, str, str]]:
    """The optional packages that are not importable, checked before any case runs."""
    import importlib.util

    return [dep for dep in OPTIONAL if importlib.util.find_spec(dep[0]) is None]


def _say(text: str) -> None:
    """A message wrapped at 100 columns, flushed."""
    import textwrap

    print("\n".join(textwrap.wrap(text, 100, subsequent_indent="  ")), flush=True)


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """One line per case on stdout, flushed (a terminal and a redirected log read the same):
    ``[ 3/15] <case id> ... 12.3 s  (0:42 elapsed, ~2:30 left)``. The estimate is each
    remaining case's expected cost (``simulate.cases.expected_seconds``) scaled by how this
    run's finished cases compared with theirs."""

    def __init__(self, cases, extra_steps: int = 0, out=None):
        from simulate.cases import expected_seconds

        self.expected = [expected_seconds(c) for c in cases]
        self.total = len(cases) + extra_steps
        self.done, self.spent_expected, self.out = 0, 0.0, out or sys.stdout
        self.t0 = time.perf_counter()

    def start(self, label: str) -> None:
        width = len(str(self.total))
        print(f"[{self.done + 1:>{width}}/{self.total}] {label} ...", end="", file=self.out, flush=True)
        self.t_case = time.perf_counter()

    def finish(self, k: int | None, note: str = "") -> None:
        """Case ``k`` (None: an extra step) finished; ``note``: a short result."""
        now = time.perf_counter()
        self.done += 1
        elapsed = now - self.t0
        if k is not None:
            self.spent_expected += self.expected[k]
            remaining = sum(self.expected[k + 1:])
        else:
            remaining = 0.0
        scale = elapsed / self.spent_expected if self.spent_expected else 1.0
        left = f", ~{_clock(remaining * scale)} left" if remaining else ""
        note = f" {note}" if note else ""
        print(f" {now - self.t_case:.1f} s{note}  ({_clock(elapsed)} elapsed{left})", file=self.out, flush=True)


def _case_note(res) -> str:
    """What a finished case says on its progress line."""
    if res.status in ("error", "skipped"):
        return f"[{res.status}: {(res.error or '').splitlines()[0][:60]}]"
    return ""


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    from simulate import cases as C
    from simulate.report import terminal_summary, write_report
    from simulate.run import run_case, skipped

    case_set = args.case_set or ("smoke" if args.smoke else "full" if args.full else "default")
    lncs = {"1": (1,), "2": (2,), "both": (1, 2)}[args.lnc]
    selected = C.SETS[case_set]()
    selected = C.select(selected, models=args.model, ops=args.op)
    if args.case:
        selected = [c for c in selected if any(s in c.id for s in args.case)]
    if args.max_tokens is not None:
        selected = [c for c in selected if c.num_tokens <= args.max_tokens]
    if args.list:
        for c in selected:
            print(c.id)
        return 0
    if not selected:
        print("no case matches --model/--op/--case", file=sys.stderr)
        return 2
    missing = missing_optional()
    for name, what, install in missing:
        _say(f"note: {name} is not installed, so {what} are left out of the report; to have them:")
        print(f"  {install}", flush=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("reports") / stamp
    command = " ".join(["python -m simulate", *(sys.argv[1:] if argv is None else argv)])
    expected = sum(C.expected_seconds(c) for c in selected)
    _say(f"nki_ssm main job: {len(selected)} cases ({case_set} set), times modeled for {args.target}, "
         f"LNC={'1 and 2' if len(lncs) == 2 else lncs[0]}; about {_clock(expected)} on 2 idle cores; "
         f"report in {out}")
    t_start = time.perf_counter()
    results, timeline, timeline_case = [], None, None
    progress = Progress(selected, extra_steps=0 if args.no_calibration else 1)
    best = [len(_TIMELINE_PREFERENCE) + 1]

    for k, c in enumerate(selected):
        progress.start(c.id.rsplit("/", 1)[0])      # op/model/batch: the set's configuration
        if c.pool_bytes() > args.max_pool_gb * 1e9:
            results.append(skipped(c, args.target, f"state pool {c.pool_bytes() / 1e9:.1f} GB "
                                                   f"> --max-pool-gb {args.max_pool_gb}"))
        else:
            rank = _timeline_rank(c, args.timeline)
            want = rank < best[0] and not missing
            res, timing = run_case(c, target=args.target, seed=args.seed, keep_timing=want, lncs=lncs,
                                   range_samples=args.range_samples)
            if want and timing is not None:
                timeline, timeline_case, best[0] = timing, c.id, rank
            results.append(res)
        progress.finish(k, _case_note(results[-1]))
    cal_rows = None
    if not args.no_calibration:
        progress.start("calibration (the cost model against published kernel timings)")
        cal_rows = _calibration(args)
        progress.finish(None)
    wall = time.perf_counter() - t_start
    paths = write_report(out, results, target=args.target, case_set=case_set, command=command,
                         wall_s=wall, calibration_rows=cal_rows, timeline_timing=timeline,
                         timeline_case=timeline_case, plots=not missing)
    if not args.out:
        _link_latest(out)
    print()
    print(terminal_summary(results, target=args.target, case_set=case_set, calibration_rows=cal_rows))
    print(f"\nreport: {paths['report']}  ({_clock(wall)} wall)")
    failed = any(x is not None and x.status == "error" for r in results for x in (r, r.lnc2))
    return 1 if failed else 0  # skipped cases are not errors


# the kernel drawn on the timeline: the first case of the first op here that has a kernel
_TIMELINE_PREFERENCE = ("ssd_prefill", "gated_delta_prefill", "short_conv_prefill", "ssd_decode",
                        "gated_delta_decode", "short_conv_decode")


def _timeline_rank(case, wanted):
    if wanted is not None:
        return 0 if wanted in case.id else len(_TIMELINE_PREFERENCE) + 1
    return _TIMELINE_PREFERENCE.index(case.op) if case.op in _TIMELINE_PREFERENCE else len(_TIMELINE_PREFERENCE)


def _calibration(args):
    from nki_ssm.perf.calibration import run_calibration

    return run_calibration(full=args.calibration_full)


def _link_latest(out: Path) -> None:
    latest = out.parent / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        os.symlink(out.name, latest)
    except OSError:
        pass  # a missing symlink is not worth failing the run


if __name__ == "__main__":
    sys.exit(main())
