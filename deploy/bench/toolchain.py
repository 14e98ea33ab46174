"""Pin and verify the toolchain before anything is compiled.

Python packages (importlib.metadata) against the SDK profile's pip pins, the runtime
and tools (dpkg-query) against its apt pins (config.SDK_PROFILES), ``neuronx-cc --version``, and (not
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


def pip_versions(names) -> dict:
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def apt_versions(names, run=_run) -> dict:
    out = {}
    for n in names:
        try:
            out[n] = run(["dpkg-query", "-W", "-f=${Version}", n]).strip() or None
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            out[n] = None
    return out


def mismatches(found: dict, pins: dict, release: str = C.SDK_RELEASE) -> list[str]:
    """Pins not met: missing package, or a version that does not start with the pin
    (dpkg versions carry a build suffix, e.g. 2.33.10.0-abc; the Neuron wheels a local
    version, e.g. nki 0.6.0+31049202112.g85070674)."""
    bad = []
    for name, want in pins.items():
        got = found.get(name)
        if got is None:
            bad.append(f"{name}: not installed (want {want})")
        elif not (got == want or got.startswith(want + "-") or got.startswith(want + "+")):
            bad.append(f"{name}: {got} installed, SDK {release} pins {want}")
    return bad


def neuron_devices(doc) -> int:
    """Number of Neuron devices in ``neuron-ls --json-output`` (a list of devices)."""
    data = json.loads(doc) if isinstance(doc, (str, bytes)) else doc
    if isinstance(data, dict):
        data = data.get("neuron_devices", data.get("devices", []))
    return len(data) if isinstance(data, list) else 0


def check(*, compile_only: bool, tools_bin: str | None = None, run=_run,
          profile: C.SdkProfile | None = None) -> dict:
    """-> {"sdk_release", "nki", "pip", "apt", "neuronx_cc", "neuron_ls", "devices",
    "mismatches", "ok"} against the pins of ``profile`` (default: config.DEFAULT_SDK)."""
    prof = profile or C.SDK_PROFILES[C.DEFAULT_SDK]
    info = {"sdk_release": prof.release, "nki": prof.nki, "pip": pip_versions(prof.pip_pins),
            "apt": {}, "neuronx_cc": None, "neuron_ls": None, "devices": None}
    bad = mismatches(info["pip"], prof.pip_pins, prof.release)
    try:
        info["neuronx_cc"] = run([tool_path(tools_bin, "neuronx-cc"), "--version"]).strip()[-200:]
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        bad.append(f"neuronx-cc --version failed: {exc}")
    if not compile_only:
        info["apt"] = apt_versions(prof.apt_pins, run=run)
        bad += mismatches(info["apt"], prof.apt_pins, prof.release)
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
