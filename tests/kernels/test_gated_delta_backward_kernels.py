"""The Gated DeltaNet backward kernel (kernels/gated_delta/chunk_backward.py) through
``ops.gated_delta_backward`` on the simulator, against the float64 reference gradients
(relative Frobenius: 1e-5 float32 I/O, 5e-3 bfloat16 I/O at the model head dims), at LNC=1
and LNC=2; ragged = separate calls; continuation = one long sequence; LNC=2 == LNC=1;
program size."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops  # noqa: E402
from nki_ssm.reference import inputs  # noqa: E402
from nki_ssm.reference.gated_delta_backward import gated_delta_forward  # noqa: E402
from nki_ssm.sim.trace import record  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
GATES = ("g", "beta", "a", "b", "A_log", "dt_bias")
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "da", "db", "dA_log", "ddt_bias", "d_initial_states")


def _case(rng, seqlens, *, H=1, HV=2, K=16, V=16, raw=False, l2=False, dtype=np.float32,
          pattern="realistic", init=True, dfinal=True):
    kw = inputs.make_gated_delta_inputs(rng, seqlens=seqlens, H=H, HV=HV, K=K, V=V,
                                        raw_gates=raw, use_qk_l2norm=l2, dtype=dtype,
                                        gate_pattern=pattern)
    n = len(kw["cu_seqlens"]) - 1
    T = kw["q"].shape[0]
    args = {name: kw[name] for name in ("q", "k", "v", *GATES, "use_qk_l2norm", "cu_seqlens")}
    args["do"] = rng.standard_normal((T, HV, V)).astype(dtype)
    shape = (n, HV, K, V)
    args["initial_states"] = (0.1 * rng.standard_normal(shape)).astype(np.float32) if init \
        else None
    args["d_final_states"] = rng.standard_normal(shape).astype(np.float32) if dfinal else None
    return args


def _f64(args):
    return {k: (np.asarray(a, np.float64) if isinstance(a, np.ndarray) and
                a.dtype.kind == "f" else a) for k, a in args.items()}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _check(args, tol, chunk_size=None):
    got = ops.gated_delta_backward(**args, chunk_size=chunk_size, backend="sim")
    ref = ops.gated_delta_backward(**_f64(args), backend="reference")
    for name in GRADS:
        if ref[name] is None:
            assert got[name] is None, name
            continue
        assert got[name].shape == ref[name].shape, name
        assert np.all(np.isfinite(np.asarray(got[name], np.float64))), name
        assert _rel(got[name], ref[name]) <= tol, (name, _rel(got[name], ref[name]))
    return got


@pytest.mark.parametrize("raw, l2", [(False, False), (True, True), (True, False)])
def test_float32_ragged_batch(rng, lnc, raw, l2):
    # lengths not multiples of the chunk (32: one exact block), an empty sequence, T = 1,
    # two q/k heads
    _check(_case(rng, [45, 0, 1, 70], H=2, HV=4, raw=raw, l2=l2), 1e-5, chunk_size=32)


@pytest.mark.parametrize("chunk_size", [None, 64], ids=["chunk128", "chunk64"])
def test_float32_block_solve(rng, lnc, chunk_size):
    # chunks of 4 and 2 exactly-inverted 32-row blocks, several chunks per sequence
    _check(_case(rng, [300, 0, 1, 140], H=1, HV=2, raw=True, l2=True), 1e-5, chunk_size)


@pytest.mark.parametrize("chunk_size", [None, 32], ids=["chunk128", "chunk32"])
def test_float32_strong_then_weak_decays(rng, lnc, chunk_size):
    _check(_case(rng, [200, 29], pattern="strong_then_weak"), 1e-5, chunk_size)


def test_float32_single_token_and_no_states(rng, lnc):
    # T = 1; no initial state, no final-state gradient; one value head (odd at LNC=2)
    _check(_case(rng, [1], HV=1, init=False, dfinal=False), 1e-5)


def test_float32_empty_sequence_passes_its_state_gradient(rng):
    args = _case(rng, [3, 0], H=1, HV=2)
    got = _check(args, 1e-5)
    np.testing.assert_array_equal(got["d_initial_states"][1], args["d_final_states"][1])


def test_no_tokens_passes_every_state_gradient(rng, lnc):
    HV, K, V = 2, 8, 8
    z = np.zeros
    dfinal = rng.standard_normal((2, HV, K, V)).astype(np.float32)
    got = ops.gated_delta_backward(z((0, 1, K), np.float32), z((0, 1, K), np.float32),
                                   z((0, HV, V), np.float32), z((0, HV, V), np.float32),
                                   g=z((0, HV), np.float32), beta=z((0, HV), np.float32),
                                   cu_seqlens=np.array([0, 0, 0], np.int32),
                                   d_final_states=dfinal, backend="sim")
    np.testing.assert_array_equal(got["d_initial_states"], dfinal)
    assert got["dq"].shape == (0, 1, K) and got["dg"].shape == (0, HV)


def test_bfloat16_model_head_dims(rng, lnc):
    _check(_case(rng, [150, 17], H=1, HV=2, K=128, V=128, raw=True, l2=True, dtype=BF16),
           5e-3)


def test_ragged_equals_separate_calls(rng):
    args = _case(rng, [137, 0, 70], HV=2)
    whole = ops.gated_delta_backward(**args, backend="sim")
    cu = args["cu_seqlens"]
    for s in range(len(cu) - 1):
        t0, t1 = int(cu[s]), int(cu[s + 1])
        if t1 == t0:
            np.testing.assert_array_equal(whole["d_initial_states"][s],
                                          args["d_final_states"][s])
            continue
        one = dict(args, cu_seqlens=np.array([0, t1 - t0], np.int32),
                   initial_states=args["initial_states"][s:s + 1],
                   d_final_states=args["d_final_states"][s:s + 1])
        for name in ("q", "k", "v", "do", "g", "beta"):
            one[name] = args[name][t0:t1]
        part = ops.gated_delta_backward(**one, backend="sim")
        for name in ("dq", "dk", "dv", "dg", "dbeta"):
            np.testing.assert_allclose(part[name], whole[name][t0:t1], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(part["d_initial_states"][0], whole["d_initial_states"][s],
                                   rtol=1e-6, atol=1e-7)


def test_continuation_equals_one_long_sequence(rng):
    args = _case(rng, [190], HV=2)
    split = 95                       # not a chunk boundary of the long sequence's chunks
    whole = ops.gated_delta_backward(**args, backend="sim")
    first = dict(args, cu_seqlens=np.array([0, split], np.int32))
    second = dict(args, cu_seqlens=np.array([0, 190 - split], np.int32))
    for name in ("q", "k", "v", "do", "g", "beta"):
        first[name] = args[name][:split]
        second[name] = args[name][split:]
    _, mid = gated_delta_forward(**{n: _f64(first)[n] for n in ("q", "k", "v", "g", "beta",
                                                                 "cu_seqlens",
                                                                 "initial_states")})
    second["initial_states"] = mid.astype(np.float32)
    late = ops.gated_delta_backward(**second, backend="sim")
    first["d_final_states"] = late["d_initial_states"]
    early = ops.gated_delta_backward(**first, backend="sim")
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        joined = np.concatenate([early[name], late[name]])
        assert _rel(joined, whole[name]) <= 1e-5, name
    assert _rel(early["d_initial_states"], whole["d_initial_states"]) <= 1e-5


def _traced(args, monkeypatch, lnc):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    with record() as trace:
        got = ops.gated_delta_backward(**args, backend="sim")
    return got, trace


def test_lnc2_equals_lnc1_and_program_size(rng, monkeypatch):
    args = _case(rng, [145, 0, 1, 70], H=2, HV=4, raw=True)
    one, _ = _traced(args, monkeypatch, 1)
    two, trace = _traced(args, monkeypatch, 2)
    for name in GRADS:
        if one[name] is not None:
            np.testing.assert_array_equal(one[name], two[name], err_msg=name)
    sizes = [trace.program_instructions(pid) for pid in (0, 1)]
    for pid in (0, 1):
        assert any(i.loop_path for i in trace.instructions if i.program_id == pid)
    assert max(len(i.loop_path) for i in trace.instructions) <= 1
    # another batch of the same bucket: the same program
    other = _case(rng, [200, 0, 16, 0], H=2, HV=4, raw=True)
    _, trace2 = _traced(other, monkeypatch, 2)
    assert sizes[0] == sizes[1] <= 20_000
    assert [trace2.program_instructions(pid) for pid in (0, 1)] == sizes


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_lnc2_equals_lnc1_with_head_groups(rng, monkeypatch, dtype):
    """Several pipelined head groups (HV = 10: groups of 4, 4, 2 at LNC=1, of 4, 1 per
    program at LNC=2), float32 and tfloat32 operands: the gradients agree bit for bit and
    stay within the float64 targets."""
    args = _case(rng, [150, 33], H=2, HV=10, raw=True, l2=True, dtype=dtype)
    one, _ = _traced(args, monkeypatch, 1)
    two, _ = _traced(args, monkeypatch, 2)
    for name in GRADS:
        if one[name] is not None:
            np.testing.assert_array_equal(one[name], two[name], err_msg=name)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    _check(args, 1e-5 if dtype == np.float32 else 5e-3)


def test_work_lists_name_each_chunk_once_in_both_orders():
    """backward_tables: every chunk's hstore row (chunk e: e*K) and tstore row (e*C) in
    order in fwd_state and reversed within each sequence in bwd_state, so the backward
    reads the T the forward recompute stored for the same chunk; rows past the chunks name
    the trash blocks (E*K, E*C)."""
    from nki_ssm.ops.launch.gated_delta_backward import backward_tables

    K, C, E = 16, 64, 256 // 64 + 4
    cu = np.array([0, 5, 5, 140, 200])            # 1, 0, 3 and 1 chunks
    _, _, fwd_rows, fwd_state, bwd_rows, bwd_state, counts = backward_tables(
        cu, K=K, chunk_size=C, num_tokens_bucket=256, num_seqs_bucket=4)
    assert counts.tolist() == [[3, 5, 5, 4]]
    assert fwd_state[:5].tolist() == [[e * K, n * K, e * C]
                                      for e, n in zip(range(5), [E, 2, 3, E, E])]
    assert bwd_state[:5, 2].tolist() == [0, 3 * C, 2 * C, C, 4 * C]
    assert (bwd_state[:5, 0] // K == bwd_state[:5, 2] // C).all()
    assert (fwd_state[5:] == [E * K, E * K, E * C]).all()
    assert (bwd_state[5:, 2] == E * C).all()
    # the same chunk's token rows under the same tstore row in both orders
    for r in range(5):
        e = bwd_state[r, 2] // C
        assert bwd_rows[r].tolist() == fwd_rows[e].tolist()
