"""nki_ssm.backend: NKI_SSM_BACKEND=auto|neuron|sim, name(), run()."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from nki_ssm import backend
from nki_ssm.sim.install import sdk_importable

pytestmark = pytest.mark.skipif(sdk_importable(), reason="Neuron SDK present: tests assume its absence")


def test_default_backend_is_simulator():
    assert backend.name() == "sim"
    assert getattr(backend.nki, "IS_NKI_SSM_SIMULATOR", False)
    assert backend.nl.tile_size.pmax == 128
    assert callable(backend.nisa.dma_copy)


def test_resolve_choices(monkeypatch):
    assert backend.resolve("sim")[0] == "sim"
    assert backend.resolve("auto")[0] == "sim"
    monkeypatch.setenv("NKI_SSM_BACKEND", "SIM")
    assert backend.resolve()[0] == "sim"


def test_neuron_backend_without_sdk_is_a_clear_import_error():
    with pytest.raises(ImportError, match="NKI_SSM_BACKEND=neuron.*not importable"):
        backend.resolve("neuron")


def test_unknown_backend_choice_rejected(monkeypatch):
    monkeypatch.setenv("NKI_SSM_BACKEND", "gpu")
    with pytest.raises(ValueError, match="NKI_SSM_BACKEND.*'gpu'"):
        backend.resolve()


def test_import_with_neuron_env_fails_in_fresh_process():
    env = dict(os.environ, NKI_SSM_BACKEND="neuron")
    r = subprocess.run([sys.executable, "-c", "import nki_ssm.backend"], env=env,
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode != 0 and "NKI_SSM_BACKEND=neuron" in r.stderr


def test_installed_simulator_is_not_mistaken_for_sdk():
    import nki_ssm.sim as sim
    assert sim.install() is True
    try:
        import nki
        assert nki.IS_NKI_SSM_SIMULATOR
        assert backend.resolve("auto")[0] == "sim"
        with pytest.raises(ImportError):
            backend.resolve("neuron")
    finally:
        sim.uninstall()


@backend.nki.jit
def _double(x):
    nl, nisa = backend.nl, backend.nisa
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_run_on_sim(rng):
    x = rng.standard_normal((8, 4)).astype(np.float32)
    np.testing.assert_array_equal(backend.run(_double, x), 2 * x)
    np.testing.assert_array_equal(backend.run(_double, x, backend="sim"), 2 * x)


def test_run_on_neuron_without_sdk_raises(rng):
    with pytest.raises(ImportError, match="Neuron SDK"):
        backend.run(_double, np.ones((2, 2), np.float32), backend="neuron")


def test_run_unknown_backend_rejected():
    with pytest.raises(ValueError, match="'tpu'"):
        backend.run(_double, np.ones((2, 2), np.float32), backend="tpu")


def _fake_sdk(monkeypatch, version):
    """A foreign `nki` package (with language / isa) reporting ``version``."""
    for name in ("nki", "nki.language", "nki.isa"):
        mod = type(sys)(name)
        mod.__version__ = version
        monkeypatch.setitem(sys.modules, name, mod)


def test_sdk_older_than_nki_080_is_passed_over(monkeypatch):
    _fake_sdk(monkeypatch, "0.7.0+30517103.g4f8d9c1")
    with pytest.raises(ImportError, match=r"NKI 0\.7\.0.*need NKI >= 0\.8\.0 \(Neuron SDK >= 2\.34"):
        backend.resolve("neuron")
    with pytest.warns(RuntimeWarning, match="using the bundled simulator"):
        assert backend.resolve("auto")[0] == "sim"


def test_sdk_with_nki_080_is_used(monkeypatch):
    _fake_sdk(monkeypatch, "0.8.0+31049202112.g85070674")
    assert backend.resolve("neuron")[0] == "neuron"
    assert backend.resolve("auto")[1] is sys.modules["nki"]


def test_reference_choice_exports_the_auto_implementation():
    assert backend.resolve("reference")[0] == "sim"


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_with_backend(value: str, code: str):
    env = dict(os.environ, NKI_SSM_BACKEND=value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, cwd=_REPO)


def test_reference_env_makes_backend_none_the_reference_on_every_op():
    """NKI_SSM_BACKEND=reference: backend=None gives the reference's result bit for bit
    (pools included), not the kernel's."""
    code = """
import numpy as np
from nki_ssm import backend, ops
from nki_ssm.ops import _dispatch
from nki_ssm.reference import inputs
print(backend.name(), backend.default_op_backend(), _dispatch.resolve(None))
kw = inputs.make_ssd_inputs(np.random.default_rng(0), seqlens=[5, 0, 9], H=2, P=8, N=16, G=1)
kw2 = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
y_none = ops.ssd_prefill(**kw)
y_ref = ops.ssd_prefill(**kw2, backend="reference")
print(np.array_equal(y_none, y_ref), np.array_equal(kw["ssm_states"], kw2["ssm_states"]))
"""
    r = _run_with_backend("reference", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["sim", "reference", "reference", "True", "True"]


def test_invalid_env_value_fails_on_import_naming_the_variable():
    r = _run_with_backend("bogus", "import nki_ssm.backend")
    assert r.returncode != 0
    assert "NKI_SSM_BACKEND: expected one of auto, neuron, sim, reference, got 'bogus'" in r.stderr
