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
    assert "region          sa-east-1: enabled on every account (not an opt-in region)" in out
    assert "/aws/service/neuron/dlami/torch-neuronx-2.14.0/ubuntu-24.04/latest/image_id" in out
    assert "Neuron SDK      2.34.0 (NKI 0.8.0), venv /opt/aws_neuronx_venv_torch_neuronx_2_14_0" in out
    assert "instance        unknown (" in out and "pass --hourly-price" in out
    for call in ("ec2.describe_regions", "ssm.get_parameter", "ec2.describe_instance_types",
                 "ec2.describe_instance_type_offerings",
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
    assert "--target trn3 --sdk 2.34.0" in out


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


# ------------------------------------------------------------------ examples and optional deps

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _examples(text: str, markdown: bool = False) -> list[str]:
    """The `python -m deploy...` commands of a text: its lines (help), or (``markdown``) the
    lines of its code blocks and its inline code spans; trailing comments dropped."""
    import re

    out, fenced = [], False
    for line in text.splitlines():
        if markdown and line.startswith("```"):
            fenced = not fenced
            continue
        if markdown and not fenced:
            out += re.findall(r"`(python -m deploy(?:\.bench)?(?=[ `])[^`]*)`", line)
            continue
        m = re.match(r"\s*(python -m deploy(?:\.bench)?(?=\s|$)[^#]*)", line)
        if m and "{" not in line:                      # not the synopsis line
            out.append(m.group(1).strip())
    return [e.strip() for e in out]


def _help_text(capsys) -> str:
    with pytest.raises(SystemExit):
        main(["--help"])
    return capsys.readouterr().out


def test_every_example_runs_as_written_with_dry_run(aws, capsys, tmp_path, monkeypatch):
    """Every example of `python -m deploy --help` and deploy/README.md, as written plus
    --dry-run, exits 0 (against the moto account: credentials present, nothing created)."""
    import shlex

    from deploy.bench.__main__ import main as bench_main

    aws.clients["s3"].create_bucket(Bucket="my-bucket",
                                    CreateBucketConfiguration={"LocationConstraint": aws.region})
    monkeypatch.chdir(tmp_path)                  # `report reports/<run id>` looks here
    help_examples = _examples(_help_text(capsys))
    readme = _examples((REPO / "deploy" / "README.md").read_text(), markdown=True)
    assert len(help_examples) >= 10 and len(readme) >= 15
    verbs = set()
    for line in help_examples + readme:
        argv = shlex.split(line)
        bench = argv[2] == "deploy.bench"
        args = argv[3:] + ([] if "--dry-run" in argv else ["--dry-run"])
        if args[0] == "--help":
            _help_text(capsys)
            continue
        code = (bench_main if bench else main)(args)
        out = capsys.readouterr()
        assert code == 0, (line, out.out[-800:], out.err[-800:])
        if not bench:
            verbs.add(args[0])
            assert "nothing was" in out.out or args[0] in ("host-script", "ami"), line
    assert verbs == set(__import__("deploy.__main__").__main__.VERBS)


def test_help_examples_use_valid_names(capsys):
    """No placeholder that the argument checks refuse (a bucket `B`, a run id `RUN`)."""
    text = _help_text(capsys)
    for bad in ("--bucket B", "--run-id RUN", "reports/RUN"):
        assert bad not in text
    readme = (REPO / "deploy" / "README.md").read_text()
    assert "today" not in readme.lower()           # dates are stated "as of"


@pytest.mark.parametrize("argv", [
    ["launch", "--bucket", "my-bucket"], ["run", "--bucket", "my-bucket"], ["ami"],
    ["collect", "--run-id", "r1", "--bucket", "my-bucket"], ["teardown", "--expired"],
])
def test_without_boto3_the_error_is_one_line(argv, monkeypatch, capsys):
    import sys

    for name in ("boto3", "botocore", "botocore.session", "botocore.config"):
        monkeypatch.setitem(sys.modules, name, None)     # `import boto3` raises ImportError
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"error: `python -m deploy {argv[0]}` needs boto3 (the deploy extra): "
                   "pip install -e '.[deploy]'\n")
    assert main(["run", "--dry-run"]) == 0              # the plan needs none
    assert "boto3 not installed" in capsys.readouterr().out


def test_without_matplotlib_report_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    import shutil
    import sys

    shutil.copy(REPO / "tests" / "deploy" / "data" / "results_fabricated.json",
                tmp_path / "results.json")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("error: `python -m deploy report` needs matplotlib (the "
                                       "deploy extra): pip install -e '.[deploy]'\n")
