"""python -m deploy {launch,run,host-script,ami,collect,report,teardown}: a trn2 / trn3 benchmark host.

    python -m deploy run --dry-run                        # the plan and price, no credentials needed
    python -m deploy run --bucket my-bucket               # the one command: launch, bench, collect,
                                                          # report, teardown (also after a failure)
    python -m deploy launch --bucket my-bucket            # only the host (ends itself after --ttl-hours)
    python -m deploy launch --region ap-southeast-4 --dry-run   # another region (this one is opt-in)
    python -m deploy run --sdk 2.33 --dry-run             # Neuron SDK 2.33 (NKI 0.7.0) instead of 2.34
    python -m deploy host-script --bucket my-bucket --run-id 20261207-120000-ab12   # the host's commands
    python -m deploy ami                                  # the DLAMI id launch would use (read-only)
    python -m deploy collect --run-id 20261207-120000-ab12 --bucket my-bucket   # S3 -> reports/<run id>
    python -m deploy report reports/20261207-120000-ab12  # measured vs modeled (table + plot)
    python -m deploy teardown --run-id 20261207-120000-ab12   # everything tagged with the run id
    python -m deploy teardown --expired                   # every run past its TTL

launch, run, ami, collect and teardown call AWS (credentials needed; --dry-run shows what they
would do); run --dry-run, launch --dry-run and host-script need no credentials.
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from deploy import config as C

DEFAULT_BENCH_ARGS = "--set smoke --set judged"
VERBS = ("launch", "run", "host-script", "ami", "collect", "report", "teardown")
DEPLOY_EXTRA = "pip install -e '.[deploy]'"
# what the deploy extra brings (and what they import): a missing one is a one-line error
OPTIONAL_MODULES = ("boto3", "botocore", "s3transfer", "jmespath", "matplotlib")


def _finite(ok, rule: str):
    """An argparse type: a finite float for which ``ok`` holds, else ``rule`` as the error."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (math.isfinite(v) and ok(v)):
            raise argparse.ArgumentTypeError(f"{rule}, got {text}")
        return v

    return parse


_ttl_hours = _finite(lambda v: C.MIN_TTL_HOURS <= v <= C.MAX_TTL_HOURS,
                     f"must be in [{C.MIN_TTL_HOURS:g}, {C.MAX_TTL_HOURS:g}] hours")
_price = _finite(lambda v: v >= 0, "must be a finite number of USD >= 0")


def _checked(check):
    """An argparse type from a checker that raises ValueError with its message."""
    def parse(text: str):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _instance_type(text: str) -> str:
    from deploy.provision.plan import check_instance_type

    return _checked(check_instance_type)(text)


def _run_id(text: str) -> str:
    from deploy.provision.plan import check_run_id

    return _checked(check_run_id)(text)


def _bucket(text: str) -> str:
    """An S3 bucket name (3-63 characters of [a-z0-9.-], starting and ending with a letter or
    digit), not a URL or a path."""
    import re

    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", text):
        raise argparse.ArgumentTypeError(f"must be an S3 bucket name (3-63 characters of "
                                         f"[a-z0-9.-]; no s3:// or /), got {text!r}")
    return text


def _seconds(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def _region_flags(p):
    p.add_argument("--region", default=None,
                   help=f"AWS region (default: the profile's, else {C.DEFAULT_REGION})")
    p.add_argument("--profile", default=None, help="AWS profile name")


def _launch_flags(p):
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (every API call, type, AMI, price) and exit; creates nothing")
    _region_flags(p)
    p.add_argument("--instance-type", default=C.DEFAULT_INSTANCE_TYPE, type=_instance_type,
                   help=f"Trainium instance type (default {C.DEFAULT_INSTANCE_TYPE}, offered in "
                        f"{C.DEFAULT_REGION}: deploy/README.md, 'Where trn2 is')")
    p.add_argument("--family", default=None, choices=C.DISCOVERED_FAMILIES,
                   help="use the smallest offered type of this family, discovered with "
                        "describe-instance-types / describe-instance-type-offerings (e.g. trn3)")
    p.add_argument("--sdk", default=C.DEFAULT_SDK, type=_checked(C.sdk_profile_key),
                   help=f"Neuron SDK release: its DLAMI, venv and pins ({', '.join(C.SDK_PROFILES)}; "
                        f"2.34 and 2.33 work too; default {C.DEFAULT_SDK}, NKI "
                        f"{C.SDK_PROFILES[C.DEFAULT_SDK].nki})")
    p.add_argument("--ami-id", default=None, help="launch this AMI (it must hold the --sdk venv)")
    p.add_argument("--bucket", default=None, type=_bucket,
                   help="S3 bucket for the source and the results (must exist, in --region)")
    p.add_argument("--ttl-hours", type=_ttl_hours, default=C.DEFAULT_TTL_HOURS,
                   help=f"the host terminates itself after this long (default {C.DEFAULT_TTL_HOURS:g}, "
                        f"max {C.MAX_TTL_HOURS:g})")
    p.add_argument("--subnet-id", default=None, help="subnet (default: a default-VPC subnet in an "
                                                     "offering zone)")
    p.add_argument("--capacity-reservation-id", default=None,
                   help="launch into this EC2 Capacity Block (cr-...)")
    p.add_argument("--hourly-price", type=_price, default=None, help="USD per hour to show in the plan")
    p.add_argument("--run-id", default=None, type=_run_id,
                   help="name of the run (default: UTC time + 4 hex digits)")


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    sub = p.add_subparsers(dest="verb", required=True, metavar="{" + ",".join(VERBS) + "}")
    pl = sub.add_parser("launch", help="provision the host (IMDSv2, no key, no open port, TTL)")
    _launch_flags(pl)
    pr = sub.add_parser("run", help="launch, run the bench through SSM, collect, report, tear down")
    _launch_flags(pr)
    ph = sub.add_parser("host-script", help="print the commands the SSM document receives, one per "
                                            "line (a POSIX sh script; needs no credentials)")
    _launch_flags(ph)
    for q in (pr, ph):
        q.add_argument("--bench-args", default=DEFAULT_BENCH_ARGS,
                       help=f"arguments of python -m deploy.bench on the host (default "
                            f"{DEFAULT_BENCH_ARGS!r}; --target and --sdk follow the instance type and --sdk)")
        q.add_argument("--bench-timeout", type=_seconds, default=None,
                       help="seconds the bench may run on the host (default: the SSM executionTimeout "
                            "less 15 min for the upload)")
    pr.add_argument("--keep", action="store_true", help="do not tear down at the end (the TTL still applies)")
    pr.add_argument("--reports", default="reports", help="local folder for the results (default reports/)")
    pa = sub.add_parser("ami", help="print the id of the DLAMI launch would use (read-only look-ups)")
    _launch_flags(pa)
    pc = sub.add_parser("collect", help="results of a run from S3 to reports/<run id>/")
    pc.add_argument("--run-id", required=True, type=_run_id)
    pc.add_argument("--bucket", required=True, type=_bucket)
    _region_flags(pc)
    pc.add_argument("--out", default=None, help="default reports/<run id>")
    pc.add_argument("--dry-run", action="store_true",
                    help="list what would be downloaded (with credentials) and exit")
    prep = sub.add_parser("report", help="measured vs modeled report of a results.json (table + plot)")
    prep.add_argument("results", help="results.json, or the folder holding it")
    prep.add_argument("--out", default=None, help="folder for the report (default: next to results.json)")
    prep.add_argument("--dry-run", action="store_true", help="say what would be written and exit")
    pt = sub.add_parser("teardown", help="delete everything tagged with a run id (or every expired run)")
    g = pt.add_mutually_exclusive_group(required=True)
    g.add_argument("--run-id", type=_run_id)
    g.add_argument("--expired", action="store_true", help="every run whose TTL tag lies in the past")
    _region_flags(pt)
    pt.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    a = p.parse_args(argv)
    _check(p, a)
    return a


def _results_path(arg: str) -> Path:
    path = Path(arg)
    return path if path.is_file() else path / "results.json"


def _check(p, a) -> None:
    """What argparse types cannot see: a file that must exist, a configured profile, the
    bench's own arguments. parser.error: message and exit code 2, before any AWS call."""
    if a.verb == "report" and not a.dry_run and not _results_path(a.results).is_file():
        p.error(f"report: no results.json at {a.results}")
    if getattr(a, "profile", None):
        try:   # botocore's session lists profiles without resolving AWS_PROFILE
            import botocore.session

            known = botocore.session.get_session().available_profiles
        except ImportError:   # boto3 not installed: main says so in one line
            known = None
        if known is not None and a.profile not in known:
            p.error(f"--profile {a.profile}: no such profile in the AWS config "
                    f"(configured: {', '.join(known) or 'none'})")
    if getattr(a, "bench_args", None) is not None:
        from deploy import workflow as W

        try:
            W.bench_options(shlex.split(a.bench_args))
        except ValueError as exc:
            p.error(str(exc))
    if a.verb in ("launch", "run", "host-script", "ami") and a.capacity_reservation_id and a.family:
        p.error("--capacity-reservation-id fixes the instance type: drop --family")


def _settings(a):
    from deploy.provision.plan import LaunchSettings

    return LaunchSettings(region=a.region or C.DEFAULT_REGION, instance_type=a.instance_type,
                          family=a.family, sdk=a.sdk, ami_id=a.ami_id,
                          bucket=a.bucket or "<your-bucket>", ttl_hours=a.ttl_hours,
                          subnet_id=a.subnet_id, capacity_reservation_id=a.capacity_reservation_id,
                          hourly_price=a.hourly_price, run_id=a.run_id or "")


def _session(a, verb):
    from deploy.provision import aws

    sess = aws.session(getattr(a, "region", None), getattr(a, "profile", None))
    aws.require_credentials(sess, verb)   # before any call
    return sess, (getattr(a, "region", None) or sess.region_name or C.DEFAULT_REGION)


def _plan(a, with_run: bool) -> int:
    """--dry-run: read-only look-ups when credentials exist, placeholders otherwise."""
    from deploy import workflow as W

    s = _settings(a)
    r, status = None, None
    try:
        from deploy.provision import aws
        from deploy.provision import discover as D

        sess = aws.session(a.region, a.profile)
        if aws.has_credentials(sess):
            s.region = a.region or sess.region_name or C.DEFAULT_REGION
            try:
                r = W.resolve(W.make_clients(sess, s.region, quick=True), s, need_subnet=False)
            except D.RegionNotEnabled as exc:
                status = "not-opted-in"
                print(f"(read-only look-ups stopped: {exc})")
            except Exception as exc:   # a plan is still printed; say what could not be looked up
                print(f"(read-only look-ups failed: {type(exc).__name__}: {exc}; placeholders shown)")
        else:
            print("(no AWS credentials: nothing is looked up; the region, the AMI and the zones are "
                  "checked at launch, before anything is created)")
    except ImportError:
        print(f"(boto3 not installed: nothing is looked up; {DEPLOY_EXTRA} to launch)")
    args = shlex.split(getattr(a, "bench_args", DEFAULT_BENCH_ARGS))
    print(W.plan_text(s, r, with_run=with_run, bench_args=args, region_status=status))
    print("\ndry run: nothing was created.")
    return 0


class _Failed(Exception):
    """A one-line error for the user (exit code ``code``)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    try:
        return _main(a)
    except _Failed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except ImportError as exc:   # an optional dependency: one line saying which extra
        missing = (getattr(exc, "name", None) or "").split(".")[0]
        if missing not in OPTIONAL_MODULES:
            raise
        print(f"error: `python -m deploy {a.verb}` needs {missing} (the deploy extra): "
              f"{DEPLOY_EXTRA}", file=sys.stderr)
        return 2
    except LookupError as exc:   # the region, image or type is not there: nothing was created
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        line = _aws_error(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 1


# what to do about the AWS errors a new account meets first
_HINTS = {
    "VcpuLimitExceeded": "the account's vCPU quota 'Running On-Demand Trn instances' (Service "
                         "Quotas, EC2) is below the type's vCPUs; request an increase",
    "InsufficientInstanceCapacity": "no on-demand capacity in the zone now; try later, another "
                                    "--region (deploy/README.md, 'Where trn2 is') or a capacity block",
    "OptInRequired": "the region (or the AMI's product) needs an opt-in for this account",
    "AuthFailure": "the credentials are not valid in this region (an opt-in region not enabled?)",
    "UnauthorizedOperation": "the credentials lack a permission (deploy/README.md, 'Prerequisites')",
    "AccessDenied": "the credentials lack a permission (deploy/README.md, 'Prerequisites')",
    "NoSuchBucket": "create the bucket first: aws s3 mb s3://<bucket> --region <region>",
}


def _aws_error(exc) -> str | None:
    """One line for an error of boto3 / botocore (None: not one of theirs)."""
    mod = type(exc).__module__ or ""
    if not mod.startswith(("botocore", "boto3")):
        return None
    err = getattr(exc, "response", {}).get("Error", {}) if hasattr(exc, "response") else {}
    code = err.get("Code", "")
    hint = _HINTS.get(code)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text + (f" ({hint})" if hint else "")


def _main(a) -> int:
    if a.verb == "report":
        return _report(a)
    if a.verb == "ami" and a.dry_run:
        from deploy.provision import plan as P

        s = _settings(a)
        print("\n".join(c.render() for c in P.region_calls(s) + P.ami_calls(s)))
        print("dry run: nothing was looked up")
        return 0
    if a.verb == "host-script":
        from deploy import workflow as W

        try:
            lines = W.host_commands(_settings(a), shlex.split(a.bench_args),
                                    bench_timeout_s=a.bench_timeout)
        except ValueError as exc:
            raise _Failed(str(exc), 2) from None
        print("\n".join(lines))
        return 0
    if a.verb in ("launch", "run"):
        if a.dry_run:
            return _plan(a, with_run=a.verb == "run")
        if not a.bucket:
            raise _Failed("--bucket is required (results go to s3://<bucket>/nki-ssm-bench/<run id>/)", 2)
        if a.verb == "run":
            from deploy import workflow as W

            try:   # before any AWS call
                W.host_commands(_settings(a), shlex.split(a.bench_args), a.bench_timeout)
            except ValueError as exc:
                raise _Failed(str(exc), 2) from None
    from deploy.provision.aws import MissingCredentials

    try:
        return _real(a)
    except MissingCredentials as exc:
        raise _Failed(str(exc), 2) from None


def _report(a) -> int:
    path = _results_path(a.results)
    if a.dry_run:
        from deploy import report as REP

        out = Path(a.out) if a.out else path.parent
        state = "found" if path.is_file() else "not there yet (`python -m deploy collect` fetches it)"
        print(f"report of {path} ({state}) -> {out / REP.REPORT_NAME}, {out / REP.PLOT_NAME}; "
              "dry run: nothing was written")
        return 0
    from deploy import report as REP

    paths = REP.write(a.results, out_dir=a.out)
    print(REP.summary_text(paths["json"]))
    print(f"\nreport: {paths['report']}  plot: {paths['plot']}")
    return 0


def _real(a) -> int:
    from deploy import workflow as W

    if a.verb in ("launch", "run", "ami"):
        sess, region = _session(a, a.verb)
        s = _settings(a)
        s.region = region
        clients = W.make_clients(sess, region)
        if a.verb == "ami":
            return _ami(a, clients, s)
        if a.verb == "run":
            out = W.run_all(clients, s, bench_args=shlex.split(a.bench_args), reports_dir=a.reports,
                            keep=a.keep, bench_timeout_s=a.bench_timeout)
            print(f"run {out['run_id']}: bench {out['status']}; {len(out['files'])} files in "
                  f"{a.reports}/{out['run_id']}; report {out['report'] and out['report']['report']}")
            return 0 if out["status"] == "Success" else 1
        from deploy.provision import launch as L

        r = W.resolve(clients, s)
        print(W.plan_text(s, r, with_run=False, bench_args=[]).split("\nAPI calls")[0])
        got = L.create(clients, s, image_id=r.image["ImageId"], subnet_id=r.subnet_id, vpc_id=r.vpc_id,
                       root_device=r.image["RootDeviceName"])
        print(f"launched {got.instance_id} (run {got.run_id}); ends itself after {s.ttl_hours:g} h; "
              f"`python -m deploy teardown --run-id {got.run_id}` ends it now")
        return 0
    if a.verb == "collect":
        from deploy import collect as COL
        from deploy.provision.plan import Names

        out = a.out or f"reports/{a.run_id}"
        prefix = Names(a.run_id).results_prefix
        if a.dry_run:
            from deploy.provision import aws

            sess = aws.session(a.region, a.profile)
            if not aws.has_credentials(sess):
                print(f"would download s3://{a.bucket}/{prefix}/results/ into {out} (no AWS "
                      "credentials: nothing listed); dry run: nothing was downloaded")
                return 0
        sess, region = _session(a, "collect")
        COL.collect(sess.client("s3", region_name=region), a.bucket, prefix, out, dry_run=a.dry_run)
        return 0
    if a.verb == "teardown":
        from deploy.provision import teardown as T

        sess, region = _session(a, "teardown")
        ec2, iam = sess.client("ec2", region_name=region), sess.client("iam")
        found = T.find(ec2, iam, a.run_id, expired=a.expired)
        print("found: " + ", ".join(f"{k}={v}" for k, v in found.to_dict().items()))
        if a.dry_run or found.empty():
            if a.dry_run:
                print("dry run: nothing was deleted")
            return 0
        T.teardown(ec2, iam, found)
        return 0
    raise AssertionError(a.verb)


def _ami(a, clients, s) -> int:
    """The DLAMI launch would use: the region check and the AMI look-ups only."""
    from deploy.provision import discover as D

    D.check_region(clients.get("regions") or clients["ec2"], s.region)
    image = D.resolve_ami(clients["ec2"], clients["ssm"], s)
    for note in image["notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(f"{image['ImageId']}\t{image['Name']}\t{image['source']}", file=sys.stderr)
    print(image["ImageId"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
