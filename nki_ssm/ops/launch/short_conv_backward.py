"""Launcher of the short conv backward kernel (``nki_ssm.kernels.short_conv.backward``).

Host side only arranges layouts and the work list (layouts in the kernel's module
docstring): x and dy padded to the token bucket with a zero row, the initial states and
d_final_states token-major (``[num_seqs * (W-1), dim]``, permute + reshape) behind them,
channels padded to a multiple of 128 * ``call.lnc`` (so both programs own the same number
of channel tiles), weight / bias as float32; the int32 work list is built by a few
vectorised array ops (``backward_tables``). The kernel's dx / d_initial rows and float32
dweight / dbias come back cut to the caller's sizes and dtypes; each LNC program returns
the dx rows of its own channels, placed side by side here.

Performance (modeled, trn2, central figure of nki_ssm.perf at this commit; ``PYTHONPATH=.
python -m simulate --set judged --op short_conv_backward --model qwen3 --no-calibration``):
the judged conv shape -- dim 8192, W 4, bfloat16, SiLU, no bias, one sequence of 16,384
tokens with initial state and d_final_states -- takes 7.48 ms at LNC=1 (one NeuronCore;
10-90 % 7.48-8.54 ms) and 3.74 ms at LNC=2 (0.50x; two cores of a logical core). The bound (x and dy read, dx
written once: 805 MB over 368 GB/s per core; FLOPs are negligible) is 2.19 ms / 1.09 ms:
29 % of the roofline. What binds is the elementwise work of the channel-major
formulation -- VectorE 80 % busy (the bf16 dweight products, a quarter of the dz
products, the sum-bank adds), GpSimd 70 % (dz, gather descriptors), TensorE 71 % (z and
dx taps, the dweight sums folded by transposes); ScalarE 36 % (silu_dx, dx evictions),
DMA queues 41 %. Program size 15,894 static instructions (LNC=1; 6 work rows per iteration
of the first row loop). For comparison, one H100
runs FLA's Triton causal_conv1d + SiLU forward + backward at this shape in 1.769 ms
(forward 0.219 ms; measured, the project's H100 reference figures): per chip, 8 trn2
cores running forward (2.18 ms modeled) + this backward on a 16K sequence each are
13.6 M tokens/s modeled against the H100's 9.26 M.
"""
from __future__ import annotations

import numpy as np

from nki_ssm.ops.launch._arrays import NUMPY, host_call


def backward_kernel():
    """The ``@nki.jit`` kernel ``backward_call`` launches."""
    from nki_ssm.kernels.short_conv.backward import short_conv_backward_kernel

    return short_conv_backward_kernel


def padded_dim(dim: int, lnc: int) -> int:
    """Channels the kernel sees: dim rounded up to 128 * lnc (equal tiles per program)."""
    unit = 128 * lnc
    return -(-dim // unit) * unit


def backward_tables(cu_seqlens, num_tokens_bucket: int, num_seqs_bucket: int, W: int,
                    has_initial_state: bool, has_final_grad: bool):
    """(rows ``[R + 1, 128, 3 * BLOCKS + 2]``, fs_rows ``[SB, H, 2]``, counts ``[1, 3]``) int32
    for a batch padded to the buckets (R = ceil(NB / T) + 2 * SB work rows, the used ones
    first; T = 128 * BLOCKS positions per row; table row r holds row r's gather indices
    and dx rows; counts, the one row both programs read: ``R // ROWS_PER_ITERATION``,
    ``R % ROWS_PER_ITERATION`` (the two row loops' trips) and the sequences with
    d_final_states).

    Each step is a vectorised array op (torch: repeat_interleave, cumsum, arange
    broadcasts, where): rows per sequence ``r = ceil((L + H) / T)``; the sequence of
    each row (``repeat``) and its first position ``p0`` (row rank within its sequence
    times T); window positions ``p0 - H + arange(T + 2H)`` mapped to x rows (``s0 + p
    - H``), initial-state rows (``NB + n*H + p``, p < H) or the zero row; dy tokens
    ``p0 - H + arange(T + H)`` to dy rows or dy's zero row; output positions
    ``p0 + arange(T)`` to dx rows, initial-state rows or scratch rows; d_final rows of
    positions ``L + arange(H)``.
    """
    from nki_ssm.kernels.short_conv.backward import BLOCKS, ROW, ROWS_PER_ITERATION, TABLE_COLUMNS

    NB, SB, H, T = int(num_tokens_bucket), int(num_seqs_bucket), W - 1, ROW
    B = 128
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    S = cu.shape[0] - 1
    s0, L = cu[:-1], np.diff(cu)
    per_seq = -(-(L + H) // T)
    R = int(per_seq.sum())
    seq = np.repeat(np.arange(S), per_seq)
    first = np.cumsum(per_seq) - per_seq
    p0 = (np.arange(R) - first[seq]) * T
    sq, Lq, s0q = seq[:, None], L[seq][:, None], s0[seq][:, None]
    zero_x, zero_dy, scratch = NB + SB * H, NB, NB + SB * H
    # x window positions p0 - H .. p0 + T + H - 1
    p = p0[:, None] - H + np.arange(T + 2 * H)[None, :]
    init_row = np.where(has_initial_state, NB + sq * H + p, zero_x)
    xrow = np.where(p < 0, zero_x, np.where(p < H, init_row, np.where(p < Lq + H, s0q + p - H,
                                                                         zero_x)))
    # dy tokens p0 - H .. p0 + T - 1
    i = p0[:, None] - H + np.arange(T + H)[None, :]
    dyrow = np.where((i >= 0) & (i < Lq), s0q + i, zero_dy)
    # output positions p0 .. p0 + T - 1 (past the sequence: a scratch row each)
    q = np.arange(T)[None, :]
    po = p0[:, None] + q
    orow = np.where(po < H, NB + sq * H + po, np.where(po < Lq + H, s0q + po - H, scratch + q))
    # table row r: work row r's gather indices and dx rows (past the last row: zero rows)
    gather = np.zeros((R + 1, B, 2 * BLOCKS + 2), dtype=np.int64)
    gather[:, :, :BLOCKS + 1] = zero_x
    gather[:, :, BLOCKS + 1:] = zero_dy
    for b in range(BLOCKS):
        gather[:R, :, b] = xrow[:, b * B:(b + 1) * B]
        gather[:R, :, BLOCKS + 1 + b] = dyrow[:, b * B:(b + 1) * B]
    gather[:R, :2 * H, BLOCKS] = xrow[:, T:]
    gather[:R, :H, 2 * BLOCKS + 1] = dyrow[:, T:]
    rows = np.zeros((-(-NB // T) + 2 * SB + 1, B, TABLE_COLUMNS), dtype=np.int64)
    rows[:R + 1, :, :2 * BLOCKS + 2] = gather
    for b in range(BLOCKS):
        rows[:R, :, 2 * BLOCKS + 2 + b] = orow[:, b * B:(b + 1) * B]
    fs_rows = np.zeros((SB, H, 2), dtype=np.int64)
    h = np.arange(H)[None, :]
    pf = L[:, None] + h
    fs_rows[:S, :, 0] = np.where(pf < H, NB + np.arange(S)[:, None] * H + pf, s0[:, None] + pf - H)
    fs_rows[:S, :, 1] = np.arange(S)[:, None] * H + h
    counts = np.array([[R // ROWS_PER_ITERATION, R % ROWS_PER_ITERATION,
                        S if has_final_grad else 0]], dtype=np.int64)
    i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731
    return i32(rows), i32(fs_rows), i32(counts)


def _channels(xp, a, width):
    """``a [rows, dim]`` with zero channels appended up to ``width`` (torch: F.pad)."""
    rows, dim = a.shape
    if dim == width:
        return a
    return xp.cat([a, xp.pad_rows(a[:0], rows, width - dim)], axis=1)


def _token_major(xp, states, rows):
    """``[num_seqs, dim, H]`` -> ``[rows, dim]``: row n*H + h = states[n, :, h], zero rows
    after (permute, reshape, pad)."""
    S, dim, H = states.shape
    return xp.pad_rows(xp.permute(states, (0, 2, 1)).reshape(S * H, dim), rows, dim)


def backward(*, x, weight, bias, dy, activation, cu_seqlens, initial_states, d_final_states,
             backend):
    """Run the backward kernel on the host path (``backward_call`` with NumPy)."""
    return backward_call(NUMPY, host_call(backend), x=x, weight=weight, bias=bias, dy=dy,
                         activation=activation, cu_seqlens=cu_seqlens,
                         initial_states=initial_states, d_final_states=d_final_states)


def backward_call(xp, call, *, x, weight, bias, dy, activation, cu_seqlens, initial_states,
                  d_final_states):
    """Lay out, launch ``call(backward_kernel(), *args)`` as ``call.lnc`` programs ->
    dict(dx ``[num_tokens, dim]`` in x's dtype, dweight ``[dim, W]`` in weight's dtype,
    dbias ``[dim]`` in bias's dtype or None, d_initial_states ``[num_seqs, dim, W-1]`` in
    initial_states' dtype or None)."""
    from nki_ssm.ops.launch.buckets import seq_bucket, token_bucket

    num_tokens, dim = x.shape
    W = weight.shape[1]
    H = W - 1
    num_seqs = len(cu_seqlens) - 1
    NB = token_bucket(num_tokens)
    SB = seq_bucket(num_seqs)
    DP = padded_dim(dim, call.lnc)
    tables = backward_tables(cu_seqlens, NB, SB, W, initial_states is not None,
                             d_final_states is not None)
    init_rows = xp.pad_rows(x[:0], SB * H + 1, dim)
    if initial_states is not None:
        init_rows = _token_major(xp, xp.cast_like(initial_states, x), SB * H + 1)
    xsrc = _channels(xp, xp.cat([xp.pad_rows(x, NB, dim), init_rows], axis=0), DP)
    dysrc = _channels(xp, xp.pad_rows(dy, NB + 1, dim), DP)
    dfsrc = None
    if d_final_states is not None:
        dfsrc = _channels(xp, xp.f32(_token_major(xp, d_final_states, SB * H + 1)), DP)
    w32 = xp.pad_rows(weight, DP, W, f32=True)
    b32 = None
    if bias is not None:
        b32 = xp.pad_rows(bias.reshape(dim, 1), DP, 1, f32=True).reshape(DP)
    outs = call(backward_kernel(), xsrc, dysrc, w32, b32, dfsrc,
                *(xp.table(t) for t in tables), "silu" if activation == "silu" else "none")
    # the programs' dx tensors (each [NR, DP / lnc], its channels) side by side
    dwo, dbo = outs[-2], outs[-1]
    dxo = outs[0] if call.lnc == 1 else xp.cat(list(outs[:-2]), axis=1)
    out = dict(dx=dxo[:num_tokens, :dim], dweight=xp.cast_like(dwo[:dim], weight),
               dbias=None, d_initial_states=None)
    if bias is not None:
        out["dbias"] = xp.cast_like(dbo[:dim], bias)
    if initial_states is not None:
        rows = dxo[NB:NB + num_seqs * H, :dim].reshape(num_seqs, H, dim)
        out["d_initial_states"] = xp.cast_like(xp.permute(rows, (0, 2, 1)), initial_states)
    return out
