"""python -m deploy.bench: compile, check and time every kernel on this host's Neuron SDK.

    python -m deploy.bench                                # smoke + judged cases, trn2, reports/bench-<time>
    python -m deploy.bench --compile-only                 # any x86 host with the Neuron pip packages
    python -m deploy.bench --compile-only --dry-run       # list the cases and the commands, run nothing
    python -m deploy.bench --set full --case ssd_decode   # other simulate sets, id substrings
    python -m deploy.bench --lnc 1                        # one physical core (default LNC=2: a logical core)

Per case: compile through the host API on the SDK (``deploy.bench.worker``,
one process per case), run it on the device and compare with the float64
reference (tolerances and pool checks of the tests), time it with
``neuron-explorer capture`` (warm-up + runs, p50 / p90), and model it with
the cost model for the same target and LNC. LNC (``--lnc``, default 2, the
trn2 / trn3 default): kernels launch as ``kernel[lnc]`` (nki_ssm.backend.run
reads NEURON_LOGICAL_NC_CONFIG) and the runtime runs the same LNC, on logical
core 0. Output: results.json (simulate's schema + ``measured`` rows, each with
its LNC), report.md and measured_vs_modeled.png.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from deploy import config as C
from deploy.provision.plan import target_of

REPO_ROOT = Path(__file__).resolve().parents[2]


def _sdk(text: str) -> str:
    try:
        return C.sdk_profile_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m deploy.bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--set", dest="sets", action="append", default=None,
                   choices=["smoke", "judged", "default", "full"],
                   help="simulate case sets (repeatable; default: smoke and judged)")
    p.add_argument("--case", action="append", default=None, help="only case ids containing this")
    p.add_argument("--op", action="append", default=None, help="only these ops / families")
    p.add_argument("--target", default="auto", choices=["auto", "trn2", "trn3"],
                   help="NEURON_PLATFORM_TARGET_OVERRIDE and the cost model's target (default auto: "
                        "the instance type's, from IMDS; trn2 off EC2 and in a --dry-run; "
                        "python -m deploy passes it explicitly)")
    p.add_argument("--lnc", type=int, default=2, choices=[1, 2],
                   help="Logical NeuronCore configuration of every launch (NEURON_LOGICAL_NC_CONFIG): 2 "
                        "(default, trn2 / trn3's) = the kernel as two programs on the two physical cores of "
                        "logical core 0; 1 = one program on physical core 0")
    p.add_argument("--sdk", default=C.DEFAULT_SDK, type=_sdk,
                   help=f"the Neuron SDK release whose pins the toolchain must match "
                        f"({', '.join(C.SDK_PROFILES)}; default {C.DEFAULT_SDK})")
    p.add_argument("--upload-to", default=None, metavar="S3_URL",
                   help="after every case, `aws s3 sync` the output folder there (s3://...)")
    p.add_argument("--upload-region", default=None, help="region of the --upload-to bucket")
    p.add_argument("--compile-only", action="store_true",
                   help="compile only (no device needed); no check, no timing")
    p.add_argument("--dry-run", action="store_true", help="list every case and the commands; run nothing")
    p.add_argument("--out", default=None, help="output folder (default reports/bench-<UTC time>)")
    p.add_argument("--warmup", type=int, default=3, help="executions dropped before timing (default 3)")
    p.add_argument("--runs", type=int, default=20, help="timed executions (default 20)")
    p.add_argument("--timer", default="explorer", choices=["explorer", "none"],
                   help="explorer: neuron-explorer capture + summary-json (default); none: no timing")
    p.add_argument("--tools-bin", default=None, help="Neuron tools folder (default /opt/aws/neuron/bin)")
    p.add_argument("--modeled", default=None,
                   help="take the modeled figures from this simulate results.json instead of "
                        "running the cost model here")
    p.add_argument("--no-model", action="store_true", help="skip the cost model")
    p.add_argument("--allow-version-mismatch", action="store_true",
                   help="go on when the toolchain does not match the SDK pins (results say so)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per case compile / run")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.upload_to is not None and not a.upload_to.startswith("s3://"):
        p.error(f"--upload-to must be an s3:// URL, got {a.upload_to!r}")
    if a.warmup < 0 or a.runs < 1:
        p.error(f"--warmup must be >= 0 and --runs >= 1, got {a.warmup} and {a.runs}")
    return a


def runtime_env(lnc: int) -> dict:
    """Runtime settings of every execution (worker and profiler). The worker's launches are
    ``kernel[lnc]`` (nki_ssm.backend.run reads NEURON_LOGICAL_NC_CONFIG), so the compiled
    grid and the runtime's LNC agree (aws-neuron-sdk logical-neuroncore-config.rst: the
    compiler's LNC must be the runtime's). NEURON_RT_VISIBLE_CORES counts the cores the
    runtime exposes, logical ones at LNC=2 (neuron-ls.rst: a trn2 device at
    logical-neuroncore-config 2 lists NEURON CORE IDS 0-3, "used with
    NEURON_RT_VISIBLE_CORES"; the NxD programming guide: it selects a "specific Logical
    NeuronCore"): core 0 is physical core 0 at LNC=1 and both physical cores of logical
    core 0 at LNC=2."""
    if lnc not in (1, 2):
        raise ValueError(f"lnc must be 1 or 2, got {lnc!r}")
    return {"NEURON_LOGICAL_NC_CONFIG": str(lnc), "NEURON_RT_VISIBLE_CORES": "0"}


def worker_env(case_dir: Path, target: str, lnc: int = 2) -> dict:
    """Environment of one case's worker (everything the SDK reads at import time). The NEFF
    lands in NKI_ARTIFACTS_DIR (the SDK's nrtpy tutorial) or, as the SDK docs say with
    NEURON_FRAMEWORK_DEBUG=1, in the working directory (``worker_cwd``): the worker looks
    in both."""
    return {
        "NKI_ARTIFACTS_DIR": str(case_dir / "artifacts"),
        "NKI_SSM_BACKEND": "neuron",                       # kernels built with the SDK's nki.jit
        "NEURON_PLATFORM_TARGET_OVERRIDE": target,
        "NEURON_FRAMEWORK_DEBUG": "1",                     # keep artifacts, source mapping
        **runtime_env(lnc),
    }


def worker_cwd(case_dir: Path) -> Path:
    """The worker's working directory: a folder of its own, searched for NEFFs."""
    return case_dir / "work"


def worker_argv(case_id: str, case_dir: Path, compile_only: bool, seed: int) -> list[str]:
    argv = [sys.executable, "-m", "deploy.bench.worker", "--case", case_id, "--out", str(case_dir),
            "--seed", str(seed)]
    return argv + (["--compile-only"] if compile_only else [])


def _shell(env: dict, argv: list[str]) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + " ".join(
        shlex.quote(a) for a in argv)


def dry_run(cases, out: Path, a) -> int:
    from deploy.bench import profiler as PR
    from deploy.bench.cases import slug, tolerance
    from nki_ssm.ops._dispatch import find_launcher

    mode = "compile only" if a.compile_only else "compile, run on the device, check, time"
    print(f"deploy.bench dry run: {len(cases)} cases, {mode}, target {a.target}, LNC={a.lnc}; output {out}")
    prof = C.SDK_PROFILES[a.sdk]
    print(f"toolchain check: pip {', '.join(f'{k}=={v}' for k, v in prof.pip_pins.items())} "
          f"(SDK {prof.release}, NKI {prof.nki}); neuronx-cc --version"
          + ("" if a.compile_only else "; dpkg-query " + ", ".join(prof.apt_pins)
             + "; neuron-ls --json-output"))
    tool = PR.tool_path(a.tools_bin)
    for k, c in enumerate(cases, 1):
        d = out / "cases" / slug(c.id)
        print(f"\n[{k}/{len(cases)}] {c.id}")
        print(f"  shape {c.shape!r}; {c.num_tokens} tokens; dtype {c.config}; tol {tolerance(c):g}")
        print(f"  op nki_ssm.ops.{c.op}(..., backend='neuron') -> launcher "
              f"nki_ssm.ops.launch.{c.family}.{c.entry}"
              + ("" if find_launcher(c.family, c.entry) else " (missing: the row will say no_kernel)"))
        env = dict(worker_env(d, a.target, a.lnc), PYTHONPATH=str(REPO_ROOT))
        print("  compile: " + _shell(env, worker_argv(c.id, d, a.compile_only, a.seed)))
        if not a.compile_only and a.timer == "explorer":
            launch = d / "inputs" / "launch_0"
            capture = PR.capture_argv(tool, str(launch / "kernel.neff"), str(d / "profile" / "launch_0" / "profile.ntff"),
                                      [("<param>", str(launch / "<param>.bin")), ("...", "...")],
                                      a.warmup + a.runs)
            print("  time:    " + _shell(runtime_env(a.lnc), capture))
            view = PR.view_argv(tool, str(launch / "kernel.neff"), "profile_exec_<k>.ntff")
            print(f"           then per execution: {' '.join(view)}  (first {a.warmup} dropped)")
    return 0


def _instance_type() -> str | None:
    """The EC2 instance type through IMDSv2 (None off EC2); one short attempt."""
    import urllib.request

    try:
        req = urllib.request.Request("http://169.254.169.254/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        token = urllib.request.urlopen(req, timeout=1).read().decode()
        req = urllib.request.Request("http://169.254.169.254/latest/meta-data/instance-type",
                                     headers={"X-aws-ec2-metadata-token": token})
        return urllib.request.urlopen(req, timeout=1).read().decode()
    except OSError:
        return None


def run_worker(case, case_dir: Path, a) -> dict:
    """The case's worker process -> its worker.json (+ compiler warnings from its output)."""
    worker_cwd(case_dir).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **worker_env(case_dir, a.target, a.lnc))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    log = case_dir / "worker.log"
    try:
        with open(log, "wb") as fh:
            subprocess.run(worker_argv(case.id, case_dir, a.compile_only, a.seed), env=env,
                           cwd=worker_cwd(case_dir),
                           stdout=fh, stderr=subprocess.STDOUT, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"case_id": case.id, "status": "error", "error": f"timed out after {a.timeout:.0f} s"}
    path = case_dir / "worker.json"
    if not path.is_file():
        tail = log.read_text(errors="replace")[-1500:]
        return {"case_id": case.id, "status": "error", "error": f"worker wrote no result: {tail}"}
    res = json.loads(path.read_text())
    res["warnings"] = compiler_warnings(log.read_text(errors="replace")) + list(res.get("warnings") or [])
    return res


def compiler_warnings(text: str, limit: int = 50) -> list[str]:
    """Lines of the compile output that are warnings (neuronx-cc / nki print 'WARNING' / 'Warning')."""
    import re

    pat = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)
    out = []
    for line in text.splitlines():
        if pat.search(line) and line.strip() not in out:
            out.append(line.strip()[:300])
    return out[:limit]


def time_case(case, case_dir: Path, res: dict, a) -> dict | None:
    from deploy.bench import profiler as PR

    if a.compile_only or a.timer == "none" or res.get("status") != "passed":
        return None
    launches = res.get("launches") or []
    if not launches or not all(ln.get("neff") for ln in launches):
        return {"error": "a launch has no NEFF to profile"}
    unsaved = unsaved_inputs(launches)
    if unsaved:   # neuron-explorer would run on zero-filled buffers: another workload
        return {"error": "not timed: " + "; ".join(unsaved)}
    totals = None
    for k, launch in enumerate(launches):
        inputs = [(i["name"], i["file"]) for i in launch["inputs"]]
        try:
            t = PR.profile(Path(launch["neff"]["path"]), inputs, case_dir / "profile" / f"launch_{k}",
                           warmup=a.warmup, runs=a.runs, tool=PR.tool_path(a.tools_bin),
                           timeout_s=a.timeout, env=runtime_env(a.lnc))
        except Exception as exc:  # the row says why; the case's check result stands
            return {"error": f"{type(exc).__name__}: {exc}"[:1000]}
        if totals is None:
            totals = t
        else:   # an op of several launches: the times add up
            for key in ("p50_ns", "p90_ns", "min_ns", "mean_ns"):
                totals[key] += t[key]
    return totals


def unsaved_inputs(launches: list[dict]) -> list[str]:
    """Why a case's launches cannot be replayed with their own inputs (empty: they can): the
    worker could not name the kernel's array arguments by its parameters, or a saved file
    is missing."""
    out = []
    for k, ln in enumerate(launches):
        if ln.get("inputs_error"):
            out.append(f"launch {k}: {ln['inputs_error']}")
        elif not ln.get("inputs"):
            out.append(f"launch {k}: no array input was saved")
        else:
            out += [f"launch {k}: input {i['name']} not saved ({i['file']})"
                    for i in ln["inputs"] if not Path(i["file"]).is_file()]
    return out


def upload(out: Path, dest: str | None, region: str | None, run=subprocess.run) -> str | None:
    """``aws s3 sync`` of the output folder to ``dest`` (None: not asked). -> an error text or
    None; a failed upload never stops the bench (the host script uploads again on exit)."""
    if not dest:
        return None
    argv = ["aws", "s3", "sync", "--only-show-errors"] + (["--region", region] if region else [])
    try:
        proc = run(argv + [str(out), dest], capture_output=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"upload to {dest} failed: {exc}"
    if proc.returncode != 0:
        return f"upload to {dest} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-300:]}"
    return None


def _modeled(cases, a) -> dict:
    """{case id: simulate CaseResult dict at the bench's LNC} from --modeled, or the cost model
    run here."""
    if a.no_model:
        return {}
    if a.modeled:
        data = json.loads(Path(a.modeled).read_text())
        return {c["case_id"]: row for c in data.get("cases", []) if (row := at_lnc(c, a.lnc)) is not None}
    from simulate.run import run_case

    out = {}
    for c in cases:
        res, _ = run_case(c, target=a.target, seed=a.seed, lncs=(a.lnc,))
        out[c.id] = res.to_dict()
    return out


def at_lnc(case_row: dict, lnc: int) -> dict | None:
    """A simulate CaseResult dict's figures at ``lnc``: the row itself, its ``lnc2`` row
    (``simulate --lnc both``), or None when the run did not model that LNC."""
    if case_row.get("lnc", 1) == lnc:
        return case_row
    other = case_row.get("lnc2")
    return other if other is not None and other.get("lnc") == lnc else None


def _hardware(target: str) -> dict:
    """The cost model's hardware table for ``target``, as simulate's results.json holds it."""
    from dataclasses import asdict

    try:
        from nki_ssm.perf.hardware import CALIBRATED, SOURCES, get_target

        spec = get_target(target)
        return {"hardware": {k: v for k, v in asdict(spec).items() if k != "extra"},
                "hardware_sources": SOURCES[spec.name], "calibrated_constants": CALIBRATED}
    except (ImportError, AttributeError, KeyError, TypeError) as exc:   # the perf layer moved on
        return {"hardware": None, "hardware_sources": None, "calibrated_constants": None,
                "hardware_error": f"{type(exc).__name__}: {exc}"}


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    from deploy.bench import cases as BC

    sets = a.sets or list(BC.DEFAULT_SETS)
    cases = BC.select(sets, contains=a.case, ops=a.op)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = (Path(a.out) if a.out else Path("reports") / f"bench-{stamp}").resolve()
    if not cases:
        print("no case matches --set / --case / --op", file=sys.stderr)
        return 2
    itype = None if a.dry_run else _instance_type()
    if a.target == "auto":   # a trn3 host compiles and models for trn3
        a.target = target_of(itype) if itype else "trn2"
    if a.dry_run:
        return dry_run(cases, out, a)
    # this process runs the cost model: kernels must be built against the simulator here
    # (the workers build them with the SDK's nki.jit)
    os.environ["NKI_SSM_BACKEND"] = "sim"
    from deploy.bench import results as RS
    from deploy.bench import toolchain as TC

    t0 = time.perf_counter()
    tc = TC.check(compile_only=a.compile_only, tools_bin=a.tools_bin, profile=C.SDK_PROFILES[a.sdk])
    for m in tc["mismatches"]:
        print(f"toolchain: {m}", file=sys.stderr)
    if not tc["ok"] and not a.allow_version_mismatch:
        print("toolchain does not match the pins; fix it or pass --allow-version-mismatch",
              file=sys.stderr)
        return 2
    modeled = _modeled(cases, a)
    rows = []
    command = "python -m deploy.bench " + " ".join(sys.argv[1:] if argv is None else argv)

    def payload(done: bool) -> dict:
        ran = cases[:len(rows)]
        return {
            "schema": RS.SCHEMA, "target": a.target, "case_set": "+".join(sets),
            "command": command, "wall_s": time.perf_counter() - t0,
            "mode": "compile-only" if a.compile_only else "device", "complete": done, "lnc": a.lnc,
            "cases_planned": len(cases), "instance_type": itype, "toolchain": tc,
            **_hardware(a.target),
            "time_unit": "ns (cases: modeled; measured: measured on the device)",
            "cases": [modeled[c.id] for c in ran if c.id in modeled],
            "calibration": None,
            "measured": [r.to_dict() for r in rows],
        }

    for k, c in enumerate(cases, 1):
        d = out / "cases" / BC.slug(c.id)
        print(f"[{k}/{len(cases)}] {c.id}", flush=True)
        res = run_worker(c, d, a)
        timing = time_case(c, d, res, a)
        row = RS.measured_row(c, res, timing, modeled.get(c.id), target=a.target, instance_type=itype,
                              lnc=a.lnc)
        rows.append(row)
        p50 = f", p50 {row.measured_ns_p50 / 1e3:.1f} us" if row.measured_ns_p50 else ""
        print(f"    {row.status}{p50}" + (f": {row.error}" if row.error else ""), flush=True)
        # every finished case is in results.json and in S3 before the next one starts
        RS.write(out, payload=payload(done=False))
        err = upload(out, a.upload_to, a.upload_region)
        if err:
            print(f"    {err}", file=sys.stderr, flush=True)
    path = RS.write(out, payload=payload(done=True))
    from deploy import report as REP

    paths = REP.write(path)
    print(REP.summary_text(path))
    print(f"\nresults: {path}\nreport: {paths['report']}")
    err = upload(out, a.upload_to, a.upload_region)
    if err:
        print(err, file=sys.stderr)
    bad = [r for r in rows if r.status not in ("compiled", "passed", "no_kernel")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
