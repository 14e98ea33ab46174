"""Every kernel is one level of runtime loops (issue 25): on ragged batches with initial
states, padding slots and several chunks per sequence, no instruction sits in more than one
runtime loop (NCC_ICFG018 on NKI 0.5.0, aws-neuron-sdk #1346; loop-carried registers in
nested loops are a known issue in 0.6.0), and the program (static instructions, every loop
body counted once) does not depend on the batch.

Small shapes: the families' own tests check the values against float64.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("nki_ssm.backend")

from nki_ssm import ops  # noqa: E402
from nki_ssm.reference import inputs  # noqa: E402
from nki_ssm.sim.trace import record  # noqa: E402

# two batches of one shape bucket (tokens and sequences): ragged, an empty sequence, padding,
# mixed initial states, lengths over several chunks and not multiples of them, T = 1
PREFILL_BATCHES = ([150, 0, 40, 200], [300, 1, 89])
DECODE_BATCHES = ((5, 2), (7, 0))    # (num_seqs, padding slots)


def _conv_prefill(rng, seqlens, padding):
    kw = inputs.make_short_conv_inputs(rng, seqlens=seqlens, dim=256, W=4, padding=padding)
    return ops.short_conv_prefill, kw


def _ssd_prefill(rng, seqlens, padding):
    kw = inputs.make_ssd_inputs(rng, seqlens=seqlens, H=2, P=16, N=16, G=1, padding=padding)
    return ops.ssd_prefill, dict(kw, chunk_size=64)


def _gdn_prefill(rng, seqlens, padding):
    kw = inputs.make_gated_delta_inputs(rng, seqlens=seqlens, H=1, HV=2, K=16, V=16,
                                        padding=padding)
    return ops.gated_delta_prefill, dict(kw, chunk_size=64)


def _conv_decode(rng, num_seqs, padding):
    kw = inputs.make_short_conv_decode_inputs(rng, num_seqs=num_seqs, T=2, dim=256, W=4,
                                              padding=padding)
    return ops.short_conv_decode, kw


def _ssd_decode(rng, num_seqs, padding):
    kw = inputs.make_ssd_decode_inputs(rng, num_seqs=num_seqs, T=2, H=2, P=16, N=16, G=1,
                                       padding=padding)
    return ops.ssd_decode, kw


def _gdn_decode(rng, num_seqs, padding):
    kw = inputs.make_gated_delta_decode_inputs(rng, num_seqs=num_seqs, T=2, H=1, HV=2, K=16,
                                               V=16, padding=padding)
    return ops.gated_delta_decode, kw


def _run(make, batch, padding):
    op, kw = make(np.random.default_rng(len(str(batch))), batch, padding)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)   # no nl.dynamic_range left
        with record() as trace:
            op(**kw, backend="sim")
    return trace


CASES = [(_conv_prefill, PREFILL_BATCHES), (_ssd_prefill, PREFILL_BATCHES),
         (_gdn_prefill, PREFILL_BATCHES), (_conv_decode, DECODE_BATCHES),
         (_ssd_decode, DECODE_BATCHES), (_gdn_decode, DECODE_BATCHES)]


@pytest.mark.parametrize("make, batches", CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_one_runtime_loop_level_and_one_program(make, batches, monkeypatch):
    for lnc in (1, 2):      # both programs at LNC=2: same size, both in loops
        monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
        sizes = []
        for i, batch in enumerate(batches):
            if isinstance(batch, tuple):
                batch, padding = batch
            else:
                padding = 1 if len(batch) > 1 else 0
            trace = _run(make, batch, padding)
            depth = max((len(inst.loop_path) for inst in trace.instructions), default=0)
            assert depth <= 1, f"an instruction sits in {depth} nested runtime loops"
            for pid in range(lnc):
                assert any(inst.loop_path for inst in trace.instructions
                           if inst.program_id == pid), f"no runtime loop ran in program {pid}"
            sizes.append([trace.program_instructions(pid) for pid in range(lnc)])
        assert sizes[0] == sizes[1] and len(set(sizes[0])) == 1 and sizes[0][0] <= 20_000
