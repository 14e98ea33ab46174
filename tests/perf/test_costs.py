"""Per-instruction cost rules and the hardware tables (nki_spec §8)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from nki_ssm.perf import costs
from nki_ssm.perf.hardware import CALIBRATED, SOURCES, TARGETS, TRN1, TRN2, TRN3, get_target
from tests.perf.synth import dma, hbm, mm, sbuf, vec

_NOT_CONSTANTS = {"name", "nc_version", "extra", "dma_eff_bytes"}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_constant_has_a_source(name):
    spec = TARGETS[name]
    for f in dataclasses.fields(spec):
        if f.name in _NOT_CONSTANTS:
            continue
        assert f.name in SOURCES[name] and SOURCES[name][f.name], f"{name}.{f.name} has no source"
    for key in CALIBRATED:
        assert hasattr(spec, key)


def test_matmul_initiation_interval():
    hw = TRN2
    assert costs.tensor_cycles(mm([], [], N=512), hw) == 512
    assert costs.tensor_cycles(mm([], [], N=16), hw) == 64       # MM_INIT floor
    assert costs.tensor_cycles(mm([], [], N=512, fp32=True), hw) == 4 * 512
    assert costs.tensor_cycles(mm([], [], N=512, fp32=True, onezero=True), hw) == 2 * 512
    t = mm([], [], N=128, is_transpose=True, fp32=True)
    assert costs.tensor_cycles(t, TRN2) == 2 * 128 and costs.tensor_cycles(t, TRN1) == 4 * 128
    assert costs.compute_ns(mm([], [], N=512), TRN1) == pytest.approx(512 / 2.8)


def test_vector_rules_and_perf_modes():
    two = vec([], [], n=512, inputs=2)
    assert costs.vector_cycles(two, TRN1) == 1024                  # ~2N
    one16 = vec([], [], n=512, inputs=1, all_16bit=True, contiguous=True, psum_operand=False)
    assert costs.vector_cycles(one16, TRN1) == 512                 # no perf mode on NC-v2
    assert costs.vector_cycles(one16, TRN2) == 128                 # x4
    psum16 = vec([], [], n=512, inputs=1, all_16bit=True, psum_operand=True)
    assert costs.vector_cycles(psum16, TRN2) == 256                # x2
    two16 = vec([], [], n=512, inputs=2, all_16bit=True, psum_operand=False)
    assert costs.vector_cycles(two16, TRN2) == 512                 # x2
    assert costs.vector_cycles(vec([], [], n=512, inputs=1, op="reciprocal"), TRN2) == 8 * 512
    # small tiles sit at the initiation-interval floor: max(MIN_II, N) [SHARED]
    assert costs.vector_cycles(vec([], [], n=8, inputs=2), TRN2) == 64


def test_scalar_rules():
    a = vec([], [], n=512, inputs=1, engine="scalar", op="activation")
    assert costs.scalar_cycles(a, TRN2) == 512
    acc = vec([], [], n=512, inputs=1, engine="scalar", op="activation", reduce=True)
    assert costs.scalar_cycles(acc, TRN2) == 512                 # accumulating is free
    r = vec([], [], n=512, inputs=1, engine="scalar", op="activation", reduce=True, reduce_res=True)
    assert costs.scalar_cycles(r, TRN2) == 512 + 64              # reading reduce_res is not
    b = vec([], [], n=512, inputs=1, engine="scalar", op="activation", all_16bit=True)
    assert costs.scalar_cycles(b, TRN3) == 256


def test_dma_single_engine_32k_matches_published_rate():
    # nki_spec §9 row 9: one Trn2 DMA engine, [4, 4096] bf16 = 32 KiB, 1416 ns
    d = dma(hbm(1, 32768), sbuf(2, parts=4, nbytes=8192), 32768, partitions=4)
    engines, ns = costs.dma_plan(d, TRN2)
    assert engines == 1
    assert 0.95 < ns / 1416 < 1.08


def test_dma_efficiency_curve():
    assert TRN2.dma_efficiency(2048) == pytest.approx(0.81)
    assert TRN2.dma_efficiency(32768) == pytest.approx(1.0)
    assert TRN2.dma_efficiency(1 << 20) == pytest.approx(1.0)
    # interpolated in log2(bytes) between the digitized 1 KiB and 2 KiB points
    assert TRN2.dma_efficiency(1536) == pytest.approx(0.42 + math.log2(1.5) * (0.81 - 0.42))
    assert TRN2.dma_efficiency(8) == pytest.approx(0.014)
    effs = [TRN2.dma_efficiency(2 ** k) for k in range(4, 17)]
    assert effs == sorted(effs)


def test_hbm_to_hbm_and_transpose_dma():
    big = dma(hbm(1, 1 << 20), hbm(2, 1 << 20), 1 << 20, partitions=0)
    engines, ns = costs.dma_plan(big, TRN2)
    assert engines == 16 and ns == pytest.approx((1 << 20) / (16 * 23 * TRN2.dma_efficiency(8192)))
    tr = dma(hbm(1, 128 * 4096), sbuf(2, nbytes=4096), 128 * 4096, transpose=True)
    plain = dma(hbm(1, 128 * 4096), sbuf(2, nbytes=4096), 128 * 4096)
    assert costs.dma_plan(tr, TRN2)[1] == pytest.approx(costs.dma_plan(plain, TRN2)[1] / 0.9)


def test_bad_engine_and_target_named_in_error():
    bad = vec([], [], engine="sync")
    with pytest.raises(ValueError, match="engine must be one of"):
        costs.compute_ns(bad, TRN2)
    with pytest.raises(TypeError, match="target must be"):
        get_target(3)
    assert get_target("gen4") is TRN3 and get_target(None) is TRN2


def test_gpsimd_rate_from_the_documented_rsqrt_ratio():
    # [SHARED]: rsqrt on GpSimd has 4x lower throughput than on ScalarE (N cycles)
    g = vec([], [], n=512, inputs=1, engine="gpsimd", op="tensor_scalar")
    s = vec([], [], n=512, inputs=1, engine="scalar", op="activation")
    assert costs.gpsimd_cycles(g, TRN2) == 4 * costs.scalar_cycles(s, TRN2)
    two = vec([], [], n=512, inputs=2, engine="gpsimd")
    assert costs.gpsimd_cycles(two, TRN2) == 4 * 512          # per-element figure, inputs not multiplied
    assert costs.gpsimd_cycles(two, TRN3) == 512              # v4: 128 elements/cycle [A3]


def test_optimistic_bracket_only_speeds_up():
    from nki_ssm.perf.hardware import OPTIMISTIC_SOURCES, optimistic

    for name in TARGETS:
        fast = optimistic(name)
        base = TARGETS[name]
        assert fast.name == base.name
        assert fast.vector_elems_per_cycle >= base.vector_elems_per_cycle
        assert fast.gpsimd_elems_per_cycle >= base.gpsimd_elems_per_cycle
        assert fast.dma_bw_per_engine > base.dma_bw_per_engine
    assert optimistic("trn1").vector_elems_per_cycle == 1.0     # v2: 128 lanes, no range
    assert optimistic("trn2").vector_elems_per_cycle == 2.0
    assert set(OPTIMISTIC_SOURCES) >= {"vector_elems_per_cycle", "gpsimd_elems_per_cycle", "dma_bw_per_engine"}
