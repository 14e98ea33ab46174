"""What a trn2 account holder needs before spending money: the current SDK and its image, a
region the account has and a type offered there, the right compile target, capacity blocks
in their zone, the whole bill, NEFFs where the SDK puts them, and bad arguments refused up
front."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy import config as C
from deploy import workflow as W
from deploy.__main__ import main
from deploy.provision import discover as D
from deploy.provision import plan as P

from moto_env import BUCKET, REGION


def _settings(**kw):
    kw.setdefault("run_id", "20261127-100000-cafe")
    return P.LaunchSettings(region=kw.pop("region", REGION), bucket=BUCKET, **kw)


# ------------------------------------------------------------------ SDK and image


def test_default_is_sdk_2_34_on_the_torchneuron_dlami():
    prof = C.SDK_PROFILES[C.DEFAULT_SDK]
    assert (prof.release, prof.nki) == ("2.34.0", "0.8.0")
    assert prof.dlami == "Deep Learning AMI Neuron torch-neuronx 2.14.0"
    assert prof.venv == "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"
    # the release-content page of each release
    assert prof.pip_pins == {"neuronx-cc": "2.29.16866.0", "nki": "0.8.0"}
    assert prof.apt_pins == {"aws-neuronx-runtime-lib": "2.36.8.0", "aws-neuronx-tools": "2.34.29.0"}
    old = C.SDK_PROFILES["2.33.0"]
    assert (old.nki, old.venv, old.extra) == ("0.7.0", prof.venv, "neuron-2-33")
    assert old.pip_pins == {"neuronx-cc": "2.28.7631.0", "nki": "0.7.0"}
    assert old.apt_pins == {"aws-neuronx-runtime-lib": "2.35.30.0", "aws-neuronx-tools": "2.33.38.0"}
    # the names no page confirms are listed, and each profile says where the rest comes from
    for p in (prof, old):
        assert any(p.ssm_parameters[0] in u for u in p.unverified)
        assert all(src.startswith("https://") for src in p.sources)
    assert "venv" in " ".join(prof.unverified)       # 2.34's image and venv names too


def test_sdk_is_given_as_major_minor_and_older_ones_name_the_release_to_use():
    assert C.sdk_profile_key("2.33") == C.sdk_profile_key("2.33.0") == "2.33.0"
    assert C.sdk_profile_key("2.34") == "2.34.0"
    for older in ("2.32", "2.32.0", "2.31.1"):
        with pytest.raises(ValueError, match="nki_ssm 0.1"):
            C.sdk_profile_key(older)
    with pytest.raises(ValueError, match="must be one of 2.34.0, 2.33.0"):
        C.sdk_profile_key("2.35")


def test_the_image_versions_meet_the_pins():
    """Versions as an image reports them (wheels with local labels, dpkg build suffixes)
    pass the check; anything else stops the bench."""
    from deploy.bench import toolchain as TC

    prof = C.SDK_PROFILES["2.34.0"]
    pip = {"neuronx-cc": "2.29.16866.0+a1b2c3d4", "nki": "0.8.0+31049202112.g85070674"}
    apt = {"aws-neuronx-runtime-lib": "2.36.8.0-ac18d186d", "aws-neuronx-tools": "2.34.29.0-526c2b7f6"}
    assert TC.mismatches(pip, prof.pip_pins, prof.release) == []
    assert TC.mismatches(apt, prof.apt_pins, prof.release) == []
    assert TC.mismatches({**pip, "nki": "0.7.0"}, prof.pip_pins, prof.release) == [
        "nki: 0.7.0 installed, SDK 2.34.0 pins 0.8.0"]


def test_the_image_is_the_torchneuron_dlami_of_the_release():
    """describe-images asks for every Neuron DLAMI of the release (the DLAMI guide's query);
    the framework words pick the TorchNeuron one, Ubuntu 24.04 before 26.04, newest first."""
    prof = C.SDK_PROFILES["2.34.0"]
    assert P.image_filters(prof) == [{"Name": "name", "Values": ["Deep Learning AMI Neuron*"]},
                                     {"Name": "description", "Values": ["*Neuron SDK 2.34.0*"]}]

    def im(name, release="2.34.0", date="2026-11-30", arch="x86_64"):
        return {"ImageId": name, "Name": f"Deep Learning AMI Neuron {name}",
                "Description": f"Neuron SDK {release}", "CreationDate": date, "Architecture": arch}

    others = [im("JAX 0.11 (Ubuntu 24.04) 20261130"), im("(Ubuntu 24.04) 20261130"),
              im("PyTorch Inference vLLM 0.29 (Ubuntu 24.04) 20261130"),
              im("torch-neuronx 2.14.0 (Ubuntu 24.04) 20261019", release="2.33.0"),
              im("torch-neuronx 2.14.0 (Ubuntu 24.04) 20261201", arch="arm64"),
              im("torch-neuronx 2.13.0 (Ubuntu 24.04) 20261130")]
    assert D.pick_image(others, prof) is None
    u26 = im("torch-neuronx 2.14.0 (Ubuntu 26.04) 20261202", date="2026-12-02")
    u24 = im("torch-neuronx 2.14.0 (Ubuntu 24.04) 20261130")
    u24_new = im("TORCH-NEURONX 2.14.0 (Ubuntu 24.04) 20261201", date="2026-12-01")
    assert D.pick_image(others + [u26], prof) is u26
    assert D.pick_image(others + [u26, u24], prof) is u24
    assert D.pick_image(others + [u24, u26, u24_new], prof) is u24_new


def test_dry_run_shows_sdk_venv_pair_source_price_transfer_and_disk(no_credentials, capsys):
    assert main(["run", "--dry-run", "--bucket", "my-bucket", "--run-id", "20261127-100000-cafe",
                 "--hourly-price", "2.5"]) == 0
    out = capsys.readouterr().out
    assert "Neuron SDK      2.34.0 (NKI 0.8.0), venv /opt/aws_neuronx_venv_torch_neuronx_2_14_0" in out
    assert f"region          {C.DEFAULT_REGION}: enabled on every account" in out
    assert "offered there: moto 5.2.6" in out
    assert "elsewhere       trn2.3xlarge in ap-southeast-4 (opt-in)" in out
    assert "trn2.48xlarge in us-east-2" in out and "us-east-2 (opt-in)" not in out
    assert "instance        $2.500/h (--hourly-price)" in out
    assert f"disk            {C.ROOT_VOLUME_GB} GB gp3" in out
    assert "S3 transfer     ~" in out and "out of S3 by `collect`" in out
    assert "total           at most ~$" in out
    assert "compile target  --target trn2" in out
    assert "older SDKs      Neuron SDK 2.32 and older" in out and "nki_ssm 0.1" in out
    assert out.count("UNVERIFIED      ") == 2
    assert "TorchNeuron 2.14.3.1" in out


def test_sdk_2_33_dry_run_names_the_2_33_ones(no_credentials, capsys):
    assert main(["run", "--dry-run", "--sdk", "2.33"]) == 0
    out = capsys.readouterr().out
    assert "Neuron SDK      2.33.0 (NKI 0.7.0), venv /opt/aws_neuronx_venv_torch_neuronx_2_14_0" in out
    assert "neuronx-cc==2.28.7631.0, nki==0.7.0" in out and "2.35.30.0" in out
    assert "Neuron SDK 2.33.0" in out
    # this release's kernels need NKI 0.8: the plan says so and which release to use, and
    # plans no bench (run stops before any AWS call)
    assert "kernels         Neuron SDK 2.33.0 has NKI 0.7.0" in out and "11f53ce" in out
    assert "send_command" not in out and "put_object" not in out
    with pytest.raises(SystemExit) as exc:
        main(["run", "--dry-run", "--sdk", "2.32"])
    assert exc.value.code == 2 and "nki_ssm 0.1" in capsys.readouterr().err


# ------------------------------------------------------------------ regions and types


def test_default_pair_is_offered_without_seeding(aws):
    """moto's offerings data (generated from AWS's answers) offers the default pair in a
    region every account has; nothing in conftest adds it."""
    assert REGION == C.DEFAULT_REGION and REGION not in C.OPT_IN_REGIONS
    assert (C.DEFAULT_REGION, C.DEFAULT_INSTANCE_TYPE) in {(r, t) for r, t, _ in C.OFFERING_EVIDENCE}
    r = W.resolve(aws.clients, _settings())
    assert r.region_status == "opt-in-not-required"
    assert r.instance_type == C.DEFAULT_INSTANCE_TYPE
    assert r.zones == ["sa-east-1a", "sa-east-1b", "sa-east-1c"]
    sub = aws.clients["ec2"].describe_subnets(SubnetIds=[r.subnet_id])["Subnets"][0]
    assert sub["AvailabilityZone"] in r.zones


def test_opt_in_regions_are_named_in_the_plan(no_credentials, capsys):
    for region in ("ap-southeast-4", "ap-south-2"):
        assert region in C.OPT_IN_REGIONS
        assert main(["launch", "--dry-run", "--region", region]) == 0
        out = capsys.readouterr().out
        assert (f"region          {region}: an opt-in region, disabled on a new account; launch "
                "checks it") in out
        assert f"aws account enable-region --region-name {region}" in out
        assert "trn2.3xlarge in sa-east-1;" in out and "sa-east-1 (opt-in)" not in out
    for region in ("sa-east-1", "us-east-2", "us-east-1"):
        assert region not in C.OPT_IN_REGIONS
    # the account's answer, when there is one, is what the plan says
    assert "NOT ENABLED for this account" in W.region_text("ap-southeast-4", "not-opted-in")
    assert W.region_text("ap-southeast-4", "opted-in") == "enabled for this account (opted-in)"


def _aws_ops(monkeypatch):
    """Every AWS operation botocore sends, in order (passed through to moto)."""
    import botocore.client

    sent = []
    real = botocore.client.BaseClient._make_api_call

    def record(self, operation_name, api_params):
        sent.append(operation_name)
        return real(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", record)
    return sent


@pytest.mark.parametrize("region, instance_type, message", [
    ("ap-southeast-4", "trn2.3xlarge", "ap-southeast-4 is an opt-in region this account has not "
                                       "enabled (ec2 describe-regions: not-opted-in)"),
    ("us-east-2", "trn2.3xlarge", "trn2.3xlarge is not offered in any zone of us-east-2"),
])
def test_launch_stops_before_any_resource(aws, monkeypatch, capsys, region, instance_type, message):
    """A region the account has not enabled (moto's account: ap-southeast-4 is not opted in),
    or one without the type: `launch` says so in one line and creates nothing."""
    if region == "us-east-2":     # the image is there: the offering check is what stops
        import boto3
        from moto_env import register_dlami, seed_reserved_parameter

        ami = register_dlami(boto3.client("ec2", region_name=region))
        seed_reserved_parameter(C.SDK_PROFILES[C.DEFAULT_SDK].ssm_parameters[0], ami, region)
    sent = _aws_ops(monkeypatch)
    code = main(["launch", "--bucket", "my-bucket", "--region", region, "--instance-type",
                 instance_type])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and "--region" in err
    if region == "ap-southeast-4":
        assert "nothing was created" in err
        assert "aws account enable-region --region-name ap-southeast-4" in err
        assert sent == ["DescribeRegions"]             # the first call, and the only one
    assert not [op for op in sent if op.startswith(("Create", "RunInstances", "Put", "Attach",
                                                    "AddRole"))]
    iam, ec2 = aws.clients["iam"], aws.clients["ec2"]
    assert iam.list_roles(PathPrefix=C.IAM_PATH)["Roles"] == []
    assert iam.list_instance_profiles(PathPrefix=C.IAM_PATH)["InstanceProfiles"] == []
    assert ec2.describe_instances()["Reservations"] == []


def test_an_enabled_opt_in_region_goes_on(aws):
    """The account's answer decides, not the list: an opted-in region passes the check."""
    class Regions:
        def describe_regions(self, **kw):
            assert kw == {"AllRegions": True, "RegionNames": ["ap-southeast-4"]}
            return {"Regions": [{"RegionName": "ap-southeast-4", "OptInStatus": "opted-in"}]}

    assert D.check_region(Regions(), "ap-southeast-4") == "opted-in"
    assert D.check_region(aws.clients["regions"], "sa-east-1") == "opt-in-not-required"
    with pytest.raises(D.RegionNotEnabled, match="not-opted-in"):
        D.check_region(aws.clients["regions"], "ap-south-2")


def test_a_region_without_the_type_says_where_else_to_look(aws):
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-2")
    types = D.instance_types(ec2, "trn2.3xlarge")
    zones = D.offerings(ec2, [t["InstanceType"] for t in types])
    assert zones == {}                      # no trn2.3xlarge in US East (nki-moe#14)
    with pytest.raises(LookupError) as exc:
        D.choose_type(types, zones, None, "trn2.3xlarge", "us-east-2")
    msg = str(exc.value)
    assert "not offered in any zone of us-east-2" in msg
    assert "trn2.3xlarge in ap-southeast-4" in msg and "trn2.3xlarge in sa-east-1" in msg
    assert "--capacity-reservation-id" in msg


def test_trn3_compiles_and_models_for_trn3():
    assert _settings(family="trn3").target == "trn3"
    assert _settings(instance_type="trn3.48xlarge").target == "trn3"
    assert _settings().target == "trn2"
    argv = W.bench_argv(_settings(family="trn3"), ["--set", "smoke"])
    assert argv[-4:] == ["--target", "trn3", "--sdk", "2.34.0"]
    assert W.bench_argv(_settings(), ["--target", "trn2"]).count("--target") == 1   # the user's stays
    from deploy.bench.__main__ import _hardware

    assert _hardware("trn3")["hardware"]["name"] == "trn3"


# ------------------------------------------------------------------ capacity blocks


def _block(zone, itype="trn2.3xlarge"):
    return {"CapacityReservations": [{
        "CapacityReservationId": "cr-0abc", "InstanceType": itype, "AvailabilityZone": zone,
        "State": "active", "ReservationType": "capacity-block",
        "StartDate": "2026-11-27T00:00:00Z", "EndDate": "2026-11-28T00:00:00Z"}]}


def test_capacity_block_uses_its_zone_and_says_it_is_paid_up_front(aws, capsys):
    ec2 = aws.clients["ec2"]
    sent = []
    ec2.describe_capacity_reservations = lambda **kw: sent.append(kw) or _block("sa-east-1b")
    s = _settings(capacity_reservation_id="cr-0abc")
    r = W.resolve(aws.clients, s)
    assert sent == [{"CapacityReservationIds": ["cr-0abc"]}]
    assert r.zones == ["sa-east-1b"]   # the block's zone, not every on-demand offering zone
    assert ec2.describe_subnets(SubnetIds=[r.subnet_id])["Subnets"][0]["AvailabilityZone"] == "sa-east-1b"
    text = W.plan_text(s, r, with_run=True, bench_args=["--set", "smoke"])
    assert "paid up front when purchased" in text and "no instance-hour charge" in text
    assert "instance        capacity block cr-0abc (trn2.3xlarge in sa-east-1b, active)" in text
    assert "instance        $" not in text   # the on-demand rate does not apply
    assert "ec2.describe_capacity_reservations" in text
    ec2.describe_capacity_reservations = lambda **kw: _block("sa-east-1b", "trn2.48xlarge")
    with pytest.raises(LookupError, match="holds trn2.48xlarge"):
        W.resolve(aws.clients, _settings(capacity_reservation_id="cr-0abc"))


# ------------------------------------------------------------------ cost


def test_cost_adds_disk_and_s3_transfer():
    s = _settings(ttl_hours=2, hourly_price=3.0)
    lines = W.cost_lines(s, 3.0, "--hourly-price", ["--set", "smoke", "--warmup", "1", "--runs", "3"], None)
    text = "\n".join(lines)
    disk = C.ROOT_VOLUME_GB * C.EBS_GP3_USD_PER_GB_MONTH * 2 / C.HOURS_PER_MONTH
    gb = 6 * (C.ASSUMED_INPUTS_MB_PER_CASE + 4 * C.ASSUMED_NTFF_MB) / 1024
    assert f"-> at most ${disk:.2f}" in text and "6 cases x" in text
    assert f"~{gb:.1f} GB" in text and f"~${gb * C.S3_EGRESS_USD_PER_GB:.2f}" in text
    assert f"at most ~${6.0 + disk + gb * C.S3_EGRESS_USD_PER_GB:.2f}" in text


# ------------------------------------------------------------------ NEFFs and inputs


def test_neff_written_to_the_working_directory_is_found(tmp_path, fake_toolchain, monkeypatch):
    """With NEURON_FRAMEWORK_DEBUG the 2.31 docs keep artifacts in the cwd, not in
    NKI_ARTIFACTS_DIR: the worker finds the NEFF there, and the case is timed."""
    from deploy.bench.__main__ import main as bench_main

    monkeypatch.setenv("FAKE_NKI_NEFF_IN_CWD", "1")
    out = tmp_path / "bench"
    code = bench_main(["--set", "smoke", "--case", "short_conv_decode/tiny", "--out", str(out),
                       "--warmup", "1", "--runs", "2", "--no-model", "--lnc", "1"])
    data = json.loads((out / "results.json").read_text())
    (m,) = data["measured"]
    assert code == 0 and m["status"] == "passed" and m["measured_ns_p50"], m["error"]
    assert list((out / "cases").glob("*/work/neuronxcc-*/graph.neff"))


def test_a_launch_whose_inputs_were_not_saved_is_not_timed(tmp_path, monkeypatch):
    import numpy as np

    from deploy.bench import __main__ as BM
    from deploy.bench import profiler as PR
    from deploy.bench import worker as WK
    from nki_ssm import backend

    monkeypatch.setattr(backend, "run", lambda kernel, *a, **k: None)

    def kernel(x, y):
        return x

    with WK.capture_launches(tmp_path / "inputs", [tmp_path]) as launches:
        backend.run(kernel, np.zeros(4), np.ones(4), np.ones(4))   # does not bind to (x, y)
    (ln,) = launches
    assert ln["inputs"] == [] and "could not be named" in ln["inputs_error"]
    ln["neff"] = {"path": str(tmp_path / "k.neff")}

    def never(*a, **k):
        raise AssertionError("profiled a launch without its inputs")

    monkeypatch.setattr(PR, "profile", never)
    a = BM._parse(["--no-model"])
    got = BM.time_case(None, tmp_path, {"status": "passed", "launches": launches}, a)
    assert got["error"].startswith("not timed: launch 0: the arguments of kernel could not be named")


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize("argv, message", [
    (["--ttl-hours", "0"], "--ttl-hours: must be in [0.5, 48]"),
    (["--ttl-hours", "-1"], "--ttl-hours: must be in"),
    (["--ttl-hours", "49"], "--ttl-hours: must be in"),
    (["--ttl-hours", "nan"], "--ttl-hours: must be in"),
    (["--ttl-hours", "inf"], "--ttl-hours: must be in"),
    (["--hourly-price", "nan"], "--hourly-price: must be a finite number"),
    (["--hourly-price", "-2"], "--hourly-price: must be a finite number"),
    (["--instance-type", "p5.48xlarge"], "--instance-type: instance type must be a Trainium type"),
    (["--instance-type", "trn2.3xlarge; rm"], "--instance-type: instance type must be a Trainium"),
    (["--profile", "no-such-profile"], "--profile no-such-profile: no such profile"),
    (["--bench-args", "--set nope"], "--bench-args '--set nope': not valid arguments"),
    (["--run-id", "Run_1"], "--run-id: run_id must be 1-40 characters"),
    (["--bucket", "s3://b/x"], "--bucket: must be an S3 bucket name"),
])
def test_bad_arguments_are_argparse_errors(argv, message, no_credentials, capsys):
    for verb in ("run",) if "--bench-args" in argv else ("launch", "run", "host-script"):
        with pytest.raises(SystemExit) as exc:
            main([verb, "--dry-run", *argv] if verb != "host-script" else [verb, *argv])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


def test_report_of_a_missing_file_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", "/nonexistent"])
    assert exc.value.code == 2 and "no results.json at /nonexistent" in capsys.readouterr().err


def test_non_trainium_type_is_refused_before_any_aws_call(monkeypatch, capsys):
    """With credentials present, a wrong type used to create the IAM role first."""
    botocore = pytest.importorskip("botocore.client")

    def refuse(self, operation_name, api_params):
        raise AssertionError(f"AWS call {operation_name} before the type was checked")

    monkeypatch.setattr(botocore.BaseClient, "_make_api_call", refuse)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with pytest.raises(SystemExit) as exc:
        main(["launch", "--bucket", "my-bucket", "--instance-type", "m7i.large"])
    assert exc.value.code == 2 and "Trainium" in capsys.readouterr().err


def test_deploy_extra_brings_what_report_needs():
    tomllib = pytest.importorskip("tomllib")
    py = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    deploy = py["project"]["optional-dependencies"]["deploy"]
    assert any(d.startswith("matplotlib") for d in deploy)
    assert any(d.startswith("boto3") for d in deploy)


# ------------------------------------------------------------------ teardown


def test_teardown_reads_every_page_of_the_iam_listings():
    from deploy.provision import teardown as T

    tags = [{"Key": C.TAG_PROJECT, "Value": C.PROJECT}, {"Key": C.TAG_RUN_ID, "Value": "r9"}]

    class Iam:
        def list_instance_profiles(self, PathPrefix, Marker=None):
            if Marker is None:
                return {"InstanceProfiles": [{"InstanceProfileName": "other", "Tags": [tags[0]]}],
                        "IsTruncated": True, "Marker": "m1"}
            return {"InstanceProfiles": [{"InstanceProfileName": "mine", "Tags": tags}],
                    "IsTruncated": False}

        def list_roles(self, PathPrefix, Marker=None):
            if Marker is None:
                return {"Roles": [{"RoleName": "other"}], "IsTruncated": True, "Marker": "m1"}
            return {"Roles": [{"RoleName": "mine"}], "IsTruncated": False}

        def list_role_tags(self, RoleName):
            return {"Tags": tags if RoleName == "mine" else [tags[0]]}

    class Ec2:
        def describe_instances(self, **kw):
            return {"Reservations": []}

        def describe_security_groups(self, **kw):
            return {"SecurityGroups": []}

    found = T.find(Ec2(), Iam(), "r9")
    assert found.instance_profiles == ["mine"] and found.roles == ["mine"]


def test_every_planned_payload_validates_against_botocore():
    """Every request the plan prints (with a capacity block and a trn3 family, the run's SSM
    command included) is valid input of its operation in botocore's service models."""
    import botocore.session
    from botocore import xform_name
    from botocore.validate import ParamValidator

    session = botocore.session.get_session()
    for s in (_settings(capacity_reservation_id="cr-0abc"), _settings(family="trn3", sdk="2.33")):
        calls = P.lookup_calls(s) + P.create_calls(s) + P.teardown_calls(s.run_id)
        if C.kernels_refusal(s.profile) is None:       # 2.33: `launch` only
            calls += W.run_calls(s, instance_id="i-0", bench_args=["--set", "smoke"])
        assert "describe_capacity_reservations" in [c.operation for c in calls] or s.family
        for c in calls:
            model = session.get_service_model(c.service)
            ops = {xform_name(o): o for o in model.operation_names}
            shape = model.operation_model(ops[c.operation]).input_shape
            report = ParamValidator().validate(c.params, shape)
            assert not report.has_errors(), (c.service, c.operation, report.generate_report())


def test_the_bench_on_a_trn3_host_targets_trn3(tmp_path, fake_toolchain, monkeypatch):
    """By hand, without --target: the instance type from IMDS picks the target."""
    from deploy.bench import __main__ as BM

    monkeypatch.setattr(BM, "_instance_type", lambda: "trn3.48xlarge")
    out = tmp_path / "bench"
    assert BM.main(["--set", "smoke", "--case", "short_conv_decode/tiny", "--out", str(out),
                    "--compile-only", "--no-model"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["target"] == "trn3" and data["hardware"]["name"] == "trn3"
    (m,) = data["measured"]
    assert m["target"] == "trn3" and m["status"] == "compiled"
    (neff,) = (out / "cases").glob("*/inputs/launch_0/kernel.neff")
    assert b"target=trn3" in neff.read_bytes()      # what the (fake) compiler was told
