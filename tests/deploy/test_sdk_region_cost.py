"""What a trn2 account holder needs before spending money: today's SDK and its image, a
region / type pair that exists, the right compile target, capacity blocks in their zone,
the whole bill, NEFFs where the SDK puts them, and bad arguments refused up front."""
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


def test_default_is_sdk_2_32_on_the_multi_framework_dlami():
    prof = C.SDK_PROFILES[C.DEFAULT_SDK]
    assert (prof.release, prof.nki, prof.dlami) == ("2.32.0", "0.6.0", "multi-framework")
    # the venv the 2.32 DLAMI has (deploy/environments/dlami.rst), holding nki and neuronx-cc
    # (the vLLM 0.24.0.1.1.0 image's Dockerfile installs them there, with these versions)
    assert prof.venv == "/opt/aws_neuronx_venv_pytorch_inference_vllm_0_24_0_1_1_0"
    assert prof.pip_pins == {"neuronx-cc": "2.27.5334.0", "nki": "0.6.0"}
    assert prof.apt_pins == {"aws-neuronx-runtime-lib": "2.34.10.0", "aws-neuronx-tools": "2.32.28.0"}
    old = C.SDK_PROFILES["2.31.0"]
    assert (old.nki, old.dlami, old.venv) == ("0.5.0", "pytorch-2.9", "/opt/aws_neuronx_venv_pytorch_2_9")
    # no 2.31.1 DLAMI exists: the 2.31 image carries tools 2.31.13, not 2.31.15
    assert old.apt_pins["aws-neuronx-tools"] == "2.31.13.0"


def test_the_image_versions_meet_the_pins():
    """Versions as the 2.32 image reports them (wheels with local labels, dpkg build
    suffixes) pass the check; anything else stops the bench."""
    from deploy.bench import toolchain as TC

    prof = C.SDK_PROFILES["2.32.0"]
    pip = {"neuronx-cc": "2.27.5334.0+f702b353", "nki": "0.6.0+31049202112.g85070674"}
    apt = {"aws-neuronx-runtime-lib": "2.34.10.0-ac18d186d", "aws-neuronx-tools": "2.32.28.0-526c2b7f6"}
    assert TC.mismatches(pip, prof.pip_pins, prof.release) == []
    assert TC.mismatches(apt, prof.apt_pins, prof.release) == []
    assert TC.mismatches({**pip, "nki": "0.5.0"}, prof.pip_pins, prof.release) == [
        "nki: 0.5.0 installed, SDK 2.32.0 pins 0.6.0"]


def test_image_filters_name_framework_os_and_release():
    for prof in C.SDK_PROFILES.values():
        (name, desc) = P.image_filters(prof)
        assert desc == {"Name": "description", "Values": [f"*Neuron SDK {prof.release}*"]}
        pattern = name["Values"][0]
        assert "Ubuntu 24.04" in pattern and pattern.startswith("Deep Learning AMI Neuron")
    import fnmatch

    multi = P.image_filters(C.SDK_PROFILES["2.32.0"])[0]["Values"][0]
    assert fnmatch.fnmatchcase("Deep Learning AMI Neuron (Ubuntu 24.04) 20260817", multi)
    for other in ("Deep Learning AMI Neuron JAX 0.10 (Ubuntu 24.04) 20260817",
                  "Deep Learning AMI Neuron PyTorch Inference vLLM 0.24.0.1.1.0 (Ubuntu 24.04) 20260817",
                  "Deep Learning AMI Neuron (Amazon Linux 2023) 20260817",
                  "Deep Learning Base Neuron AMI (Ubuntu 24.04) 20260817"):
        assert not fnmatch.fnmatchcase(other, multi), other


def test_dry_run_shows_sdk_venv_pair_source_price_transfer_and_disk(no_credentials, capsys):
    assert main(["run", "--dry-run", "--bucket", "my-bucket", "--run-id", "20261127-100000-cafe"]) == 0
    out = capsys.readouterr().out
    assert "Neuron SDK      2.32.0 (NKI 0.6.0), venv /opt/aws_neuronx_venv_pytorch_inference_vllm_0_24_0_1_1_0" in out
    assert f"region          {C.DEFAULT_REGION}" in out and "offered there: moto 5.2.5" in out
    assert "elsewhere       trn2.3xlarge in sa-east-1" in out and "trn2.48xlarge in us-east-2" in out
    assert "instance        $2.235/h (Price List API not asked" in out
    assert f"disk            {C.ROOT_VOLUME_GB} GB gp3" in out
    assert "S3 transfer     ~" in out and "out of S3 by `collect`" in out
    assert "total           at most ~$" in out
    assert "compile target  --target trn2" in out


# ------------------------------------------------------------------ regions and types


def test_default_pair_is_offered_without_seeding(aws):
    """moto's offerings data (generated from AWS's answers) offers the default pair; nothing
    in conftest adds it."""
    assert REGION == C.DEFAULT_REGION
    assert (C.DEFAULT_REGION, C.DEFAULT_INSTANCE_TYPE) in {(r, t) for r, t, _ in C.OFFERING_EVIDENCE}
    r = W.resolve(aws.clients, _settings())
    assert r.instance_type == C.DEFAULT_INSTANCE_TYPE and r.zones == ["ap-southeast-4c"]
    sub = aws.clients["ec2"].describe_subnets(SubnetIds=[r.subnet_id])["Subnets"][0]
    assert sub["AvailabilityZone"] == "ap-southeast-4c"


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
    assert argv[-4:] == ["--target", "trn3", "--sdk", "2.32.0"]
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
    ec2.describe_capacity_reservations = lambda **kw: sent.append(kw) or _block("ap-southeast-4a")
    s = _settings(capacity_reservation_id="cr-0abc")
    r = W.resolve(aws.clients, s)
    assert sent == [{"CapacityReservationIds": ["cr-0abc"]}]
    assert r.zones == ["ap-southeast-4a"]   # not the on-demand offering zone (4c)
    assert ec2.describe_subnets(SubnetIds=[r.subnet_id])["Subnets"][0]["AvailabilityZone"] == "ap-southeast-4a"
    text = W.plan_text(s, r, with_run=True, bench_args=["--set", "smoke"])
    assert "paid up front when purchased" in text and "no instance-hour charge" in text
    assert "instance        capacity block cr-0abc (trn2.3xlarge in ap-southeast-4a, active)" in text
    assert "instance        $" not in text   # the on-demand rate does not apply
    assert "ec2.describe_capacity_reservations" in text
    ec2.describe_capacity_reservations = lambda **kw: _block("ap-southeast-4a", "trn2.48xlarge")
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
    for s in (_settings(capacity_reservation_id="cr-0abc"), _settings(family="trn3", sdk="2.31.0")):
        calls = (P.ami_calls(s) + P.discovery_calls(s) + P.create_calls(s)
                 + W.run_calls(s, instance_id="i-0", bench_args=["--set", "smoke"])
                 + P.teardown_calls(s.run_id))
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
