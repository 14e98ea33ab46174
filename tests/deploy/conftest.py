"""Fixtures of the deploy tests: a moto-backed AWS account seeded like a real one, and the
FAKE Neuron toolchain (fake `nki` package, neuronx-cc, neuron-ls, neuron-explorer, dpkg-query)."""
from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from moto_env import BUCKET, REGION, register_dlami, seed_reserved_parameter

FAKES = Path(__file__).parent / "fakes"
TOOLS = ("neuron-explorer", "neuron-ls", "neuronx-cc", "dpkg-query")


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """An environment with no AWS credentials anywhere (env, files, profile)."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")   # no IMDS look-up for credentials


def seed_managed_policy(name: str) -> None:
    """One AWS managed policy in moto's IAM backend (loading all of them costs seconds per test)."""
    import json

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.aws_managed_policies import aws_managed_policies_data
    from moto.iam.models import AWSManagedPolicy, iam_backends

    backend = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
    policy = AWSManagedPolicy.from_data(name, DEFAULT_ACCOUNT_ID, backend.region_name,
                                        json.loads(aws_managed_policies_data)[name])
    backend.managed_policies[policy.arn] = policy


@dataclass
class AwsEnv:
    session: object
    clients: dict
    ami: str
    bucket: str = BUCKET
    region: str = REGION


@pytest.fixture
def aws(monkeypatch, no_credentials):
    """moto account in the default region: the SDK 2.34.0 TorchNeuron DLAMI registered and
    its (UNVERIFIED) SSM parameter seeded, the results bucket created; dummy credentials in
    the env. Instance-type offerings and region opt-in states are moto's own data, not added
    here: the default pair must be offered by that data, the default region enabled."""
    boto3 = pytest.importorskip("boto3")
    from moto import mock_aws

    from deploy import config as C

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    with mock_aws():
        seed_managed_policy(C.SSM_CORE_POLICY_ARN.rsplit("/", 1)[1])
        sess = boto3.session.Session(region_name=REGION)
        clients = {svc: sess.client(svc, region_name=REGION) for svc in ("ec2", "iam", "ssm", "s3")}
        clients["regions"] = sess.client("ec2", region_name=C.REGION_STATUS_ENDPOINT)
        ami = register_dlami(clients["ec2"])
        seed_reserved_parameter(C.SDK_PROFILES[C.DEFAULT_SDK].ssm_parameters[0], ami)
        clients["s3"].create_bucket(Bucket=BUCKET,
                                    CreateBucketConfiguration={"LocationConstraint": REGION})
        yield AwsEnv(sess, clients, ami)


@pytest.fixture
def fake_toolchain(tmp_path, monkeypatch):
    """FAKE Neuron SDK on PATH / sys.path: tools in tmp/bin, the fake `nki` package and the
    pinned packages' metadata of the default SDK (tests/deploy/fakes/sdk-meta/<release>).
    Device present unless told."""
    from deploy import config as C

    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in TOOLS:
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(FAKES)!r})\n"
                          f"from tools import main\nsys.exit(main({name!r}, sys.argv[1:]))\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    sdk, meta = str(FAKES / "sdk"), str(FAKES / "sdk-meta" / C.DEFAULT_SDK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [sdk, meta, os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(sdk)
    monkeypatch.syspath_prepend(meta)         # package metadata for the in-process toolchain check
    monkeypatch.setenv("FAKE_NEURON_SDK", C.DEFAULT_SDK)
    monkeypatch.setenv("NKI_SSM_BACKEND", "sim")   # restored after the test (the bench sets it)
    monkeypatch.setenv("FAKE_NEURON_DEVICE", "1")
    for k in ("FAKE_NKI_COMPILE_ERROR", "FAKE_NKI_NO_WRITEBACK", "FAKE_NKI_NEFF_IN_CWD", "FAKE_NKI_HANG"):
        monkeypatch.delenv(k, raising=False)
    return bin_dir
