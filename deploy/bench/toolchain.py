"""Pin and verify the toolchain before anything is compiled.

Python packages (importlib.metadata) against config.PIP_PINS, the runtime and
tools (dpkg-query) against config.APT_PINS, ``neuronx-cc --version``, and (not
with --compile-only) ``neuron-ls --json-output`` for the devices. A mismatch
stops the bench unless --allow-version-mismatch: numbers measured with another
compiler are not this release's numbers.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import subprocess

from deploy import config as C
from deploy.bench.profiler import tool_path


def _run(argv, timeout=120) -> str:
    proc = subprocess.run(argv, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')[-400:]}")
    return proc.stdout.decode(errors="replace")


def pip_versions(names=tuple(C.PIP_PINS)) -> dict:
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def apt_versions(names=tuple(C.APT_PINS), run=_run) -> dict:
    out = {}
    for n in names:
        try:
            out[n] = run(["dpkg-query", "-W", "-f=${Version}", n]).strip() or None
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            out[n] = None
    return out


def mismatches(found: dict, pins: dict) -> list[str]:
    """Pins not met: missing package, or a version that does not start with the pin
    (dpkg versions carry a build suffix, e.g. 2.33.10.0-abc)."""
    bad = []
    for name, want in pins.items():
        got = found.get(name)
        if got is None:
            bad.append(f"{name}: not installed (want {want})")
        elif not (got == want or got.startswith(want + "-") or got.startswith(want + "+")):
            bad.append(f"{name}: {got} installed, SDK {C.SDK_RELEASE} pins {want}")
    return bad


def neuron_devices(doc) -> int:
    """Number of Neuron devices in ``neuron-ls --json-output`` (a list of devices)."""
    data = json.loads(doc) if isinstance(doc, (str, bytes)) else doc
    if isinstance(data, dict):
        data = data.get("neuron_devices", data.get("devices", []))
    return len(data) if isinstance(data, list) else 0


def check(*, compile_only: bool, tools_bin: str | None = None, run=_run) -> dict:
    """-> {"pip", "apt", "neuronx_cc", "neuron_ls", "devices", "mismatches", "ok"}."""
    info = {"sdk_release": C.SDK_RELEASE, "pip": pip_versions(), "apt": {}, "neuronx_cc": None,
            "neuron_ls": None, "devices": None}
    bad = mismatches(info["pip"], C.PIP_PINS)
    try:
        info["neuronx_cc"] = run([tool_path(tools_bin, "neuronx-cc"), "--version"]).strip()[-200:]
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        bad.append(f"neuronx-cc --version failed: {exc}")
    if not compile_only:
        info["apt"] = apt_versions(run=run)
        bad += mismatches(info["apt"], C.APT_PINS)
        try:
            doc = run([tool_path(tools_bin, "neuron-ls"), "--json-output"])
            info["neuron_ls"] = json.loads(doc)
            info["devices"] = neuron_devices(info["neuron_ls"])
            if not info["devices"]:
                bad.append("neuron-ls lists no Neuron device")
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            bad.append(f"neuron-ls --json-output failed: {exc}")
    info["mismatches"] = bad
    info["ok"] = not bad
    return info
