"""Short causal depthwise conv1d kernels (NKI): ragged prefill and decode with a state pool.

Math (per sequence, per channel c; weight[:, W-1] multiplies the current token):
``y[t, c] = act(bias[c] + sum_k weight[c, k] * xx[t + k, c])`` over the
window stream ``xx = (state ++ x)``; the state is the last W-1 inputs.

Layouts
-------
- x ``[num_tokens, dim]`` (prefill, ragged; padded to the token bucket, the
  batch layout in run-time tables) and y ``[num_tokens, dim]``, token-major as
  serving engines hold them.
- conv state pool ``[slots, dim, W-1]`` (oldest first), updated in place by
  the kernels' own DMA writes (prefill: one ``scalar_offset`` DMA per slot and
  channel group).
- Prefill on chip: channels on the 128 partitions and tokens on the free
  axis for the input window ``xw [128 ch, tiles, 16 + 512 tok]`` (window
  column c = token t0 - 16 + c, so the gather-transposed block starts 32-byte
  aligned); tokens on partitions for the PSUM result ``[128 tok, 512 ch]`` and
  the output tile, so both HBM streams are contiguous rows.
- Decode: the pool as its ``[slots * R, (dim / R) * (W-1)]`` row view, one
  partition per (sequence, channel block) row (R blocks fill 128 lanes for
  small batches); x ``[num_seqs, T, dim]``.

Engine plan
-----------
Prefill (``prefill.py``, design note there): a runtime stream loop per channel
group over fixed 512-token chunks of the whole token stream, each window one
indirect (gather) ``dma_transpose`` of up to 16 channel tiles x 528 tokens by
an index tile computed on chip; TensorE does the W taps as accumulating
matmuls with the shifted x window as stationary and ``diag(weight[:, k])`` as
moving, which also turns the result token-major (every 7th channel tile
instead runs its taps on VectorE in float32 and is transposed by TensorE, to
share the load); ScalarE applies SiLU (or copy) while evicting each PSUM bank;
one ``scalar_offset`` DMA stores a chunk's rows. Sequence boundaries are
handled afterwards by a runtime head loop over live sequences: the first W-1
outputs are recomputed from the old state (VectorE taps over every channel
tile at once) and written over the stream's values, and the new state goes to
the slot.

Decode (``decode.py``): (sequence, channel block) rows on partitions for
every HBM stream (contiguous per-row gathers/scatters of the pool), TensorE
transposes of the window to channel-major so weights are per-partition
scalars, ScalarE first tap + bias, VectorE fused multiply-adds, TensorE
transpose back, ScalarE SiLU on eviction, three-stage software pipeline;
for one channel block of bfloat16 data (batches >= 65 sequences) the taps
run on TensorE instead (diagonal weights, as in prefill).

Compile-time vs run-time
------------------------
Both kernels take only shapes (the token / sequence buckets), dtypes and layer
config (W, activation, bias and precision flags) as compile-time arguments;
sequence lengths, slots, padding and has_initial_state are run-time tables
built by a few vectorised array ops in the launcher, and every loop that grows
with tokens or sequences is a runtime loop (design notes in prefill.py and
decode.py). One program per bucket: prefill 4869 static instructions at 2K
and 16K tokens (dim 8192, W 4, bf16).

Limits
------
Any dim (the last channel tile may be partial), W >= 2 (prefill: W - 1 <=
64), any sequence length, empty sequences, padding slots; x and pool float32 or bfloat16 (matmul operands
are float32 when either is float32: quarter TensorE rate); ``slots * dim``
< 2^31. Decode: any T >= 1 (speculative steps), any number of sequences
(groups of up to 128 rows); padding rows must carry finite x. Kernels are
written for trn2 limits (PSUM N <= 512, 8 banks) and run unchanged on trn3.

Performance (modeled, trn2, one NeuronCore, LNC=1)
--------------------------------------------------
Command: ``PYTHONPATH=. python3 tests/kernels/short_conv_perf.py`` (Qwen3-Next
conv shape: dim 8192, W 4, bfloat16 x / weight / pool, no bias, SiLU; the
bound is the minimal HBM bytes -- x, y and the named slots' state in and out
-- over the core's 368 GB/s DMA bandwidth; cost model of nki_ssm.perf as of
this commit).

- prefill 16K tokens, one sequence: 1944 us, 276 GB/s = 75.1 % of DMA
  bandwidth (cost model with runtime-loop synchronisation; the compile-time-
  layout kernel it replaces: 1913 us under the same model, +1.6 %). Program
  4869 static instructions, equal at 2K and 8 x 2K (was 36.8K at 16K).
- prefill 8 x 2K ragged: 2049 us (was 2159: -5.1 %).
- prefill 2K tokens, one sequence: 316 us (was 301).
- decode 512 sequences x 1 token: 274.9 us = 1.51x the bytes-moved bound
  (182 us); DMA-bound (88 % busy), TensorE taps (runtime group loop over
  compacted live sequences, see decode.py); 200.8 us under the earlier model
  without runtime-loop synchronisation.
- decode 32 sequences x 1 token: 55.3 us = 4.85x the bound (11.4 us); DMA 73 %
  (21.9 us under the earlier model).
- on trn3: not re-measured under the current model (earlier model, compile-
  time-layout prefill: 16K 1651 us; decode 512 155 us).

Other precision plans (2K tokens x dim 8192, bfloat16 unless said; figures of
the compile-time-layout prefill, scratch measurement): with bias (one K=1
matmul per tile) 68 %; float32 x and pool (quarter-rate float32 matmuls,
half the tiles on VectorE) 53 %; bfloat16 x with float32 weights that are not
bfloat16 values (hi + lo split) 49 % (float32 weights holding bfloat16 values
skip the split: 81 %). Runtime-batch prefill, float32 x and pool, 2K tokens:
1130 us modeled (688 for the compile-time-layout kernel, same model): the
gather transpose is 2-byte only, so float32 windows are gathered token-major
(one x row per partition) and transposed on TensorE (5 fp32 transposes + a
ScalarE eviction per tile and chunk), and the extra staging halves the channel
group (4 tiles).
"""
