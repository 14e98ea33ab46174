"""Backend resolution and the launch/commit step, with recording launchers in place of the
real ones (each op calls its launcher through its plain import, so replacing the launch
module's function replaces it)."""
from __future__ import annotations

import numpy as np
import pytest
from ops_case_inputs import FAMILY, OPS, assert_pools_unchanged, base, pool_name, pool_snapshot

import nki_ssm.ops._dispatch as dispatch
from nki_ssm.ops.launch import gated_delta, mamba2_ssd, short_conv
from nki_ssm.reference.testing import named_slots, unnamed_slots

LAUNCH_MODULES = {"short_conv": short_conv, "mamba2_ssd": mamba2_ssd,
                  "gated_delta": gated_delta}


def install(monkeypatch, launchers: dict, nki_backend: str = "sim"):
    """Replace ``nki_ssm.ops.launch.<family>.<entry>`` by the given functions
    (``launchers``: {family: {entry: fn}}) and make ``backend=None`` pick ``nki_backend``."""
    for family, entries in launchers.items():
        for entry, fn in entries.items():
            monkeypatch.setattr(LAUNCH_MODULES[family], entry, fn)
    monkeypatch.setattr(dispatch, "nki_backend_name", lambda: nki_backend)


class Recorder:
    """A launcher that records its call, writes a marker into the named slots, returns a marker."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def __call__(self, **kw):
        self.calls.append(kw)
        pool = kw[pool_name(kw)]
        pool[named_slots(kw["state_indices"])] = 7.0  # a kernel updating in place
        if self.fail:
            raise RuntimeError("kernel failed mid-launch")
        return "launcher-output"


@pytest.mark.parametrize("nki_backend", ["sim", "neuron"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_default_backend_uses_launcher_on_nki_backend(op, nki_backend, monkeypatch):
    family, entry = FAMILY[op]
    rec = Recorder()
    install(monkeypatch, {family: {entry: rec}}, nki_backend=nki_backend)
    kw = base(op)
    assert OPS[op](**kw) == "launcher-output"
    (call,) = rec.calls
    assert call["backend"] == nki_backend
    # normalised arguments: int32 copies, the caller's pool itself
    assert call["state_indices"].dtype == np.int32
    assert call["state_indices"] is not kw["state_indices"]
    pool = "conv_states" if "conv_states" in kw else "ssm_states"
    assert call[pool] is kw[pool]
    expected = set(kw) - {"backend"}
    assert set(call) - {"backend"} >= expected


def test_launcher_gets_normalised_optionals(monkeypatch):
    rec = Recorder()
    install(monkeypatch, {"gated_delta": {"prefill": rec}, "mamba2_ssd": {"prefill": rec}})
    kw = base("gated_delta_prefill")
    kw["cu_seqlens"] = kw["cu_seqlens"].astype(np.int64)
    OPS["gated_delta_prefill"](**kw)
    call = rec.calls[-1]
    assert call["scale"] == pytest.approx(16 ** -0.5) and isinstance(call["scale"], float)
    assert call["cu_seqlens"].dtype == np.int32
    assert call["has_initial_state"].dtype == np.bool_
    assert call["a"] is None and call["A_log"] is None
    kw = base("ssd_prefill", D=None)
    kw["dt_limit"] = [0, 5]
    OPS["ssd_prefill"](**kw)
    call = rec.calls[-1]
    assert call["dt_limit"] == (0.0, 5.0) and call["D"] is None
    assert call["precision"] == "bf16" and call["chunk_size"] == 16


def test_explicit_backends_with_launcher(monkeypatch):
    rec = Recorder()
    install(monkeypatch, {"short_conv": {"prefill": rec}}, nki_backend="sim")
    assert OPS["short_conv_prefill"](**base("short_conv_prefill"), backend="neuron") \
        == "launcher-output"
    assert rec.calls[-1]["backend"] == "neuron"
    y = OPS["short_conv_prefill"](**base("short_conv_prefill"), backend="reference")
    assert isinstance(y, np.ndarray) and len(rec.calls) == 1


@pytest.mark.parametrize("op", sorted(OPS))
def test_failing_launcher_has_named_slots_restored(op, monkeypatch):
    family, entry = FAMILY[op]
    rec = Recorder(fail=True)
    install(monkeypatch, {family: {entry: rec}})
    kw = base(op)
    before = pool_snapshot(kw)
    with pytest.raises(RuntimeError, match="kernel failed"):
        OPS[op](**kw)
    assert len(rec.calls) == 1  # it did run and scribble
    assert_pools_unchanged(kw, before)


def test_unknown_backend_type(monkeypatch):
    install(monkeypatch, {})
    for bad in ("gpu", "", 1, "Reference"):
        with pytest.raises(ValueError, match=r"^backend must be one of None, 'reference'"):
            dispatch.resolve(bad)


@pytest.mark.parametrize("fail", [False, True])
def test_launcher_sees_contiguous_arrays_and_strided_pool_is_committed(fail, monkeypatch):
    """A pool that is a strided view gets a contiguous working copy; named slots come back."""
    rec = Recorder(fail=fail)
    install(monkeypatch, {"short_conv": {"prefill": rec}})
    kw = base("short_conv_prefill")
    backing = np.zeros(kw["conv_states"].shape[:2] + (2 * kw["conv_states"].shape[2],),
                       np.float32)
    backing[..., ::2] = kw["conv_states"]
    kw["conv_states"] = backing[..., ::2]           # strided view into a bigger cache
    kw["x"] = np.asfortranarray(kw["x"])            # a strided activation
    before = backing.tobytes()
    if fail:
        with pytest.raises(RuntimeError):
            OPS["short_conv_prefill"](**kw)
        assert backing.tobytes() == before
        return
    OPS["short_conv_prefill"](**kw)
    (call,) = rec.calls
    assert call["x"].flags.c_contiguous and call["conv_states"].flags.c_contiguous
    assert call["conv_states"] is not kw["conv_states"]
    named = named_slots(kw["state_indices"])
    unnamed = unnamed_slots(kw["state_indices"], backing.shape[0])
    assert (backing[named][..., ::2] == 7.0).all()   # committed through the view
    assert not backing[..., 1::2].any()               # the gaps never touched
    assert backing[unnamed].tobytes() == np.frombuffer(before, np.float32).reshape(
        backing.shape)[unnamed].tobytes()


def test_find_launcher_names_each_ops_launcher():
    for op, (family, entry) in FAMILY.items():
        assert dispatch.find_launcher(family, entry) is getattr(LAUNCH_MODULES[family], entry), op
    assert dispatch.find_launcher("short_conv", "backward") is None
    assert dispatch.find_launcher("mamba1", "prefill") is None


@pytest.mark.parametrize("backend,expected", [(None, "neuron"), ("sim", "sim"),
                                              ("neuron", "neuron"), ("reference", "reference")])
def test_resolve(backend, expected, monkeypatch):
    install(monkeypatch, {}, nki_backend="neuron")
    assert dispatch.resolve(backend) == expected


# ------------------------------------------------------------------ the LNC (issue 29)

from nki_ssm import backend as nki_backend  # noqa: E402

LNC_VAR = nki_backend.LNC_ENV_VAR


@pytest.mark.parametrize("value", ["1", "2"])
def test_logical_nc_config_reads_the_environment_on_every_backend(value, monkeypatch):
    monkeypatch.setenv(LNC_VAR, value)
    for which in ("sim", "neuron", None):
        assert nki_backend.logical_nc_config(which) == int(value)


@pytest.mark.parametrize("value", ["3", "0", "-1", "two", "1.0", "2,2", "", " 2 ", "2\n"])
def test_bad_logical_nc_config_names_the_variable(value, monkeypatch):
    """Exactly "1" or "2" (README): an empty or padded value is a ValueError, not unset."""
    monkeypatch.setenv(LNC_VAR, value)
    for which in ("sim", "neuron", None):
        with pytest.raises(ValueError, match=rf"{LNC_VAR}: expected 1 or 2, got"):
            nki_backend.logical_nc_config(which)


@pytest.mark.parametrize("target,expected", [("trn2", 2), ("trn3", 2), ("trn1", 1)])
def test_unset_logical_nc_config_is_the_runtime_default(target, expected, monkeypatch):
    """Unset: the Neuron runtime's default on the Neuron backend (2 on trn2 / trn3, 1 on
    trn1), 1 on the simulator whatever the target."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    monkeypatch.delenv(LNC_VAR, raising=False)
    assert nki_backend.logical_nc_config("neuron") == expected
    assert nki_backend.logical_nc_config("sim") == 1
    monkeypatch.setattr(nki_backend, "_NAME", "neuron")    # the SDK in use (faked)
    assert nki_backend.logical_nc_config() == expected
    monkeypatch.setattr(nki_backend, "_NAME", "sim")
    assert nki_backend.logical_nc_config() == 1


@nki_backend.nki.jit
def _programs_kernel(x):
    """Row ``pid`` of out [2, 4] = 10 * num_programs + pid (the other row untouched)."""
    n, pid = 1, 0
    if nki_backend.nl.program_ndim() != 0:
        n, pid = nki_backend.nl.num_programs(0), nki_backend.nl.program_id(0)
    out = nki_backend.nl.ndarray((2, 4), dtype=nki_backend.nl.float32,
                                 buffer=nki_backend.nl.shared_hbm)
    t = nki_backend.nl.ndarray((1, 4), dtype=nki_backend.nl.float32, buffer=nki_backend.nl.sbuf)
    nki_backend.nisa.memset(dst=t, value=10.0 * n + pid)
    nki_backend.nisa.dma_copy(dst=out[pid:pid + 1, :], src=t)
    return out


def test_run_launches_the_kernel_as_lnc_programs_on_the_simulator(monkeypatch):
    """``backend.run(kernel, ..., lnc=)`` runs ``kernel[lnc]``: two programs at 2, one at 1;
    lnc None is ``logical_nc_config``; a bad lnc is a ValueError naming it."""
    if nki_backend.name() != "sim":
        pytest.skip("runs the simulator's kernel")
    x = np.zeros((1, 4), dtype=np.float32)
    out = nki_backend.run(_programs_kernel, x, backend="sim", lnc=2)
    assert out.tolist() == [[20.0] * 4, [21.0] * 4]
    out = nki_backend.run(_programs_kernel, x, backend="sim", lnc=1)
    assert out[0].tolist() == [10.0] * 4 and not np.any(out[1] == 11.0)
    monkeypatch.setenv(LNC_VAR, "2")
    assert nki_backend.run(_programs_kernel, x, backend="sim")[1].tolist() == [21.0] * 4
    for bad in (3, 0, True, "2"):
        with pytest.raises(ValueError, match="lnc: expected 1 or 2"):
            nki_backend.run(_programs_kernel, x, backend="sim", lnc=bad)


@pytest.mark.parametrize("backend", [None, "sim", "neuron"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_bad_lnc_fails_before_the_launch_and_leaves_pools(op, backend, monkeypatch):
    """Every op on every NKI backend: a bad NEURON_LOGICAL_NC_CONFIG is the ValueError naming
    it, before the launcher runs (no pool touched); the reference backend launches nothing and
    never reads it."""
    family, entry = FAMILY[op]
    rec = Recorder()
    install(monkeypatch, {family: {entry: rec}}, nki_backend="sim")
    monkeypatch.setenv(LNC_VAR, "4")
    kw = base(op)
    before = pool_snapshot(kw)
    with pytest.raises(ValueError, match=rf"{LNC_VAR}: expected 1 or 2, got '4'"):
        OPS[op](**kw, backend=backend)
    assert not rec.calls
    assert_pools_unchanged(kw, before)
    OPS[op](**base(op), backend="reference")
