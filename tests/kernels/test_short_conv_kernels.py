"""Short causal conv1d NKI kernels on the simulator, against the float64 reference.

Bounds:
- float32 I/O: relative Frobenius error <= 1e-6 (the kernel accumulates W
  exact fp32 products in fp32 PSUM and rounds once; observed ~1e-7).
- bfloat16 I/O (x, weight, pool bf16): the kernel's only rounding that
  matters is the final cast of y to bf16, so every element must be within
  one bf16 unit roundoff of the float64 reference: |y - ref| <= 2^-8 |ref|
  (+ 1e-5 max|ref| for the fp32 accumulation near zero crossings).
- pools hold copies of inputs, so the updated slots must equal the reference
  bit for bit, and unnamed slots must not change at all.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops  # noqa: E402
from nki_ssm.reference import short_conv as ref  # noqa: E402
from nki_ssm.reference.inputs import make_short_conv_decode_inputs, make_short_conv_inputs  # noqa: E402
from nki_ssm.reference.metrics import rel_fro  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
F32_TOL = 1e-6


def _kernel_prefill(inp):
    """Run the op on the simulator; returns (y, pool after, pool before)."""
    kw = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inp.items()}
    before = kw["conv_states"].copy()
    y = ops.short_conv_prefill(kw.pop("x"), kw.pop("weight"), kw.pop("bias"), backend="sim", **kw)
    return y, kw["conv_states"], before


def _ref_prefill(inp, pool):
    return ref.short_conv_prefill(inp["x"], inp["weight"], inp["bias"],
                                  activation=inp["activation"], cu_seqlens=inp["cu_seqlens"],
                                  conv_states=pool, state_indices=inp["state_indices"],
                                  has_initial_state=inp["has_initial_state"])


def _check_pool(after, before, ref_pool, state_indices):
    named = np.asarray(state_indices)[np.asarray(state_indices) >= 0]
    unnamed = np.setdiff1d(np.arange(before.shape[0]), named)
    # unnamed slots: the very same bytes (NaN payloads included)
    assert after[unnamed].tobytes() == before[unnamed].tobytes()
    # named slots hold copies of inputs: exact after the cast to the pool dtype
    np.testing.assert_array_equal(after[named].astype(np.float64),
                                  ref_pool[named].astype(after.dtype).astype(np.float64))


def _check_y(y, y_ref, dtype):
    assert y.dtype == dtype and y.shape == y_ref.shape
    if dtype == np.float32:
        assert rel_fro(y, y_ref) <= F32_TOL
    else:
        err = np.abs(y.astype(np.float64) - y_ref)
        bound = 2.0 ** -8 * np.abs(y_ref) + 1e-5 * np.abs(y_ref).max(initial=1e-30)
        assert np.all(err <= bound), float((err / bound).max())


def _run_and_check(inp):
    y, after, before = _kernel_prefill(inp)
    y_ref, ref_pool = _ref_prefill(inp, before)
    _check_y(y, y_ref, inp["x"].dtype)
    _check_pool(after, before, ref_pool, inp["state_indices"])
    return y, after


def _run_decode_and_check(inp, dtype):
    """Kernel decode on a copy of the pool vs the float64 reference -> y."""
    before = inp["conv_states"].copy()
    pool = before.copy()
    y = ops.short_conv_decode(inp["x"], inp["weight"], inp["bias"], activation="silu",
                              conv_states=pool, state_indices=inp["state_indices"], backend="sim")
    y_ref, pool_ref = ref.short_conv_decode(inp["x"], inp["weight"], inp["bias"],
                                            activation="silu", conv_states=before,
                                            state_indices=inp["state_indices"])
    _check_y(y, y_ref, dtype)
    _check_pool(pool, before, pool_ref, inp["state_indices"])
    return y


# --------------------------------------------------------------------------- prefill

@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_prefill_ragged_edge_lengths(rng, W, dtype, lnc):
    """T = 1, T < W-1, empty, a padding slot and a normal sequence in one launch."""
    inp = make_short_conv_inputs(rng, seqlens=[1, W - 2, 0, 7, 5], dim=256, W=W, dtype=dtype,
                                 pool_dtype=dtype, padding=1, has_initial_state="mixed")
    y, _ = _run_and_check(inp)
    pad = np.flatnonzero(inp["state_indices"] < 0)
    cu = inp["cu_seqlens"]
    for s in pad:
        assert not np.any(y[cu[s]:cu[s + 1]].astype(np.float64))


@pytest.mark.parametrize("x_dtype,pool_dtype,w_dtype", [
    (np.float32, BF16, np.float32),     # fp32 matmuls, bf16 pool cast on store
    (BF16, np.float32, BF16),           # bf16 x staged up to fp32 (fp32 pool values kept exact)
    (BF16, BF16, np.float32),           # hi+lo bf16 split of fp32 weights
])
def test_prefill_mixed_dtypes(rng, x_dtype, pool_dtype, w_dtype, lnc):
    inp = make_short_conv_inputs(rng, seqlens=[3, 1, 9], dim=256, W=4, dtype=x_dtype,
                                 pool_dtype=pool_dtype, has_initial_state=[True, True, False])
    _with_param_dtype(rng, inp, w_dtype)
    _run_and_check(inp)


def _with_param_dtype(rng, inp, w_dtype):
    """weight / bias in w_dtype; float32 ones get full float32 mantissas (not bf16 values),
    so the kernel's hi + lo split is exercised."""
    for name in ("weight", "bias"):
        v = inp[name].astype(np.float64)
        if w_dtype == np.float32:
            v = v * (1.0 + 1e-3 * rng.standard_normal(v.shape))
        inp[name] = v.astype(w_dtype)


def test_prefill_partial_tile_no_bias_no_activation(rng, lnc):
    """dim 192 = one full and one 64-channel tile; identity activation, no bias."""
    inp = make_short_conv_inputs(rng, seqlens=[4, 2], dim=192, W=3, bias=False, activation=None,
                                 has_initial_state=True)
    _run_and_check(inp)


def test_prefill_long_sequence_crosses_chunks(rng, lnc):
    """A 700-token sequence spans two 512-token chunks (the second chunk's window starts
    16 tokens before it, gathered by index)."""
    inp = make_short_conv_inputs(rng, seqlens=[700, 130], dim=256, W=4, dtype=BF16,
                                 pool_dtype=BF16, has_initial_state=True)
    _run_and_check(inp)


def test_prefill_repeated_calls_continue_sequences(rng, lnc):
    """Two calls over the halves of each sequence == one call over the whole sequences."""
    dim, W = 256, 4
    full = make_short_conv_inputs(rng, seqlens=[6, 2, 9], dim=dim, W=W, has_initial_state=True)
    lengths = np.diff(full["cu_seqlens"])
    first_len = np.array([4, 1, 2])
    pool = full["conv_states"].copy()
    ys = []
    for part in (0, 1):
        lens = first_len if part == 0 else lengths - first_len
        starts = full["cu_seqlens"][:-1] + (0 if part == 0 else first_len)
        x = np.concatenate([full["x"][s:s + n] for s, n in zip(starts, lens)])
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        ys.append(ops.short_conv_prefill(x, full["weight"], full["bias"], activation="silu",
                                         cu_seqlens=cu, conv_states=pool,
                                         state_indices=full["state_indices"],
                                         has_initial_state=np.ones(3, bool), backend="sim"))
    y_ref, pool_ref = _ref_prefill(full, full["conv_states"])
    cu1 = np.concatenate([[0], np.cumsum(first_len)])
    cu2 = np.concatenate([[0], np.cumsum(lengths - first_len)])
    y = np.concatenate([np.concatenate([ys[0][cu1[s]:cu1[s + 1]], ys[1][cu2[s]:cu2[s + 1]]])
                        for s in range(3)])
    assert rel_fro(y, y_ref) <= F32_TOL
    _check_pool(pool, full["conv_states"], pool_ref, full["state_indices"])


def test_prefill_varlen_equals_separate_calls(rng, lnc):
    """A ragged batch (empty, T = 1, T < W-1, one spanning chunks, mixed initial states)
    gives, bit for bit, the y rows and pool slots of one call per sequence."""
    inp = make_short_conv_inputs(rng, seqlens=[2, 0, 600, 1, 9], dim=160, W=4, dtype=BF16,
                                 pool_dtype=BF16, slots=7, has_initial_state="mixed")
    y, after, _ = _kernel_prefill(inp)
    cu = inp["cu_seqlens"]
    pool = inp["conv_states"].copy()
    for s in range(len(cu) - 1):
        one = dict(inp, x=inp["x"][cu[s]:cu[s + 1]], conv_states=pool,
                   cu_seqlens=np.array([0, cu[s + 1] - cu[s]], dtype=np.int32),
                   state_indices=inp["state_indices"][s:s + 1],
                   has_initial_state=inp["has_initial_state"][s:s + 1])
        y1, pool, _ = _kernel_prefill(one)
        assert y1.tobytes() == y[cu[s]:cu[s + 1]].tobytes(), s
    assert pool.tobytes() == after.tobytes()


def test_prefill_all_padding_touches_nothing(rng, lnc):
    """Every sequence a padding slot: y is zeros and the pool keeps its bytes."""
    inp = make_short_conv_inputs(rng, seqlens=[3, 0, 5], dim=128, W=4, dtype=BF16,
                                 pool_dtype=BF16, slots=4)
    inp["state_indices"] = np.full(3, -1, dtype=inp["state_indices"].dtype)
    y, after, before = _kernel_prefill(inp)
    assert y.shape == inp["x"].shape and not np.any(y.astype(np.float64))
    assert after.tobytes() == before.tobytes()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_prefill_garbage_in_fresh_slots_and_padding_tokens(rng, bad, lnc):
    """Slots of sequences without initial state hold NaN / Inf, and so do the tokens of
    padding sequences: neither reaches a live output or a stored state (the old state of
    a fresh sequence is zeroed, the new state is picked by a DMA offset, never by a mask)."""
    inp = make_short_conv_inputs(rng, seqlens=[2, 4, 1, 0, 3, 5], dim=160, W=4,
                                 slots=9, padding=2, has_initial_state="mixed")
    idx, init = inp["state_indices"], inp["has_initial_state"]
    fresh = idx[(idx >= 0) & ~np.asarray(init, bool)]
    assert fresh.size, "the mixed case names a fresh slot"
    inp["conv_states"][fresh] = bad
    cu = inp["cu_seqlens"]
    for s in np.flatnonzero(idx < 0):
        inp["x"][cu[s]:cu[s + 1]] = bad
    y, _ = _run_and_check(inp)
    assert np.all(np.isfinite(y))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prefill_hypothesis_ragged(data):
    """Random ragged batches: lengths 0..12 (T = 1, T < W-1, empty), padding, mixed
    initial states, W 2..8, partial channel tiles, both dtypes, bias or not, LNC=1 or 2."""
    seed = data.draw(st.integers(0, 2**31 - 1))
    W = data.draw(st.sampled_from([2, 3, 4, 8]))
    dim = data.draw(st.sampled_from([64, 128, 160, 256]))
    lens = data.draw(st.lists(st.integers(0, 12), min_size=1, max_size=4))
    padding = data.draw(st.integers(0, len(lens) - 1))
    dtype = data.draw(st.sampled_from([np.float32, BF16]))
    rng = np.random.default_rng(seed)
    inp = make_short_conv_inputs(rng, seqlens=lens, dim=dim, W=W, dtype=dtype, pool_dtype=dtype,
                                 padding=padding, has_initial_state="mixed",
                                 bias=data.draw(st.booleans()))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEURON_LOGICAL_NC_CONFIG", str(data.draw(st.sampled_from([1, 2]))))
        _run_and_check(inp)


def test_invalid_call_changes_nothing(rng):
    inp = make_short_conv_inputs(rng, seqlens=[3, 2], dim=128, W=4)
    pool = inp["conv_states"].copy()
    bad = inp["state_indices"].copy()
    bad[1] = pool.shape[0]          # out of range
    with pytest.raises(ValueError, match="state_indices"):
        ops.short_conv_prefill(inp["x"], inp["weight"], inp["bias"], activation="silu",
                               cu_seqlens=inp["cu_seqlens"], conv_states=pool,
                               state_indices=bad, has_initial_state=inp["has_initial_state"],
                               backend="sim")
    assert pool.tobytes() == inp["conv_states"].tobytes()


def _prefill_lengths(draw, W, total_lo, total_hi, n_lo, n_hi):
    """Ragged lengths with the edge cases: 0, 1, < W-1, and one that spans chunks; the
    total in [total_lo, total_hi] so the batch stays in one token bucket."""
    n = draw(st.integers(n_lo, n_hi))
    kinds = draw(st.lists(st.sampled_from(["zero", "one", "short", "mid"]), min_size=n - 1,
                          max_size=n - 1))
    lens = [{"zero": 0, "one": 1, "short": max(0, W - 2)}.get(k, 0) for k in kinds]
    for i, k in enumerate(kinds):
        if k == "mid":
            lens[i] = draw(st.integers(2, 60))
    # the long one takes the rest: several chunks when the bucket is above one chunk
    rest = draw(st.integers(total_lo, total_hi)) - sum(lens)
    lens.insert(draw(st.integers(0, n - 1)), max(rest, 0))
    return lens


@pytest.mark.parametrize("dtype,pool_dtype", [(np.float32, np.float32), (BF16, BF16),
                                              (BF16, np.float32)])
def test_prefill_one_specialisation_per_bucket(dtype, pool_dtype, lnc):
    """Many ragged batches within one bucket (513..1024 tokens -> token bucket 1024 =
    two 512-token chunks; 5..8 sequences -> sequence bucket 8): lengths 0, 1, < W-1 and
    one spanning both chunks, padding slots anywhere, mixed has_initial_state. The
    kernel is compiled once, and every call matches the float64 reference (y, named and
    unnamed pool slots)."""
    from nki_ssm import sim

    sim.reset_specialisations()
    W = 4

    @settings(max_examples=10, deadline=None)
    @given(data=st.data())
    def check(data):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
        lens = _prefill_lengths(data.draw, W, 513, 1024, 5, 8)
        inp = make_short_conv_inputs(rng, seqlens=lens, dim=160, W=W, dtype=dtype,
                                     pool_dtype=pool_dtype, slots=12,
                                     padding=data.draw(st.integers(0, len(lens) - 1)),
                                     has_initial_state="mixed")
        y, _ = _run_and_check(inp)
        cu = inp["cu_seqlens"]
        for s in np.flatnonzero(inp["state_indices"] < 0):
            assert not np.any(y[cu[s]:cu[s + 1]].astype(np.float64))

    check()
    spec = {k: v for k, v in sim.specialisations().items() if "short_conv_prefill" in k}
    assert list(spec.values()) == [1], spec


def test_prefill_program_size_does_not_grow_with_tokens(rng, lnc):
    """One sequence of 3000 tokens (bucket 4096: 3 chunk pairs) and of 9000 (bucket
    16384: 9 pairs): the same static program (each runtime loop body once)."""
    from nki_ssm.sim.trace import record

    sizes = []
    for n in (3000, 9000):
        inp = make_short_conv_inputs(rng, seqlens=[n], dim=128, W=4, dtype=BF16,
                                     pool_dtype=BF16, has_initial_state=True, bias=False)
        with record() as trace:
            _run_and_check(inp)
        sizes.append(trace.program_instructions())
        # a runtime loop ran more than once (3000: two single-pair iterations; 9000: one
        # of PAIRS_PER_ITERATION pairs and three single ones)
        assert max(lp.iterations for lp in trace.loops.values()) >= 2, trace.loops
    assert sizes[0] == sizes[1], sizes


def _max_loop_depth(trace) -> int:
    return max((len(inst.loop_path) for inst in trace.instructions), default=0)


@pytest.mark.parametrize("dim", [256, 200])
def test_prefill_no_runtime_loop_inside_a_runtime_loop(rng, dim, lnc):
    """Issue 25: on a ragged batch with initial states (mixed), padding slots, empty and
    short sequences and one spanning several chunks, no instruction sits in more than one
    runtime loop -- and the result still matches the float64 reference. dim 200 adds the
    partial channel tile (a second channel group and head group)."""
    from nki_ssm.sim.trace import record

    inp = make_short_conv_inputs(rng, seqlens=[5, 0, 1300, 2, 1, 700], dim=dim, W=4, dtype=BF16,
                                 pool_dtype=BF16, slots=9, padding=2, has_initial_state="mixed")
    with record() as trace:
        _run_and_check(inp)
    runtime = [lp for lp in trace.loops.values() if lp.iterations > 1]
    assert runtime, "the stream and head loops iterate"
    assert _max_loop_depth(trace) == 1


@pytest.mark.parametrize("num_seqs,padding", [(6, 2), (80, 5)])
def test_decode_no_runtime_loop_inside_a_runtime_loop(rng, num_seqs, padding, lnc):
    """Issue 25: decode with padding slots, either row layout (6 live sequences: the wide
    layout; 75: one block per sequence), T = 2: every instruction sits in at
    most one runtime loop, and the result matches the float64 reference."""
    from nki_ssm.sim.trace import record

    inp = make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=2, dim=512, W=4, dtype=BF16,
                                        pool_dtype=BF16, padding=padding, bias=False)
    with record() as trace:
        _run_decode_and_check(inp, BF16)
    assert any(inst.loop_path for inst in trace.instructions)
    assert _max_loop_depth(trace) == 1


def test_prefill_tables_from_cu_seqlens():
    """The launcher's tables: live sequences compacted first, head rows clamped into the
    bucket, y rows per (token, channel tile) (scratch rows past the bucket for k >=
    length), slot and case min(length, H), the compacted slots that start from zeros, loop
    counts."""
    from nki_ssm.kernels.short_conv.prefill import PAIRS_PER_ITERATION
    from nki_ssm.ops.launch.short_conv import prefill_tables

    cu = np.array([0, 2, 2, 7, 600])                 # lengths 2, 0, 5, 593
    idx = np.array([4, -1, 0, 3])
    init = np.array([True, True, False, True])
    win_base, rows, yrows, info, zslots, counts = prefill_tables(cu, idx, init, 1024, 4, 4, 256)
    H, M = 3, 16
    assert win_base.shape == (128, 5) and win_base[0, 0] == -M and win_base[1, 2] == 256 + 1 - M
    live_order = [0, 2, 3]                           # the padding sequence goes last
    starts, ends = cu[:-1][live_order], cu[1:][live_order]
    assert rows.shape == (4, 2 * M, 1) and rows.dtype == np.uint32
    np.testing.assert_array_equal(rows[:3, :M, 0], np.clip(starts[:, None] + np.arange(M), 0, 1023))
    np.testing.assert_array_equal(rows[:3, M:, 0], np.clip(ends[:, None] - M + np.arange(M), 0, 1023))
    # y as 128-channel rows (2 per token at dim 256): row_k * 2 + tile j at (j * H + k) of
    # one column (128 // H = 42 tiles per column)
    assert yrows.shape == (4, 1, 128)
    assert (yrows[:3, 0, 0:H] // 2).tolist() == [[0, 1, 1024 + 2], [2, 3, 4], [7, 8, 9]]
    assert yrows[2, 0, 1 * H + 1] == 8 * 2 + 1
    # dim 300: two full tiles in column 0, the 44-channel tile alone in column 1
    _, _, yr300, _, _, _ = prefill_tables(cu, idx, init, 1024, 4, 4, 300)
    assert yr300.shape == (4, 2, 128) and yr300[1, 1, 0:H].tolist() == [2 * 3 + 2, 3 * 3 + 2, 4 * 3 + 2]
    assert info.shape == (4, 2) and info[:3].tolist() == [[4, 2], [0, 3], [3, 3]]
    # slot 0 (live, no initial state) is the one slot the zero loop writes
    assert zslots.shape == (4, 1) and zslots[0, 0] == 0
    # 600 tokens -> 2 chunks of 512 -> 1 pair: no loop iteration (of PAIRS_PER_ITERATION
    # pairs or of one) + the last pair; 3 live sequences; 1 slot to zero
    assert counts.tolist() == [[0, 0, 3, 1]]
    # 16K tokens in a 16K bucket: 16 pairs, 15 in the loops (3 x 5 + 0), then the last
    many = prefill_tables(np.array([0, 16384]), np.array([0]), np.array([False]), 16384, 1,
                          4, 256)[5]
    assert many.tolist() == [[15 // PAIRS_PER_ITERATION, 15 % PAIRS_PER_ITERATION, 1, 1]]
    # LNC=2, dim 256: two programs of one tile each, y as 2 rows per token (one per
    # program: each adds its block's offset), the same tables and one counts row for both
    t2 = prefill_tables(cu, idx, init, 1024, 4, 4, 256, programs=2)
    assert t2[2].shape == (4, 1, 128) and (t2[2][:3, 0, 0:H] // 2).tolist() == [
        [0, 1, 1024 + 2], [2, 3, 4], [7, 8, 9]]
    assert (t2[2][:3, 0, 0:H] % 2 == 0).all() and t2[5].tolist() == [[0, 0, 3, 1]]
    # dim 300 -> 150 channels per program: a full and a 22-channel tile each, 4 rows per
    # token (2 per program)
    t300 = prefill_tables(cu, idx, init, 1024, 4, 4, 300, programs=2)
    assert t300[2].shape == (4, 2, 128) and t300[2][1, 1, 0:H].tolist() == [
        2 * 4 + 1, 3 * 4 + 1, 4 * 4 + 1]
    # dim 128: program 1 has no channels of its own (the same counts: it runs program 0's
    # loops into dumps), y keeps a block for it
    t128 = prefill_tables(cu, idx, init, 1024, 4, 4, 128, programs=2)
    assert t128[5].tolist() == [[0, 0, 3, 1]] and t128[2][1, 0, 0] == 2 * 2


# --------------------------------------------------------------------------- decode

@pytest.mark.parametrize("T", [None, 1, 3])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_decode_matches_reference(rng, T, dtype, lnc):
    """T = 1 ([num_seqs, dim] and [num_seqs, 1, dim]) and a 3-token speculative step."""
    inp = make_short_conv_decode_inputs(rng, num_seqs=5, T=T, dim=256, W=4, dtype=dtype,
                                        pool_dtype=dtype, padding=1)
    y = _run_decode_and_check(inp, dtype)
    assert not np.any(y[inp["state_indices"] < 0].astype(np.float64))


# --------------------------------------------------------------------------- docs

def test_kernel_docstrings_state_layouts_limits_engine_plan():
    from nki_ssm.kernels import short_conv

    doc = short_conv.__doc__
    for word in ("Layouts", "Limits", "Engine plan", "[num_tokens, dim]", "[slots, dim, W-1]",
                 "compile-time", "modeled"):
        assert word in doc, word


def test_prefill_several_channel_groups(rng, lnc):
    """dim 2240 = a 16-tile group, a 1-tile group and a 64-channel partial tile: heads of
    the first groups carried by the next group's stream loop, the last group's in the
    final head loop."""
    inp = make_short_conv_inputs(rng, seqlens=[5, 0, 2], dim=2240, W=4, dtype=BF16,
                                 pool_dtype=BF16, has_initial_state=[True, True, False])
    _run_and_check(inp)


@pytest.mark.parametrize("num_seqs,dim,T,pool_dtype,wide", [
    (130, 128, 1, np.float32, None),   # one-block layout only (dim 128), two groups, fp32 pool
    (100, 256, 2, BF16, False),  # R = 2 pool rows; one block: TensorE taps, 2 rows / partition
    (3, 96, 2, np.float32, None),      # one-block layout only, a partial sub-tile
    (40, 256, 4, BF16, None),    # wide layout R = 2, one group
    (40, 512, 1, BF16, None),    # wide layout R = 4: two groups of 32 positions
    (20, 512, 1, BF16, False),   # one block forced: 4 pool rows per partition, TensorE taps
    (6, 512, 3, np.float32, False),    # one block forced at a small batch: 4 rows / partition
])
def test_decode_row_split_and_groups(rng, monkeypatch, num_seqs, dim, T, pool_dtype, wide, lnc):
    """Both row layouts (the launcher's pick or forced), partition groups, both tap
    engines; W = 2, 3, 4."""
    from nki_ssm.ops.launch import short_conv as launch

    if wide is not None:
        monkeypatch.setattr(launch, "use_wide_layout", lambda n, R: wide)
    W = {1: 2, 2: 3, 3: 4, 4: 4}[T]
    inp = make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=T, dim=dim, W=W,
                                        dtype=BF16, pool_dtype=pool_dtype, padding=2)
    _run_decode_and_check(inp, BF16)


@pytest.mark.parametrize("num_seqs,dim,T,W,dtype,bias", [
    (24, 2048, 1, 4, BF16, False),     # wide R = 4, 2-sub-tile fused steps, TensorE tap sums
    (24, 2048, 1, 4, BF16, True),      # the same with a bias
    (9, 4096, 2, 3, np.float32, True),  # float32, a 2-token step, 4-sub-tile fused steps
    (5, 2176, 1, 4, BF16, True),       # a partial sub-tile per block: per-sub-tile taps too
])
def test_decode_wide_fused_taps(rng, num_seqs, dim, T, W, dtype, bias, lnc):
    """The wide layout's fused taps (one multiply by zero-stride weights and one tap
    reduction per step, half the sub-tiles summed on TensorE) and the weight columns
    loaded as rows and transposed on TensorE."""
    inp = make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=T, dim=dim, W=W,
                                        dtype=dtype, pool_dtype=dtype, padding=1, bias=bias)
    _run_decode_and_check(inp, dtype)


@pytest.mark.slow
def test_model_dim_prefill_and_decode(rng, lnc):
    """Qwen3-Next conv dim 8192 (4 channel groups): a ragged prefill across a chunk
    boundary with T = 1, empty and padding sequences, then a 2-token decode of 130
    sequences (two partition groups) continuing from the same pool."""
    inp = make_short_conv_inputs(rng, seqlens=[600, 1, 0, 37], dim=8192, W=4, dtype=BF16,
                                 pool_dtype=BF16, padding=1, slots=140, bias=False)
    _run_and_check(inp)
    dec = make_short_conv_decode_inputs(rng, num_seqs=130, T=2, dim=8192, W=4, dtype=BF16,
                                        pool_dtype=BF16, padding=3, slots=140, bias=False)
    assert dec["bias"] is None  # Qwen3-Next conv has no bias
    _run_decode_and_check(dec, BF16)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_decode_hypothesis(data):
    """Random decode batches: 1..140 sequences (R from 1 to 64 channel blocks), T 1..4,
    W 2..8, padding, dims that are not powers of two, bias or not, both dtypes, LNC=1 or 2
    (dims 200 and 256 split across the two programs)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    num_seqs = data.draw(st.integers(1, 140))
    dtype = data.draw(st.sampled_from([np.float32, BF16]))
    inp = make_short_conv_decode_inputs(
        rng, num_seqs=num_seqs, T=data.draw(st.integers(1, 4)),
        dim=data.draw(st.sampled_from([64, 96, 128, 200, 256])),
        W=data.draw(st.sampled_from([2, 3, 4, 8])),
        dtype=dtype, pool_dtype=data.draw(st.sampled_from([np.float32, BF16])),
        padding=data.draw(st.integers(0, num_seqs - 1)), bias=data.draw(st.booleans()))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEURON_LOGICAL_NC_CONFIG", str(data.draw(st.sampled_from([1, 2]))))
        _run_decode_and_check(inp, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("x_dtype,pool_dtype,w_dtype", [
    (np.float32, np.float32, np.float32),   # fp32 matmuls: smaller channel groups fit SBUF
    (BF16, np.float32, np.float32),         # staged bf16 x, fp32 weights
    (BF16, BF16, np.float32),               # hi + lo split weights
])
def test_model_dim_prefill_precisions(rng, x_dtype, pool_dtype, w_dtype, lnc):
    """dim 8192 with every precision plan (the SBUF working set depends on it)."""
    inp = make_short_conv_inputs(rng, seqlens=[130, 2], dim=8192, W=4, dtype=x_dtype,
                                 pool_dtype=pool_dtype, has_initial_state=True)
    _with_param_dtype(rng, inp, w_dtype)
    _run_and_check(inp)


def test_precision_flags_split_only_non_bf16_weights():
    """fp32 weights that are bf16 values need no hi/lo split; others do."""
    from nki_ssm.ops.launch.short_conv import _precision_flags

    x = np.zeros((4, 128), BF16)
    pool = np.zeros((2, 128, 3), BF16)
    w_exact = np.ones((128, 4), np.float32) * 0.375
    w_full = np.full((128, 4), 0.1, np.float32)
    assert _precision_flags(x, w_exact, None, pool) == (False, False, False, False)
    assert _precision_flags(x, w_full, w_full[:, 0], pool) == (False, False, True, True)
    assert _precision_flags(x, w_full, None, pool.astype(np.float32)) == (True, True, False, False)


def test_kernels_import_only_the_backend_and_take_tuples(rng, monkeypatch):
    """Layering (kernels import nki_ssm.backend and the kernels' shared helpers only) and NKI
    argument rules: the launcher
    passes arrays, scalars, strings, None and tuples -- never lists."""
    import ast
    import pathlib

    import nki_ssm.kernels.short_conv as pkg
    from nki_ssm import backend as nki_backend

    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):     # the backend, and the kernels' helpers
                assert node.module in ("nki_ssm.backend", "nki_ssm.kernels._common",
                                       "nki_ssm.kernels.scaffold",
                                       "nki_ssm.kernels.short_conv.split"), \
                    (path.name, node.module)
            assert not isinstance(node, ast.Import), path.name
            assert not isinstance(node, ast.Raise), path.name      # NKI rejects raise
            if isinstance(node, ast.Compare):
                assert not any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops), path.name

    seen = []
    real = nki_backend.run

    def spy(kernel, *args, backend, lnc=None):
        seen.append(args)
        return real(kernel, *args, backend=backend, lnc=lnc)

    monkeypatch.setattr(nki_backend, "run", spy)   # the launchers' host path (host_call)
    inp = make_short_conv_inputs(rng, seqlens=[3, 0], dim=128, W=3, padding=1)
    _run_and_check(inp)
    dec = make_short_conv_decode_inputs(rng, num_seqs=2, T=1, dim=128, W=3)
    ops.short_conv_decode(dec["x"], dec["weight"], dec["bias"], conv_states=dec["conv_states"],
                          state_indices=dec["state_indices"], backend="sim")
    assert len(seen) == 2
    for args in seen:
        for a in args:
            assert a is None or isinstance(a, (np.ndarray, bool, int, str, tuple)), type(a)


# --------------------------------------------------------------------------- decode: runtime batch

def _decode_both(inp, dtype):
    """(reference y, sim y) of one decode call, each on its own copy of the pool; the
    sim result is also checked against the reference (y and pools)."""
    kw = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inp.items()}
    y_ref = ops.short_conv_decode(kw.pop("x"), kw.pop("weight"), kw.pop("bias"),
                                  backend="reference", **kw)
    return y_ref, _run_decode_and_check(inp, dtype)


@pytest.mark.parametrize("num_seqs,dim,T", [
    (1, 8192, 16),      # issue 9 row 2: PSUM ran out for T >= 15 at W = 4
    (1, 200, 16),       # dim not a multiple of 128 (one block, partial sub-tiles)
    (3, 131, 17),       # odd dim: one channel block, odd T
    (70, 128, 16),      # > 64 sequences (one block, one group of 128 positions)
])
def test_decode_long_speculative_steps_fit_psum(rng, num_seqs, dim, T, lnc):
    """Issue 9 row 2: any T works (tokens processed in PSUM-sized slices) on every
    backend, and the kernel matches the reference."""
    inp = make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=T, dim=dim, W=4,
                                        dtype=BF16, pool_dtype=BF16, bias=False)
    y_ref, y = _decode_both(inp, BF16)
    assert y_ref.shape == y.shape == (num_seqs, T, dim)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e30])
def test_decode_padding_row_nan_gives_zeros(rng, bad, lnc):
    """Issue 9 row 3: a padding row's x is never read, so NaN / Inf / huge garbage there
    gives zeros (the contract) on every backend, and the live rows are unaffected."""
    inp = make_short_conv_decode_inputs(rng, num_seqs=3, T=2, dim=128, W=4)
    inp["state_indices"] = np.array([1, 3, -1], dtype=np.int32)
    inp["x"][2] = bad
    y_ref, y = _decode_both(inp, np.float32)
    for out in (y_ref, y):
        assert np.all(np.isfinite(out)) and not np.any(out[2])


@pytest.mark.parametrize("num_seqs,padding", [(1, 0), (1, 1), (3, 0), (5, 2), (7, 0), (6, 5)])
def test_decode_one_and_odd_numbers_of_live_sequences(rng, num_seqs, padding, lnc):
    """1 sequence, odd numbers of live sequences and an all-but-one-padding batch: the
    last group's unused positions mirror a live sequence (issue 14 item 7)."""
    inp = make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=1, dim=256, W=4,
                                        padding=padding)
    _run_decode_and_check(inp, np.float32)


def test_decode_all_padding_touches_nothing(rng, lnc):
    inp = make_short_conv_decode_inputs(rng, num_seqs=4, T=1, dim=128, W=3, padding=4)
    y = _run_decode_and_check(inp, np.float32)
    assert not np.any(y)


def test_decode_tables_compact_live_sequences_and_mirror_padding():
    """The launcher's tables: live sequences first (stable), padding positions of the
    last live group mirror its first sequence; pool rows block-major per group, one
    row per (position, block) for the wide layout, RB / R per partition otherwise;
    counts give the layout not picked a zero trip count."""
    from nki_ssm.ops.launch.short_conv import decode_plan, decode_tables

    idx = np.array([-1, 5, -1, 2, 7, -1, -1, -1])
    order, pos, pool_rows, num_live = decode_tables(idx, 8, 16, 16)    # Pn = 8: one group
    assert list(order) == [1, 3, 4, 1, 1, 1, 1, 1]
    assert list(pos[[1, 3, 4]]) == [0, 1, 2]
    assert num_live == 3
    assert pool_rows.shape == (8, 16) and pool_rows.dtype == np.int32
    flat = pool_rows.reshape(-1)            # group 0: partition r * 8 + i
    assert list(flat[:8]) == [80, 32, 112, 80, 80, 80, 80, 80]      # slot * 16 + 0
    assert list(flat[8:11]) == [81, 33, 113]                        # block r = 1
    order, _, pool_rows, _ = decode_tables(idx, 8, 32, 32)          # Pn = 4: two groups
    assert list(order[:4]) == [1, 3, 4, 1]
    # one block per sequence over a pool of 4 rows per slot: each position's 4 rows
    order, _, pool_rows, _ = decode_tables(idx, 8, 1, 4)
    assert list(order[:3]) == [1, 3, 4]
    assert pool_rows[:3].tolist() == [[20, 21, 22, 23], [8, 9, 10, 11], [28, 29, 30, 31]]
    R, parts, _, _, _, _, counts = decode_plan(idx, 8, 512)
    assert (R, parts) == (4, 1) and counts.tolist() == [[3, 0, 0]] and counts.dtype == np.int32
    live = np.concatenate([np.arange(40), -np.ones(24, int)])
    _, _, order, _, _, _, counts = decode_plan(live, 64, 512)      # 40 * 4 rows: two groups
    assert counts.tolist() == [[40, 0, 0]] and list(order[40:]) == [32] * 24
    live = np.concatenate([np.arange(70), -np.ones(58, int)])
    _, _, order, _, _, _, counts = decode_plan(live, 128, 512)     # 70 * 4 > 256: one block
    assert counts.tolist() == [[0, 70, 1]] and list(order[70:]) == [0] * 58
    none = decode_plan(np.full(8, -1), 8, 512)[-1]
    assert none.tolist() == [[0, 0, 0]]
    # LNC=2: two programs of 256 channels (R = 2 blocks of 128 each), the pool viewed as 4
    # rows per slot; one table for both (program 1 adds its 2 rows), one counts row for both
    R, parts, order, _, rows_wide, rows_one, counts = decode_plan(idx, 8, 512, programs=2)
    assert (R, parts) == (2, 2) and counts.tolist() == [[3, 0, 0]]
    assert rows_wide.shape == (8, 2) and list(rows_wide.reshape(-1)[:3]) == [20, 8, 28]
    assert rows_wide.reshape(-1)[8] == 5 * 4 + 1                 # block 1 of slot 5
    assert rows_one[:3].tolist() == [[20, 21], [8, 9], [28, 29]]
    # dim 128 (one channel tile): program 1 has no channels of its own, the same counts
    R, parts, _, _, _, _, counts = decode_plan(idx, 8, 128, programs=2)
    assert (R, parts) == (1, 1) and counts.tolist() == [[0, 3, 1]]


@pytest.mark.parametrize("pool_dtype", [np.float32, BF16])
def test_decode_one_specialisation_per_bucket(pool_dtype, lnc):
    """Many random batches within one bucket (5..8 sequences -> bucket 8; padding slots
    anywhere, all-padding included): the kernel is compiled once, and every call
    matches the float64 reference (y, named and unnamed pool slots)."""
    from nki_ssm import sim

    sim.reset_specialisations()

    @settings(max_examples=12, deadline=None)
    @given(data=st.data())
    def check(data):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
        num_seqs = data.draw(st.integers(5, 8))
        inp = make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=2, dim=256, W=4,
                                            dtype=BF16, pool_dtype=pool_dtype, slots=11,
                                            padding=data.draw(st.integers(0, num_seqs)))
        _run_decode_and_check(inp, BF16)

    check()
    spec = {k: v for k, v in sim.specialisations().items() if "short_conv_decode" in k}
    assert list(spec.values()) == [1], spec


def test_decode_program_size_does_not_grow_with_sequences(rng, lnc):
    """Buckets of 1, 32, 128 and 512 sequences compile the same program: both row layouts,
    each a runtime group loop (the program counted over a launch with the launcher's
    layout and one with the other: the same size)."""
    from short_conv_perf import decode_traces, program_size

    sizes = []
    for n in (1, 32, 128, 512):
        inp = make_short_conv_decode_inputs(rng, num_seqs=n, T=1, dim=512, W=4, dtype=BF16,
                                            pool_dtype=BF16, bias=False)
        traces = decode_traces(inp)
        sizes.append(program_size(traces))
        for trace in traces:
            # one layout's group loop iterates (the other's stop is 0): the wide one (0,)
            # with the diagonal build not taken, or the one-block one (1,) with it taken
            ran = [k[1] for k, lp in trace.loops.items() if lp.iterations and k[0] == 0]
            built = trace.branches[(0, ("if", 0))].outcomes
            assert (ran, built) in (([(0,)], [False]), ([(1,)], [True])), \
                (trace.loops, trace.branches)
        # at 512 sequences the group loop iterates: more dynamic than static instructions
        assert len(traces[0]) > sizes[-1] or n < 512
    assert sizes == [sizes[0]] * 4 and sizes[0] <= 20_000, sizes


# --------------------------------------------------------------------------- LNC=2

def _programs_iterated(trace) -> list:
    """Per program of the launch: whether any of its runtime loops ran an iteration."""
    return [any(inst.loop_path for inst in trace.instructions if inst.program_id == p)
            for p in (0, 1)]


def _lnc2_program_sizes(monkeypatch, run, iterated=(True, True)) -> list:
    """Run ``run`` (-> arrays) with NEURON_LOGICAL_NC_CONFIG 1, then 2: the arrays are
    equal bit for bit, the programs of the LNC=2 launch whose runtime loops iterate are
    ``iterated``, no runtime loop nests. Returns the LNC=2 programs' sizes."""
    from nki_ssm.sim.trace import record

    out = {}
    for lnc in (1, 2):
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
        with record() as trace:
            out[lnc] = [a.tobytes() for a in run()]
    assert out[1] == out[2]
    assert _programs_iterated(trace) == list(iterated)
    assert _max_loop_depth(trace) == 1
    return [trace.program_instructions(p) for p in (0, 1)]


@pytest.mark.parametrize("dim", [384, 200])
def test_prefill_lnc2_splits_channels_bit_identical(rng, monkeypatch, dim):
    """LNC=2: the two programs take the two channel halves (dim 384: 192 each, a full and
    a partial tile; dim 200: 100 each, one partial tile). On ragged batches with initial
    states (mixed), padding slots, empty and T = 1 sequences and sequences spanning several
    chunks, y and the pool equal LNC=1 bit for bit (and the float64 reference); both
    programs run their loops; the two programs have the same size, <= 20,000, and the same
    for another batch of the same buckets (2048 tokens, 8 sequences)."""
    sizes = []
    for lens in ([5, 0, 1300, 2, 1, 700], [700, 1, 0, 1200, 9, 3, 40]):
        inp = make_short_conv_inputs(rng, seqlens=lens, dim=dim, W=4, dtype=BF16,
                                     pool_dtype=BF16, slots=11, padding=2,
                                     has_initial_state="mixed")
        sizes.append(_lnc2_program_sizes(monkeypatch, lambda: _run_and_check(inp)))
    assert sizes[0] == sizes[1] and sizes[0][0] == sizes[0][1] <= 20_000, sizes


@pytest.mark.parametrize("num_seqs,dim,T,dtype,wide", [
    (6, 512, 2, BF16, None),         # wide layout (R = 2 per program)
    (20, 512, 1, BF16, False),       # one block forced: TensorE taps, 2 pool rows / partition
    (5, 200, 3, np.float32, None),   # 100 channels per program: one-block only, partial tile
])
def test_decode_lnc2_splits_channels_bit_identical(rng, monkeypatch, num_seqs, dim, T, dtype,
                                                   wide):
    """LNC=2 decode: the two programs take the two channel halves of every sequence. With
    padding slots, y and the pool equal LNC=1 bit for bit (and the float64 reference); both
    programs run their group loops; the two programs have the same size, <= 20,000, and
    the same for another batch of the same bucket."""
    from nki_ssm.ops.launch import short_conv as launch

    if wide is not None:
        monkeypatch.setattr(launch, "use_wide_layout", lambda n, R: wide)
    sizes = []
    for n, padding in ((num_seqs, 2), (num_seqs - 1, 1)):
        inp = make_short_conv_decode_inputs(rng, num_seqs=n, T=T, dim=dim, W=4, dtype=dtype,
                                            pool_dtype=dtype, padding=padding, slots=n + 3)

        def run():
            pool = inp["conv_states"].copy()
            y = _run_decode_and_check(dict(inp, conv_states=pool), dtype)
            return y, pool

        sizes.append(_lnc2_program_sizes(monkeypatch, run))
    assert sizes[0] == sizes[1] and sizes[0][0] == sizes[0][1] <= 20_000, sizes


@pytest.mark.parametrize("dim", [128, 99])
def test_lnc2_one_channel_tile_or_odd_dim_program_1_idle(rng, monkeypatch, dim):
    """The channels do not split (one 128-channel tile, or an odd dim): program 1 has no
    channels of its own and runs program 0's loops into private dumps (the same trip
    counts: both programs iterate), results equal LNC=1 bit for bit, and both programs
    have the same size."""
    inp = make_short_conv_inputs(rng, seqlens=[3, 0, 600, 1], dim=dim, W=4, slots=6,
                                 padding=1, has_initial_state="mixed")
    dec = make_short_conv_decode_inputs(rng, num_seqs=5, T=2, dim=dim, W=3, padding=1)

    def run_decode():
        pool = dec["conv_states"].copy()
        return _run_decode_and_check(dict(dec, conv_states=pool), np.float32), pool

    for run in (lambda: _run_and_check(inp), run_decode):
        sizes = _lnc2_program_sizes(monkeypatch, run)
        assert sizes[0] == sizes[1], sizes
