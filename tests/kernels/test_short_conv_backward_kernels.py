"""Short conv backward kernel (simulator) against the float64 reference: every gradient
within 1e-5 (float32 I/O) / 5e-3 (bfloat16 I/O) relative Frobenius, at LNC=1 and LNC=2;
edge cases (lengths not a multiple of the 128-position row, T = 1, T < W, empty
sequences), ragged batch = separate calls, continuation = one long sequence, LNC=2 ==
LNC=1 bit for bit, one runtime-loop level, program size, bad input."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ssm import ops
from nki_ssm.reference.metrics import rel_fro
from nki_ssm.reference.short_conv_backward import short_conv_backward as reference
from nki_ssm.reference.short_conv_backward import short_conv_forward
from nki_ssm.sim.trace import record

BF16 = ml_dtypes.bfloat16
KEYS = ("dx", "dweight", "dbias", "d_initial_states")
# empty, T = 1, T < W, over a 128-position row and not a multiple of it
EDGE_LENGTHS = [0, 1, 2, 133, 5]


def _batch(rng, lengths, dim, W, dtype=np.float32, bias=True, init=True, dfin=True):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n, S, H = int(cu[-1]), len(lengths), W - 1
    # causal-conv1d's weight init scale (uniform, 1 / sqrt(W)); inputs and gradients ~ N(0, 1)
    bound = 1.0 / np.sqrt(W)
    return dict(
        x=rng.standard_normal((n, dim)).astype(dtype),
        weight=rng.uniform(-bound, bound, (dim, W)).astype(np.float32),
        bias=rng.uniform(-bound, bound, dim).astype(np.float32) if bias else None,
        dy=rng.standard_normal((n, dim)).astype(dtype),
        cu_seqlens=cu,
        initial_states=rng.standard_normal((S, dim, H)).astype(np.float32) if init else None,
        d_final_states=rng.standard_normal((S, dim, H)).astype(np.float32) if dfin else None)


def _grads(b, activation, backend="sim"):
    return ops.short_conv_backward(b["x"], b["weight"], b["bias"], b["dy"],
                                   activation=activation, cu_seqlens=b["cu_seqlens"],
                                   initial_states=b["initial_states"],
                                   d_final_states=b["d_final_states"], backend=backend)


def _assert_close(got, b, activation, tol):
    ref = reference(b["x"], b["weight"], b["bias"], b["dy"], activation=activation,
                    cu_seqlens=b["cu_seqlens"], initial_states=b["initial_states"],
                    d_final_states=b["d_final_states"])
    for key in KEYS:
        if ref[key] is None:
            assert got[key] is None, key
            continue
        assert got[key].shape == ref[key].shape, key
        err = rel_fro(got[key].astype(np.float64), ref[key])
        assert err <= tol, f"{key}: relative Frobenius error {err:.3g} > {tol}"


@pytest.mark.parametrize("activation, bias, init, dfin, W", [
    ("silu", True, True, True, 4),
    (None, False, False, False, 4),
    ("silu", False, True, False, 2),
    (None, True, False, True, 3),
    ("silu", True, True, True, 8),      # the widest conv the host API takes
])
def test_float32_gradients(rng, lnc, activation, bias, init, dfin, W):
    b = _batch(rng, EDGE_LENGTHS, 200, W, bias=bias, init=init, dfin=dfin)
    got = _grads(b, activation)
    assert got["dx"].dtype == np.float32
    _assert_close(got, b, activation, 1e-5)


@pytest.mark.parametrize("bf16_weights", [True, False], ids=["bf16_w", "f32_w"])
def test_bfloat16_gradients(rng, lnc, bf16_weights):
    # two model channel tiles (Qwen3-Next conv: dim 8192 = 64 tiles of 128, W 4, SiLU)
    b = _batch(rng, [300, 7, 0, 130], 256, 4, dtype=BF16, bias=False)
    if bf16_weights:
        b["weight"] = b["weight"].astype(BF16)
    got = _grads(b, "silu")
    assert got["dx"].dtype == BF16 and got["dweight"].dtype == b["weight"].dtype
    _assert_close(got, b, "silu", 5e-3)


@pytest.mark.parametrize("W, bias", [(4, True), (2, False), (3, True), (5, False)])
def test_bfloat16_groups_and_row_loops(rng, lnc, W, bias):
    # 5 channel tiles (2-byte x, W <= 4: groups of 4 tiles and a 1-tile group, the
    # dweight sums folded on TensorE; W 5: the ScalarE sums) and 11 work rows (a main
    # loop iteration of 6 rows, then the row loop over the 5 left)
    b = _batch(rng, [2400, 7, 0, 500], 640, W, dtype=BF16, bias=bias)
    got = _grads(b, "silu")
    _assert_close(got, b, "silu", 5e-3)


def test_ragged_batch_equals_separate_calls(rng):
    b = _batch(rng, EDGE_LENGTHS, 130, 4)
    whole = _grads(b, "silu")
    cu = b["cu_seqlens"]
    dweight = np.zeros_like(whole["dweight"], dtype=np.float64)
    for n in range(len(cu) - 1):
        s0, s1 = cu[n], cu[n + 1]
        one = dict(b, x=b["x"][s0:s1], dy=b["dy"][s0:s1], cu_seqlens=np.array([0, s1 - s0], np.int32),
                   initial_states=b["initial_states"][n:n + 1],
                   d_final_states=b["d_final_states"][n:n + 1])
        got = _grads(one, "silu")
        # dx and d_initial of a sequence come from its own rows only: bit for bit
        np.testing.assert_array_equal(got["dx"], whole["dx"][s0:s1])
        np.testing.assert_array_equal(got["d_initial_states"][0], whole["d_initial_states"][n])
        dweight += got["dweight"]
    assert rel_fro(whole["dweight"].astype(np.float64), dweight) <= 1e-6


def test_continuation_equals_one_long_sequence(rng):
    # a sequence of 150 tokens = its first 40 (initial state I) then its last 110 (initial
    # state = the first part's final state): back-propagate part 2, hand its d_initial to
    # part 1 as d_final
    b = _batch(rng, [150], 140, 4)
    long = _grads(b, "silu")
    a = 40
    part1 = dict(b, x=b["x"][:a], dy=b["dy"][:a], cu_seqlens=np.array([0, a], np.int32))
    _, mid = short_conv_forward(part1["x"], b["weight"], b["bias"], activation="silu",
                                cu_seqlens=part1["cu_seqlens"],
                                initial_states=b["initial_states"])
    part2 = dict(b, x=b["x"][a:], dy=b["dy"][a:], cu_seqlens=np.array([0, 150 - a], np.int32),
                 initial_states=mid.astype(np.float32))
    g2 = _grads(part2, "silu")
    g1 = _grads(dict(part1, d_final_states=g2["d_initial_states"]), "silu")
    pieces = dict(dx=np.concatenate([g1["dx"], g2["dx"]]),
                  dweight=g1["dweight"].astype(np.float64) + g2["dweight"],
                  dbias=g1["dbias"].astype(np.float64) + g2["dbias"],
                  d_initial_states=g1["d_initial_states"])
    for key in KEYS:
        assert rel_fro(pieces[key].astype(np.float64), long[key].astype(np.float64)) <= 1e-6, key


def _traced(b, lnc, monkeypatch):
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    with record() as trace:
        got = _grads(b, "silu")
    return got, trace


def test_lnc2_bit_identical_one_loop_level_same_program(rng, monkeypatch):
    b = _batch(rng, [200, 0, 3, 129], 512, 4, dtype=BF16)
    one, t1 = _traced(b, 1, monkeypatch)
    two, t2 = _traced(b, 2, monkeypatch)
    for key in KEYS:
        np.testing.assert_array_equal(two[key], one[key], err_msg=key)
    assert max(len(i.loop_path) for i in t2.instructions) == 1
    assert max(len(i.loop_path) for i in t1.instructions) == 1
    # both programs run the loops (each over its own channel tiles), the same program
    for pid in (0, 1):
        assert sum(lp.iterations for lp in t2.loops.values() if lp.program_id == pid) > 1
    assert t2.program_instructions(0) == t2.program_instructions(1)
    # another batch of the same buckets (tokens 512, sequences 4): the same program
    other = _batch(rng, [1, 400, 2, 0], 512, 4, dtype=BF16)
    _, t3 = _traced(other, 2, monkeypatch)
    assert t3.program_instructions(0) == t2.program_instructions(0)
    assert len(t3) != len(t2)


@pytest.mark.parametrize("programs", [1, 2])
def test_program_size_at_the_model_shape(rng, monkeypatch, programs):
    # Qwen3-Next conv: dim 8192, W 4, bfloat16, SiLU, no bias; a tiny batch (the program
    # does not depend on it)
    b = _batch(rng, [3], 8192, 4, dtype=BF16, bias=False, init=False)
    _, trace = _traced(b, programs, monkeypatch)
    sizes = [trace.program_instructions(pid) for pid in range(programs)]
    assert len(set(sizes)) == 1 and sizes[0] <= 20_000


BAD = [
    (dict(dy=np.zeros((6, 8), BF16)), TypeError, "dy must have the same dtype as x"),
    (dict(dy=np.zeros((5, 8), np.float32)), ValueError, "dy must have shape"),
    (dict(dy=None), TypeError, "dy must be a numpy.ndarray"),
    (dict(weight=np.zeros((8, 1), np.float32)), ValueError, "W (weight.shape[1]) must be in"),
    (dict(initial_states=np.zeros((2, 8, 2), np.float32)), ValueError,
     "initial_states must have shape"),
    (dict(d_final_states=np.zeros((2, 8), np.float32)), ValueError,
     "d_final_states must have shape"),
    (dict(cu_seqlens=np.array([0, 5], np.int32)), ValueError, "cu_seqlens[-1] must equal"),
    (dict(activation="relu"), ValueError, "activation must be one of"),
    (dict(bias=np.zeros(7, np.float32)), ValueError, "bias must have shape"),
]


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("change, error, message", BAD, ids=lambda v: str(v)[:40])
def test_bad_input_same_verdict_on_every_backend(backend, change, error, message):
    kw = dict(x=np.zeros((6, 8), np.float32), weight=np.zeros((8, 4), np.float32),
              bias=None, dy=np.zeros((6, 8), np.float32), activation="silu",
              cu_seqlens=np.array([0, 2, 6], np.int32),
              initial_states=np.zeros((2, 8, 3), np.float32), d_final_states=None)
    kw.update(change)
    with pytest.raises(error) as info:
        ops.short_conv_backward(**kw, backend=backend)
    assert message in str(info.value)


def test_forward_messages_for_shared_arguments():
    # the same words as short_conv_prefill for x and weight
    pool = np.zeros((1, 8, 3), np.float32)
    msgs = []
    for fn in (lambda x, w: ops.short_conv_prefill(
                   x, w, cu_seqlens=np.array([0, 6], np.int32), conv_states=pool,
                   state_indices=np.array([0], np.int32), has_initial_state=np.array([False])),
               lambda x, w: ops.short_conv_backward(x, w, None, x, cu_seqlens=np.array([0, 6],
                                                                                  np.int32))):
        with pytest.raises(ValueError) as info:
            fn(np.zeros((6, 8), np.float32), np.zeros((9, 4), np.float32))
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1]
