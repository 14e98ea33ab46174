"""SSD prefill at every valid chunk size, with padding sequences holding more tokens
than ``(token_bucket // Q) * Q`` (issue 26 row 1: the kernel backends crashed at
Q = 48, 80, 96, 112 while the reference accepted the call). Every backend gives the
same verdict: chunk multiples of 16 in 16..128 run and match the float64 recurrence,
padding rows of y are zero, the padding sequence's slot and unnamed slots keep
their bytes; other chunk sizes are a ValueError naming chunk_size, pool untouched.
Each runs at LNC=1 and LNC=2 (one head of P = 4: at LNC=2 two heads of 2 channels,
one per program).
"""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm import ops
from nki_ssm.reference.inputs import make_ssd_inputs
from nki_ssm.reference.mamba2_ssd import ssd_recurrent
from nki_ssm.reference.metrics import rel_fro

BACKENDS = ("reference", "sim")


def _inputs(seqlens, state_indices):
    kw = make_ssd_inputs(np.random.default_rng(0), seqlens=seqlens, H=1, P=4, N=8, G=1,
                         slots=3)
    kw["state_indices"] = np.array(state_indices, np.int32)
    return kw


def _run(kw, chunk_size, backend):
    kw = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    before = kw["ssm_states"].copy()
    y = ops.ssd_prefill(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                        chunk_size=chunk_size, precision="fp32", backend=backend, **kw)
    return y, kw["ssm_states"], before


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk_size", range(16, 129, 16))
def test_padding_tokens_beyond_whole_chunks_of_the_bucket(chunk_size, backend, lnc):
    # 101 tokens -> bucket 128; the padding sequence's 100 tokens exceed 128 // Q * Q
    # for Q = 48 (96), 80 (80), 96 (96), 112 (112)
    kw = _inputs([100, 1], [-1, 0])
    y_ref, pool_ref = ssd_recurrent(**kw)
    y, after, before = _run(kw, chunk_size, backend)
    assert not np.any(y[:100])
    assert rel_fro(y[100:], y_ref[100:]) <= 1e-5
    assert rel_fro(after[0], pool_ref[0]) <= 1e-5
    assert after[1:].tobytes() == before[1:].tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk_size", [48, 80, 112])
def test_all_padding_batch_filling_the_bucket(chunk_size, backend, lnc):
    # every token of a full bucket belongs to padding sequences: y is all zeros and
    # no pool slot changes
    kw = _inputs([70, 58], [-1, -1])
    y, after, before = _run(kw, chunk_size, backend)
    assert y.shape == kw["x"].shape and not np.any(y)
    assert after.tobytes() == before.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk_size", [0, 8, 40, 144, 256])
def test_other_chunk_sizes_rejected_alike(chunk_size, backend, lnc):
    kw = _inputs([100, 1], [-1, 0])
    pool = kw["ssm_states"]
    before = pool.copy()
    with pytest.raises(ValueError, match="chunk_size"):
        ops.ssd_prefill(kw.pop("x"), kw.pop("dt"), kw.pop("A"), kw.pop("B"), kw.pop("C"),
                        chunk_size=chunk_size, backend=backend, **kw)
    assert pool.tobytes() == before.tobytes()
