"""The verbs' work, with the boto3 clients passed in (the CLI makes them; tests use moto).

``plan_text`` is what ``--dry-run`` prints; ``resolve`` does the read-only
look-ups; ``run_all`` is the one command (launch, bench through SSM, collect,
report) with the teardown in a ``finally``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from deploy import config as C
from deploy.provision import discover as D
from deploy.provision import plan as P
from deploy.provision import remote as R

REPO_ROOT = Path(__file__).resolve().parent.parent
CLIENT_SERVICES = ("ec2", "iam", "ssm", "s3")


@dataclass
class Resolved:
    """What the read-only look-ups found (None: not looked up, e.g. no credentials)."""

    image: dict | None = None
    instance_type: str = C.DEFAULT_INSTANCE_TYPE
    type_info: dict | None = None
    zones: list = field(default_factory=list)
    family_types: list = field(default_factory=list)
    subnet_id: str | None = None
    vpc_id: str | None = None
    price: float | None = None
    price_source: str = ""
    block: dict | None = None          # the capacity reservation (zone, type, dates)
    region_status: str | None = None   # OptInStatus of the region for the account
    notes: list = field(default_factory=list)


def make_clients(sess, region: str, *, quick: bool = False) -> dict:
    """boto3 clients of the verbs; ``quick`` (the dry run's look-ups): short timeouts and
    few retries, so a plan without network access is printed within seconds."""
    from botocore.config import Config

    cfg = (Config(connect_timeout=5, read_timeout=15, retries={"mode": "standard", "max_attempts": 2})
           if quick else Config(connect_timeout=20, read_timeout=120,
                                retries={"mode": "standard", "max_attempts": 5}))
    out = {svc: sess.client(svc, region_name=region, config=cfg) for svc in CLIENT_SERVICES}
    out["pricing"] = sess.client("pricing", region_name="us-east-1", config=cfg)  # Price List API endpoint
    # describe-regions where every account is enabled: a disabled region refuses the call
    out["regions"] = sess.client("ec2", region_name=C.REGION_STATUS_ENDPOINT, config=cfg)
    return out


def resolve(clients: dict, s: P.LaunchSettings, *, need_subnet: bool = True) -> Resolved:
    """Region enabled, AMI, instance type (family discovered), zones, capacity block, subnet,
    price: read-only calls only, in the order of ``plan.lookup_calls``. A region the account
    has not enabled, an image or a type that is not there: LookupError before anything is
    created."""
    r = Resolved(instance_type=s.instance_type)
    ec2 = clients["ec2"]
    r.region_status = D.check_region(clients.get("regions") or ec2, s.region)
    r.image = D.resolve_ami(ec2, clients["ssm"], s)
    r.notes += r.image.get("notes", [])
    if s.capacity_reservation_id:
        r.block = D.capacity_block(ec2, s.capacity_reservation_id)
        if not s.family and r.block["instance_type"] != s.instance_type:
            raise LookupError(f"capacity reservation {s.capacity_reservation_id} holds "
                              f"{r.block['instance_type']}, not {s.instance_type}: pass "
                              f"--instance-type {r.block['instance_type']}")
    pattern = f"{s.family}.*" if s.family else s.instance_type
    r.family_types = D.instance_types(ec2, pattern)
    zones = D.offerings(ec2, [t["InstanceType"] for t in r.family_types])
    if r.block:   # a block is capacity in one zone, whatever the offerings say
        zones = {r.block["instance_type"]: [r.block["zone"]]}
    r.instance_type = D.choose_type(r.family_types, zones, s.family, s.instance_type, s.region)
    s.instance_type = r.instance_type
    r.zones = zones.get(r.instance_type, [])
    r.type_info = next((t for t in r.family_types if t["InstanceType"] == r.instance_type), None)
    if need_subnet:
        if s.subnet_id:
            r.subnet_id, r.vpc_id, zone = D.subnet_vpc(ec2, s.subnet_id)
            if r.block and zone != r.block["zone"]:
                raise LookupError(f"--subnet-id {s.subnet_id} is in {zone}; capacity reservation "
                                  f"{s.capacity_reservation_id} is in {r.block['zone']}")
        else:
            r.subnet_id, r.vpc_id = D.default_subnet(ec2, r.zones)
    r.price, r.price_source = price(clients, s)
    return r


def price(clients: dict | None, s: P.LaunchSettings) -> tuple[float | None, str]:
    """--hourly-price, else the Price List API (with credentials), else the reference table."""
    if s.hourly_price is not None:
        return s.hourly_price, "--hourly-price"
    if clients is not None and "pricing" in clients:
        try:
            got = D.hourly_price(clients["pricing"], s.instance_type, s.region)
            if got is not None:
                return got, f"AWS Price List API, on-demand Linux, {s.region}"
        except Exception as exc:  # no pricing:GetProducts permission, no network
            note = f"Price List API failed ({type(exc).__name__}); "
        else:
            note = "not in the Price List API; "
    else:
        note = "Price List API not asked: no credentials, or the look-ups failed; "
    value, source = D.reference_price(s.instance_type, s.region)
    return value, note + source


def bench_argv(s: P.LaunchSettings, bench_args: list[str]) -> list[str]:
    """The bench's arguments on the host: the user's, plus the compile / cost-model target
    of the instance type and the SDK profile (pins), unless given."""
    out = list(bench_args)
    if not any(a == "--target" or a.startswith("--target=") for a in out):
        out += ["--target", s.target]
    if not any(a == "--sdk" or a.startswith("--sdk=") for a in out):
        out += ["--sdk", s.sdk]
    return out


def bench_options(bench_args: list[str]):
    """The bench's parsed options (ValueError for arguments the bench would refuse)."""
    from deploy.bench.__main__ import _parse

    try:
        return _parse(list(bench_args))
    except SystemExit as exc:
        raise ValueError(f"--bench-args {' '.join(bench_args)!r}: not valid arguments of "
                         "python -m deploy.bench") from exc


def results_gb(bench_args: list[str]) -> tuple[float, str]:
    """Estimated size of the results (GB) and how it was estimated (config's assumptions)."""
    from deploy.bench import cases as BC

    a = bench_options(bench_args)
    n = len(BC.select(a.sets or list(BC.DEFAULT_SETS), contains=a.case, ops=a.op))
    execs = 0 if (a.compile_only or a.timer == "none") else a.warmup + a.runs
    mb = C.ASSUMED_INPUTS_MB_PER_CASE + execs * C.ASSUMED_NTFF_MB
    return n * mb / 1024, (f"{n} cases x ({C.ASSUMED_INPUTS_MB_PER_CASE:g} MB inputs + {execs} NTFF "
                           f"x {C.ASSUMED_NTFF_MB:g} MB), assumed")


def cost_lines(s: P.LaunchSettings, p: float | None, psrc: str, bench_args: list[str] | None,
               block: dict | None) -> list[str]:
    """The plan's cost: instance, disk, S3 transfer of the results, each with its source."""
    if s.capacity_reservation_id:
        where = f" ({block['instance_type']} in {block['zone']}, {block['state']})" if block else ""
        inst = (f"capacity block {s.capacity_reservation_id}{where}: paid up front when purchased "
                "(describe-capacity-block-offerings UpfrontFee), whether used or not; the run adds "
                "no instance-hour charge; keep --ttl-hours inside the block")
        worst = 0.0
    elif p is not None:
        inst = f"${p:.3f}/h ({psrc}); TTL {s.ttl_hours:g} h -> at most ${p * s.ttl_hours:.2f}"
        worst = p * s.ttl_hours
    else:
        inst = f"unknown ({psrc}); pass --hourly-price"
        worst = None
    disk = C.ROOT_VOLUME_GB * C.EBS_GP3_USD_PER_GB_MONTH * s.ttl_hours / C.HOURS_PER_MONTH
    lines = [f"  instance        {inst}",
             f"  disk            {C.ROOT_VOLUME_GB} GB gp3 x ${C.EBS_GP3_USD_PER_GB_MONTH}/GB-month x "
             f"{s.ttl_hours:g} h -> at most ${disk:.2f} (list price, US East, unverified)"]
    extra = disk
    if bench_args is not None:
        gb, basis = results_gb(bench_args)
        transfer = gb * C.S3_EGRESS_USD_PER_GB
        extra += transfer
        lines.append(f"  S3 transfer     ~{gb:.1f} GB of results ({basis}) out of S3 by `collect` x "
                     f"${C.S3_EGRESS_USD_PER_GB}/GB -> ~${transfer:.2f} (list price, US East, "
                     "unverified; uploads into S3 are free)")
    if worst is not None:
        lines.append(f"  total           at most ~${worst + extra:.2f}"
                     + (" beyond the block's up-front price" if s.capacity_reservation_id else ""))
    return lines


def plan_text(s: P.LaunchSettings, r: Resolved | None, *, with_run: bool, bench_args: list[str],
              region_status: str | None = None) -> str:
    """The full plan: settings, resolved values, and every API call in order
    (``region_status``: the account's, when the look-ups stopped at the region check)."""
    names = P.Names(s.run_id)
    prof = s.profile
    if s.family and r is None:   # the type is not known until describe-instance-types answers
        s = dataclasses.replace(s, instance_type=f"<smallest offered {s.family} type>")
    ami = (f"{r.image['ImageId']} ({r.image['Name']}; {r.image['Description']}; via {r.image['source']})"
           if r and r.image else
           (f"{s.ami_id} (given)" if s.ami_id else
            f"'{prof.dlami}' (Ubuntu 24.04, else 26.04), resolved at launch: SSM parameter "
            f"{prof.ssm_parameters[0]} (UNVERIFIED name), the image's description naming "
            f"Neuron SDK {prof.release}; else the newest image of that release by name"))
    if r is not None:
        p, psrc = r.price, r.price_source
    else:
        p, psrc = price(None, s)
    if s.family:
        itype = (f"{r.instance_type} (smallest offered {s.family} type, describe-instance-types)"
                 if r else f"the smallest offered {s.family}.* type (discovered at run time)")
    else:
        itype = s.instance_type
    source = next((src for reg, t, src in C.OFFERING_EVIDENCE
                   if reg == s.region and t == s.instance_type), None)
    lines = [
        f"{C.PROJECT} plan — run {s.run_id}",
        f"  region          {s.region}: {region_text(s.region, r.region_status if r else region_status)}",
        f"  instance type   {itype}",
    ]
    if source:
        lines.append(f"                  offered there: {source}")
    alternatives = [f"{t} in {reg}" + (" (opt-in)" if reg in C.OPT_IN_REGIONS else "")
                    for reg, t, _ in C.OFFERING_EVIDENCE if (reg, t) != (s.region, s.instance_type)]
    lines.append(f"  elsewhere       {'; '.join(alternatives)} (deploy/README.md, 'Where trn2 is')")
    if r and r.type_info:
        t = r.type_info
        lines.append(f"                  {t['vcpus']} vCPU, {t['memory_mib']} MiB, {t['neuron_devices']} x "
                     f"{t['neuron_device']} ({t['cores_per_device']} cores each); zones {', '.join(r.zones)}")
    if r and s.family:
        lines.append("  family types    " + ", ".join(t["InstanceType"] for t in r.family_types))
    lines += [
        f"  AMI             {ami}",
        f"  Neuron SDK      {prof.release} (NKI {prof.nki}), venv {prof.venv}",
        f"  older SDKs      {C.OLDER_SDKS}",
    ]
    refusal = C.kernels_refusal(prof)
    if refusal:
        lines.append(f"  kernels         {refusal}: `run` and `host-script` refuse this SDK; "
                     "`launch` gives you the host")
    lines += [
        "  SDK pins        " + ", ".join(f"{k}=={v}" for k, v in prof.pip_pins.items()) + "; "
        + ", ".join(f"{k} {v}" for k, v in prof.apt_pins.items()),
        f"  compile target  --target {s.target} (NEURON_PLATFORM_TARGET_OVERRIDE and the cost model)",
        f"  torch path      {prof.torch_path} (the bench itself calls the kernels with NumPy)",
    ]
    lines += cost_lines(s, p, psrc, bench_args if with_run else None, r.block if r else None)
    lines += [
        f"  time to live    {s.ttl_hours:g} h: shutdown behaviour terminate + on-host timer + "
        f"tag {C.TAG_TTL_EXPIRES}",
        "  access          IMDSv2 only, no key pair, no inbound rule; commands via SSM Run Command",
        f"  instance role   {names.role}: AmazonSSMManagedInstanceCore + s3://{s.bucket}/"
        f"{names.results_prefix}/* only",
        f"  tags            {C.TAG_PROJECT}={C.PROJECT}, {C.TAG_RUN_ID}={s.run_id}, Name, {C.TAG_TTL_EXPIRES}",
    ]
    if with_run and not refusal:
        ex, bench = run_timeouts(s.ttl_hours)
        lines.append(f"  on the host     `python -m deploy host-script` prints the commands (POSIX sh); "
                     f"bench timeout {bench} s < SSM executionTimeout {ex} s; results to S3 after "
                     "every case and on exit")
    if not s.ami_id:
        for name in prof.unverified:
            lines.append(f"  UNVERIFIED      {name}")
    for note in (r.notes if r else []):
        lines.append(f"  note            {note}")
    calls = P.lookup_calls(s)
    img = r.image["ImageId"] if r and r.image else "<ami>"
    root = r.image["RootDeviceName"] if r and r.image else "/dev/sda1"
    calls += P.create_calls(s, image_id=img, subnet_id=(r.subnet_id if r and r.subnet_id else
                                                         "<default subnet in an offering zone>"),
                            vpc_id=(r.vpc_id if r and r.vpc_id else "<default vpc>"), root_device=root)
    if with_run and not refusal:
        calls += run_calls(s, instance_id="<instance id>", bench_args=bench_args)
    down = P.teardown_calls(s.run_id)
    lines.append("")
    lines.append(f"API calls, in order ({sum(c.creates for c in calls)} create something):")
    lines += [c.render() for c in calls]
    lines.append("")
    lines.append("Teardown (" + ("at the end, and after any failure" if with_run else
                                 "after a failed launch, or `python -m deploy teardown --run-id "
                                 f"{s.run_id}`") + "):")
    lines += [c.render() for c in down]
    return "\n".join(lines)


def region_text(region: str, status: str | None = None) -> str:
    """The plan's word on the region: opt-in or not, and the account's status when known."""
    if status == "not-opted-in":
        return (f"an opt-in region NOT ENABLED for this account; launch stops before creating "
                f"anything. Enable it with {C.enable_region_hint(region)}")
    if status in ("opted-in", "opt-in-not-required"):
        return f"enabled for this account ({status})"
    if region in C.OPT_IN_REGIONS:
        return ("an opt-in region, disabled on a new account; launch checks it (describe-regions) "
                f"and stops before creating anything if it is not enabled: {C.enable_region_hint(region)}")
    return "enabled on every account (not an opt-in region); launch checks it (describe-regions)"


def host_commands(s: P.LaunchSettings, bench_args: list[str], bench_timeout_s: int | None = None
                  ) -> list[str]:
    """The lines the SSM document receives (``python -m deploy host-script`` prints them)."""
    ex, bench = run_timeouts(s.ttl_hours)
    if bench_timeout_s is not None:
        if not 0 < bench_timeout_s <= bench:
            raise ValueError(f"bench timeout must be in (0, {bench}] s for --ttl-hours "
                             f"{s.ttl_hours:g} (SSM executionTimeout {ex} s less "
                             f"{UPLOAD_MARGIN_S} s for the results upload), got {bench_timeout_s}")
        bench = bench_timeout_s
    prof = s.profile
    refusal = C.kernels_refusal(prof)
    if refusal:
        raise ValueError(f"sdk {refusal}")
    return R.bench_commands(bucket=s.bucket, prefix=P.Names(s.run_id).results_prefix, region=s.region,
                            run_id=s.run_id, bench_args=bench_argv(s, bench_args), venv=prof.venv,
                            nki=prof.nki, extra=prof.extra, bench_timeout_s=bench)


def run_calls(s: P.LaunchSettings, *, instance_id: str, bench_args: list[str]) -> list[P.Call]:
    timeout_s, _ = run_timeouts(s.ttl_hours)
    names = P.Names(s.run_id)
    prefix = names.results_prefix
    cmds = host_commands(s, bench_args)
    return [
        P.Call("s3", "put_object", {"Bucket": s.bucket, "Key": f"{prefix}/{R.SOURCE_KEY}",
                                    "Body": "<git ls-files tarball>"}, "the project source"),
        P.Call("ssm", "describe_instance_information",
               {"Filters": [{"Key": "InstanceIds", "Values": [instance_id]}]}, "wait for the SSM agent"),
        P.Call("ssm", "send_command", R.send_command_params(
            instance_id=instance_id, commands=cmds, bucket=s.bucket, prefix=prefix, run_id=s.run_id,
            timeout_s=timeout_s), "the bench, as root, on the host"),
        P.Call("ssm", "get_command_invocation", {"CommandId": "<CommandId returned by send_command>",
                                                  "InstanceId": instance_id},
               "poll until done"),
        P.Call("s3", "list_objects_v2", {"Bucket": s.bucket, "Prefix": f"{prefix}/results/"},
               "collect results into reports/<run id>/"),
    ]


# The SSM command must end before the host halts at its TTL, and the bench before the
# command, leaving the EXIT trap time to copy the results out (GBs of NTFFs).
TTL_MARGIN_S = 600
UPLOAD_MARGIN_S = 900


def run_timeouts(ttl_hours: float) -> tuple[int, int]:
    """(SSM executionTimeout, bench timeout) in s: TTL - 10 min, then 15 min less for the
    upload. Both count from the command's start."""
    execution = max(600, int(ttl_hours * 3600) - TTL_MARGIN_S)
    return execution, max(60, execution - UPLOAD_MARGIN_S)


def execution_timeout_s(ttl_hours: float) -> int:
    """The Run Command's executionTimeout."""
    return run_timeouts(ttl_hours)[0]


def run_all(clients: dict, s: P.LaunchSettings, *, bench_args: list[str], reports_dir,
            keep: bool = False, timeout_s: int | None = None, poll_s: float = 30, log=print,
            retry_delay: float = 5.0, bench_timeout_s: int | None = None) -> dict:
    """Launch, run the bench through SSM, collect, report; tear down in ``finally``.

    -> {"run_id", "instance_id", "status", "files", "report"}. A failure at any
    step still tears down everything tagged with the run id (unless ``keep``;
    the TTL still ends the host), then re-raises.
    """
    from deploy import collect as COL
    from deploy.provision import launch as L
    from deploy.provision import teardown as T

    timeout_s = execution_timeout_s(s.ttl_hours) if timeout_s is None else timeout_s
    host_commands(s, bench_args, bench_timeout_s)   # a bad bench timeout fails before any call
    r = resolve(clients, s)
    log(plan_text(s, r, with_run=True, bench_args=bench_args).split("\nAPI calls")[0])
    prefix = P.Names(s.run_id).results_prefix
    out = {"run_id": s.run_id, "instance_id": None, "status": "launching", "files": [], "report": None}
    launched = L.create(clients, s, image_id=r.image["ImageId"], subnet_id=r.subnet_id,
                        vpc_id=r.vpc_id, root_device=r.image["RootDeviceName"], log=log,
                        retry_delay=retry_delay)
    out["instance_id"] = launched.instance_id
    try:
        R.upload_source(clients["s3"], s.bucket, prefix, REPO_ROOT)
        R.wait_online(clients["ssm"], launched.instance_id, poll_s=poll_s, log=log)
        cmds = host_commands(s, bench_args, bench_timeout_s)
        sent = clients["ssm"].send_command(**R.send_command_params(
            instance_id=launched.instance_id, commands=cmds, bucket=s.bucket, prefix=prefix,
            run_id=s.run_id, timeout_s=timeout_s))
        inv = R.wait_command(clients["ssm"], sent["Command"]["CommandId"], launched.instance_id,
                             timeout_s=timeout_s + 900, poll_s=poll_s, log=log)
        out["status"] = inv.get("Status")
        out["files"] = COL.collect(clients["s3"], s.bucket, prefix, Path(reports_dir) / s.run_id, log=log)
        results = Path(reports_dir) / s.run_id / "results.json"
        if results.is_file():
            from deploy import report as REP

            out["report"] = REP.write(results)
    finally:
        if keep:
            log(f"--keep: {launched.instance_id} stays until its TTL; "
                f"`python -m deploy teardown --run-id {s.run_id}` ends it now")
        else:
            log(f"teardown of run {s.run_id}")
            T.teardown(clients["ec2"], clients["iam"], T.find(clients["ec2"], clients["iam"], s.run_id),
                       log=log, delay=retry_delay)
    return out
