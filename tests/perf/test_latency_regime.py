"""The costs of the latency-bound regime (issue 28), each shown changing a schedule the way its
source says, the NC-v3 instruction overhead fitted to the published DeltaNet kernel, the sampled
10-90 % interval, and the perf package's import graph."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from nki_ssm import perf
from nki_ssm.perf import costs, hardware
from nki_ssm.perf.hardware import TRN1, TRN2, TRN3
from tests.perf.synth import act, mm, new_storage, sbuf, trace_of, vec


def _psum(sid, nbytes=2048):
    from nki_ssm.sim.trace import Region

    return Region("psum", sid, 0, 128, 0, nbytes)


def test_a_consumer_on_another_engine_waits_for_the_result_then_the_semaphore():
    # [PERF Opt #5a]: a dependent instruction cannot read until the producer's output is committed
    a, b, c = new_storage(), new_storage(), new_storage()
    t = perf.model(trace_of(vec([sbuf(a)], [sbuf(b)], inputs=1), act([sbuf(b)], [sbuf(c)])), TRN2)
    s = t.schedule
    assert s.start[1] == pytest.approx(s.end[0] + costs.raw_latency_ns("vector", TRN2) + TRN2.semaphore_ns)
    # a matmul's PSUM result is readable after the array drains (tensor_result_cycles)
    p, d = new_storage(), new_storage()
    t = perf.model(trace_of(mm([sbuf(a), sbuf(b)], [_psum(p)], N=128), vec([_psum(p)], [sbuf(d)], inputs=1)),
                   TRN2)
    s = t.schedule
    drain = TRN2.tensor_result_cycles / TRN2.tensor_ghz
    assert costs.result_latency_ns("tensor", TRN2) == pytest.approx(drain)
    assert s.start[1] == pytest.approx(s.end[0] + drain + TRN2.semaphore_ns)
    # same engine: the pipeline latency only; write-after-read: the reader's end only
    t = perf.model(trace_of(vec([sbuf(a)], [sbuf(b)], inputs=1), vec([sbuf(b)], [sbuf(c)], inputs=1)), TRN2)
    assert t.schedule.start[1] == pytest.approx(t.schedule.end[0] + costs.raw_latency_ns("vector", TRN2))
    e = new_storage()
    t = perf.model(trace_of(vec([sbuf(e)], [sbuf(new_storage())], inputs=1), act([sbuf(a)], [sbuf(e)])), TRN2)
    assert t.schedule.start[1] == pytest.approx(t.schedule.end[0] + TRN2.semaphore_ns)


def _bf16_op(op, inputs, psum=False):
    return vec([sbuf(new_storage()) for _ in range(inputs)], [sbuf(new_storage())], n=2048, inputs=inputs,
               op=op, all_16bit=True, psum_operand=psum, contiguous=True)


def test_bf16_perf_modes_apply_to_the_instructions_the_architecture_guide_names():
    # trainium2_arch.rst: tensor_copy / tensor_scalar x4 (x2 with a PSUM side), tensor_tensor x2
    fixed = TRN2.vector_overhead_cycles
    cycles = {op: costs.vector_cycles(_bf16_op(op, k), TRN2) - fixed
              for op, k in (("tensor_copy", 1), ("tensor_scalar", 1), ("tensor_tensor", 2),
                            ("tensor_reduce", 1), ("tensor_tensor_scan", 2), ("scalar_tensor_tensor", 2),
                            ("nc_stream_shuffle", 1))}
    assert cycles["tensor_copy"] == cycles["tensor_scalar"] == 2048 / 4
    assert costs.vector_cycles(_bf16_op("tensor_copy", 1, psum=True), TRN2) - fixed == 2048 / 2
    assert cycles["tensor_tensor"] == 2048
    # every other instruction streams at the base rate (a second input at vector_second_input)
    assert cycles["tensor_reduce"] == cycles["nc_stream_shuffle"] == 2048
    second = np.ceil(2048 * (1 + TRN2.vector_second_input))
    assert cycles["tensor_tensor_scan"] == cycles["scalar_tensor_tensor"] == second
    # NC-v2 has no perf mode at all
    assert costs.vector_cycles(_bf16_op("tensor_copy", 1), TRN1) - TRN1.vector_overhead_cycles == 2048


def test_nc3_instruction_overhead_is_read_off_the_deltanet_row():
    for engine in ("vector", "scalar", "gpsimd"):
        name = f"{engine}_overhead_cycles"
        assert getattr(TRN2, name) == getattr(TRN3, name) == hardware.NC3_INSTRUCTION_OVERHEAD_CYCLES
        assert getattr(TRN1, name) == 64              # NC-v2 keeps its chain-II figure
        lo, hi = hardware.ranges("trn2")[name]
        assert lo < getattr(TRN2, name) < hi
        assert "deltanet_fused_slope" in hardware.source_of("trn2", name)
    assert "deltanet_fused_slope" in hardware.CALIBRATED["vector_overhead_cycles"]
    # the estimate of the TensorE drain carries its range and its label
    assert hardware.ranges("trn2")["tensor_result_cycles"] == (128, 384)
    assert hardware.source_of("trn2", "tensor_result_cycles").startswith("estimate")


def test_sampled_tables_are_seeded_independent_and_inside_the_ranges():
    draws = hardware.sampled("trn2", samples=200, seed=7)
    again = hardware.sampled("trn2", samples=200, seed=7)
    assert draws == again and hardware.sampled("trn2", samples=200, seed=8) != draws
    rng = hardware.ranges("trn2")
    position = {}
    for name, (fast, slow) in rng.items():
        values = np.array([getattr(d, name) for d in draws], dtype=float)
        assert values.min() >= min(fast, slow) and values.max() <= max(fast, slow), name
        central = float(getattr(TRN2, name))
        # the central value is each draw's median (split uniform about it)
        assert abs(np.mean(values <= central) - 0.5) < 0.12, name
        position[name] = (values - min(fast, slow)) / (abs(slow - fast) or 1.0)
    # independent: two constants' draws are not tied together (the extremes would be +-1)
    corr = np.corrcoef(position["semaphore_ns"], position["dma_fixed_ns"])[0, 1]
    assert abs(corr) < 0.3
    with pytest.raises(ValueError, match="samples"):
        hardware.sampled("trn2", samples=0)


def test_model_range_reports_a_10_90_interval_inside_the_extremes():
    tr = trace_of(*[act([sbuf(new_storage())], [sbuf(new_storage())], n=256, function=f)
                    for f in ("exp", "silu", "exp")],
                  *[vec([sbuf(new_storage())], [sbuf(new_storage())], n=256, inputs=1) for _ in range(4)])
    t = perf.model_range(tr, "trn2")
    assert t.range_samples == hardware.RANGE_SAMPLES
    assert t.time_low_ns <= t.time_p10_ns <= t.time_ns <= t.time_p90_ns <= t.time_high_ns
    # the interval is narrower than the all-fast / all-slow extremes
    assert t.time_p90_ns - t.time_p10_ns < 0.8 * (t.time_high_ns - t.time_low_ns)
    assert perf.model_range(tr, "trn2").time_p10_ns == t.time_p10_ns      # deterministic
    assert "10-90 %" in t.summary()
    d = t.to_dict()
    assert d["time_p10_ns"] == t.time_p10_ns and d["time_low_ns"] == t.time_low_ns


def _package_imports(path: Path, package: str) -> set:
    """Modules of ``package`` that a file imports anywhere (module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package if node.level == 1 else package.rsplit(".", node.level - 1)[0]
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" for a in node.names] + [mod]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out |= {n for n in names if n.startswith(package + ".")}
    return out


def test_perf_has_no_import_circle():
    pkg = Path(perf.__file__).parent
    modules = {f"nki_ssm.perf.{p.stem}": p for p in pkg.glob("*.py") if p.stem != "__init__"}
    graph = {m: {d for d in _package_imports(p, "nki_ssm.perf") if d in modules and d != m}
             for m, p in modules.items()}
    assert "nki_ssm.perf.calibration_row" in graph["nki_ssm.perf.measured"]
    assert "nki_ssm.perf.calibration" not in graph["nki_ssm.perf.measured"]
    state: dict = {}

    def visit(m, stack):
        state[m] = "open"
        for d in graph[m]:
            assert state.get(d) != "open", "import circle: " + " -> ".join(stack + [m, d])
            if d not in state:
                visit(d, stack + [m])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [])
