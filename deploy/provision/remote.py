"""Run the bench on the host through SSM Run Command (no SSH, no open port).

The project source goes to ``s3://<bucket>/<prefix>/src/`` as a tarball; the
command (POSIX sh: :func:`bench_commands`) downloads it with the instance role,
installs it into the DLAMI venv of the SDK profile (which holds ``nki`` and
``neuronx-cc``; the profile's extra pins exactly those versions; when that venv is not
there, the ``/opt`` venv holding the profile's ``nki``), runs
``python -m deploy.bench`` and copies the results folder to
``s3://<bucket>/<prefix>/results/`` after every case and on exit.
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


# The root of every host path in the script: empty on the host; the offline tests run the
# very same script under /bin/sh with a temporary root holding fake tools.
HOST_ROOT_VAR = "NKI_SSM_HOST_ROOT"


def bench_commands(*, bucket: str, prefix: str, region: str, run_id: str, bench_args: list[str],
                   venv: str, nki: str, extra: str, bench_timeout_s: int) -> list[str]:
    """The lines of the Run Command: a POSIX sh script (AWS-RunShellScript hands them to
    ``sh``, which is dash on Ubuntu: no ``pipefail``, ``source`` or ``PIPESTATUS``).

    The bench runs the DLAMI venv's python directly (no activation): ``venv``, else the
    ``/opt/aws_neuronx_venv_*`` that holds ``nki`` ``nki`` (the venv's name is not verified
    for every release), else the script stops naming the venvs it found. It runs under
    ``timeout`` shorter than the SSM executionTimeout, copies the results to S3 after every
    case (``--upload-to``), and an EXIT trap copies them once more however the script ends
    (success, a failed step, the timeout, SIGTERM)."""
    q = shlex.quote
    work = f"$R{WORK_ROOT}/{run_id}"
    s3 = f"s3://{bucket}/{prefix}"
    args = " ".join(q(a) for a in bench_args)
    dist = f"nki-{nki}*.dist-info"
    return [
        f"# {C.PROJECT} run {run_id}: POSIX sh (AWS-RunShellScript runs sh; dash on Ubuntu)",
        "set -u",
        f'R="${{{HOST_ROOT_VAR}:-}}"',
        f'W="{work}"',
        f'V="$R{venv}"',
        f"S3={q(s3)}",
        f"REGION={q(region)}",
        'HOME="$R/root"',
        "export HOME",
        # single quotes: expanded when the trap runs, i.e. on every way out of the script
        """trap 'aws s3 sync --region "$REGION" --only-show-errors "$W/results" "$S3/results" """
        """|| echo "nki-ssm-bench: results upload failed" >&2' EXIT""",
        "trap 'exit 129' HUP",
        "trap 'exit 130' INT",
        "trap 'exit 143' TERM",
        'mkdir -p "$W/src" "$W/results" || exit 1',
        # the venv holding the pinned nki when the expected one is not there
        'if [ ! -x "$V/bin/python" ]; then for d in "$R"/opt/aws_neuronx_venv_*; do '
        f'set -- "$d"/lib/python3*/site-packages/{dist}; '
        'if [ -e "$1" ]; then V="$d"; break; fi; done; fi',
        f'[ -x "$V/bin/python" ] || {{ echo "nki-ssm-bench: no venv with nki {nki} under /opt '
        f'(looked for {venv} first); launch a DLAMI of that SDK (--ami-id)" >&2; '
        'ls -d "$R"/opt/aws_neuronx_venv_* >&2; exit 1; }',
        'echo "nki-ssm-bench: venv $V"',
        f'PATH="$V/bin:$R{C.NEURON_TOOLS_BIN}:$PATH"',
        "export PATH",
        'cd "$W" || exit 1',
        f'aws s3 cp --region "$REGION" --only-show-errors "$S3/{SOURCE_KEY}" src.tar.gz || exit 1',
        "tar -xzf src.tar.gz -C src || exit 1",
        f'"$V/bin/python" -m pip install --quiet --extra-index-url {C.NEURON_PIP_INDEX} '
        f'-e "src[{extra},report]" >"$W/results/pip.log" 2>&1 '
        '|| { tail -n 40 "$W/results/pip.log"; exit 1; }',
        "cd src || exit 1",
        f'{{ timeout --kill-after=60 {int(bench_timeout_s)} "$V/bin/python" -m deploy.bench '
        f'--out "$W/results" --upload-to "$S3/results" --upload-region "$REGION" {args}; '
        'echo "$?" >"$W/bench.rc"; } 2>&1 | tee "$W/results/bench.log"',
        'rc=$(cat "$W/bench.rc" 2>/dev/null || echo 1)',
        'exit "$rc"',
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
