"""The package is whole: metadata, the data files it reads at run time, and a one-line hint
naming the extra to install when an optional dependency is missing."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]


def test_metadata_and_package_data():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["license"] == "Apache-2.0"                     # SPDX expression, no table
    assert all((ROOT / f).is_file() for f in project["license-files"])
    assert any(c.startswith("Programming Language :: Python :: 3") for c in project["classifiers"])
    assert not any(c.startswith("License ::") for c in project["classifiers"])   # PEP 639
    assert all(u.startswith("https://") for u in project["urls"].values())
    # every data file under nki_ssm/ that the code reads is declared package data
    declared = {Path(pkg.replace(".", "/")) / name
                for pkg, names in meta["tool"]["setuptools"]["package-data"].items() for name in names}
    data = {p.relative_to(ROOT) for p in (ROOT / "nki_ssm").rglob("*")
            if p.is_file() and p.suffix in (".json", ".toml")}
    assert data and data <= declared
    assert all((ROOT / p).is_file() for p in declared)


def _reimport_without(monkeypatch, missing: str, module: str):
    """Import ``module`` afresh as if ``missing`` were not installed."""
    monkeypatch.setitem(sys.modules, missing, None)            # import of it raises ImportError
    for name in [n for n in sys.modules if n == module or n.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module(module)


def test_missing_torch_names_the_extra(monkeypatch):
    with pytest.raises(ImportError, match=r"nki_ssm.torch needs PyTorch: pip install 'nki-ssm\[torch\]'"):
        _reimport_without(monkeypatch, "torch", "nki_ssm.torch")


def test_missing_matplotlib_names_the_install(monkeypatch, tmp_path):
    plots = _reimport_without(monkeypatch, "matplotlib", "nki_ssm.perf.plots")
    with pytest.raises(ImportError, match=r"plots need matplotlib: pip install 'matplotlib>=3.7'"):
        plots.roofline_png([], tmp_path / "r.png")
