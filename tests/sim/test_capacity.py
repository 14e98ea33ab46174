"""SBUF / PSUM capacity by access liveness (sim/memory.py).

A tile occupies on-chip memory from its first access to its last, not while a
Python name refers to it; a tile used inside a runtime loop it was allocated
outside of is live for the whole loop, and an allocation made in every
iteration of a loop body is one buffer (NKI docs,
nki/deep-dives/nki-dynamic-loops.rst, "Register Allocation Implications").
"""
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


def _touch(t):
    """One cheap instruction that accesses tile ``t`` (its first column)."""
    nisa.memset(dst=t[:, 0:1], value=0.0)


@jit
def hold_tiles(x, n_tiles, cols):
    """n_tiles fp32 [128, cols] tiles, each accessed first in turn and again at the end,
    so all of them are live at once."""
    tiles = []
    for i in range(n_tiles):
        t = nl.ndarray((128, cols), nl.float32, buffer=nl.sbuf, name=f"tile{i}")
        _touch(t)
        tiles.append(t)
    for t in tiles:
        _touch(t)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    if nl.program_id(0) == 0:       # under LNC=2 one program writes the output
        nisa.dma_copy(dst=out, src=x)
    return out


@jit
def referenced_unused(x, n_tiles, cols):
    """Python keeps every tile alive, but each is used by one instruction only."""
    tiles = []
    for i in range(n_tiles):
        t = nl.ndarray((128, cols), nl.float32, buffer=nl.sbuf, name=f"tile{i}")
        _touch(t)
        tiles.append(t)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


@jit
def psum_tiles(x, n_tiles, cols):
    """n_tiles PSUM tiles of cols fp32, all live at once."""
    tiles = []
    for i in range(n_tiles):
        t = nl.ndarray((128, cols), nl.float32, buffer=nl.psum, name=f"acc{i}")
        _touch(t)
        tiles.append(t)
    for t in tiles:
        _touch(t)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    if nl.program_id(0) == 0:       # under LNC=2 one program writes the output
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


def test_kernel_over_sbuf_capacity_names_instruction_and_live_tiles():
    with pytest.raises(NkiCapacityError) as e:
        simulate(hold_tiles)(X, 5, 50 * 256)   # 250 KiB per partition
    msg = str(e.value)
    assert "SBUF capacity exceeded at instruction #4 (memset" in msg
    assert "test_capacity.py" in msg                       # the kernel line that needed it
    assert ("it needs 51200 bytes per partition more (tile4 (128, 12800) float32 on sbuf (51200 B, "
            "first access #4 at") in msg
    for i in range(4):                                     # the four tiles already live
        assert f"tile{i} (128, 12800) float32 on sbuf: 51200 B, live #{i}..#{5 + i}" in msg


def test_capacity_error_is_a_validation_error():
    assert issubclass(NkiCapacityError, NkiValidationError)
    assert issubclass(NkiCapacityError, ValueError)


def test_single_tile_larger_than_sbuf_rejected():
    with pytest.raises(NkiCapacityError, match="limit 212992"):
        simulate(hold_tiles)(X, 1, 60 * KiB)   # 240 KiB in one tile


def test_tiles_count_by_use_not_python_lifetime():
    # 6 x 100 KiB tiles stay referenced from a Python list (600 KiB by Python lifetime),
    # but each is used by one instruction: at most one is live
    np.testing.assert_array_equal(simulate(referenced_unused)(X, 6, 25 * KiB), X)
    u = referenced_unused.last_memory_usage[0]
    assert u["sbuf_peak"] == 100 * KiB and u["sbuf_live"] == 0


def test_a_tile_no_instruction_touches_costs_nothing():
    @jit
    def k(x):
        nl.ndarray((128, 60 * KiB), nl.float32, buffer=nl.sbuf)   # 240 KiB, never used
        return _copy(x)
    np.testing.assert_array_equal(simulate(k)(X), X)
    assert k.last_memory_usage[0]["sbuf_peak"] == 0


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


@jit
def psum_rebound_in_loop(x, n_iters):
    """A loop rebinds one-bank PSUM tiles (and keeps each in a Python list): by Python
    lifetime n_iters banks, by use two (the new accumulator and the one being drained)."""
    acc_sb = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    kept = []
    prev = None
    for i in range(n_iters):
        ps = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, name=f"ps{i}")
        nisa.memset(dst=ps, value=float(i))
        if prev != None:  # noqa: E711
            nisa.tensor_copy(dst=acc_sb, src=prev)
        prev = ps
        kept.append(ps)
    nisa.tensor_copy(dst=acc_sb, src=prev)
    return _copy(x)


def test_psum_loop_rebinding_fits_by_use_not_by_python_lifetime():
    """Issue 14 acceptance: 16 PSUM tiles stay referenced (16 banks by Python lifetime, over
    the 8 a partition has); by first-to-last use at most 2 are live, so it fits."""
    np.testing.assert_array_equal(simulate(psum_rebound_in_loop)(X, 16), X)
    assert psum_rebound_in_loop.last_memory_usage[0]["psum_banks_peak"] == 2


def test_psum_eight_banks_fit_nine_rejected_with_live_tiles_named():
    np.testing.assert_array_equal(simulate(psum_tiles)(X, 8, 512), X)
    with pytest.raises(NkiCapacityError) as e:
        simulate(psum_tiles)(X, 9, 512)
    msg = str(e.value)
    assert msg.startswith("PSUM capacity exceeded at instruction #8 (memset")
    assert ("it needs 1 more bank(s) of 2048 B (acc8 (128, 512) float32 on psum (1 bank(s), first "
            "access #8 at") in msg and "while 8 bank(s) are live" in msg
    assert all(f"acc{i} (128, 512) float32 on psum: 1 bank(s)" in msg for i in range(8))


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


def test_small_tiles_are_aligned():
    with memory.launch() as tr:
        t = nl.ndarray((128, 1), nl.float32)
        _touch(t)
        assert tr.usage()["sbuf_peak"] == memory.SBUF_ALIGN


def test_failed_capacity_check_leaves_inputs_unchanged():
    @jit
    def writes_then_overflows(x):
        t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=7.0)
        nisa.dma_copy(dst=x, src=t)                   # modifies the caller's input
        big = nl.ndarray((128, 60 * KiB), nl.float32, buffer=nl.sbuf)
        _touch(big)                                   # 240 KiB: does not fit
        return _copy(x)
    x = np.ones((2, 2), np.float32)
    with pytest.raises(NkiCapacityError):
        simulate(writes_then_overflows)(x)
    np.testing.assert_array_equal(x, np.ones((2, 2), np.float32))


def test_outside_a_launch_nothing_is_counted():
    assert memory.current() is None
    t = nl.ndarray((128, 60 * KiB), nl.float32)   # 240 KiB: not counted outside a kernel
    assert t.shape == (128, 60 * KiB)


# ---- runtime loops -------------------------------------------------------------

@jit
def loop_body_tiles(x, n_iters, cols):
    """Each iteration of a runtime loop allocates a [128, cols] fp32 tile and uses it twice."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for _ in nl.dynamic_range(n_iters):
        t = nl.ndarray((128, cols), nl.float32, buffer=nl.sbuf, name="body")
        _touch(t)
        nisa.dma_copy(dst=out, src=x)
        _touch(t)
    return out


@pytest.mark.nki_version("0.6.0")
def test_allocation_in_every_iteration_of_a_runtime_loop_is_one_buffer():
    """nki-dynamic-loops.rst: "Tensors allocated inside the loop body are allocated once and
    reused across iterations": 6 iterations x 150 KiB is one 150 KiB buffer."""
    np.testing.assert_array_equal(simulate(loop_body_tiles)(X, 6, 150 * 256), X)
    u = loop_body_tiles.last_memory_usage[0]
    assert u["sbuf_peak"] == 150 * KiB


@jit
def tile_before_loop(x, cols_a, cols_b, dynamic):
    """Tile A is used at the start of the body, tile B (allocated in the body) after it:
    in straight-line code they never overlap; in a runtime loop both live for the whole loop."""
    a = nl.ndarray((128, cols_a), nl.float32, buffer=nl.sbuf, name="a")
    nisa.memset(dst=a, value=1.0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    if dynamic:
        for _ in nl.dynamic_range(1):
            _body(a, cols_b, out, x)
    else:
        _body(a, cols_b, out, x)
    return out


def _body(a, cols_b, out, x):
    _touch(a)
    b = nl.ndarray((128, cols_b), nl.float32, buffer=nl.sbuf, name="b")
    _touch(b)
    nisa.dma_copy(dst=out, src=x)


@pytest.mark.nki_version("0.6.0")
def test_tiles_live_during_a_runtime_loop_are_live_for_the_whole_loop():
    """nki-dynamic-loops.rst: "the compiler must keep all live tensors in on-chip memory
    (SBUF/PSUM) for the entire duration of the loop"."""
    cols_a, cols_b = 120 * 256, 100 * 256          # 120 KiB + 100 KiB > 208 KiB
    np.testing.assert_array_equal(simulate(tile_before_loop)(X, cols_a, cols_b, False), X)
    with pytest.raises(NkiCapacityError) as e:
        simulate(tile_before_loop)(X, cols_a, cols_b, True)
    msg = str(e.value)
    assert msg.startswith("SBUF capacity exceeded at instruction #2 (memset")
    assert "b (128, 25600) float32 on sbuf (102400 B, first access #2" in msg
    assert "a (128, 30720) float32 on sbuf: 122880 B, live #0..#3" in msg   # the whole loop


@jit
def two_body_tiles(x, cols):
    """A runtime loop body uses tile t1, then tile t2 (both allocated in the body)."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for _ in nl.dynamic_range(3):
        t1 = nl.ndarray((128, cols), nl.float32, buffer=nl.sbuf, name="t1")
        _touch(t1)
        _touch(t1)
        t2 = nl.ndarray((128, cols), nl.float32, buffer=nl.sbuf, name="t2")
        _touch(t2)
        nisa.dma_copy(dst=out, src=x)
    return out


@pytest.mark.nki_version("0.6.0")
def test_tiles_of_a_loop_body_share_memory_by_use(monkeypatch):
    """Tiles allocated in a runtime loop body are live by use within the body (one buffer
    each, reused by every iteration): released nki-library code relies on it
    (bwmm_shard_on_I.py: compute_one_block inside nl.dynamic_range allocates H/128 PSUM
    tiles in transpose_hidden_states_allocated). The stricter reading of
    nki-dynamic-loops.rst (every body tile live for the whole loop) rejects this kernel."""
    cols = 150 * 256                                # 150 KiB each: both at once do not fit
    np.testing.assert_array_equal(simulate(two_body_tiles)(X, cols), X)
    assert two_body_tiles.last_memory_usage[0]["sbuf_peak"] == 150 * KiB
    monkeypatch.setattr(memory, "WHOLE_LOOP_BODY_TILES", True)
    with pytest.raises(NkiCapacityError, match=r"at instruction #0 .* t2 \(128, 38400\)"):
        simulate(two_body_tiles)(X, cols)
