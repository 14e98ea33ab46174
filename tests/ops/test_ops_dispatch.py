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
