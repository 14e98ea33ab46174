"""Run one case: the float64 reference, and the kernel (if the op has one) in the simulator.

The kernel runs through the host API (``nki_ssm.ops.<op>(..., backend="sim")``)
inside ``nki_ssm.sim.trace.record()`` with NEURON_PLATFORM_TARGET_OVERRIDE
set to the target and NEURON_LOGICAL_NC_CONFIG to the LNC (1: one program on
one physical core; 2: two programs on the two physical cores of a logical
core, launched ``kernel[2]``), and the captured trace is timed by
``nki_ssm.perf.model``. ``run_case(..., lncs=(1, 2))`` runs the kernel at
both: the first LNC's figures (with the 10-90 % interval) fill the result,
the second's (central figure only: one scheduling pass instead of 15) its
``lnc2`` field.
An op "has a kernel" when ``nki_ssm.ops._dispatch.find_launcher`` finds its
launcher; otherwise only the reference runs and the result says so (no time
is invented).

Backward cases (``ops.<family>_backward``, no state pool) compare every gradient
with the float64 reference gradients (``simulate.backward_reference``, run in
pieces): ``err_grads`` per gradient, ``err_out`` the worst per-token or
parameter gradient, ``err_state`` d_initial_states'.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field

import numpy as np

from simulate.cases import BACKWARD_GRADS, SSD_REFERENCE_CHUNK, Case

NO_KERNEL = "reference only, no kernel yet"
# the unit of the per-chunk instruction counts: every prefill / backward case, whatever its
# kernel's chunk, is counted per 128 tokens of each sequence (a partial chunk counts as one)
COUNT_CHUNK = 128
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


def count_chunks(case: Case) -> int | None:
    """128-token chunks of a prefill / backward case (sum over sequences of ceil(len / 128));
    None for decode."""
    if case.entry == "decode":
        return None
    return int(sum(-(-n // COUNT_CHUNK) for n in case.seqlens))


def engine_counts(trace) -> dict:
    """Executed instructions per engine of a recorded trace (every engine of ENGINES, 0 if unused;
    an engine outside ENGINES gets its own key)."""
    counts = dict.fromkeys(ENGINES, 0)
    for inst in trace.instructions:
        counts[inst.engine] = counts.get(inst.engine, 0) + 1
    return counts


@dataclass
class CaseResult:
    case_id: str
    op: str
    family: str
    entry: str
    model: str
    shape: str
    num_tokens: int
    num_seqs: int
    dtype: str
    pool_dtype: str
    target: str
    config: str = ""                 # layer dtypes / options as in the case id
    lnc: int = 1                     # programs of the launch: 1 physical core, or 2 (one logical core)
    status: str = NO_KERNEL          # "kernel", NO_KERNEL, "error" or "skipped"
    error: str | None = None
    err_out: float | None = None     # rel Frobenius vs float64 reference (backward: the worst gradient)
    err_state: float | None = None   # (backward: d_initial_states)
    err_grads: dict = field(default_factory=dict)   # backward: gradient name -> rel Frobenius
    max_abs_out: float | None = None  # max |err| / max |ref|
    modeled_ns: float | None = None
    modeled_ns_p10: float | None = None      # 10-90 % interval: constants drawn within their ranges
    modeled_ns_p90: float | None = None      # (perf.model_range)
    modeled_ns_low: float | None = None      # same trace, every uncertain constant at its fast end
    modeled_ns_high: float | None = None     # ... at its slow end (perf.model_range)
    modeled_ns_optimistic: float | None = None   # = modeled_ns_low (older readers)
    launch_ns: float | None = None           # kernel launch, its own line (not in modeled_ns)
    tokens_per_s: float | None = None
    bytes_per_s: float | None = None          # minimal HBM bytes / modeled time
    dma_bw_bytes_per_s: float | None = None   # the target core's DMA bandwidth (roofline memory roof)
    hbm_fraction: float | None = None         # bytes_per_s / dma_bw_bytes_per_s
    roofline_fraction: float | None = None
    roofline_bound: str | None = None
    roofline_ns: float | None = None
    binding_engine: str | None = None
    share: dict = field(default_factory=dict)
    instructions: int | None = None          # dynamic: every executed instruction
    program_instructions: int | None = None  # static: what the compiler emits (loop bodies once)
    loop_iterations: int | None = None       # runtime-loop iterations charged a boundary
    loop_overhead_ns: float | None = None    # iterations x (barrier + branch) charged
    act_table_loads: int | None = None
    dma_bytes: int | None = None
    dma_transfers: int | None = None
    matmul_flops: int | None = None
    min_flops: float = 0.0
    min_hbm_bytes: float = 0.0
    reference_wall_s: float | None = None
    kernel_wall_s: float | None = None
    traceback: str | None = None
    top_ops: list = field(default_factory=list)   # [("engine:op", count, busy ns), ...]
    program_ns: list = field(default_factory=list)  # each program's end (LNC=2: two); modeled_ns the later
    # executed instructions per engine (tensor, vector, scalar, gpsimd, dma; at LNC=2 both programs')
    engine_instructions: dict = field(default_factory=dict)
    chunks: int | None = None        # prefill / backward: 128-token chunks, sum of ceil(len / 128)
    instructions_per_chunk: dict = field(default_factory=dict)   # engine_instructions / chunks
    forward_id: str | None = None    # backward: the case id of its forward (the prefill case)
    lnc2: "CaseResult | None" = None  # the same case at LNC=2 (run_case(lncs=(1, 2))), central figure only

    def to_dict(self) -> dict:
        return asdict(self)


def _reference_fn(case: Case):
    from nki_ssm.reference import gated_delta, mamba2_ssd, short_conv

    return {
        ("short_conv", "prefill"): short_conv.short_conv_prefill,
        ("short_conv", "decode"): short_conv.short_conv_decode,
        ("mamba2_ssd", "prefill"): mamba2_ssd.ssd_chunked,
        ("mamba2_ssd", "decode"): mamba2_ssd.ssd_decode,
        ("gated_delta", "prefill"): gated_delta.gated_delta_chunked,
        ("gated_delta", "decode"): gated_delta.gated_delta_decode,
    }[(case.family, case.entry)]


# decode arrays with one row per sequence (split when the reference runs in groups)
_PER_SEQUENCE = {
    "short_conv": ("x",),
    "mamba2_ssd": ("x", "dt", "B", "C", "z"),
    "gated_delta": ("q", "k", "v", "g", "beta", "a", "b"),
}
_REF_GROUP_BYTES = 256e6   # float64 pool bytes per reference call
# conv prefill: channels are independent (depthwise), so the float64 reference runs in
# blocks of channels: ~3x faster at 16K x 8192 than one call (1 GB float64 temporaries)
_CONV_REF_CHANNELS = 512


class _FroError:
    """Relative Frobenius error and max |err| / max |ref| accumulated over pieces
    (metrics.rel_fro / max_abs_scaled conventions)."""

    def __init__(self):
        self.num = self.den = self.max_err = self.max_ref = 0.0
        self.nan = False

    def add(self, actual, ref) -> None:
        a = np.asarray(actual, dtype=np.float64)
        r = np.asarray(ref, dtype=np.float64)
        if a.shape != r.shape:
            raise ValueError(f"actual and ref must have the same shape: actual.shape = {a.shape}, "
                             f"ref.shape = {r.shape}")
        if a.size == 0:
            return
        diff = np.abs(a - r)
        d = float(np.sum(diff ** 2))
        q = float(np.sum(r ** 2))
        self.nan |= not (np.isfinite(d) and np.isfinite(q))
        self.num += d
        self.den += q
        self.max_err = max(self.max_err, float(diff.max()))
        self.max_ref = max(self.max_ref, float(np.abs(r).max()))

    @staticmethod
    def _ratio(num: float, den: float, nan: bool) -> float:
        if nan:
            return float("nan")
        if den == 0.0:
            return 0.0 if num == 0.0 else float("inf")
        return num / den

    def value(self) -> float:
        return float(np.sqrt(self._ratio(self.num, self.den, self.nan)))

    def max_scaled(self) -> float:
        return self._ratio(self.max_err, self.max_ref, self.nan)


def _pieces(case: Case, kw: dict):
    """Split one reference call into independent pieces.

    Yields ``(sub_kwargs, out_index, live_index, state_index)``: the reference's
    arguments for the piece, the index of its part of the output, of its live
    sequences in state_indices order, and of its part of each named slot's state.
    Decode: groups of sequences, each with a pool of its own slots (the reference
    copies its pool to float64; a 512-sequence pool would need several GB at once).
    Conv prefill: blocks of channels. Otherwise one piece.
    """
    pool = case.pool_name
    idx = np.asarray(kw["state_indices"])
    everything = slice(None)
    if case.family == "short_conv" and case.entry == "prefill" and kw["x"].shape[1] > _CONV_REF_CHANNELS:
        dim = kw["x"].shape[1]
        for c0 in range(0, dim, _CONV_REF_CHANNELS):
            ch = slice(c0, c0 + _CONV_REF_CHANNELS)
            sub = dict(kw, x=kw["x"][:, ch], weight=kw["weight"][ch], conv_states=kw[pool][:, ch])
            if kw.get("bias") is not None:
                sub["bias"] = kw["bias"][ch]
            yield sub, (everything, ch), everything, (everything, ch)
        return
    group = max(1, int(_REF_GROUP_BYTES // max(kw[pool][0].size * 8, 1)))
    if case.entry != "decode" or len(idx) <= group:
        yield kw, everything, everything, everything
        return
    done = 0
    for s0 in range(0, len(idx), group):
        sub = dict(kw)
        for name in _PER_SEQUENCE[case.family]:
            if sub.get(name) is not None:
                sub[name] = kw[name][s0:s0 + group]
        sub_idx = idx[s0:s0 + group]
        live = sub_idx >= 0
        n_live = int(live.sum())
        sub[pool] = kw[pool][sub_idx[live]]
        local = np.full(len(sub_idx), -1, dtype=np.int32)
        local[live] = np.arange(n_live, dtype=np.int32)
        sub["state_indices"] = local
        yield sub, slice(s0, s0 + group), slice(done, done + n_live), everything
        done += n_live


def _reference_errors(case: Case, kw: dict, out=None, new_slots=None):
    """Run the float64 reference piece by piece (:func:`_pieces`) and compare.

    ``out``: the kernel's output; ``new_slots``: its state of the named slots in
    state_indices order (None: reference only). -> (output error, state error),
    two :class:`_FroError`; ``value()`` is the relative Frobenius error.
    """
    return _reference_errors_of(case, kw, [(out, new_slots)])[0]


def _reference_errors_of(case: Case, kw: dict, runs: list) -> list:
    """:func:`_reference_errors` for several kernel runs ``[(out, new_slots), ...]`` against
    one reference run -> ``[(output error, state error), ...]``."""
    fn = _reference_fn(case)
    if case.family == "mamba2_ssd" and case.entry == "prefill":
        kw = dict(kw, chunk_size=SSD_REFERENCE_CHUNK)  # exact for any chunk; faster in NumPy
    if case.family == "gated_delta" and case.entry == "prefill" and kw.get("chunk_size") is None:
        kw = dict(kw, chunk_size=case.chunk)  # None = the kernel's default; any chunk is exact
    errors = [(_FroError(), _FroError()) for _ in runs]
    for sub, out_ix, live_ix, state_ix in _pieces(case, kw):
        ref_out, ref_pool = fn(**sub)[:2]
        named = None
        for (out, new_slots), (err_out, err_state) in zip(runs, errors):
            if out is not None:
                err_out.add(out[out_ix], ref_out)
            if new_slots is not None:
                if named is None:
                    sub_idx = np.asarray(sub["state_indices"])
                    named = np.asarray(ref_pool)[sub_idx[sub_idx >= 0]]
                err_state.add(new_slots[live_ix][state_ix], named)   # the piece's pool is its part
        del ref_out, ref_pool, named
    return errors


def _backward_errors_of(case: Case, kw: dict, runs: list) -> list:
    """Each kernel run's gradients ``[grads, ...]`` against one float64 reference run ->
    ``[(worst gradient's error, d_initial_states' error, {name: error}), ...]``."""
    from simulate.backward_reference import reference_gradients

    ref = reference_gradients(case, kw)
    out = []
    for grads in runs:
        errs = {}
        for name in BACKWARD_GRADS[case.family]:
            if ref.get(name) is None:
                continue
            errs[name] = _FroError()
            if grads is not None:
                errs[name].add(grads[name], ref[name])
        per_token = [e for n, e in errs.items() if n != "d_initial_states"]
        worst = max(per_token, key=lambda e: (np.nan_to_num(e.value(), nan=np.inf)))
        out.append((worst, errs["d_initial_states"], errs))
    return out


def has_kernel(case: Case) -> bool:
    from nki_ssm.ops._dispatch import find_launcher

    if case.entry == "backward":
        return True   # every backward host op runs its NKI kernel on the simulator
    return find_launcher(case.family, case.entry) is not None


def _new_result(case: Case, target: str, **kw) -> CaseResult:
    return CaseResult(
        case_id=case.id, op=case.op, family=case.family, entry=case.entry, model=case.model,
        shape=repr(case.shape), num_tokens=case.num_tokens,
        num_seqs=case.num_seqs if case.entry == "decode" else len(case.seqlens),
        dtype=np.dtype(case.dtype).name, pool_dtype=np.dtype(case.pool_dtype).name, target=target,
        config=case.config, min_flops=case.min_flops(), chunks=count_chunks(case),
        forward_id=case.forward().id if case.entry == "backward" else None, **kw)


def skipped(case: Case, target: str, reason: str) -> CaseResult:
    """A result row for a case that was not run (status "skipped", reason in ``error``)."""
    return _new_result(case, target, status="skipped", error=reason)


def _fail(res: CaseResult, where: str, exc: BaseException) -> None:
    res.status = "error"
    res.error = f"{where}{type(exc).__name__}: {exc}"[:500]
    res.traceback = traceback.format_exc(limit=6)


def logical_nc(lnc: int):
    """Set NEURON_LOGICAL_NC_CONFIG (read by ``nki_ssm.backend.logical_nc_config``) for the block."""
    from nki_ssm.backend import LNC_ENV_VAR
    from nki_ssm.perf.profile import environment

    if lnc not in (1, 2):
        raise ValueError(f"lnc must be 1 or 2, got {lnc!r}")
    return environment(LNC_ENV_VAR, str(lnc))


def _run_kernel(case: Case, kw: dict, target: str, lnc: int, ranges: bool, keep_timing: bool,
                range_samples: int | None = None):
    """-> (output, the named slots' new state, Timing): one simulated launch at ``lnc``."""
    from nki_ssm import ops, perf
    from nki_ssm.perf.profile import platform_target, program_instructions
    from nki_ssm.sim.trace import record

    args, new_slots = dict(kw), None
    if case.entry != "backward":
        pool = case.pool_name
        live = np.asarray(kw["state_indices"])
        live = live[live >= 0]
        args[pool] = kw[pool].copy()
    with platform_target(target), logical_nc(lnc), record(target=target) as trace:
        out = getattr(ops, case.op)(**args, backend="sim")   # backward: the gradients (dict)
    if isinstance(out, tuple):
        out = out[0]
    if case.entry != "backward":
        new_slots = args[pool][live]
    if ranges:
        timing = perf.model_range(trace, target=target, keep_schedule=keep_timing, samples=range_samples)
    else:
        timing = perf.model(trace, target=target, keep_schedule=keep_timing)
    timing.program_instructions = program_instructions(trace)
    timing.engine_instructions = engine_counts(trace)
    return out, new_slots, timing


def run_case(case: Case, target: str = "trn2", seed: int = 0, *, keep_timing: bool = False,
             lncs: tuple = (1,), range_samples: int | None = None):
    """-> (CaseResult, Timing or None). Never raises for a failing kernel: status says it.

    ``lncs``: the LNCs to launch at; the first fills the result (with the
    10-90 % interval from ``range_samples`` constant tables, None: hardware.RANGE_SAMPLES),
    a second (2) fills ``result.lnc2`` (central figure).
    Memory: 512-sequence decode pools are ~1 GB (fp32); the kernel runs first
    on a copy of the pool, only its named slots are kept, and the float64
    reference (which copies the pool itself; references never modify their
    inputs) runs after, once for every launch, so at most a few pool-sized
    arrays are alive.
    """
    lncs = tuple(lncs)
    if not lncs or len(lncs) > 2 or any(n not in (1, 2) for n in lncs) or len(set(lncs)) != len(lncs):
        raise ValueError(f"lncs must be (1,), (2,), (1, 2) or (2, 1), got {lncs!r}")
    kw = case.make_inputs(seed)
    res = _new_result(case, target, status=NO_KERNEL, min_hbm_bytes=case.min_hbm_bytes(kw), lnc=lncs[0])
    results = [res] + [_new_result(case, target, status=NO_KERNEL, min_hbm_bytes=res.min_hbm_bytes, lnc=n)
                       for n in lncs[1:]]
    if len(results) > 1:
        res.lnc2 = results[1]

    runs = []        # (result, output, new slots, timing) of each launch that ran
    if has_kernel(case):
        for k, r in enumerate(results):
            t0 = time.perf_counter()
            try:
                out, new_slots, timing = _run_kernel(case, kw, target, r.lnc, ranges=k == 0,
                                                     keep_timing=keep_timing and k == 0,
                                                     range_samples=range_samples)
            except Exception as exc:  # a kernel that fails is reported, not fatal
                _fail(r, "", exc)
                r.kernel_wall_s = time.perf_counter() - t0
                if k == 0:
                    return res, None
                continue
            r.kernel_wall_s = time.perf_counter() - t0
            runs.append((r, out, new_slots, timing))

    t0 = time.perf_counter()
    try:
        if case.entry == "backward":
            errors = _backward_errors_of(case, kw, [out for _, out, _, _ in runs] or [None])
        else:
            errors = _reference_errors_of(case, kw, [(out, slots) for _, out, slots, _ in runs] or [(None, None)])
    except Exception as exc:  # a broken reference is reported like a broken kernel
        _fail(res, "reference: ", exc)
        return res, None
    res.reference_wall_s = time.perf_counter() - t0
    if not runs:
        return res, None
    for (r, _, _, timing), (err_out, err_state, *grads) in zip(runs, errors):
        _fill(r, case, timing, err_out, err_state)
        if grads:
            r.err_grads = {name: e.value() for name, e in grads[0].items()}
    timing = runs[0][3]
    return res, (timing if keep_timing else None)


def _fill(res: CaseResult, case: Case, timing, err_out, err_state) -> None:
    """A kernel result's fields from its Timing and its errors against float64."""
    res.status = "kernel"
    res.err_out = err_out.value()
    res.max_abs_out = err_out.max_scaled()
    res.err_state = err_state.value()
    res.modeled_ns = timing.time_ns
    res.program_ns = list(timing.program_time_ns)
    res.modeled_ns_p10, res.modeled_ns_p90 = timing.time_p10_ns, timing.time_p90_ns
    res.modeled_ns_low, res.modeled_ns_high = timing.time_low_ns, timing.time_high_ns
    res.modeled_ns_optimistic = timing.time_low_ns
    res.launch_ns = timing.launch_ns
    if timing.time_ns > 0:
        res.tokens_per_s = case.num_tokens / (timing.time_ns * 1e-9)
        res.bytes_per_s = res.min_hbm_bytes / (timing.time_ns * 1e-9)
        res.dma_bw_bytes_per_s = timing.dma_bw_bytes_per_ns * 1e9
        res.hbm_fraction = res.bytes_per_s / res.dma_bw_bytes_per_s
    res.roofline_ns = timing.roofline_ns(res.min_flops, res.min_hbm_bytes)
    res.roofline_fraction = timing.roofline(res.min_flops, res.min_hbm_bytes)
    res.roofline_bound = timing.roofline_bound(res.min_flops, res.min_hbm_bytes)
    res.binding_engine = timing.binding_engine
    res.share = timing.share
    res.instructions = timing.num_instructions
    res.program_instructions = timing.program_instructions
    res.engine_instructions = dict(getattr(timing, "engine_instructions", None) or {})
    if res.chunks:
        res.instructions_per_chunk = {e: n / res.chunks for e, n in res.engine_instructions.items()}
    res.loop_iterations, res.act_table_loads = timing.loop_iterations, timing.act_table_loads
    res.loop_overhead_ns = timing.loop_overhead_ns
    res.dma_bytes, res.dma_transfers = timing.dma_bytes, timing.dma_transfers
    res.matmul_flops = timing.matmul_flops
    res.top_ops = timing.top_ops(5)
