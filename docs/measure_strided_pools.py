"""Time host-API decode calls on pools laid out as a serving engine lays them (run from the
repository root).

    PYTHONPATH=. python3 docs/measure_strided_pools.py [--backends reference sim] [--repeat 5]

vLLM carves every layer's states out of one page per block, padded to the largest layer's
page (``MambaBase.bind_kv_cache``), so a state pool is a strided view into a byte buffer,
never C-contiguous. This builds such pools (a conv state, then the SSM state, then padding,
in each page), 64 and 2,048 slots, and times ``ops.gated_delta_decode`` (HV 4, K = V = 64,
the pool viewed ``[slots, HV, K, V]`` from vLLM's ``[slots, HV, V, K]``) and
``ops.ssd_decode`` (H 8, P 64, N 16) on 4 sequences, best of ``--repeat`` calls, and prints
the ratio of the two times: a call's cost follows the batch, not the pool.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from nki_ssm import ops
from nki_ssm.reference import inputs as gen

NUM_SEQS = 4
PAGE_PAD_BYTES = 4096        # what the largest layer's page adds to this one


def paged_pool(slots: int, state_shape: tuple, conv_elems: int, rng) -> tuple:
    """(pool view [slots, *state_shape] float32, backing bytes): each slot's page holds a conv
    state of ``conv_elems`` floats, the SSM state, then padding (as vLLM lays a page)."""
    state_elems = int(np.prod(state_shape))
    page = (conv_elems + state_elems) * 4 + PAGE_PAD_BYTES
    backing = np.zeros((slots, page), np.uint8)
    view = backing[:, conv_elems * 4:(conv_elems + state_elems) * 4].view(np.float32)
    view[...] = 0.1 * rng.standard_normal(view.shape).astype(np.float32)
    return view.reshape((slots,) + state_shape), backing


def gdn_call(slots: int, rng) -> tuple:
    kw = gen.make_gated_delta_decode_inputs(rng, num_seqs=NUM_SEQS, T=1, H=2, HV=4, K=64, V=64,
                                            raw_gates=True, use_qk_l2norm=True, slots=slots)
    vllm_view, _ = paged_pool(slots, (4, 64, 64), 3 * 256, rng)    # vLLM's [slots, HV, V, K]
    kw["ssm_states"] = vllm_view.transpose(0, 1, 3, 2)              # ours: [slots, HV, K, V]
    return ops.gated_delta_decode, kw


def ssd_call(slots: int, rng) -> tuple:
    kw = gen.make_ssd_decode_inputs(rng, num_seqs=NUM_SEQS, H=8, P=64, N=16, slots=slots)
    kw["ssm_states"], _ = paged_pool(slots, (8, 64, 16), 3 * 544, rng)
    return ops.ssd_decode, kw


def best_time(op, kw: dict, backend: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        op(**kw, backend=backend)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["reference", "sim"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--slots", nargs=2, type=int, default=[64, 2048])
    args = parser.parse_args()
    small, large = args.slots
    print(f"| op | backend | {small} slots | {large} slots | ratio |")
    print("|---|---|---|---|---|")
    for name, build in (("gated_delta_decode", gdn_call), ("ssd_decode", ssd_call)):
        for backend in args.backends:
            times = []
            for slots in (small, large):
                op, kw = build(slots, np.random.default_rng(0))
                assert not kw["ssm_states"].flags.c_contiguous
                op(**kw, backend=backend)                      # warm-up (kernel build)
                times.append(best_time(op, kw, backend, args.repeat))
            print(f"| {name} | {backend} | {times[0] * 1e3:.1f} ms | {times[1] * 1e3:.1f} ms "
                  f"| {times[1] / times[0]:.2f}x |")


if __name__ == "__main__":
    main()
