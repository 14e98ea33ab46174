"""Backend resolution with fake launcher modules (through the dispatch import hook)."""
from __future__ import annotations

import types

import numpy as np
import pytest
from ops_case_inputs import FAMILY, OPS, assert_pools_unchanged, base, pool_name, pool_snapshot

import nki_ssm.ops._dispatch as dispatch
from nki_ssm.reference.testing import named_slots, unnamed_slots


def install(monkeypatch, launchers: dict, nki_backend: str | None = "sim",
            broken: dict | None = None):
    """Make ``nki_ssm.ops.launch.<family>`` resolve to fake modules.

    ``launchers``: {family: {entry: fn}}; families not listed do not exist.
    ``broken``: {family: exception raised while importing that launcher}.
    ``nki_backend`` None: ``nki_ssm.backend`` does not exist.
    """
    broken = broken or {}
    fake_backend = types.SimpleNamespace(name=lambda: nki_backend)

    def fake_import(name):
        if name == "nki_ssm.backend":
            if nki_backend is None:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return fake_backend
        family = name.rsplit(".", 1)[-1]
        if family in broken:
            raise broken[family]
        if family not in launchers:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return types.SimpleNamespace(**launchers[family])

    monkeypatch.setattr(dispatch, "_import", fake_import)


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


@pytest.mark.parametrize("op", sorted(OPS))
def test_default_backend_is_reference_without_launcher(op, monkeypatch):
    install(monkeypatch, {})
    assert dispatch.resolve(*FAMILY[op], None) == ("reference", None)
    kw, kw_ref = base(op), base(op)
    y = OPS[op](**kw)
    y_ref = OPS[op](**kw_ref, backend="reference")
    assert y.tobytes() == y_ref.tobytes()
    assert pool_snapshot(kw) == pool_snapshot(kw_ref)


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


def test_explicit_backend_without_launcher_is_not_implemented(monkeypatch):
    install(monkeypatch, {"short_conv": {"prefill": Recorder()}})
    kw = base("short_conv_decode")
    before = pool_snapshot(kw)
    with pytest.raises(NotImplementedError,
                       match=r"^short_conv_decode has no NKI kernel launcher.*backend='sim'.*"
                             r"backends that work: None, 'reference'"):
        OPS["short_conv_decode"](**kw, backend="sim")
    assert_pools_unchanged(kw, before)
    with pytest.raises(NotImplementedError, match=r"^ssd_prefill .*backend='neuron'"):
        OPS["ssd_prefill"](**base("ssd_prefill"), backend="neuron")


def test_explicit_backends_with_launcher(monkeypatch):
    rec = Recorder()
    install(monkeypatch, {"short_conv": {"prefill": rec}}, nki_backend="sim")
    assert OPS["short_conv_prefill"](**base("short_conv_prefill"), backend="neuron") \
        == "launcher-output"
    assert rec.calls[-1]["backend"] == "neuron"
    y = OPS["short_conv_prefill"](**base("short_conv_prefill"), backend="reference")
    assert isinstance(y, np.ndarray) and len(rec.calls) == 1


def test_launcher_module_without_the_entry_falls_back(monkeypatch):
    install(monkeypatch, {"mamba2_ssd": {"prefill": Recorder(), "decode": "not callable"}})
    assert dispatch.resolve("mamba2_ssd", "decode", None) == ("reference", None)
    assert dispatch.resolve("mamba2_ssd", "prefill", None)[0] == "sim"


def test_broken_launcher_import_propagates(monkeypatch):
    """Only a missing launcher means 'use the reference'; other import errors surface."""
    err = ModuleNotFoundError("No module named 'neuronxcc'", name="neuronxcc")
    install(monkeypatch, {}, broken={"short_conv": err})
    kw = base("short_conv_prefill")
    before = pool_snapshot(kw)
    with pytest.raises(ModuleNotFoundError, match="neuronxcc"):
        OPS["short_conv_prefill"](**kw)
    assert_pools_unchanged(kw, before)


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
            dispatch.resolve("short_conv", "prefill", bad)


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


def test_default_backend_is_reference_while_nki_backend_module_is_missing(monkeypatch):
    rec = Recorder()
    install(monkeypatch, {"short_conv": {"prefill": rec}}, nki_backend=None)
    assert dispatch.resolve("short_conv", "prefill", None) == ("reference", None)
    y = OPS["short_conv_prefill"](**base("short_conv_prefill"))
    assert isinstance(y, np.ndarray) and not rec.calls
    # an explicit NKI backend still goes to the launcher (which then reports what is missing)
    assert dispatch.resolve("short_conv", "prefill", "sim") == ("sim", rec)
