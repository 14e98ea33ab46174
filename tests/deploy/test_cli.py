"""python -m deploy: the verbs, the dry-run plan without credentials, and the clear error
when credentials are missing (before any API call)."""
from __future__ import annotations

import pytest

from deploy.__main__ import main


@pytest.fixture
def no_api_calls(monkeypatch):
    """Fail the test on any botocore API call."""
    botocore = pytest.importorskip("botocore.client")

    def refuse(self, operation_name, api_params):
        raise AssertionError(f"unexpected AWS call {operation_name}")

    monkeypatch.setattr(botocore.BaseClient, "_make_api_call", refuse)


def test_help_lists_the_verbs(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for verb in ("launch", "run", "collect", "report", "teardown"):
        assert verb in out


def test_dry_run_prints_the_plan_without_credentials(no_credentials, no_api_calls, capsys):
    assert main(["launch", "--dry-run", "--run-id", "20261124-120000-abcd"]) == 0
    out = capsys.readouterr().out
    assert "no AWS credentials" in out and "nothing was created" in out
    assert "instance type   trn2.3xlarge" in out
    assert "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id" in out
    assert "instance        $2.235/h" in out and "unverified" in out
    for call in ("ssm.get_parameter", "ec2.describe_instance_types", "ec2.describe_instance_type_offerings",
                 "pricing.get_products", "iam.create_role", "iam.attach_role_policy",
                 "iam.put_role_policy", "iam.create_instance_profile", "ec2.create_security_group",
                 "ec2.run_instances"):
        assert call in out
    assert '"HttpTokens": "required"' in out and '"InstanceInitiatedShutdownBehavior": "terminate"' in out
    assert "KeyName" not in out and "authorize_security_group_ingress" not in out
    assert '"Key": "nki-ssm:ttl-expires"' in out
    assert "CREATE ec2.run_instances" in out and "read   ssm.get_parameter" in out
    assert out.index("Teardown (") < out.index("ec2.terminate_instances") < out.index("iam.delete_role ")


def test_run_dry_run_adds_the_ssm_steps_and_a_family(no_credentials, no_api_calls, capsys):
    assert main(["run", "--dry-run", "--family", "trn3", "--bucket", "my-bucket", "--hourly-price", "7"]) == 0
    out = capsys.readouterr().out
    assert "the smallest offered trn3.* type (discovered at run time)" in out
    assert '"InstanceType": "<smallest offered trn3 type>"' in out
    assert '"Values": [\n              "trn3.*"' in out
    assert "ssm.send_command" in out and "-m deploy.bench" in out
    assert "$7.000/h (--hourly-price)" in out
    # a trn3 host compiles and models for trn3 (issue 27 item 5): the plan says so, and the
    # bench command of the SSM document carries it
    assert "compile target  --target trn3" in out
    assert "--target trn3 --sdk 2.32.0" in out


def test_missing_credentials_fail_clearly_before_any_call(no_credentials, no_api_calls, capsys):
    for argv in (["launch", "--bucket", "my-bucket"], ["run", "--bucket", "my-bucket"], ["teardown", "--run-id", "x1"],
                 ["collect", "--run-id", "x1", "--bucket", "my-bucket"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "needs AWS credentials and none were found" in err and "--dry-run" in err


def test_launch_needs_a_bucket(capsys):
    assert main(["launch"]) == 2
    assert "--bucket is required" in capsys.readouterr().err


def test_neuron_extras_pin_the_sdk_profiles_of_config():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")   # Python 3.11+

    from deploy import config as C

    py = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = py["project"]["optional-dependencies"]
    for prof in C.SDK_PROFILES.values():   # what the host installs is what the check expects
        assert sorted(extras[prof.extra]) == sorted(f"{k}=={v}" for k, v in prof.pip_pins.items())
    assert any(d.startswith("boto3") for d in extras["deploy"])
    for need in ("boto3", "moto", "cfn-lint"):      # CI installs the test extra
        assert any(d.startswith(need) for d in extras["test"])
