"""Run the bench on the host through SSM Run Command (no SSH, no open port).

The project source goes to ``s3://<bucket>/<prefix>/src/`` as a tarball; the
command downloads it with the instance role, installs it into the DLAMI's
PyTorch venv with the ``neuron`` extra, runs ``python -m deploy.bench`` and
copies the results folder back to ``s3://<bucket>/<prefix>/results/``.
"""
from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
import time
from pathlib import Path

from deploy import config as C

SOURCE_KEY = "src/nki-ssm-src.tar.gz"
WORK_ROOT = "/opt/nki-ssm-bench"
_TERMINAL = {"Success", "Cancelled", "TimedOut", "Failed", "Cancelling"}


def source_files(repo: Path) -> list[str]:
    """Files to ship: git-tracked ones when in a git work tree, else the package folders."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    keep = ("nki_ssm/", "simulate/", "deploy/", "pyproject.toml", "README.md")
    return sorted(str(p.relative_to(repo)) for p in repo.rglob("*")
                  if p.is_file() and str(p.relative_to(repo)).startswith(keep)
                  and "__pycache__" not in p.parts)


def source_tarball(repo: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in source_files(repo):
            if (repo / rel).is_file():
                tar.add(repo / rel, arcname=rel)
    return buf.getvalue()


def bench_commands(*, bucket: str, prefix: str, region: str, run_id: str, bench_args: list[str],
                   venv: str = C.DLAMI_VENV) -> list[str]:
    """The shell lines of the Run Command (AWS-RunShellScript, as root)."""
    work = f"{WORK_ROOT}/{run_id}"
    s3 = f"s3://{bucket}/{prefix}"
    args = " ".join(shlex.quote(a) for a in bench_args)
    return [
        "set -uo pipefail",
        "export HOME=/root",
        f"mkdir -p {work}/src {work}/results && cd {work}",
        f"aws s3 cp --region {region} {s3}/{SOURCE_KEY} src.tar.gz",
        "tar -xzf src.tar.gz -C src",
        f"source {venv}/bin/activate",
        f"pip install --quiet --extra-index-url {C.NEURON_PIP_INDEX} -e 'src[neuron,report]'",
        "cd src",
        f"python -m deploy.bench --out {work}/results {args} 2>&1 | tee {work}/results/bench.log",
        "rc=${PIPESTATUS[0]}",
        f"aws s3 cp --region {region} --recursive --only-show-errors {work}/results {s3}/results/",
        "exit $rc",
    ]


def send_command_params(*, instance_id: str, commands: list[str], bucket: str, prefix: str,
                        run_id: str, timeout_s: int) -> dict:
    return {
        "InstanceIds": [instance_id],
        "DocumentName": "AWS-RunShellScript",
        "Comment": f"{C.PROJECT} run {run_id}"[:100],
        "Parameters": {"commands": commands, "executionTimeout": [str(timeout_s)]},
        "TimeoutSeconds": 600,                      # to start delivering the command
        "OutputS3BucketName": bucket,
        "OutputS3KeyPrefix": f"{prefix}/ssm-output",
    }


def upload_source(s3, bucket: str, prefix: str, repo: Path) -> str:
    key = f"{prefix}/{SOURCE_KEY}"
    s3.put_object(Bucket=bucket, Key=key, Body=source_tarball(repo))
    return key


def wait_online(ssm, instance_id: str, timeout_s: float = 900, poll_s: float = 15, log=print) -> None:
    """Until the SSM agent of the instance reports Online (the DLAMI ships the agent)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        info = ssm.describe_instance_information(
            Filters=[{"Key": "InstanceIds", "Values": [instance_id]}]).get("InstanceInformationList", [])
        if info and info[0].get("PingStatus") == "Online":
            return
        log(f"  waiting for the SSM agent of {instance_id} ...")
        time.sleep(poll_s)
    raise TimeoutError(f"{instance_id} did not register with SSM within {timeout_s:.0f} s "
                       "(outbound HTTPS to ssm/ssmmessages/ec2messages needed)")


def wait_command(ssm, command_id: str, instance_id: str, timeout_s: float, poll_s: float = 30,
                 log=print) -> dict:
    """Poll the invocation until it ends -> get_command_invocation's answer."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            inv = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
        except Exception as exc:  # InvocationDoesNotExist right after send_command
            if "InvocationDoesNotExist" not in str(exc):
                raise
            inv = {"Status": "Pending"}
        status = inv.get("Status")
        if status in _TERMINAL:
            return inv
        if time.monotonic() > end:
            raise TimeoutError(f"bench command {command_id} still {status} after {timeout_s:.0f} s")
        log(f"  bench {status} ...")
        time.sleep(poll_s)
