"""Launcher of the Gated DeltaNet kernels (``nki_ssm.kernels.gated_delta``).

Only ``decode`` exists: ``gated_delta_prefill`` has no kernel yet, so with
``backend=None`` the host API resolves it to the float64 reference (no
``prefill`` attribute here = "no launcher", see ``nki_ssm.ops._dispatch``),
and ``backend="sim"|"neuron"`` raises NotImplementedError for it.

Host side only arranges layouts and index tables; all math and every pool
gather / scatter happens in the kernel:

- the pool ``[slots, HV, K, V]`` is passed as its ``[slots*HV*K, V]`` row
  view (no copy for a C-contiguous pool); partition k of a sequence's state
  tile reads rows ``slot*HV*K + hv*K + k`` (int32 ``[num_seqs*K, 1]`` table);
- q and k become one ``[K, num_seqs*T*H*2]`` column table (k on partitions,
  k / q columns interleaved per head) plus k as one row ``[1, num_seqs*T*H*K]``;
  v becomes ``[V, num_seqs*T*HV]`` (v on partitions); gates are widened to
  float32 rows ``[2, num_seqs*T*HV]``; A_log / dt_bias one float32 row;
- which sequences are padding is a compile-time tuple (zero output, zero
  intermediate states, no instructions on the pool);
- the kernel's v-major output ``[V, num_seqs*T*HV]`` is transposed back and
  rounded once (RNE) to q's dtype.
"""
from __future__ import annotations

import numpy as np

_INT32_MAX = np.iinfo(np.int32).max


def _run(kernel, *args, backend):
    from nki_ssm import backend as _backend

    return _backend.run(kernel, *args, backend=backend)


def decode_tables(q, k, v, state_indices, slots):
    """(kq_cols, k_rows, v_cols, pool_idx) of ``gdn_decode_step`` (layouts in its docstring)."""
    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    if slots * HV * K > _INT32_MAX:
        raise ValueError(f"ssm_states must have slots*HV*K <= {_INT32_MAX} (int32 row indices), "
                         f"got {slots}*{HV}*{K} = {slots * HV * K}")
    kq = np.stack([np.asarray(k), np.asarray(q)], axis=-1)            # [S, T, H, K, 2]
    kq_cols = np.ascontiguousarray(kq.transpose(3, 0, 1, 2, 4)).reshape(K, S * T * H * 2)
    k_rows = np.ascontiguousarray(np.asarray(k).reshape(1, S * T * H * K))
    v_cols = np.ascontiguousarray(np.asarray(v).transpose(3, 0, 1, 2)).reshape(V, S * T * HV)
    idx = np.asarray(state_indices, dtype=np.int64)
    rows = np.where(idx[:, None] >= 0, idx[:, None] * HV * K + np.arange(K)[None, :], 0)
    pool_idx = rows.astype(np.int32).reshape(S * K, 1)
    return kq_cols, k_rows, v_cols, pool_idx


def decode(*, q, k, v, g, beta, a, b, A_log, dt_bias, scale, use_qk_l2norm, ssm_states,
           state_indices, return_intermediate_states, backend):
    """Launch ``gdn_decode_step``; returns o ``[num_seqs, T, HV, V]`` in q's dtype, or
    ``(o, intermediate [num_seqs, T, HV, K, V])`` (pool dtype) with
    return_intermediate_states. ``ssm_states`` is updated in place (named slots only)."""
    from nki_ssm.kernels.gated_delta.decode import gdn_decode_step
    from nki_ssm.ops._dispatch import cast_rne

    S, T, H, K = q.shape
    HV, V = v.shape[2:]
    slots = ssm_states.shape[0]
    raw = g is None
    kq_cols, k_rows, v_cols, pool_idx = decode_tables(q, k, v, state_indices, slots)
    first, second = (a, b) if raw else (g, beta)
    gate_rows = np.stack([np.asarray(first, np.float32).reshape(S * T * HV),
                          np.asarray(second, np.float32).reshape(S * T * HV)])
    head_params = None
    if raw:
        head_params = np.concatenate([np.asarray(A_log, np.float32),
                                      np.asarray(dt_bias, np.float32)]).reshape(1, 2 * HV)
    live = tuple(bool(i >= 0) for i in np.asarray(state_indices))
    pool = ssm_states.reshape(slots * HV * K, V)
    out = _run(gdn_decode_step, kq_cols, k_rows, v_cols, np.ascontiguousarray(gate_rows),
               head_params, pool, pool_idx, live, int(T), int(H), bool(raw),
               bool(use_qk_l2norm), float(scale), bool(return_intermediate_states),
               backend=backend)
    if not np.shares_memory(pool, ssm_states):
        ssm_states[...] = pool.reshape(ssm_states.shape)
    o_cols = out[0] if return_intermediate_states else out
    o = np.asarray(o_cols, dtype=np.float32).reshape(V, S, T, HV).transpose(1, 2, 3, 0)
    o = cast_rne(o, q.dtype)
    if return_intermediate_states:
        inter = np.asarray(out[1]).reshape(S, T, HV, K, V).astype(ssm_states.dtype, copy=False)
        return o, inter
    return o
