"""One control flow for both LNC programs, on work that does not split evenly.

Every op (forward and backward) at LNC=2 on batches whose work does not divide between
the two programs (odd sequence counts, one sequence or head, channel tiles that do not
split, all padding): both programs run identical runtime trip counts and ``nl.if_else``
outcomes (read from ``Trace.loops`` / ``Trace.branches``: for every loop the same entries
and iterations, for every branch the same outcomes in order), at least one runtime loop
iterates on each, and every result (outputs, gradients and the updated pool) equals
LNC=1's bit for bit; no PSUM tile is written in a runtime loop it was allocated outside of
(the simulator's NkiWeakEvidenceWarning is an error here). A planted kernel whose programs
read different trip counts is rejected (``NkiSyncError``).

Each family adds its cases to ``CASES``: ``(id, make)`` with ``make(rng) -> (op,
kwargs)``, ``op`` an ``nki_ssm.ops`` function called with ``**kwargs, backend="sim"``
(pools in ``kwargs`` are compared after the call, on fresh copies per run).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from nki_ssm import ops
from nki_ssm.reference import inputs
from nki_ssm.sim.trace import record

BF16 = ml_dtypes.bfloat16
POOLS = ("conv_states", "ssm_states")


def _conv_decode(num_seqs, padding, dim, T=2, dtype=np.float32):
    def make(rng):
        kw = inputs.make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=T, dim=dim, W=4,
                                                  dtype=dtype, pool_dtype=dtype,
                                                  padding=padding, slots=num_seqs + 2)
        return ops.short_conv_decode, kw
    return make


def _conv_prefill(seqlens, padding, dim, dtype=np.float32):
    def make(rng):
        kw = inputs.make_short_conv_inputs(rng, seqlens=seqlens, dim=dim, W=4, dtype=dtype,
                                           pool_dtype=dtype, padding=padding,
                                           slots=len(seqlens) + 2, has_initial_state="mixed")
        return ops.short_conv_prefill, kw
    return make


def _conv_backward(lengths, dim, dtype=np.float32):
    def make(rng):
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        n, S = int(cu[-1]), len(lengths)
        kw = dict(x=rng.standard_normal((n, dim)).astype(dtype),
                  weight=rng.uniform(-0.5, 0.5, (dim, 4)).astype(np.float32),
                  bias=rng.uniform(-0.5, 0.5, dim).astype(np.float32),
                  dy=rng.standard_normal((n, dim)).astype(dtype), cu_seqlens=cu,
                  initial_states=rng.standard_normal((S, dim, 3)).astype(np.float32),
                  d_final_states=rng.standard_normal((S, dim, 3)).astype(np.float32))
        return ops.short_conv_backward, kw
    return make


def _ssd_decode(num_seqs, padding, T=None, H=2, pool_dtype=np.float32):
    def make(rng):
        kw = inputs.make_ssd_decode_inputs(rng, num_seqs=num_seqs, T=T, H=H, P=16, N=16, G=1,
                                           padding=padding, z=True, pool_dtype=pool_dtype,
                                           slots=num_seqs + 2)
        return ops.ssd_decode, kw
    return make


def _gdn_decode(num_seqs, padding, T=1, HV=2, raw=False, pool_dtype=np.float32):
    def make(rng):
        kw = inputs.make_gated_delta_decode_inputs(rng, num_seqs=num_seqs, T=T, H=1, HV=HV,
                                                   K=16, V=16, raw_gates=raw,
                                                   use_qk_l2norm=raw, padding=padding,
                                                   pool_dtype=pool_dtype,
                                                   slots=num_seqs + 2)
        return ops.gated_delta_decode, dict(kw, return_intermediate_states=True)
    return make


def _gdn_prefill(seqlens, padding, H, HV, dtype=np.float32, raw=False, chunk=16):
    def make(rng):
        kw = inputs.make_gated_delta_inputs(rng, seqlens=seqlens, H=H, HV=HV, K=16, V=16,
                                            dtype=dtype, pool_dtype=dtype, raw_gates=raw,
                                            use_qk_l2norm=raw, padding=padding,
                                            slots=len(seqlens) + 2)
        return ops.gated_delta_prefill, dict(kw, chunk_size=chunk)
    return make


def _ssd_prefill(seqlens, padding, H, P, G=1, dtype=np.float32, chunk=16):
    def make(rng):
        kw = inputs.make_ssd_inputs(rng, seqlens=seqlens, H=H, P=P, N=16, G=G, dtype=dtype,
                                    padding=padding, slots=len(seqlens) + 2, z=True,
                                    has_initial_state="mixed")
        return ops.ssd_prefill, dict(kw, chunk_size=chunk)
    return make


def _ssd_backward(lengths, H, P, G=1, dtype=np.float32, chunk=16, N=16):
    def make(rng):
        kw = inputs.make_ssd_inputs(rng, seqlens=lengths, H=H, P=P, N=N, G=G, dtype=dtype,
                                    z=True)
        for name in ("ssm_states", "state_indices", "has_initial_state"):
            kw.pop(name)
        S, n = len(lengths), int(sum(lengths))
        kw.update(dy=rng.standard_normal((n, H, P)).astype(dtype), chunk_size=chunk,
                  initial_states=rng.standard_normal((S, H, P, N)).astype(np.float32),
                  d_final_states=rng.standard_normal((S, H, P, N)).astype(np.float32))
        return ops.ssd_backward, kw
    return make


def _gdn_backward(lengths, H, HV, raw=False, dtype=np.float32, chunk=32):
    def make(rng):
        kw = inputs.make_gated_delta_inputs(rng, seqlens=lengths, H=H, HV=HV, K=16, V=16,
                                            raw_gates=raw, use_qk_l2norm=raw, dtype=dtype)
        for name in ("ssm_states", "state_indices", "has_initial_state"):
            kw.pop(name)
        S, n = len(lengths), int(sum(lengths))
        kw.update(do=rng.standard_normal((n, HV, 16)).astype(dtype), chunk_size=chunk,
                  initial_states=(0.1 * rng.standard_normal((S, HV, 16, 16))).astype(np.float32),
                  d_final_states=rng.standard_normal((S, HV, 16, 16)).astype(np.float32))
        return ops.gated_delta_backward, kw
    return make


CASES = [
    # SSD decode: the programs split the sequences; an odd live count (a spare entry), one
    # sequence (spare only), full iterations and single-entry ones, all padding
    ("ssd_decode/odd-seqs", _ssd_decode(7, 2, T=2)),
    ("ssd_decode/one-seq", _ssd_decode(1, 0, H=1)),
    ("ssd_decode/many-seqs-bf16-pool", _ssd_decode(37, 4, pool_dtype=BF16)),
    ("ssd_decode/all-padding", _ssd_decode(3, 3)),
    # GDN decode: an odd live count (spare batch), one sequence and one value head, both
    # loops, all padding
    ("gated_delta_decode/odd-seqs", _gdn_decode(7, 2, T=2, raw=True)),
    ("gated_delta_decode/one-seq-one-head", _gdn_decode(1, 0, HV=1)),
    ("gated_delta_decode/both-loops", _gdn_decode(45, 4, pool_dtype=BF16)),
    ("gated_delta_decode/all-padding", _gdn_decode(2, 2)),
    # prefill: channels split (dim 384: a full and a half tile each), odd sequence count with
    # an empty one and padding; one 128-channel tile (program 1 has none of its own); an
    # odd dim in bfloat16; all padding
    ("short_conv_prefill/odd-seqs", _conv_prefill([5, 0, 700], 1, 384)),
    ("short_conv_prefill/one-tile", _conv_prefill([300], 0, 128)),
    ("short_conv_prefill/odd-dim", _conv_prefill([9, 1, 40], 1, 99, BF16)),
    ("short_conv_prefill/all-padding", _conv_prefill([4, 6], 2, 256)),
    # backward: odd sequence count, T < W, an empty sequence; a partial channel tile
    ("short_conv_backward/odd-seqs", _conv_backward([5, 0, 2, 133], 200)),
    ("short_conv_backward/one-seq", _conv_backward([300], 128, BF16)),
    # channels split in two (dim 512), an odd number of live sequences, one padding slot
    ("short_conv_decode/odd-seqs", _conv_decode(5, 1, 512)),
    # one sequence, one 128-channel tile: program 1 has no channels of its own
    ("short_conv_decode/one-seq-one-tile", _conv_decode(1, 0, 128)),
    # an odd dim (does not split) in bfloat16 (one-block TensorE taps), odd batch
    ("short_conv_decode/odd-dim", _conv_decode(3, 1, 99, T=1, dtype=BF16)),
    # all padding: no live sequence, both programs run zero groups
    ("short_conv_decode/all-padding", _conv_decode(4, 4, 256)),
    # SSD prefill: the heads split (both programs run the whole work list): an odd sequence
    # count with an empty one and padding, pairs ending in an all-masked chunk; one head of
    # odd P (does not split: program 1 runs program 0's loops into dumps); an odd H (2H heads
    # of P/2) in bfloat16; all padding (only the padding tokens' y rows are zeroed)
    ("ssd_prefill/odd-seqs", _ssd_prefill([37, 0, 70], 1, 4, 8, G=2)),
    ("ssd_prefill/one-head", _ssd_prefill([21], 0, 1, 5)),
    ("ssd_prefill/odd-H", _ssd_prefill([9, 40, 1], 1, 3, 8, dtype=BF16)),
    ("ssd_prefill/all-padding", _ssd_prefill([5, 30], 2, 2, 8)),
    # GDN prefill: the value heads split (both programs run the whole work list): an odd
    # sequence count with an empty one, padding, bodies of several chunks and single ones; one
    # value head and an odd HV (do not split: program 1 runs program 0's heads into dumps)
    # with raw gates and the fused L2 norm in bfloat16; all padding
    ("gated_delta_prefill/odd-seqs", _gdn_prefill([37, 0, 150, 5], 1, 1, 2)),
    ("gated_delta_prefill/one-head", _gdn_prefill([40, 3], 0, 1, 1)),
    ("gated_delta_prefill/odd-HV", _gdn_prefill([9, 70, 1], 1, 1, 3, dtype=BF16, raw=True)),
    ("gated_delta_prefill/all-padding", _gdn_prefill([5, 30], 2, 1, 2)),
    # SSD backward: an odd sequence count with an empty one (a group per program); odd H
    # (does not split: both programs run every head, program 0's gradients kept); groups
    # whose heads sit in both programs (H = 6, G = 3: group 1; one group of two dstate
    # tiles in bfloat16; heads of 256 channels split into 2H = 6 heads, G = 3): dB / dC
    # bit for bit too
    ("ssd_backward/odd-seqs", _ssd_backward([37, 0, 5], 4, 8, G=2)),
    ("ssd_backward/odd-H", _ssd_backward([20, 3], 3, 8, dtype=BF16)),
    ("ssd_backward/shared-group", _ssd_backward([37, 0, 5], 6, 8, G=3)),
    ("ssd_backward/shared-group-N256", _ssd_backward([20, 3], 2, 8, N=256, dtype=BF16)),
    ("ssd_backward/shared-group-P256", _ssd_backward([9, 21], 3, 256, G=3)),
    # GDN backward: the value heads split (padded with zero heads to a multiple of the
    # programs; both programs run the whole work list): an odd sequence count with an empty
    # one, lengths not multiples of the chunk; one sequence of several chunks; one value
    # head (program 1 runs a padding head) in bfloat16 with raw gates
    ("gated_delta_backward/odd-seqs", _gdn_backward([45, 0, 1, 70, 33], 2, 4, raw=True)),
    ("gated_delta_backward/one-seq", _gdn_backward([150], 1, 2, chunk=64)),
    ("gated_delta_backward/one-head", _gdn_backward([37, 5, 90], 1, 1, raw=True, dtype=BF16)),
]


def _flatten(result) -> list:
    if isinstance(result, dict):
        return [result[k] for k in sorted(result) if result[k] is not None]
    if isinstance(result, (tuple, list)):
        return list(result)
    return [result]


def _run(make, monkeypatch, lnc):
    """(result arrays, trace) of one call at ``lnc`` on fresh inputs (same seed)."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    op, kw = make(np.random.default_rng(7))
    with record() as trace:
        out = _flatten(op(**kw, backend="sim"))
    out += [kw[name] for name in POOLS if name in kw]
    return [np.asarray(a) for a in out], trace


def program_flows(trace) -> dict:
    """Per program: {("loop", loop_id): (entries, iterations), ("if", branch_id): outcomes}."""
    flows: dict = {}
    for (pid, loop_id), loop in trace.loops.items():
        flows.setdefault(pid, {})[("loop", loop_id)] = (loop.entries, loop.iterations)
    for (pid, branch_id), branch in trace.branches.items():
        flows.setdefault(pid, {})[("if", branch_id)] = tuple(branch.outcomes)
    return flows


# a TensorE write to a PSUM tile allocated outside its runtime loop warns (sim.control):
# released runtime-loop kernels allocate PSUM in the body
@pytest.mark.filterwarnings("error::nki_ssm.sim.errors.NkiWeakEvidenceWarning")
@pytest.mark.parametrize("name, make", CASES, ids=[c[0] for c in CASES])
def test_both_programs_one_flow_and_lnc1_results(name, make, monkeypatch):
    ref, _ = _run(make, monkeypatch, 1)
    got, trace = _run(make, monkeypatch, 2)
    flows = program_flows(trace)
    assert sorted(flows) == [0, 1], flows
    assert flows[0] == flows[1], flows
    # the work is real: both programs iterate or take a branch (no live work: neither
    # does, or both only zero the padding tokens' rows)
    iterated = {pid for (pid, _), loop in trace.loops.items() if loop.iterations}
    taken = {pid for (pid, _), branch in trace.branches.items() if branch.taken}
    if name.endswith("all-padding"):
        assert iterated | taken in (set(), {0, 1}), (trace.loops, trace.branches)
    else:
        assert iterated | taken == {0, 1}, (trace.loops, trace.branches)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


def test_planted_kernel_whose_programs_differ_is_rejected():
    """A kernel that reads each program's own trip count (the pre-0.8 form) and is given
    different counts fails under LNC=2 with NkiSyncError naming both programs; given one
    row for both (scaffold.trip_counts) it runs."""
    from nki_ssm import backend
    from nki_ssm.backend import nki, nl, nisa
    from nki_ssm.kernels.scaffold import lnc_grid, trip_counts, work_loop
    from nki_ssm.sim.errors import NkiSyncError

    @nki.jit
    def planted(x, counts):
        programs, pid = lnc_grid()
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        n = trip_counts(counts[pid:pid + 1, :])[0]
        t = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)

        def body(i):
            nisa.dma_copy(dst=out.ap(pattern=[[x.shape[1], 1], [1, x.shape[1]]],
                                     offset=pid * x.shape[1], scalar_offset=i * 2,
                                     indirect_dim=0), src=t)

        work_loop(n, body)
        return out

    x = np.zeros((8, 4), dtype=np.float32)
    backend.run(planted, x, np.array([[2], [2]], dtype=np.int32), backend="sim", lnc=2)
    with pytest.raises(NkiSyncError, match="programs 0 and 1"):
        backend.run(planted, x, np.array([[2], [1]], dtype=np.int32), backend="sim", lnc=2)
