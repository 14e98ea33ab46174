"""Host API for training: functional forwards (nki_ssm.ops.training) and the SSD / GDN
backward ops (reference backend; the SSD one raises NotImplementedError on the NKI backends,
the GDN one runs its kernel: tests/kernels/test_gated_delta_backward_kernels.py)."""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm import ops
from nki_ssm.reference.gated_delta_backward import gated_delta_backward as gdn_ref
from nki_ssm.reference.inputs import make_gated_delta_inputs, make_ssd_inputs
from nki_ssm.reference.mamba2_ssd_backward import ssd_backward as ssd_ref
from nki_ssm.reference.mamba2_ssd_backward import ssd_forward as ssd_ref_forward
from nki_ssm.reference.metrics import rel_fro

POOL_ARGS = ("ssm_states", "state_indices", "has_initial_state")


def _functional(inp: dict, rng, tail) -> dict:
    inp = {k: v for k, v in inp.items() if k not in POOL_ARGS}
    inp["initial_states"] = (0.3 * rng.standard_normal(
        (inp["cu_seqlens"].shape[0] - 1, *tail))).astype(np.float32)
    return inp


def _ssd(rng, dtype=np.float32, **kw):
    inp = make_ssd_inputs(rng, seqlens=[9, 0, 20], H=4, P=8, N=16, G=2, dtype=dtype, z=True, **kw)
    return _functional(inp, rng, (4, 8, 16))


def _gdn(rng, raw_gates=True):
    inp = make_gated_delta_inputs(rng, seqlens=[9, 0, 20], H=2, HV=4, K=16, V=16,
                                  raw_gates=raw_gates, use_qk_l2norm=True)
    return _functional(inp, rng, (4, 16, 16))


def _snapshot(inp):
    return {k: v.copy() for k, v in inp.items() if isinstance(v, np.ndarray)}


def _unchanged(inp, before):
    for k, v in before.items():
        np.testing.assert_array_equal(inp[k], v, err_msg=k)


def test_ssd_forward_matches_reference_and_kernel(rng):
    inp = _ssd(rng)
    before = _snapshot(inp)
    y, final = ops.ssd_forward(**inp, backend="reference")
    y64, final64 = ssd_ref_forward(**inp)
    assert y.dtype == np.float32 and final.dtype == np.float32
    assert rel_fro(y, y64) < 1e-6 and rel_fro(final, final64) < 1e-6
    ys, finals = ops.ssd_forward(**inp, backend="sim")      # fp32 operands for float32 x
    assert rel_fro(ys, y64) < 1e-5 and rel_fro(finals, final64) < 1e-5
    _unchanged(inp, before)


def test_gated_delta_forward_matches_kernel(rng):
    inp = _gdn(rng)
    o, final = ops.gated_delta_forward(**inp, backend="reference")
    os_, finals = ops.gated_delta_forward(**inp, backend="sim")
    assert rel_fro(os_, o) < 1e-5 and rel_fro(finals, final) < 1e-5


def test_float64_runs_on_the_reference_backend_only(rng):
    inp = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
           for k, v in _ssd(rng).items()}
    y, final = ops.ssd_forward(**inp, backend="reference")
    assert y.dtype == final.dtype == np.float64
    y64, final64 = ssd_ref_forward(**inp)
    np.testing.assert_allclose(y, y64, rtol=1e-12, atol=1e-12)
    grads = ops.ssd_backward(**inp, dy=np.ones_like(y), backend="reference")
    assert all(g.dtype == np.float64 for g in grads.values())
    with pytest.raises(TypeError, match="x must have dtype float32 or bfloat16, got float64"):
        ops.ssd_forward(**inp, backend="sim")


def test_ssd_backward_is_the_reference_in_input_dtypes(rng):
    inp = _ssd(rng, dt_limit=(0.01, 3.0))
    before = _snapshot(inp)
    y, final = ops.ssd_forward(**inp, backend="reference")
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dfinal = rng.standard_normal(final.shape).astype(np.float32)
    grads = ops.ssd_backward(**inp, dy=dy, d_final_states=dfinal, backend="reference")
    ref = ssd_ref(**inp, dy=dy, d_final_states=dfinal)
    for key, value in grads.items():
        assert value.dtype == np.float32, key
        assert rel_fro(value, ref[key]) < 1e-6, key
    _unchanged(inp, before)


def test_gated_delta_backward_gates(rng):
    for raw in (True, False):
        inp = _gdn(rng, raw_gates=raw)
        o, final = ops.gated_delta_forward(**inp, backend="reference")
        grads = ops.gated_delta_backward(**inp, do=o, backend="reference")
        ref = gdn_ref(**inp, do=o)
        present = {"dq", "dk", "dv", "d_initial_states"} | (
            {"da", "db", "dA_log", "ddt_bias"} if raw else {"dg", "dbeta"})
        assert {k for k, v in grads.items() if v is not None} == present
        for key in present:
            assert rel_fro(grads[key], ref[key]) < 1e-6, key


def test_ssd_backward_on_sim_runs_the_nki_kernel(rng):
    """backend "sim" runs nki_ssm/kernels/mamba2_ssd/chunk_backward.py (its own tests:
    tests/kernels/test_mamba2_ssd_backward_kernels.py): the reference's gradients to 1e-5."""
    inp = _ssd(rng)
    dy = rng.standard_normal(inp["x"].shape).astype(np.float32)
    got = ops.ssd_backward(**inp, dy=dy, backend="sim")
    want = ops.ssd_backward(**inp, dy=dy, backend="reference")
    for key, ref in want.items():
        if ref is None:
            assert got[key] is None, key
        else:
            assert got[key].dtype == ref.dtype and rel_fro(got[key], ref) < 1e-5, key


@pytest.mark.parametrize("backend", ["reference", "sim"])
def test_backward_rejects_bad_arguments_naming_them(rng, backend):
    """The forward's checks and messages, on every backend, before the backend rule."""
    inp = _ssd(rng)
    dy = np.zeros(inp["x"].shape, np.float32)
    cases = [
        (dict(dy=dy[:, :2]), ValueError, r"dy must have shape .* = \[29, 4, 8\], got \(29, 2, 8\)"),
        (dict(dy=dy.astype(np.float16)), TypeError, "dy must have dtype"),
        (dict(d_final_states=np.zeros((2, 4, 8, 16), np.float32)), ValueError,
         r"d_final_states must have shape \[num_seqs, H, P, N\] = \[3, 4, 8, 16\]"),
        (dict(initial_states=np.zeros((3, 4, 8, 15), np.float32)), ValueError,
         r"initial_states must have shape \[num_seqs, H, P, N\]"),
        (dict(cu_seqlens=np.array([0, 9, 28], np.int32)), ValueError,
         r"cu_seqlens\[-1\] must equal num_tokens \(x.shape\[0\]\) = 29, got 28"),
        (dict(A=np.abs(inp["A"])), ValueError, "A must be finite and <= 0"),
        (dict(chunk_size=20), ValueError, "chunk_size must be a multiple of 16"),
    ]
    for bad, error, message in cases:
        args = {**inp, "dy": dy, **bad}
        if "cu_seqlens" in bad:
            args["initial_states"] = None
        with pytest.raises(error, match=message):
            ops.ssd_backward(**args, backend=backend)
    g = _gdn(rng)
    with pytest.raises(ValueError, match=r"do must have shape \[num_tokens, HV, V\]"):
        ops.gated_delta_backward(**g, do=np.zeros((29, 2, 16), np.float32), backend=backend)
    with pytest.raises(ValueError, match="gates: pass either"):
        ops.gated_delta_backward(**{**g, "g": g["a"]}, do=np.zeros(g["v"].shape, np.float32),
                                 backend=backend)


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("entry", ["forward", "backward"])
@pytest.mark.parametrize("family,lead,other", [("ssd", "x", "B"), ("ssd", "x", "C"), ("ssd", "x", "z"),
                                               ("gdn", "q", "k"), ("gdn", "q", "v")])
@pytest.mark.parametrize("wide", ["lead", "other"])
def test_streamed_activations_share_one_dtype_on_every_backend(rng, backend, entry, family, lead,
                                                               other, wide):
    """A float64 activation beside float32 ones is a TypeError naming an argument of the pair on
    every backend (the reference backend runs float64 calls, but all of one dtype)."""
    inp = _ssd(rng) if family == "ssd" else _gdn(rng)
    wide_name = lead if wide == "lead" else other
    inp[wide_name] = inp[wide_name].astype(np.float64)
    name = {"ssd": "ssd", "gdn": "gated_delta"}[family]
    if entry == "backward":
        grad, like = ("dy", "x") if family == "ssd" else ("do", "v")
        inp[grad] = np.ones(inp[like].shape, np.float32)
    before = _snapshot(inp)
    if backend == "reference":
        # a float64 lead: the first streamed array after it is named
        named = other if wide == "other" else {"ssd": "B", "gdn": "k"}[family]
        message = rf"{named} must have the same dtype as {lead} \({inp[lead].dtype}\)"
    else:
        message = rf"{wide_name} must have dtype float32 or bfloat16, got float64"
    with pytest.raises(TypeError, match=message):
        getattr(ops, f"{name}_{entry}")(**inp, backend=backend)
    _unchanged(inp, before)
