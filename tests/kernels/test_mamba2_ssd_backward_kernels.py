"""The Mamba-2 SSD backward kernel (nki_ssm/kernels/mamba2_ssd/chunk_backward.py) through
``ops.ssd_backward`` on the simulator, against the float64 reference gradients
(nki_ssm/reference/mamba2_ssd_backward.py), at LNC=1 and LNC=2.

Every gradient within 1e-5 relative Frobenius for float32 I/O and 5e-3 for bfloat16 I/O
at model head dims (P = 64, N = 128) with realistic gates; strong-then-weak decays inside
one chunk; lengths not a multiple of the chunk, T = 1, empty sequences; ragged = separate
calls; continuation from a saved state = one long sequence; LNC=2 == LNC=1; one runtime
loop level and a program size independent of the batch, equal in both programs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops  # noqa: E402
from nki_ssm.reference.inputs import make_ssd_inputs  # noqa: E402
from nki_ssm.reference.mamba2_ssd_backward import ssd_backward as ref_backward  # noqa: E402
from nki_ssm.reference.mamba2_ssd_backward import ssd_forward as ref_forward  # noqa: E402
from nki_ssm.reference.metrics import rel_fro  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
EXACT_TOL = 1e-5
BF16_TOL = 5e-3
KEYS = ("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "d_initial_states")
PER_TOKEN = ("dx", "ddt", "dB", "dC", "dz")
PER_HEAD = ("dA", "dD", "ddt_bias")


def _case(rng, seqlens, *, H=4, P=8, N=16, G=2, dtype=np.float32, D="H", z=True,
          dt_mode="softplus", dt_limit=(0.0, float("inf")), pattern="strong_then_weak",
          initial=True, dfinal=True):
    inp = make_ssd_inputs(rng, seqlens=seqlens, H=H, P=P, N=N, G=G, dtype=dtype, D=D, z=z,
                          dt_mode=dt_mode, dt_limit=dt_limit, gate_pattern=pattern)
    for name in ("ssm_states", "state_indices", "has_initial_state"):
        inp.pop(name)
    S = len(seqlens)
    inp["initial_states"] = (0.5 * rng.standard_normal((S, H, P, N))).astype(np.float32) \
        if initial else None
    inp["dy"] = rng.standard_normal((int(inp["cu_seqlens"][-1]), H, P)).astype(dtype)
    inp["d_final_states"] = rng.standard_normal((S, H, P, N)).astype(np.float32) \
        if dfinal else None
    return inp


def _kernel(inp, chunk_size):
    args = {k: v for k, v in inp.items() if k not in ("x", "dt", "A", "B", "C", "dy")}
    return ops.ssd_backward(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["dy"],
                            chunk_size=chunk_size, backend="sim", **args)


def _reference(inp):
    return ref_backward(**inp)


def _check(inp, chunk_size, tol):
    got, want = _kernel(inp, chunk_size), _reference(inp)
    for key in KEYS:
        if want[key] is None:
            assert got[key] is None, key
            continue
        assert got[key].shape == want[key].shape, key
        err = rel_fro(np.asarray(got[key], np.float64), want[key])
        assert err <= tol, (key, err)
    return got


def test_gradients_fp32_ragged_with_empty_and_single_token_sequences(lnc):
    """Lengths not a multiple of the chunk, T = 1, an empty sequence, initial states and
    d_final_states, D [H], z, dt_bias with softplus; strong-then-weak decays in a chunk."""
    rng = np.random.default_rng(0)
    _check(_case(rng, [37, 0, 1, 16, 21]), 16, EXACT_TOL)


def test_gradients_fp32_per_channel_D_no_z_raw_dt_and_dt_limit(lnc):
    """D [H, P], no z, dt without dt_bias / softplus, a finite dt_limit clipping some dt'
    (the clip passes no gradient there), no initial states, no d_final_states."""
    rng = np.random.default_rng(1)
    inp = _case(rng, [45, 7], D="HP", z=False, dt_mode="raw", dt_limit=(0.05, 2.0),
                pattern="realistic", initial=False, dfinal=False)
    _check(inp, 16, EXACT_TOL)


def test_gradients_fp32_without_D_with_softplus_limit(lnc):
    rng = np.random.default_rng(2)
    inp = _case(rng, [50], H=2, G=1, D=None, z=True, dt_limit=(0.0, 1.5), pattern="realistic")
    _check(inp, 32, EXACT_TOL)


@pytest.mark.parametrize("chunk", [16, 64])
def test_strong_then_weak_decay_in_one_chunk(chunk):
    rng = np.random.default_rng(3)
    _check(_case(rng, [2 * chunk + 5, 37], H=2, G=1), chunk, EXACT_TOL)


def test_gradients_bf16_model_head_dims(lnc):
    """bfloat16 I/O at Mamba-2 head dims (P = 64, N = 128), realistic gates, two chunks of
    128 and a partial one: within 5e-3 of float64 on the same bf16 inputs."""
    rng = np.random.default_rng(4)
    inp = _case(rng, [300], H=2, P=64, N=128, G=1, dtype=BF16, pattern="realistic")
    _check(inp, 128, BF16_TOL)


@pytest.mark.parametrize("P, N, D, dtype, tol", [
    (8, 256, "H", np.float32, EXACT_TOL),        # two dstate tiles
    (8, 200, "HP", np.float32, EXACT_TOL),       # a partial second dstate tile
    (256, 16, "HP", np.float32, EXACT_TOL),      # heads of 256: 2H heads of 128
    (256, 256, "H", BF16, BF16_TOL),             # both (Falcon-H1-like N)
    (256, 256, "H", np.float32, EXACT_TOL),
])
def test_gradients_dstate_and_head_dim_256(lnc, P, N, D, dtype, tol):
    """The shapes the forward accepts beyond one partition tile (N up to 256: dstate in
    two tiles; P up to 256: heads split in the launcher), ragged with an empty sequence
    and lengths off the chunk, realistic gates: within 1e-5 (float32) / 5e-3 (bfloat16)
    of float64."""
    rng = np.random.default_rng(12)
    inp = _case(rng, [37, 0, 9], H=2, P=P, N=N, G=1, dtype=dtype, D=D, pattern="realistic")
    _check(inp, 16, tol)


def test_ragged_batch_equals_separate_calls():
    """Per-token gradients and d_initial_states of a ragged batch equal separate calls bit
    for bit; the per-head sums (dA, dD, ddt_bias) equal the sums of the calls' to 1e-6."""
    rng = np.random.default_rng(5)
    lens = [23, 0, 40]
    inp = _case(rng, lens, pattern="realistic")
    whole = _kernel(inp, 16)
    cu = inp["cu_seqlens"]
    summed = {k: 0.0 for k in PER_HEAD}
    for s in range(len(lens)):
        rows = slice(int(cu[s]), int(cu[s + 1]))
        one = dict(inp)
        for name in ("x", "dt", "B", "C", "z", "dy"):
            one[name] = inp[name][rows]
        for name in ("initial_states", "d_final_states"):
            one[name] = inp[name][s:s + 1]
        one["cu_seqlens"] = np.array([0, rows.stop - rows.start], np.int32)
        g = _kernel(one, 16)
        for key in PER_TOKEN:
            assert g[key].tobytes() == whole[key][rows].tobytes(), (key, s)
        assert g["d_initial_states"].tobytes() == whole["d_initial_states"][s:s + 1].tobytes()
        for key in PER_HEAD:
            summed[key] = summed[key] + np.asarray(g[key], np.float64)
    for key in PER_HEAD:
        assert rel_fro(np.asarray(whole[key], np.float64), summed[key]) <= 1e-6, key


def test_continuation_from_a_saved_state_equals_one_long_sequence():
    """Backward of the second half from the first half's final state, then of the first
    half with the second's d_initial_states as its d_final_states = one long sequence."""
    rng = np.random.default_rng(6)
    inp = _case(rng, [53], pattern="realistic")
    whole = _kernel(inp, 16)
    split = 29

    def part(rows, init, dy, dfinal):
        one = dict(inp)
        for name in ("x", "dt", "B", "C", "z"):
            one[name] = inp[name][rows]
        one.update(cu_seqlens=np.array([0, rows.stop - rows.start], np.int32),
                   initial_states=init, dy=dy, d_final_states=dfinal)
        return one

    first = part(slice(0, split), inp["initial_states"], inp["dy"][:split], None)
    fwd = {k: v for k, v in first.items() if k not in ("dy", "d_final_states")}
    _, mid = ref_forward(**fwd)
    second = part(slice(split, 53), mid.astype(np.float32), inp["dy"][split:],
                  inp["d_final_states"])
    g2 = _kernel(second, 16)
    first["d_final_states"] = g2["d_initial_states"]
    g1 = _kernel(first, 16)
    for key in PER_TOKEN:
        assert rel_fro(np.concatenate([g1[key], g2[key]]), whole[key]) <= EXACT_TOL, key
    for key in PER_HEAD:
        assert rel_fro(g1[key] + g2[key], whole[key]) <= EXACT_TOL, key
    assert rel_fro(g1["d_initial_states"], whole["d_initial_states"]) <= EXACT_TOL


def _run_lnc(monkeypatch, lnc, inp, chunk):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    return _kernel(inp, chunk)


@pytest.mark.parametrize("H, G, P, N", [(4, 2, 8, 16), (4, 1, 8, 16), (6, 3, 8, 16),
                                        (3, 1, 8, 16), (6, 1, 8, 256), (3, 3, 256, 16)])
def test_lnc2_equals_lnc1(monkeypatch, H, G, P, N):
    """Heads split across the two programs (H even; odd H: both programs run every head,
    program 0's gradients are kept; P = 256: 2H heads of 128): every gradient equals
    LNC=1 bit for bit, dB / dC included when a group's heads sit in both programs (G = 1,
    or G = 3 with H = 6 or 2H = 6: both settings add the same two halves' partials)."""
    rng = np.random.default_rng(7)
    inp = _case(rng, [40, 0, 1, 19], H=H, G=G, P=P, N=N, pattern="realistic")
    one = _run_lnc(monkeypatch, 1, inp, 16)
    two = _run_lnc(monkeypatch, 2, inp, 16)
    for key in KEYS:
        assert two[key].tobytes() == one[key].tobytes(), key


@pytest.mark.parametrize("H, G, P, N, z", [(4, 1, 8, 16, False), (6, 3, 8, 16, True),
                                           (6, 1, 8, 256, True)])
def test_lnc2_equals_lnc1_bf16(monkeypatch, H, G, P, N, z):
    """bfloat16 callers (tfloat32 TensorE operands, no widening copies, with and without
    z): every gradient, dB / dC included, equals LNC=1 bit for bit."""
    rng = np.random.default_rng(12)
    inp = _case(rng, [40, 0, 1, 19], H=H, G=G, P=P, N=N, dtype=BF16, z=z, pattern="realistic")
    one = _run_lnc(monkeypatch, 1, inp, 16)
    two = _run_lnc(monkeypatch, 2, inp, 16)
    for key in KEYS:
        assert (one[key] is None) == (two[key] is None), key
        if one[key] is not None:
            assert two[key].tobytes() == one[key].tobytes(), key


def _trace(inp, chunk):
    from nki_ssm.sim.trace import record
    with record() as trace:
        _kernel(inp, chunk)
    return trace


@pytest.mark.parametrize("lnc_value", [1, 2])
def test_program_size_one_loop_level_independent_of_the_batch(monkeypatch, lnc_value):
    """No instruction in more than one runtime loop; the program size (static
    instructions) is the same for two batches of one bucket, equal in both programs at
    LNC=2, and within 20,000."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc_value))
    rng = np.random.default_rng(8)
    short = _trace(_case(rng, [40, 0, 1, 19]), 16)
    long_ = _trace(_case(rng, [100, 20, 3, 0]), 16)
    for trace in (short, long_):
        assert max(len(inst.loop_path) for inst in trace.instructions) == 1
    sizes = [short.program_instructions(p) for p in range(lnc_value)]
    assert sizes == [long_.program_instructions(p) for p in range(lnc_value)]
    assert len(set(sizes)) == 1 and 0 < sizes[0] <= 20_000
    assert len(long_.instructions) > len(short.instructions)   # more rows ran


def test_model_shape_program_size():
    """Mamba-2 2.7B heads (H = 80, P = 64, N = 128, G = 1) at LNC=2: each program's size is
    within 20,000 (traced on a short batch; the size does not depend on it)."""
    import os
    rng = np.random.default_rng(9)
    old = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = "2"
    try:
        trace = _trace(_case(rng, [5], H=80, P=64, N=128, G=1, pattern="realistic"), 128)
    finally:
        if old is None:
            del os.environ["NEURON_LOGICAL_NC_CONFIG"]
        else:
            os.environ["NEURON_LOGICAL_NC_CONFIG"] = old
    sizes = [trace.program_instructions(p) for p in range(2)]
    assert sizes[0] == sizes[1] <= 20_000, sizes


@pytest.mark.parametrize("H, P, N, G", [(128, 64, 256, 1), (128, 64, 128, 8)])
def test_model_shapes_fit_the_sbuf_at_lnc1(monkeypatch, H, P, N, G):
    """Falcon-H1 (N = 256) and Granite-4.0-H (G = 8) heads at LNC=1, the widest program:
    the block tiles fall back to one set where two do not fit (no capacity error)."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    rng = np.random.default_rng(11)
    trace = _trace(_case(rng, [5], H=H, P=P, N=N, G=G, pattern="realistic"), 128)
    assert 0 < trace.program_instructions(0) <= 20_000


def test_kernel_limits_are_a_value_error():
    rng = np.random.default_rng(10)
    inp = _case(rng, [5], H=2, P=4, N=384, G=1)
    with pytest.raises(ValueError, match=r"N \(B.shape\[-1\]\) must be <= 256"):
        _kernel(inp, 16)


def test_all_sequences_empty(lnc):
    """No tokens: d_initial_states is d_final_states, the per-head gradients are zero."""
    rng = np.random.default_rng(11)
    inp = _case(rng, [0, 0], H=2, G=1, D="H", z=False)
    g = _kernel(inp, 16)
    assert g["d_initial_states"].tobytes() == inp["d_final_states"].tobytes()
    for key in ("dA", "dD", "ddt_bias"):
        assert not np.any(g[key]), key
    assert g["dx"].shape == (0, 2, 8) and g["dB"].shape == (0, 1, 16)
