"""The indirect (gather) form of ``nisa.dma_transpose`` and the dynamic transposes it excludes.

Source of every rule: NKI API page nki.isa.dma_transpose, "DMA Indirect
Transpose Constraints" (aws-neuron-sdk nki/api/nki/isa/__init__.py, SDK 2.28
through 2.32): dge_mode unknown or swdge (lowered to ``dma_gather_transpose``);
(1) 4-D src: src.shape[1] or src.shape[2] == 1; (2) src.shape[-1] <= 128;
(3) 2-byte dtype; (4) src on HBM; (5) indices 2-D; (6) indices.shape[0] *
indices.shape[1] >= src.shape[0]; (7) src.shape[0] divisible by 16;
(8) indices.shape[0] in [16, 128] and divisible by 16; (9) indices.shape[0] ==
128 when indices.shape[1] > 1; (10) uint32 indices; (11) indices in SBUF;
(12) trn2+. Semantics: ``flat_indices = indices.T.flatten()[:src.shape[0]];
dst = src[flat_indices, :].T``, the indices given as ``vector_offset`` of
``src.ap(..., indirect_dim=0)`` (the page's 1-D, 2-D and 4-D examples).
scalar_offset transposes: rejected after nki-library's NKI-415 workaround
(core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.tensor import from_array

BF16 = ml_dtypes.bfloat16


def _idx(values, dtype=np.uint32):
    a = np.asarray(values, dtype=dtype)
    t = nl.ndarray(a.shape, dtype=nl.uint32 if dtype == np.uint32 else nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=from_array(a))
    return t


def _val(t):
    return t.read()


def _raises(fn, *words):
    with pytest.raises(NkiValidationError) as ei:
        fn()
    for w in words:
        assert w in str(ei.value), f"{w!r} not in {ei.value}"


def test_1d_indices_gather_rows_then_transpose(rng):
    """The page's first example: indices [128, 1], pattern [[P, F], [1, P]]."""
    src = rng.standard_normal((300, 64)).astype(BF16)
    rows = rng.integers(0, 300, size=128)
    idx = _idx(rows[:, None])
    dst = nl.ndarray((64, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
    view = from_array(src).ap(pattern=[[64, 128], [1, 64]], vector_offset=idx, indirect_dim=0)
    nisa.dma_transpose(dst=dst, src=view, axes=(1, 0))
    np.testing.assert_array_equal(_val(dst), src[rows].T)


def test_2d_indices_are_read_column_major(rng):
    """indices [128, N]: flat_indices = indices.T.flatten()[:src.shape[0]] (F <= 128 * N)."""
    src = rng.standard_normal((1000, 32)).astype(BF16)
    table = rng.integers(0, 1000, size=(128, 3))
    F = 272                                    # 17 * 16 rows, fewer than 3 * 128 indices
    idx = _idx(table)
    dst = nl.ndarray((32, F), dtype=nl.bfloat16, buffer=nl.sbuf)
    view = from_array(src).ap(pattern=[[32, F], [1, 32]], vector_offset=idx, indirect_dim=0)
    nisa.dma_transpose(dst=dst, src=view)
    flat = table.T.reshape(-1)[:F]
    np.testing.assert_array_equal(_val(dst), src[flat].T)


def test_4d_token_rows_to_channel_major_tiles(rng):
    """The short conv window: x [tokens, dim] rows by index, [F, n, 1, P] -> [P, n, 1, F]
    (4-D with src.shape[2] == 1), a channel offset, into a 32-byte aligned dst slice."""
    x = rng.standard_normal((200, 384)).astype(BF16)
    toks = np.clip(np.arange(48) + 150 - 16, 0, 199)
    idx = _idx(toks[:, None])                 # 48 = 3 * 16 indices, one column
    n, P, c0 = 2, 128, 128
    dst = nl.ndarray((P, n, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
    view = from_array(x).ap(pattern=[[384, 48], [128, n], [1, 1], [1, P]], offset=c0,
                            vector_offset=idx, indirect_dim=0)
    nisa.dma_transpose(dst=dst.ap(pattern=[[n * 64, P], [64, n], [1, 1], [1, 48]], offset=16),
                       src=view, axes=(3, 1, 2, 0))
    got = _val(dst)[:, :, 16:64]
    want = x[toks][:, c0:c0 + n * P].reshape(48, n, P).transpose(2, 1, 0)
    np.testing.assert_array_equal(got, want)


def test_trace_records_a_software_dge_transpose(rng):
    from nki_ssm.sim.trace import record

    src = from_array(rng.standard_normal((64, 16)).astype(BF16))
    idx = _idx(np.arange(16)[:, None])
    dst = nl.ndarray((16, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    with record() as tr:
        nisa.dma_transpose(dst=dst, src=src.ap(pattern=[[16, 16], [1, 16]], vector_offset=idx,
                                               indirect_dim=0))
    inst = tr.instructions[-1]
    assert inst.op == "dma_transpose"
    assert inst.attrs["dge_mode"] == "swdge" and inst.attrs["indirect"] and inst.attrs["transpose"]


def test_out_of_bounds_index_raises_or_skips(rng):
    """oob_mode.error (default) raises; skip leaves that row's dst column as it was (the
    page: skip "Only valid when src uses indirect indexing")."""
    src = rng.standard_normal((20, 8)).astype(BF16)
    rows = np.arange(16)
    rows[3] = 25
    dst = nl.ndarray((8, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=dst, value=-1.0)
    view = from_array(src).ap(pattern=[[8, 16], [1, 8]], vector_offset=_idx(rows[:, None]),
                              indirect_dim=0)
    _raises(lambda: nisa.dma_transpose(dst=dst, src=view), "out of bounds")
    nisa.dma_transpose(dst=dst, src=view, oob_mode=nisa.oob_mode.skip)
    got = _val(dst).astype(np.float32)
    assert np.all(got[:, 3] == -1.0)
    keep = [r for r in range(16) if r != 3]
    np.testing.assert_array_equal(got[:, keep], src[rows[keep]].T.astype(np.float32))
    # and skip is rejected on a direct transpose
    _raises(lambda: nisa.dma_transpose(dst=nl.ndarray((8, 16), dtype=nl.bfloat16, buffer=nl.sbuf),
                                       src=from_array(src[:16]), oob_mode=nisa.oob_mode.skip),
            "oob_mode.skip", "indirect")


# ---------------------------------------------------------------- rejected forms

def _view(src_shape, pattern, idx_values, dtype=BF16, idx_dtype=np.uint32):
    return from_array(np.zeros(src_shape, dtype=dtype)).ap(
        pattern=pattern, vector_offset=_idx(idx_values, idx_dtype), indirect_dim=0)


def _dst(shape, dtype=nl.bfloat16):
    return nl.ndarray(shape, dtype=dtype, buffer=nl.sbuf)


def test_rejects_hwdge_and_none_modes():
    v = _view((64, 16), [[16, 16], [1, 16]], np.zeros((16, 1)))
    for mode in (nisa.dge_mode.hwdge, nisa.dge_mode.none):
        _raises(lambda: nisa.dma_transpose(dst=_dst((16, 16)), src=v, dge_mode=mode),
                "unknown or swdge")
    nisa.dma_transpose(dst=_dst((16, 16)), src=v, dge_mode=nisa.dge_mode.swdge)


def test_rejects_4d_src_without_a_unit_middle_dim():          # rule (1)
    v = _view((64, 2, 2, 16), [[64, 16], [32, 2], [16, 2], [1, 16]], np.zeros((16, 1)))
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 2, 2, 16)), src=v),
            "src.shape[1] or src.shape[2] == 1")


def test_rejects_rows_longer_than_128():                       # rule (2)
    """src.shape[-1] becomes dst's partition dim, so a longer row has no SBUF dst at all."""
    v = _view((64, 256), [[256, 16], [1, 256]], np.zeros((16, 1)))
    with pytest.raises(NkiValidationError, match="partition dim"):
        nisa.dma_transpose(dst=_dst((256, 16)), src=v)


def test_rejects_four_byte_dtype():                            # rule (3)
    v = _view((64, 16), [[16, 16], [1, 16]], np.zeros((16, 1)), dtype=np.float32)
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 16), nl.float32), src=v), "2 bytes")


def test_rejects_too_few_indices():                            # rule (6)
    """16 indices cannot cover a 32-row gather (the view is refused when it is made)."""
    short = from_array(np.zeros((64, 16), dtype=BF16))
    with pytest.raises(NkiValidationError, match="rows"):
        short.ap(pattern=[[16, 32], [1, 16]], vector_offset=_idx(np.zeros((16, 1))),
                 indirect_dim=0)


def test_rejects_rows_not_multiple_of_16():                    # rule (7)
    v = _view((64, 16), [[16, 24], [1, 16]], np.zeros((32, 1)))
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 24)), src=v), "divisible by 16")


def test_rejects_index_partitions_outside_16_to_128():         # rule (8)
    v = _view((64, 16), [[16, 16], [1, 16]], np.zeros((24, 1)))
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 16)), src=v), "[16, 128]")


def test_rejects_multi_column_indices_without_128_partitions():  # rule (9)
    v = _view((64, 16), [[16, 32], [1, 16]], np.zeros((16, 2)))
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 32)), src=v), "must be 128")


def test_rejects_int32_indices():                              # rule (10)
    v = _view((64, 16), [[16, 16], [1, 16]], np.zeros((16, 1)), idx_dtype=np.int32)
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 16)), src=v), "uint32")


def test_rejects_trn1(monkeypatch):                            # rule (12)
    v = _view((64, 16), [[16, 16], [1, 16]], np.zeros((16, 1)))
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 16)), src=v), "NeuronCore-v3")


def test_rejects_scalar_offset_transpose():
    """No source shows a dynamic-start transpose working; nki-library replaces it by
    dma_copy + TensorE transpose (NKI-415)."""
    src = from_array(np.zeros((64, 16), dtype=BF16))
    off = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=off, value=0)
    v = src.ap(pattern=[[16, 16], [1, 16]], scalar_offset=off, indirect_dim=0)
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 16)), src=v), "scalar_offset", "NKI-415")
    reg = nisa.register_alloc(0)
    v = src.ap(pattern=[[16, 16], [1, 16]], scalar_offset=reg, indirect_dim=0)
    _raises(lambda: nisa.dma_transpose(dst=_dst((16, 16)), src=v), "scalar_offset")


def test_dma_copy_rejects_the_column_major_index_form():
    """dma_copy's vector_offset is one (P, 1) index per partition (dma_copy API page)."""
    src = from_array(np.zeros((64, 16), dtype=np.float32))
    v = src.ap(pattern=[[16, 32], [1, 16]], vector_offset=_idx(np.zeros((16, 2)), np.int32),
               indirect_dim=0)
    _raises(lambda: nisa.dma_copy(dst=_dst((32, 16), nl.float32), src=v), "(32, 1)")


def test_rules_enforced_when_the_view_is_made():                  # rules (4), (5), (11)
    """src on HBM, 2-D indices, indices in SBUF: a vector_offset view cannot be made
    otherwise (APS guide: vector_offset indexes HBM tensors; index tensor in SBUF)."""
    sb_src = nl.ndarray((16, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match="HBM"):
        sb_src.ap(pattern=[[16, 16], [1, 16]], vector_offset=_idx(np.zeros((16, 1))),
                  indirect_dim=0)
    src = from_array(np.zeros((64, 16), dtype=BF16))
    flat = nl.ndarray((16, 1, 1), dtype=nl.uint32, buffer=nl.sbuf)
    with pytest.raises(NkiValidationError, match="shape"):
        src.ap(pattern=[[16, 16], [1, 16]], vector_offset=flat, indirect_dim=0)
    in_hbm = from_array(np.zeros((16, 1), dtype=np.uint32))
    with pytest.raises(NkiValidationError, match="SBUF"):
        src.ap(pattern=[[16, 16], [1, 16]], vector_offset=in_hbm, indirect_dim=0)
