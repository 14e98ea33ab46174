"""SBUF / PSUM capacity accounting (strict where the SDK simulator is lenient)."""
from __future__ import annotations

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim import memory
from nki_ssm.sim.errors import NkiCapacityError, NkiValidationError
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.targets import SBUF_RESERVED_BYTES, TRN1, TRN2, TRN3, current_target

KiB = 1024


@jit
def hold_tiles(x, n_tiles, cols):
    """Keeps n_tiles fp32 [128, cols] SBUF tiles alive at once."""
    tiles = []
    for i in range(n_tiles):
        t = nl.ndarray((128, cols), nl.float32, buffer=nl.sbuf, name=f"tile{i}")
        tiles.append(t)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


@jit
def rotate_tiles(x, n_iters, cols):
    """Allocates a big tile per iteration; each rebinding frees the previous one."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in range(n_iters):
        t = nl.ndarray((128, cols), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:x.shape[0], 0:x.shape[1]], src=x)
        nisa.dma_copy(dst=out, src=t[0:x.shape[0], 0:x.shape[1]])
    return out


@jit
def psum_tiles(x, n_tiles, cols):
    tiles = []
    for i in range(n_tiles):
        tiles.append(nl.ndarray((128, cols), nl.float32, buffer=nl.psum))
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


X = np.ones((2, 2), np.float32)


def test_target_limits_and_reserve():
    assert (TRN1.sbuf_bytes_per_partition, TRN2.sbuf_bytes_per_partition,
            TRN3.sbuf_bytes_per_partition) == (192 * KiB, 224 * KiB, 256 * KiB)
    assert TRN2.sbuf_usable_bytes == 224 * KiB - SBUF_RESERVED_BYTES
    assert all(t.psum_bytes_per_partition == 16 * KiB and t.psum_num_banks == 8
               for t in (TRN1, TRN2, TRN3))
    assert nl.tile_size.sbuf_fmax_bytes == TRN2.sbuf_usable_bytes


def test_sbuf_within_capacity_runs():
    # 200 KiB of fp32 tiles per partition fits trn2's 208 KiB usable
    np.testing.assert_array_equal(simulate(hold_tiles)(X, 4, 50 * 256), X)
    assert hold_tiles.last_memory_usage[0]["sbuf_peak"] == 200 * KiB


def test_kernel_over_sbuf_capacity_rejected():
    with pytest.raises(NkiCapacityError, match="SBUF capacity exceeded allocating tile4"):
        simulate(hold_tiles)(X, 5, 50 * 256)   # 250 KiB per partition


def test_capacity_error_is_a_validation_error():
    assert issubclass(NkiCapacityError, NkiValidationError)
    assert issubclass(NkiCapacityError, ValueError)


def test_single_tile_larger_than_sbuf_rejected():
    with pytest.raises(NkiCapacityError, match="limit 212992"):
        simulate(hold_tiles)(X, 1, 60 * KiB)   # 240 KiB in one tile


def test_freed_tiles_return_capacity():
    # 40 iterations x 100 KiB would be 4 MiB if never freed; the peak is the
    # old and the new tile at a rebinding
    np.testing.assert_array_equal(simulate(rotate_tiles)(X, 40, 25 * KiB), X)
    usage = rotate_tiles.last_memory_usage[0]
    assert usage["sbuf_peak"] == 2 * 100 * KiB and usage["sbuf_live"] == 0


def test_rebound_tile_counts_twice_while_replaced():
    # the old tile is alive while the new one is allocated: 2 x 110 KiB > 208 KiB
    with pytest.raises(NkiCapacityError):
        simulate(rotate_tiles)(X, 2, 110 * KiB // 4)


def test_trn3_holds_more_than_trn2(set_target):
    with pytest.raises(NkiCapacityError):
        simulate(hold_tiles)(X, 5, 46 * 256)   # 230 KiB
    set_target("trn3")
    assert current_target() is TRN3
    np.testing.assert_array_equal(simulate(hold_tiles)(X, 5, 46 * 256), X)


def test_trn1_holds_less(set_target):
    set_target("gen2")
    with pytest.raises(NkiCapacityError, match="trn1"):
        simulate(hold_tiles)(X, 4, 50 * 256)   # 200 KiB > 176 KiB usable


def test_psum_eight_banks_fit_nine_rejected():
    np.testing.assert_array_equal(simulate(psum_tiles)(X, 8, 512), X)
    with pytest.raises(NkiCapacityError, match="PSUM capacity exceeded"):
        simulate(psum_tiles)(X, 9, 512)


def test_psum_tile_rounds_up_to_whole_banks():
    # 513 fp32 columns = 2 banks; 4 such tiles fill 8 banks, a 5th does not fit
    simulate(psum_tiles)(X, 4, 513)
    with pytest.raises(NkiCapacityError, match="2 bank"):
        simulate(psum_tiles)(X, 5, 513)
    with pytest.raises(NkiCapacityError):
        simulate(psum_tiles)(X, 1, 4097)   # 9 banks in one tile


def test_psum_bank_reserved_for_pe_transpose(monkeypatch):
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
    assert nl.tile_size.psum_num_banks == 7
    with pytest.raises(NkiCapacityError, match="limit 7 banks"):
        simulate(psum_tiles)(X, 8, 512)


def test_each_launch_and_program_starts_empty():
    simulate(hold_tiles)(X, 4, 50 * 256)
    simulate(hold_tiles)(X, 4, 50 * 256)            # not cumulative across launches
    k = hold_tiles[2]
    simulate(k)(X, 4, 50 * 256)                     # each program has its own SBUF
    assert [u["sbuf_peak"] for u in k.last_memory_usage] == [200 * KiB, 200 * KiB]


def test_last_memory_usage_of_plain_function():
    from nki_ssm.sim.jit import last_memory_usage
    simulate(hold_tiles.func)(X, 3, 256)
    u = last_memory_usage()
    assert len(u) == 1 and u[0]["sbuf_peak"] == 3 * KiB and u[0]["target"] == "trn2"


def test_lnc_usage_per_program():
    k = hold_tiles[2]
    simulate(k)(X, 2, 256)
    assert [u["sbuf_peak"] for u in k.last_memory_usage] == [2 * KiB, 2 * KiB]


def test_small_tiles_are_aligned():
    with memory.launch() as tr:
        t = nl.ndarray((128, 1), nl.float32)
        assert tr.sbuf_live == memory.SBUF_ALIGN
        del t
        assert tr.sbuf_live == 0


def test_outside_a_launch_nothing_is_counted():
    assert memory.current() is None
    t = nl.ndarray((128, 60 * KiB), nl.float32)   # 240 KiB: not counted outside a kernel
    assert t.shape == (128, 60 * KiB)
