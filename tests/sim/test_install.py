"""nki_ssm.sim.install(): an unmodified `import nki` kernel file runs on the simulator."""
from __future__ import annotations

import importlib
import pathlib
import sys

import numpy as np
import pytest

import nki_ssm.sim as sim
from nki_ssm.sim.install import install, is_simulator_module, sdk_importable, uninstall

DATA = pathlib.Path(__file__).parent / "data"


@pytest.fixture
def installed(monkeypatch):
    """Install the simulator as `nki` for one test; restore sys.modules after."""
    if sdk_importable():
        pytest.skip("the Neuron SDK is installed; install() would not override it")
    monkeypatch.syspath_prepend(str(DATA))
    assert install() is True
    yield
    uninstall()
    sys.modules.pop("plain_nki_kernel", None)


def test_unmodified_kernel_file_runs(installed, rng):
    mod = importlib.import_module("plain_nki_kernel")
    import nki
    assert is_simulator_module(nki)
    a = rng.standard_normal((200, 16)).astype(np.float32)
    b = rng.standard_normal((200, 16)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate(mod.add_rows_kernel)(a, b), a + b)
    np.testing.assert_array_equal(mod.add_rows_kernel(a, b), a + b)  # direct call simulates


def test_install_registers_submodules_and_uninstall_removes(installed):
    import nki
    import nki.isa
    import nki.language
    assert nki.language is sim.language and nki.isa is sim.isa
    assert "nki.typing" in sys.modules and nki.typing.NkiTensor is sim.tensor.NkiTensor
    assert install() is True  # idempotent
    uninstall()
    assert "nki" not in sys.modules and "nki.language" not in sys.modules


def test_uninstall_leaves_foreign_nki_alone(monkeypatch):
    fake = type(sys)("nki")
    monkeypatch.setitem(sys.modules, "nki", fake)
    uninstall()
    assert sys.modules["nki"] is fake
    assert sdk_importable() is True        # a non-simulator `nki` counts as the SDK
    assert install() is False              # ... and is not replaced
    assert sys.modules["nki"] is fake


def test_sdk_simulator_entry_points(installed, rng, monkeypatch):
    """aws-neuron-sdk nki/guides/nki_simulator.rst: nki.simulate(kernel)(...) with NumPy or
    torch tensors; NKI_SIMULATOR=1 runs every @nki.jit kernel on the simulator; vLLM Neuron's
    CPU mode calls nki.simulator.simulate_kernel(func, args, kwargs, lnc=...)."""
    mod = importlib.import_module("plain_nki_kernel")
    import nki
    from nki.simulator import simulate_kernel
    a = rng.standard_normal((200, 16)).astype(np.float32)
    b = rng.standard_normal((200, 16)).astype(np.float32)
    np.testing.assert_array_equal(simulate_kernel(mod.add_rows_kernel, (), {"a": a, "b": b},
                                                  lnc=1), a + b)
    raw = mod.add_rows_kernel.func                      # the plain function vLLM Neuron passes
    np.testing.assert_array_equal(simulate_kernel(raw, (a,), {"b": b}, lnc=2), a + b)
    with pytest.raises(ValueError, match="lnc must be None, 1 or 2"):
        simulate_kernel(raw, (a, b), {}, lnc=4)
    with pytest.raises(TypeError, match="args must be a tuple"):
        simulate_kernel(raw, a, {})
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("NKI_SIMULATOR", "1")
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for out in (nki.simulate(mod.add_rows_kernel)(ta, tb), mod.add_rows_kernel(ta, tb)):
        assert isinstance(out, torch.Tensor)
        np.testing.assert_array_equal(out.numpy(), a + b)
