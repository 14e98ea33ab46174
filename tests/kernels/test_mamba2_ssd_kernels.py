"""Mamba-2 SSD NKI kernels (chunked prefill, decode) on the simulator vs float64 references.

Bounds (relative Frobenius error against ``ssd_recurrent`` / ``ssd_decode``):
- exact mode (precision="fp32", float32 I/O and pool): <= 1e-5 for y and
  for the final states (issue 6; observed ~1e-7: every matmul operand is
  float32 and the decays are exp of directly summed segments).
- bf16 mode (precision="bf16"): <= 3e-3 (issue 6), with bf16 model I/O:
  the kernel rounds only C and the state S to bf16 for the y_off matmul;
  observed y error = the bf16 output rounding (~1.6e-3) + <1e-4, states
  ~1e-7 with a float32 pool.
- bfloat16 I/O with the exact mode: the kernel's float32 result is rounded
  once to bf16, so |y - ref| <= 2^-8 |ref| + 1e-5 max|ref| per element.
- slots no sequence names keep their bytes; padding rows of y are exactly 0.
Every kernel test runs at LNC=1 and LNC=2 (the ``lnc`` fixture: the programs
split the heads (prefill) or the sequences (decode)); LNC=2 results equal
LNC=1 bit for bit, and the two programs have equal sizes.
Model shapes (Mamba-2 2.7B, Granite-like G=8, 2K tokens; Falcon-H1-like
N=256 decode and a 256-token prefill) are ``slow``. The decode's split-state
path (a state cut into SBUF-sized units, taken at N=256 model size) is
exercised at small shapes by lowering the unit budget (``_unit_bytes``).
"""
from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops  # noqa: E402
from nki_ssm.reference.inputs import make_ssd_decode_inputs, make_ssd_inputs  # noqa: E402
from nki_ssm.reference.mamba2_ssd import ssd_decode, ssd_recurrent  # noqa: E402
from nki_ssm.reference.metrics import rel_fro  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
EXACT_TOL = 1e-5
BF16_MODE_TOL = 3e-3
_HYP = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def _copy(inp):
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inp.items()}


def _prefill(inp, *, precision="fp32", chunk_size=32):
    """-> (y, pool after, pool before) from the kernel on the simulator."""
    kw = _copy(inp)
    before = kw["ssm_states"].copy()
    y = ops.ssd_prefill(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                        chunk_size=chunk_size, precision=precision, backend="sim", **kw)
    return y, kw["ssm_states"], before


def _decode(inp):
    kw = _copy(inp)
    before = kw["ssm_states"].copy()
    y = ops.ssd_decode(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                       backend="sim", **kw)
    return y, kw["ssm_states"], before


def _named(state_indices):
    idx = np.asarray(state_indices)
    return idx[idx >= 0]


def _check(y, after, before, y_ref, pool_ref, state_indices, tol, cu_seqlens=None,
           state_tol=None):
    """y within ``tol`` of the reference, the named slots within ``state_tol`` (default
    ``tol``), every other slot untouched, padding sequences' outputs exact zeros."""
    state_tol = tol if state_tol is None else state_tol
    assert y.shape == y_ref.shape
    named = _named(state_indices)
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    assert after[unnamed].tobytes() == before[unnamed].tobytes()
    assert rel_fro(y, y_ref) <= tol, rel_fro(y, y_ref)
    if named.size:
        err = rel_fro(after[named], pool_ref[named])
        assert err <= state_tol, err
    # padding sequences output exact zeros
    idx = np.asarray(state_indices)
    for s in np.flatnonzero(idx < 0):
        rows = y[s] if cu_seqlens is None else y[cu_seqlens[s]:cu_seqlens[s + 1]]
        assert not np.any(rows.astype(np.float32))


@st.composite
def _prefill_case(draw, filler=0, dtype=np.float32):
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2, 3]))
    P = draw(st.sampled_from([8, 16, 24]))
    N = draw(st.sampled_from([8, 16, 32, 136]))       # 136: two dstate tiles (128 + 8)
    chunk = draw(st.sampled_from([16, 32]))
    lens = draw(st.lists(st.sampled_from([0, 1, 2, 15, 16, 17, 33, 40]), min_size=1, max_size=4))
    lens = lens + [filler] if filler else lens
    padding = draw(st.integers(0, len(lens) - 1))
    seed = draw(st.integers(0, 2**31 - 1))
    extras = dict(D=draw(st.sampled_from([None, "H", "HP"])), z=draw(st.booleans()),
                  dt_mode=draw(st.sampled_from(["softplus", "raw"])),
                  dt_limit=draw(st.sampled_from([(0.0, float("inf")), (0.01, 2.0)])))
    pool_dtype = np.float32 if dtype == np.float32 else draw(st.sampled_from([np.float32, BF16]))
    inp = make_ssd_inputs(np.random.default_rng(seed), seqlens=lens, H=H, P=P, N=N, G=G,
                          padding=padding, dtype=dtype, pool_dtype=pool_dtype, **extras)
    return inp, chunk


@_HYP
@given(case=_prefill_case())
def test_prefill_exact_mode_matches_recurrent_reference(case, lnc):
    inp, chunk = case
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, before = _prefill(inp, precision="fp32", chunk_size=chunk)
    assert y.dtype == np.float32
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], EXACT_TOL, inp["cu_seqlens"])


@_HYP
@given(case=_prefill_case(filler=64, dtype=BF16))
def test_prefill_bf16_mode_within_3e3(case, lnc):
    # bf16 model I/O (x, B, C, z bfloat16; y rounded to bf16 alone costs
    # ~1.6e-3). 3e-3 is a Frobenius-norm statistic of roundings; over a
    # handful of elements one cancelling dot product can exceed it, so each
    # batch also carries a 64-token sequence (>= 1.5k output elements) next
    # to the edge cases.
    inp, chunk = case
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, before = _prefill(inp, precision="bf16", chunk_size=chunk)
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], BF16_MODE_TOL,
           inp["cu_seqlens"])


@pytest.mark.parametrize("precision, tol", [("fp32", EXACT_TOL), ("bf16", BF16_MODE_TOL)])
def test_prefill_pipelined_across_chunks(precision, tol, lnc):
    # > 6 head blocks (H 32, P 64, chunk 128 -> 4 heads per block, 8 blocks):
    # the kernel pipelines blocks across chunk boundaries (the small
    # hypothesis shapes drain the pipeline at each chunk instead; LNC=2: 4
    # blocks per program, drained)
    rng = np.random.default_rng(11)
    dtype = np.float32 if precision == "fp32" else BF16
    inp = make_ssd_inputs(rng, seqlens=[300, 0, 129], H=32, P=64, N=16, G=2, z=True,
                          dtype=dtype, padding=0)
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, before = _prefill(inp, precision=precision, chunk_size=128)
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], tol, inp["cu_seqlens"])


def test_largest_head_dim_and_dstate(lnc):
    # P = 128 (one head fills the partitions), N = 256 (Falcon-H1: two dstate
    # tiles), G = 2; prefill and a 2-token decode
    rng = np.random.default_rng(12)
    inp = make_ssd_inputs(rng, seqlens=[70, 33], H=4, P=128, N=256, G=2, z=True, D="HP")
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, before = _prefill(inp, precision="fp32", chunk_size=64)
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], EXACT_TOL, inp["cu_seqlens"])
    dec = make_ssd_decode_inputs(rng, num_seqs=2, T=2, H=4, P=128, N=256, G=2, z=True)
    yd_ref, dpool_ref = ssd_decode(**dec)
    yd, dafter, dbefore = _decode(dec)
    assert rel_fro(yd, yd_ref) <= EXACT_TOL
    named = _named(dec["state_indices"])
    assert rel_fro(dafter[named], dpool_ref[named]) <= EXACT_TOL


def test_prefill_bf16_io_and_pool_round_once(lnc):
    rng = np.random.default_rng(3)
    inp = make_ssd_inputs(rng, seqlens=[37, 0, 20], H=4, P=16, N=32, G=2, z=True,
                          dtype=BF16, pool_dtype=BF16, padding=1)
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, before = _prefill(inp, precision="fp32", chunk_size=16)
    assert y.dtype == BF16 and after.dtype == BF16
    err = np.abs(y.astype(np.float64) - y_ref)
    assert np.all(err <= 2.0**-8 * np.abs(y_ref) + 1e-5 * np.abs(y_ref).max())
    named = _named(inp["state_indices"])
    s_err = np.abs(after[named].astype(np.float64) - pool_ref[named])
    assert np.all(s_err <= 2.0**-8 * np.abs(pool_ref[named]) + 1e-5 * np.abs(pool_ref[named]).max())
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    assert after[unnamed].tobytes() == before[unnamed].tobytes()


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-6), ("bf16", BF16_MODE_TOL)])
def test_prefill_continuation_through_pool_equals_one_long_prefill(precision, tol, lnc):
    rng = np.random.default_rng(4)
    whole = make_ssd_inputs(rng, seqlens=[70], H=2, P=16, N=16, slots=3, z=True,
                            has_initial_state=True)
    y_one, pool_one, _ = _prefill(whole, precision=precision)
    cut = 45                                     # not a chunk multiple: chunks differ
    pool = whole["ssm_states"].copy()
    ys = []
    for lo, hi in ((0, cut), (cut, 70)):
        part = dict(whole, ssm_states=pool, cu_seqlens=np.array([0, hi - lo], np.int32))
        for k in ("x", "dt", "B", "C", "z"):
            part[k] = whole[k][lo:hi]
        kw = _copy(part)
        kw["ssm_states"] = pool                  # carried through the pool, in place
        ys.append(ops.ssd_prefill(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"),
                                  kw.pop("C"), precision=precision, chunk_size=32,
                                  backend="sim", **kw))
    assert rel_fro(np.concatenate(ys), y_one) <= tol
    assert rel_fro(pool, pool_one) <= tol


def test_prefill_ragged_batch_equals_separate_calls_bitwise(lnc):
    rng = np.random.default_rng(5)
    lens = [19, 0, 40, 1]
    inp = make_ssd_inputs(rng, seqlens=lens, H=4, P=8, N=16, G=2, D="HP", z=True)
    y_all, pool_all, _ = _prefill(inp, precision="bf16")
    cu = inp["cu_seqlens"]
    pool = inp["ssm_states"].copy()
    for s, n in enumerate(lens):
        one = dict(inp, cu_seqlens=np.array([0, n], np.int32), ssm_states=pool,
                   state_indices=inp["state_indices"][s:s + 1],
                   has_initial_state=inp["has_initial_state"][s:s + 1])
        for k in ("x", "dt", "B", "C", "z"):
            one[k] = inp[k][cu[s]:cu[s + 1]]
        kw = _copy(one)
        kw["ssm_states"] = pool
        y = ops.ssd_prefill(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                            precision="bf16", chunk_size=32, backend="sim", **kw)
        assert y.tobytes() == y_all[cu[s]:cu[s + 1]].tobytes()
    assert pool.tobytes() == pool_all.tobytes()


def test_prefill_huge_gates_do_not_overflow(lnc):
    # dt' up to ~1e3 with A = -16: per-token log decays of -1.6e4 (a factored
    # exp(c_i) * exp(-c_j) would overflow float32 within one chunk)
    rng = np.random.default_rng(6)
    inp = make_ssd_inputs(rng, seqlens=[64], H=2, P=8, N=16, dt_mode="raw")
    inp["dt"] = (inp["dt"] * 1e4).astype(np.float32)
    inp["A"] = np.full_like(inp["A"], -16.0)
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, _ = _prefill(inp, precision="fp32")
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(after))
    assert rel_fro(y, y_ref) <= EXACT_TOL
    named = _named(inp["state_indices"])
    assert rel_fro(after[named], pool_ref[named]) <= EXACT_TOL


def test_prefill_invalid_call_changes_nothing():
    rng = np.random.default_rng(7)
    inp = make_ssd_inputs(rng, seqlens=[5, 6], H=2, P=8, N=16)
    kw = _copy(inp)
    before = kw["ssm_states"].copy()
    kw["state_indices"] = np.array([0, kw["ssm_states"].shape[0]], np.int32)  # out of range
    with pytest.raises(ValueError, match="state_indices"):
        ops.ssd_prefill(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                        backend="sim", **kw)
    assert kw["ssm_states"].tobytes() == before.tobytes()


# ----------------------------------------------------------------------------- decode

@st.composite
def _decode_case(draw):
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2, 3]))
    P = draw(st.sampled_from([8, 16, 24]))
    N = draw(st.sampled_from([8, 16, 136]))
    S = draw(st.integers(1, 4))
    T = draw(st.sampled_from([None, 1, 3]))
    seed = draw(st.integers(0, 2**31 - 1))
    pool_dtype = draw(st.sampled_from([np.float32, BF16]))
    extras = dict(D=draw(st.sampled_from([None, "H", "HP"])), z=draw(st.booleans()),
                  dt_mode=draw(st.sampled_from(["softplus", "raw"])),
                  dt_limit=draw(st.sampled_from([(0.0, float("inf")), (0.01, 2.0)])))
    return make_ssd_decode_inputs(np.random.default_rng(seed), num_seqs=S, T=T, H=H, P=P, N=N,
                                  G=G, padding=draw(st.integers(0, S - 1)),
                                  pool_dtype=pool_dtype, **extras)


@_HYP
@given(inp=_decode_case())
def test_decode_matches_reference(inp, lnc):
    y_ref, pool_ref = ssd_decode(**inp)
    y, after, before = _decode(inp)
    assert y.dtype == np.float32 and y.shape == inp["x"].shape
    assert rel_fro(y, y_ref) <= EXACT_TOL
    named = _named(inp["state_indices"])
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    assert after[unnamed].tobytes() == before[unnamed].tobytes()
    if named.size:
        if after.dtype == BF16:   # float32 state rounded once to the bf16 pool
            err = np.abs(after[named].astype(np.float64) - pool_ref[named])
            assert np.all(err <= 2.0**-8 * np.abs(pool_ref[named])
                          + 1e-5 * np.abs(pool_ref[named]).max())
        else:
            assert rel_fro(after[named], pool_ref[named]) <= EXACT_TOL
    for s in np.flatnonzero(np.asarray(inp["state_indices"]) < 0):
        assert not np.any(y[s])


def test_decode_multi_token_equals_single_steps_bitwise(lnc):
    rng = np.random.default_rng(8)
    inp = make_ssd_decode_inputs(rng, num_seqs=3, T=4, H=4, P=16, N=32, G=2, z=True, padding=1)
    y_multi, pool_multi, _ = _decode(inp)
    pool = inp["ssm_states"].copy()
    for t in range(4):
        kw = {k: (v[:, t].copy() if k in ("x", "dt", "B", "C", "z") else v)
              for k, v in _copy(inp).items()}
        kw["ssm_states"] = pool
        y = ops.ssd_decode(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                           backend="sim", **kw)
        assert y.tobytes() == y_multi[:, t].tobytes()
    assert pool.tobytes() == pool_multi.tobytes()


def test_decode_step_continues_a_prefill(lnc):
    """prefill(n tokens) then decode(token n+1) == prefill(n+1 tokens), exact mode."""
    rng = np.random.default_rng(9)
    inp = make_ssd_inputs(rng, seqlens=[21], H=2, P=16, N=16, z=True, has_initial_state=True)
    y_all, pool_all, _ = _prefill(inp, precision="fp32")
    pool = inp["ssm_states"].copy()
    head = dict(inp, cu_seqlens=np.array([0, 20], np.int32))
    for k in ("x", "dt", "B", "C", "z"):
        head[k] = inp[k][:20]
    kw = _copy(head)
    kw["ssm_states"] = pool
    ops.ssd_prefill(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                    precision="fp32", backend="sim", **kw)
    step = {k: inp[k][20:21] for k in ("x", "dt", "B", "C", "z")}
    y = ops.ssd_decode(step["x"], step["dt"], inp["A"], step["B"], step["C"], D=inp["D"],
                       z=step["z"], dt_bias=inp["dt_bias"], dt_softplus=inp["dt_softplus"],
                       dt_limit=inp["dt_limit"], ssm_states=pool,
                       state_indices=inp["state_indices"], backend="sim")
    assert rel_fro(y, y_all[20:21]) <= 1e-6
    assert rel_fro(pool, pool_all) <= 1e-6


def test_decode_segments_one_head_per_partition_and_segment():
    from nki_ssm.kernels.mamba2_ssd.decode import decode_segments
    # Mamba-2 2.7B: nt 40 rows per partition, P 64 -> five segments of 8 rows
    assert decode_segments(40, 64, 128) == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40)]
    assert decode_segments(64, 64, 128) == [(0, 64)]          # Granite / Falcon-H1: one head
    assert decode_segments(3, 24, 48) == [(0, 3)]
    assert decode_segments(3, 64, 128) == [(0, 1), (1, 2), (2, 3)]
    for nt, P, pr in [(40, 64, 128), (6, 64, 128), (3, 24, 48), (2, 8, 8)]:
        for o, e in decode_segments(nt, P, pr):
            for q in range(pr):              # rows pr*o + q*(e-o) + k, k < e-o: one head
                assert len({(pr * o + q * (e - o) + k) // P for k in range(e - o)}) == 1


@pytest.mark.parametrize("T, pool_dtype", [(None, np.float32), (2, BF16)])
def test_decode_bf16_io_tensor_input_term_matches_reference(T, pool_dtype, lnc):
    # bf16 I/O, G = 1: the input term dt'x * B on TensorE (dt'x split in bf16 hi + lo);
    # H 12, P 64 -> pr 128, nt 6: three segments of two rows
    rng = np.random.default_rng(21)
    inp = make_ssd_decode_inputs(rng, num_seqs=5, T=T, H=12, P=64, N=32, G=1, z=True,
                                 D="H", dtype=BF16, pool_dtype=pool_dtype, padding=1)
    y_ref, pool_ref = ssd_decode(**inp)
    y, after, before = _decode(inp)
    tol = BF16_MODE_TOL if pool_dtype == np.float32 else 2.0**-9 + BF16_MODE_TOL
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], BF16_MODE_TOL,
           state_tol=tol)


@contextlib.contextmanager
def _unit_bytes(value):
    """Decode state-unit budget set to ``value`` (small shapes then take the
    split-state path that N = 256 at model size takes)."""
    from nki_ssm.kernels.mamba2_ssd import decode as dec_kernel
    old = dec_kernel._UNIT_BYTES
    dec_kernel._UNIT_BYTES = value
    try:
        yield
    finally:
        dec_kernel._UNIT_BYTES = old


def test_decode_units_cover_each_state_once():
    from nki_ssm.kernels.mamba2_ssd.decode import _unit_spans, entries_per_iteration
    # Falcon-H1 (nt 64, N 256): 64 KiB fp32 per sequence -> two 32-row units;
    # Mamba-2 2.7B (nt 40, N 128) bf16 pool: 30 KiB -> one unit
    assert _unit_spans(64, 256, True) == [(0, 32), (32, 64)]
    assert _unit_spans(64, 256, False) == [(0, 32), (32, 64)]
    assert _unit_spans(40, 128, False) == [(0, 40)]
    # entries per full iteration: 16, fewer for long speculative steps (token tiles)
    assert [entries_per_iteration(T) for T in (1, 2, 4, 8, 16, 20)] == [16, 8, 4, 2, 1, 1]
    with _unit_bytes(1):          # never below one row block per unit
        assert _unit_spans(3, 8, True) == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("num_seqs, T, pool_dtype", [(1, None, np.float32), (3, 2, np.float32),
                                                     (3, None, BF16), (2, 3, BF16)])
def test_decode_split_state_dstate_256_equals_whole_state_bitwise(num_seqs, T, pool_dtype, lnc):
    # N = 256 with 2 row blocks per partition (H 4, P 64 -> pr 128, nt 2); a
    # one-block unit budget cuts every state in two units, as Falcon-H1's 64
    # KiB state is cut at model size. Per element the math is the same, so y
    # and the pool must match the whole-state run bit for bit, and the reference.
    rng = np.random.default_rng(13)
    inp = make_ssd_decode_inputs(rng, num_seqs=num_seqs, T=T, H=4, P=64, N=256, G=2, z=True,
                                 D="HP", pool_dtype=pool_dtype, padding=int(num_seqs > 2))
    y_whole, pool_whole, _ = _decode(inp)
    with _unit_bytes(256 * 4):
        y, after, before = _decode(inp)
    assert y.tobytes() == y_whole.tobytes()
    assert after.tobytes() == pool_whole.tobytes()
    y_ref, pool_ref = ssd_decode(**inp)
    assert rel_fro(y, y_ref) <= EXACT_TOL
    named = _named(inp["state_indices"])
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    assert after[unnamed].tobytes() == before[unnamed].tobytes()
    if pool_dtype == np.float32:
        assert rel_fro(after[named], pool_ref[named]) <= EXACT_TOL


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(H=st.sampled_from([2, 3, 6]), P=st.sampled_from([24, 64]), N=st.sampled_from([8, 136, 256]),
       S=st.integers(1, 4), T=st.sampled_from([None, 2]), rows=st.integers(1, 3),
       pool_dtype=st.sampled_from([np.float32, BF16]), seed=st.integers(0, 2**31 - 1))
def test_decode_split_state_matches_reference(H, P, N, S, T, rows, pool_dtype, seed, lnc):
    # H*P > 128 gives several row blocks per partition; a budget of `rows`
    # row blocks per unit cuts the states into units of 1..3 blocks
    inp = make_ssd_decode_inputs(np.random.default_rng(seed), num_seqs=S, T=T, H=H, P=P, N=N,
                                 G=1, z=True, D="H", pool_dtype=pool_dtype,
                                 padding=int(S > 1))
    row_bytes = N * (4 if pool_dtype == np.float32 else 6)
    with _unit_bytes(rows * row_bytes):
        y, after, before = _decode(inp)
    y_ref, pool_ref = ssd_decode(**inp)
    assert rel_fro(y, y_ref) <= EXACT_TOL
    named = _named(inp["state_indices"])
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    assert after[unnamed].tobytes() == before[unnamed].tobytes()
    ref = pool_ref[named]
    err = np.abs(after[named].astype(np.float64) - ref)
    if pool_dtype == np.float32:
        assert rel_fro(after[named], ref) <= EXACT_TOL
    else:                         # float32 state rounded once to the bf16 pool
        assert np.all(err <= 2.0**-8 * np.abs(ref) + 1e-5 * np.abs(ref).max())


# ----------------------------------------------------------------------------- model shapes

@pytest.mark.slow
@pytest.mark.parametrize("H, P, N, G, precision, tol", [
    (80, 64, 128, 1, "bf16", BF16_MODE_TOL),     # Mamba-2 2.7B, bf16 I/O
    (80, 64, 128, 1, "fp32", EXACT_TOL),         # Mamba-2 2.7B, exact mode, float32 I/O
    (128, 64, 128, 8, "bf16", BF16_MODE_TOL),    # Granite-4.0-H-like, bf16 I/O
])
def test_prefill_model_shapes_2k_tokens(H, P, N, G, precision, tol, lnc):
    rng = np.random.default_rng(10)
    dtype = BF16 if precision == "bf16" else np.float32
    inp = make_ssd_inputs(rng, seqlens=[1500, 548], H=H, P=P, N=N, G=G, z=True, dtype=dtype,
                          slots=2, has_initial_state=True)
    from nki_ssm.reference.mamba2_ssd import ssd_chunked
    y_ref, pool_ref = ssd_chunked(**inp)         # agrees with ssd_recurrent to 1e-10
    y, after, _ = _prefill(inp, precision=precision, chunk_size=128)
    assert rel_fro(y, y_ref) <= tol
    assert rel_fro(after, pool_ref) <= tol


@pytest.mark.slow
@pytest.mark.parametrize("pool_dtype", [np.float32, BF16])
def test_decode_falcon_h1_shape(pool_dtype, lnc):
    # H 128, P 64, N 256: 64 KiB of fp32 state per partition and sequence,
    # more than SBUF holds for the three sequences in flight unless cut
    rng = np.random.default_rng(14)
    inp = make_ssd_decode_inputs(rng, num_seqs=4, T=None, H=128, P=64, N=256, z=True,
                                 pool_dtype=pool_dtype, padding=1)
    y_ref, pool_ref = ssd_decode(**inp)
    y, after, before = _decode(inp)
    # a bf16 pool holds the float32 state rounded once (RNE: <= 2^-9 relative)
    tol = EXACT_TOL if pool_dtype == np.float32 else 2.0**-9 + EXACT_TOL
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], EXACT_TOL, state_tol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("precision, pool_dtype", [("bf16", np.float32), ("fp32", BF16)])
def test_prefill_falcon_h1_shape(precision, pool_dtype, lnc):
    rng = np.random.default_rng(15)
    dtype = BF16 if precision == "bf16" else np.float32
    inp = make_ssd_inputs(rng, seqlens=[150, 106], H=128, P=64, N=256, G=1, z=True,
                          dtype=dtype, pool_dtype=pool_dtype, slots=2, has_initial_state=True)
    from nki_ssm.reference.mamba2_ssd import ssd_chunked
    y_ref, pool_ref = ssd_chunked(**inp)
    y, after, _ = _prefill(inp, precision=precision, chunk_size=128)
    tol = EXACT_TOL if precision == "fp32" else BF16_MODE_TOL
    assert rel_fro(y, y_ref) <= tol
    # a bf16 pool holds the float32 state rounded once (RNE: <= 2^-9 relative)
    state_tol = tol if pool_dtype == np.float32 else 2.0**-9 + EXACT_TOL
    assert rel_fro(after, pool_ref) <= state_tol


# ------------------------------------------------------------- one program per bucket (issue 10)

def _specialisations(kernel_name):
    from nki_ssm import sim
    counts = sim.specialisations()
    return sum(v for k, v in counts.items() if k.endswith(kernel_name))


_BUCKET_HYP = settings(max_examples=12, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow,
                                              HealthCheck.data_too_large,
                                              HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("pool_dtype", [np.float32, BF16])
def test_prefill_ragged_batches_in_one_bucket_share_one_program(pool_dtype, lnc):
    """Many ragged batches within one bucket (<= 128 tokens, 3-4 sequences; lengths 0, 1,
    short, several chunks; padding slots; mixed has_initial_state) run one compiled
    program and match the float64 reference (exact mode), pools and unnamed slots as
    always."""
    from nki_ssm import sim
    sim.reset_specialisations()

    @_BUCKET_HYP
    @given(lens=st.lists(st.sampled_from([0, 1, 5, 16, 17, 40]), min_size=3, max_size=4),
           data=st.data(), seed=st.integers(0, 2**31 - 1))
    def run(lens, data, seed):
        if sum(lens) > 128:
            lens = [min(n, 16) for n in lens]
        padding = data.draw(st.integers(0, len(lens)))
        gates = data.draw(st.sampled_from(["realistic", "strong_then_weak"]))
        inp = make_ssd_inputs(np.random.default_rng(seed), seqlens=lens, H=2, P=16, N=16, G=1,
                              slots=6, padding=padding, pool_dtype=pool_dtype, z=True, D="H",
                              gate_pattern=gates)
        y_ref, pool_ref = ssd_recurrent(**inp)
        y, after, before = _prefill(inp, precision="fp32", chunk_size=16)
        if pool_dtype == np.float32:
            _check(y, after, before, y_ref, pool_ref, inp["state_indices"], EXACT_TOL,
                   inp["cu_seqlens"])
        else:
            # a bf16 pool: the initial state is the bf16 value (exact in the reference
            # too), the final state rounded once (RNE)
            named = _named(inp["state_indices"])
            unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
            assert after[unnamed].tobytes() == before[unnamed].tobytes()
            assert rel_fro(y, y_ref) <= EXACT_TOL
            if named.size:
                err = np.abs(after[named].astype(np.float64) - pool_ref[named])
                assert np.all(err <= 2.0**-8 * np.abs(pool_ref[named])
                              + 1e-5 * np.abs(pool_ref[named]).max())
            for s in np.flatnonzero(np.asarray(inp["state_indices"]) < 0):
                assert not np.any(y[inp["cu_seqlens"][s]:inp["cu_seqlens"][s + 1]])

    run()
    assert _specialisations("ssd_chunk_prefill") == 1


@pytest.mark.parametrize("pool_dtype", [np.float32, BF16])
def test_decode_batches_in_one_bucket_share_one_program(pool_dtype, lnc):
    """Decode batches of 3-4 sequences (one bucket) with 0..all padding run one program
    and match the reference (an all-padding batch included: zeros, pool untouched)."""
    from nki_ssm import sim
    sim.reset_specialisations()

    @_BUCKET_HYP
    @given(S=st.integers(3, 4), data=st.data(), seed=st.integers(0, 2**31 - 1))
    def run(S, data, seed):
        padding = data.draw(st.integers(0, S))
        inp = make_ssd_decode_inputs(np.random.default_rng(seed), num_seqs=S, H=2, P=64, N=16,
                                     G=1, slots=6, padding=padding, pool_dtype=pool_dtype,
                                     z=True, D="H")
        y_ref, pool_ref = ssd_decode(**inp)
        y, after, before = _decode(inp)
        assert rel_fro(y, y_ref) <= EXACT_TOL if padding < S else not np.any(y)
        named = _named(inp["state_indices"])
        unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
        assert after[unnamed].tobytes() == before[unnamed].tobytes()
        ref = pool_ref[named]
        if named.size and pool_dtype == np.float32:
            assert rel_fro(after[named], ref) <= EXACT_TOL
        elif named.size:
            err = np.abs(after[named].astype(np.float64) - ref)
            assert np.all(err <= 2.0**-8 * np.abs(ref) + 1e-5 * np.abs(ref).max())
        for s in np.flatnonzero(np.asarray(inp["state_indices"]) < 0):
            assert not np.any(y[s])

    run()
    assert _specialisations("ssd_decode_step") == 1


def test_decode_all_padding_batch(lnc):
    """Issue 9 row 1: every sequence padding -> zero output, pool untouched (no error)."""
    inp = make_ssd_decode_inputs(np.random.default_rng(0), num_seqs=2, H=2, P=4, N=8)
    inp["state_indices"][:] = -1
    y, after, before = _decode(inp)
    assert not np.any(y) and after.tobytes() == before.tobytes()


def _program_size(fn):
    """(static instructions of each program, instructions program 0 ran in runtime loops)."""
    from nki_ssm.sim.trace import record
    with record() as trace:
        fn()
    programs = sorted({inst.program_id for inst in trace.instructions})
    return (tuple(trace.program_instructions(p) for p in programs),
            sum(inst.program_id == 0 and bool(inst.loop_path) for inst in trace.instructions))


def test_program_size_does_not_grow_with_the_batch(lnc):
    """The compiled program does not grow with the batch (every batch-sized loop is a
    runtime loop) and at LNC=2 is the same for both programs: the prefill's is one size
    for every bucket that runs 8 chunks per iteration (here 1K and 4K tokens: the second
    runs ~3x the loop instructions), and a bucket with fewer chunks per iteration
    (``prefill_per``: short buckets) compiles a smaller one; the decode's is one size
    for 4 and 32 sequences."""
    def prefill(lens):
        inp = make_ssd_inputs(np.random.default_rng(1), seqlens=lens, H=2, P=16, N=16,
                              z=True, has_initial_state=True)
        return lambda: _prefill(inp, precision="bf16", chunk_size=32)

    def decode(S):
        inp = make_ssd_decode_inputs(np.random.default_rng(2), num_seqs=S, H=2, P=16, N=16,
                                     z=True, padding=1)
        return lambda: _decode(inp)

    from nki_ssm.ops.launch.mamba2_ssd import prefill_per

    assert [prefill_per(t, s, 32) for t, s in ((128, 2), (1024, 4), (4096, 4))] == [2, 8, 8]
    short = _program_size(prefill([100, 20]))
    long_, longer = _program_size(prefill([700, 100, 3])), _program_size(prefill([2000, 300, 3]))
    assert long_[0] == longer[0] == (long_[0][0],) * lnc and longer[1] > 2 * long_[1]
    assert short[0] == (short[0][0],) * lnc and short[0][0] < long_[0][0]
    few, many = _program_size(decode(4)), _program_size(decode(32))
    assert few[0] == many[0] == (few[0][0],) * lnc and many[1] > 4 * few[1]


@pytest.mark.parametrize("chunk", [16, 64, 128])
def test_prefill_strong_then_weak_decay_in_one_chunk(chunk, lnc):
    """Strong decays then weak ones inside one chunk (issue 9's gate pattern): the
    decays are exp of direct segment sums, so float32 stays within 1e-5 at every
    chunk size (ragged, with a sequence that starts mid-chunk)."""
    rng = np.random.default_rng(16)
    inp = make_ssd_inputs(rng, seqlens=[2 * chunk + 5, 37], H=2, P=16, N=16,
                          has_initial_state=True, gate_pattern="strong_then_weak")
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, _ = _prefill(inp, precision="fp32", chunk_size=chunk)
    assert rel_fro(y, y_ref) <= EXACT_TOL
    named = _named(inp["state_indices"])
    assert rel_fro(after[named], pool_ref[named]) <= EXACT_TOL


@pytest.mark.parametrize("chunk", [48, 128])
def test_prefill_bf16_mode_sub_block_segment_sums(chunk, lnc):
    """bf16 mode with bf16 I/O and D per head (the tfloat32 segment sums over 16- or
    32-token sub-blocks, D x against a bf16 D_h I): strong-then-weak decays inside one
    chunk and huge gates (dt' ~1e4, A = -16) stay finite and within the bf16-mode
    budget."""
    rng = np.random.default_rng(23)
    inp = make_ssd_inputs(rng, seqlens=[2 * chunk + 5, 37], H=8, P=16, N=16, dtype=BF16,
                          has_initial_state=True, gate_pattern="strong_then_weak")
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, _ = _prefill(inp, precision="bf16", chunk_size=chunk)
    assert rel_fro(y, y_ref) <= BF16_MODE_TOL
    named = _named(inp["state_indices"])
    assert rel_fro(after[named], pool_ref[named]) <= BF16_MODE_TOL
    big = make_ssd_inputs(np.random.default_rng(24), seqlens=[chunk + 7], H=8, P=16, N=16,
                          dtype=BF16, dt_mode="raw")
    big["dt"] = (big["dt"] * 1e4).astype(np.float32)
    big["A"] = np.full_like(big["A"], -16.0)
    y_ref, pool_ref = ssd_recurrent(**big)
    y, after, _ = _prefill(big, precision="bf16", chunk_size=chunk)
    assert np.all(np.isfinite(np.asarray(y, np.float32))) and np.all(np.isfinite(after))
    assert rel_fro(y, y_ref) <= BF16_MODE_TOL


@pytest.mark.parametrize("precision, tol", [("fp32", EXACT_TOL), ("bf16", BF16_MODE_TOL)])
def test_prefill_long_pipeline_pair_loop(precision, tol, lnc):
    # 12 head blocks (H 48, P 64 -> 4 heads per block) > 10 stages: the chunk-pair loop
    # balances the engines through TensorE (y_off + y_intra and every second block's
    # state update as identity matmuls, pe_add); lengths with odd chunk counts, an empty
    # live sequence and padding
    rng = np.random.default_rng(17)
    dtype = np.float32 if precision == "fp32" else BF16
    inp = make_ssd_inputs(rng, seqlens=[100, 0, 70, 1], H=48, P=64, N=16, G=2, z=True,
                          D="HP", dtype=dtype, padding=1)
    y_ref, pool_ref = ssd_recurrent(**inp)
    y, after, before = _prefill(inp, precision=precision, chunk_size=32)
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], tol, inp["cu_seqlens"])


def test_prefill_single_context_equals_double_bitwise(monkeypatch, lnc):
    # shapes whose two chunk contexts would not fit SBUF (Falcon-H1-like) use
    # one; same arithmetic, so the results are bit-identical
    from nki_ssm.kernels.mamba2_ssd import chunk as chunk_kernel
    rng = np.random.default_rng(18)
    inp = make_ssd_inputs(rng, seqlens=[70, 33, 0], H=4, P=16, N=32, G=2, z=True, padding=1)
    y2, after2, _ = _prefill(inp, precision="bf16", chunk_size=16)
    monkeypatch.setattr(chunk_kernel, "_SBUF_BUDGET", 0)
    y1, after1, _ = _prefill(inp, precision="bf16", chunk_size=16)
    assert y1.tobytes() == y2.tobytes() and after1.tobytes() == after2.tobytes()


@pytest.mark.parametrize("H, P, N, chunk, budget", [
    (2, 16, 16, 16, None),       # two contexts, drained pipelines (2 blocks)
    (48, 64, 16, 32, None),      # two contexts, one shared pipeline (12 blocks, pe_add)
    (4, 16, 32, 16, 0),          # one context
])
def test_prefill_chunks_per_iteration_equal_bitwise(monkeypatch, H, P, N, chunk, budget, lnc):
    """2, 4 or 8 chunks per loop-B iteration (``prefill_per``): the same arithmetic per
    chunk, the state's HBM round trips exact, so bit-identical results in exact mode (in
    bf16 mode an all-masked chunk on the TensorE state path rounds the state to tfloat32
    once more); a ragged batch with initial states, an empty sequence, padding and
    groups ending in masked chunks."""
    from nki_ssm.kernels.mamba2_ssd import chunk as chunk_kernel
    from nki_ssm.ops.launch import mamba2_ssd as launch
    if budget is not None:
        monkeypatch.setattr(chunk_kernel, "_SBUF_BUDGET", budget)
    inp = make_ssd_inputs(np.random.default_rng(23), seqlens=[5 * chunk + 3, 0, 2 * chunk, 7],
                          H=H, P=P, N=N, G=1, z=True, slots=6, padding=1)
    out = {}
    for per in (2, 4, 8):
        monkeypatch.setattr(launch, "prefill_per", lambda *a, _p=per: _p)
        y, after, before = _prefill(inp, precision="fp32", chunk_size=chunk)
        out[per] = (y.tobytes(), after.tobytes())
    assert out[4] == out[2] and out[8] == out[2]
    y_ref, pool_ref = ssd_recurrent(**inp)
    _check(y, after, before, y_ref, pool_ref, inp["state_indices"], EXACT_TOL, inp["cu_seqlens"])


def test_prefill_per_by_bucket():
    from nki_ssm.ops.launch.mamba2_ssd import prefill_per
    assert prefill_per(16384, 1, 128) == 8 and prefill_per(512, 1, 128) == 4
    assert prefill_per(256, 1, 128) == 2 and prefill_per(16384, 64, 128) == 2
    assert prefill_per(16384, 8, 128) == 8 and prefill_per(16384, 16, 128) == 8


# ------------------------------------------------------------- one runtime loop level (issue 25)

def _loop_depths(fn):
    from nki_ssm.sim.trace import record
    with record() as trace:
        fn()
    return {len(inst.loop_path) for inst in trace.instructions}


@pytest.mark.parametrize("H, P, chunk", [(2, 16, 16), (48, 64, 32)])   # drained / pe_add
def test_prefill_runs_no_runtime_loop_inside_another(H, P, chunk, lnc):
    """A ragged batch with initial states, padding slots, an empty sequence and several
    chunks per sequence: every instruction sits in at most one runtime loop."""
    inp = make_ssd_inputs(np.random.default_rng(20), seqlens=[5 * chunk + 3, 0, 2 * chunk, 7],
                          H=H, P=P, N=16, G=1, z=True, slots=6, padding=1,
                          has_initial_state=np.array([True, True, False, True]))
    y_ref, pool_ref = ssd_recurrent(**inp)
    out = []
    depths = _loop_depths(lambda: out.append(_prefill(inp, precision="fp32", chunk_size=chunk)))
    assert max(depths) == 1
    _check(*out[0], y_ref, pool_ref, inp["state_indices"], EXACT_TOL, inp["cu_seqlens"])


def test_decode_runs_no_runtime_loop_inside_another(lnc):
    inp = make_ssd_decode_inputs(np.random.default_rng(21), num_seqs=5, T=2, H=2, P=16, N=16,
                                 z=True, padding=2)
    assert max(_loop_depths(lambda: _decode(inp))) == 1


def test_prefill_tables_work_list():
    """The flat work list: one row per chunk pair of each live sequence in order, its state
    source = the sequence's own block after its first pair, its initial state's block
    (has_initial_state) or the zero block; final blocks; zero rows for padding tokens."""
    from nki_ssm.ops.launch.mamba2_ssd import prefill_tables
    cu = np.array([0, 70, 70, 103, 108, 228], np.int32)   # lengths 70, 0, 33, 5, 120
    idx = np.array([4, 2, -1, 0, 1], np.int32)
    init = np.array([False, True, True, True, False])
    Q, T, S, pr = 16, 256, 8, 3
    pair_rows, pair_vals, init_tab, final_tab, zero_tab, counts = prefill_tables(
        cu, idx, init, T, S, Q, pr)
    # live: 0 (70 tok, 3 pairs), 1 (empty), 3 (5 tok, 1 pair), 4 (120 tok, 4 pairs)
    assert counts.tolist() == [[2, 8, 4, 3]]
    assert pair_rows.shape == (T // (2 * Q) + S, Q, 4) and pair_vals.shape == (T // 32 + S, 4)
    assert pair_vals[:8, 2].tolist() == [0, 0, 0, 2, 3, 3, 3, 3]    # blocks (live order)
    # the pair's source: seq 0 from zeros, then its own block; seq 3's init (block 2);
    # seq 4 from zeros, then its own block
    assert pair_vals[:8, 3].tolist() == [S, 0, 0, 2, S, 3, 3, 3]
    assert pair_vals[:8, 0].tolist() == [0, 32, 64, 103, 108, 140, 172, 204]
    assert pair_vals[:8, 1].tolist() == [16, 48, T, T, 124, 156, 188, 220]
    assert np.all(pair_vals[8:, 0:2] == T) and np.all(pair_vals[8:, 2:] == S)
    # pair 2 of sequence 0: tokens 64..69 valid, the rest masked to the dump row
    assert pair_rows[2, :, 1].tolist() == [1] * 6 + [0] * 10 and not pair_rows[2, :, 3].any()
    assert pair_rows[2, :6, 0].tolist() == list(range(64, 70))
    assert np.all(pair_rows[2, 6:, 0] == T) and np.all(pair_rows[2, :, 2] == T)
    # initial states: slots 2 (seq 1 -> block 1) and 0 (seq 3 -> block 2)
    assert init_tab[0, :pr, 0].tolist() == [6, 7, 8] and init_tab[0, 0, 1] == 1
    assert init_tab[1, :pr, 0].tolist() == [0, 1, 2] and init_tab[1, 0, 1] == 2
    assert final_tab[:4, 0, 1].tolist() == [0, 1, 2, 3]
    # an empty sequence without an initial state ends in zeros
    _, _, _, final2, _, _ = prefill_tables(cu, idx, np.zeros(5, bool), T, S, Q, pr)
    assert final2[:4, 0, 1].tolist() == [0, S, 2, 3]
    # padding tokens 70..102 in ceil(33 / 16) = 3 rows; room for a full bucket of them
    assert zero_tab.shape == (T // Q, Q, 1)
    assert zero_tab.reshape(-1)[:33].tolist() == list(range(70, 103))
    assert np.all(zero_tab.reshape(-1)[33:] == T)
    for q in range(16, 129, 16):     # issue 26 row 1: any chunk size, a whole bucket of padding
        *_, zt, c = prefill_tables(np.array([0, 100, 101]), np.array([-1, 0]), [False, False],
                                   128, 2, q, pr)
        assert zt.shape[0] * q >= 100 and c[0, 3] * q >= 100


def test_prefill_tables_four_chunks_per_row():
    """per = 4: a row holds four chunks (token rows / valid flags in columns 2c, 2c + 1,
    first token rows in pair_vals[:, c]), then the S^T block and the state source."""
    from nki_ssm.ops.launch.mamba2_ssd import prefill_tables
    T, S, Q, pr = 256, 4, 16, 3
    cu = np.array([0, 70, 70, 103, 200])
    idx = np.array([0, 2, -1, 1])
    rows, vals, _, _, _, counts = prefill_tables(cu, idx, np.array([False, True, False, False]),
                                                 T, S, Q, pr, per=4)
    assert rows.shape == (T // 64 + S, Q, 8) and vals.shape == (T // 64 + S, 6)
    # sequence 0 (70 tokens): 2 rows; sequence 1 (empty): none; sequence 3 (97): 2 rows
    assert counts[0, 1] == 4
    assert vals[:4, 0:4].tolist() == [[0, 16, 32, 48], [64, T, T, T], [103, 119, 135, 151],
                                      [167, 183, 199, T]]
    assert vals[:4, 4].tolist() == [0, 0, 2, 2] and vals[:4, 5].tolist() == [S, 0, S, 2]
    assert rows[1, :, 1].tolist() == [1] * 6 + [0] * 10 and not rows[1, :, 3::2].any()
    assert rows[3, :, 4].tolist() == [199] + [T] * 15
    assert np.all(vals[4:, 0:4] == T) and np.all(vals[4:, 4:] == S)


def test_prefill_tables_two_programs():
    """LNC=2: both programs read the same tables, counts included (one control flow), and
    run the whole work list on their heads: with two head parts the pool rows of a slot
    are 2 pr apart (part 1's a static offset in the kernel), nothing else changes."""
    from nki_ssm.ops.launch.mamba2_ssd import prefill_tables
    cu = np.array([0, 70, 70, 103], np.int32)
    idx = np.array([4, 2, 0], np.int32)
    init = np.array([True, False, True])
    one = prefill_tables(cu, idx, init, 256, 4, 16, 3)
    two = prefill_tables(cu, idx, init, 256, 4, 16, 3, 6)
    for k in (0, 1, 4, 5):
        assert one[k].tobytes() == two[k].tobytes()
    assert one[5].tolist() == [[2, 5, 3, 0]]      # 2 initial states, 3 + 0 + 2 pairs, 3 live
    assert two[2][0, :3, 0].tolist() == [24, 25, 26]    # slot 4: rows 4 * 6 + q
    assert two[3][:3, 0, 0].tolist() == [24, 12, 0]


def test_decode_tables_two_programs():
    """LNC=2: the live sequences split in order into two runs of n_live // 2 (full
    iterations of per entries, then single-entry rows), one counts row for both; an odd
    n_live leaves the last live sequence as program 0's spare entry (row 0 of its block)
    and program 1's row 0 a dump entry (pool rows 0 .. pr-1, sequence 0); padding
    sequences get no entry. One live sequence: no loop iteration, the spare only."""
    from nki_ssm.ops.launch.mamba2_ssd import decode_tables
    idx = np.array([3, -1, 5, 0, -1, 1, 2], np.int32)      # live 0, 2, 3, 5, 6
    seq, counts = decode_tables(idx, 8, 2, 2, 2)
    rows = 1 + 2 + 2                                       # spare, ceil(4 / 2) main, 2 tail
    assert seq.shape == (2 * rows, 128, 4) and counts.tolist() == [[1, 0, 1]]
    # main row of program 0: sequences 0, 2; of program 1: 3, 5; program 0's spare: 6
    assert seq[1, 0, 1::2].tolist() == [0, 2] and seq[rows + 1, 0, 1::2].tolist() == [3, 5]
    assert seq[0, 0, 1] == 6 and seq[0, :2, 0].tolist() == [2 * 2, 2 * 2 + 1]   # slot 2
    assert seq[rows, :2, 0].tolist() == [0, 1] and seq[rows, 0, 1] == 0         # dump entry
    assert seq[rows + 1, :2, 2].tolist() == [1 * 2, 1 * 2 + 1]     # sequence 5: slot 1
    seq, counts = decode_tables(idx, 8, 2, 4, 1)           # LNC=1: one main row, one tail
    assert counts.tolist() == [[1, 1, 0]]
    assert seq[1, 0, 1::2].tolist() == [0, 2, 3, 5] and seq[2, 0, 1] == 6
    _, lone = decode_tables(np.array([7], np.int32), 1, 2, 2, 2)
    assert lone.tolist() == [[0, 0, 1]]


# ------------------------------------------------------------- LNC=2: two programs (issue 29)

def _at_lnc(monkeypatch, lnc, fn):
    """fn() at NEURON_LOGICAL_NC_CONFIG=lnc -> (its result, the trace)."""
    from nki_ssm.sim.trace import record
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    with record() as trace:
        out = fn()
    return out, trace


def _program_sizes(trace, both_work=True):
    """Both programs' static sizes (asserted equal and <= 20,000); with ``both_work``
    each program ran runtime-loop iterations, else program 1 ran none."""
    sizes = [trace.program_instructions(p) for p in (0, 1)]
    assert sizes[0] == sizes[1] <= 20_000
    looped = [any(i.program_id == p and i.loop_path for i in trace.instructions) for p in (0, 1)]
    assert looped == [True, both_work]
    return sizes[0]


@pytest.mark.parametrize("H, P, N, G, chunk, precision", [
    (4, 16, 16, 2, 16, "bf16"),      # one group per program; _pair loop
    (3, 8, 136, 1, 16, "fp32"),      # odd H: 6 heads of P/2 (3 per program); two dstate tiles
    (6, 8, 16, 3, 32, "bf16"),       # the middle group's heads on both programs
    (48, 128, 16, 2, 32, "fp32"),    # 24 heads per program: the TensorE-balanced pipeline
])
def test_prefill_lnc2_equals_lnc1_bitwise(monkeypatch, H, P, N, G, chunk, precision):
    """A ragged batch with initial states, padding slots, an empty sequence and several
    chunks: LNC=2 (heads split over two programs) gives LNC=1's y and pool bit for bit;
    both programs work, with equal program sizes that do not depend on the batch."""
    def batch(seed, lens, padding):
        return make_ssd_inputs(np.random.default_rng(seed), seqlens=lens, H=H, P=P, N=N, G=G,
                               z=True, D="HP", slots=7, padding=padding,
                               has_initial_state=np.arange(len(lens)) % 3 != 1)

    inp = batch(30, [3 * chunk + 5, 0, 2 * chunk, 7, chunk + 1], 3)
    (y1, after1, before), _ = _at_lnc(monkeypatch, 1, lambda: _prefill(
        inp, precision=precision, chunk_size=chunk))
    (y2, after2, _), trace = _at_lnc(monkeypatch, 2, lambda: _prefill(
        inp, precision=precision, chunk_size=chunk))
    assert y2.tobytes() == y1.tobytes() and after2.tobytes() == after1.tobytes()
    y_ref, pool_ref = ssd_recurrent(**inp)
    tol = EXACT_TOL if precision == "fp32" else BF16_MODE_TOL
    _check(y2, after2, before, y_ref, pool_ref, inp["state_indices"], tol, inp["cu_seqlens"])
    size = _program_sizes(trace)
    other = batch(31, [chunk, 5 * chunk + 3, 1], 0)     # same buckets
    _, trace = _at_lnc(monkeypatch, 2, lambda: _prefill(other, precision=precision,
                                                        chunk_size=chunk))
    assert _program_sizes(trace) == size


def test_prefill_lnc2_one_head_runs_on_both_programs(monkeypatch):
    """One head of odd P does not split: program 1 runs program 0's head and loops into
    private dumps of y and the pool (one control flow); y and the pool equal LNC=1's bit
    for bit."""
    inp = make_ssd_inputs(np.random.default_rng(32), seqlens=[40, 0, 17], H=1, P=5, N=8,
                          z=True, slots=4, padding=1, has_initial_state=True)
    (y1, after1, _), _ = _at_lnc(monkeypatch, 1, lambda: _prefill(inp))
    (y2, after2, _), trace = _at_lnc(monkeypatch, 2, lambda: _prefill(inp))
    assert y2.tobytes() == y1.tobytes() and after2.tobytes() == after1.tobytes()
    _program_sizes(trace)
    loops = {pid: {k[1]: (v.entries, v.iterations) for k, v in trace.loops.items()
                   if k[0] == pid} for pid in (0, 1)}
    assert loops[0] == loops[1] and loops[0]


@pytest.mark.parametrize("num_seqs, T, pool_dtype, padding, unit_bytes", [
    (7, 2, np.float32, 2, None),     # 5 live: 3 + 2, each with a last partial iteration
    (6, None, BF16, 1, None),
    (5, None, np.float32, 1, 256 * 4),   # split states: one sequence per iteration
])
def test_decode_lnc2_equals_lnc1_bitwise(monkeypatch, num_seqs, T, pool_dtype, padding,
                                         unit_bytes):
    """Sequences split over two programs: y and the pool equal LNC=1's bit for bit,
    both programs work, equal program sizes independent of the batch."""
    def batch(seed, S, pad):
        return make_ssd_decode_inputs(np.random.default_rng(seed), num_seqs=S, T=T, H=4, P=64,
                                      N=256 if unit_bytes else 16, G=2, z=True, D="HP",
                                      pool_dtype=pool_dtype, padding=pad)

    inp = batch(33, num_seqs, padding)
    with contextlib.ExitStack() as stack:
        if unit_bytes:
            stack.enter_context(_unit_bytes(unit_bytes))
        (y1, after1, before), _ = _at_lnc(monkeypatch, 1, lambda: _decode(inp))
        (y2, after2, _), trace = _at_lnc(monkeypatch, 2, lambda: _decode(inp))
        size = _program_sizes(trace)
        _, trace = _at_lnc(monkeypatch, 2, lambda: _decode(batch(34, num_seqs + 1, 0)))
        assert _program_sizes(trace) == size
    assert y2.tobytes() == y1.tobytes() and after2.tobytes() == after1.tobytes()
    named = _named(inp["state_indices"])
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    assert after2[unnamed].tobytes() == before[unnamed].tobytes()
    y_ref, _ = ssd_decode(**inp)
    assert rel_fro(y2, y_ref) <= EXACT_TOL


def test_decode_lnc2_one_sequence_runs_on_program_0(monkeypatch):
    """One live sequence at LNC=2: it is program 0's spare entry; program 1 takes the same
    branch on a dump entry (same control flow), results equal LNC=1's bit for bit."""
    inp = make_ssd_decode_inputs(np.random.default_rng(35), num_seqs=1, T=None, H=2, P=16,
                                 N=16, z=True)
    (y1, after1, _), _ = _at_lnc(monkeypatch, 1, lambda: _decode(inp))
    (y2, after2, _), trace = _at_lnc(monkeypatch, 2, lambda: _decode(inp))
    assert y2.tobytes() == y1.tobytes() and after2.tobytes() == after1.tobytes()
    sizes = [trace.program_instructions(p) for p in (0, 1)]
    assert sizes[0] == sizes[1] <= 20_000
    assert [trace.branches[(p, ("if", 0))].outcomes for p in (0, 1)] == [[True], [True]]
    assert not any(loop.iterations for loop in trace.loops.values())
