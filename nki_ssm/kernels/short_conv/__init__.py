"""Short causal depthwise conv1d kernels (NKI): ragged prefill and decode with a state pool.

Math (per sequence, per channel c; weight[:, W-1] multiplies the current token):
``y[t, c] = act(bias[c] + sum_k weight[c, k] * xx[t + k, c])`` over the
window stream ``xx = (state ++ x)``; the state is the last W-1 inputs.

Layouts
-------
- x ``[num_tokens, dim]`` (prefill, ragged by compile-time sequence ranges)
  and y ``[num_tokens, dim]``, token-major as serving engines hold them.
- conv state pool ``[slots, dim, W-1]`` (oldest first), passed as its
  ``[slots * dim, W-1]`` row view and updated in place (prefill); gather /
  scatter row tables int32 ``[num_seqs, 128]`` (``slot * dim + partition``,
  the channel group's first channel added as a compile-time offset).
- Prefill on chip: channels on the 128 partitions and tokens on the free
  axis for the input window ``xw [128 ch, tiles, 16 + 512 tok]`` (the W-1
  halo ends at column 16 so the DMA-transposed tokens start 32-byte aligned); tokens on
  partitions for the PSUM result ``[128 tok, 512 ch]`` and the output tile,
  so both HBM streams are contiguous rows.
- Decode: the pool as its ``[slots * R, (dim / R) * (W-1)]`` row view, one
  partition per (sequence, channel block) row (R blocks fill 128 lanes for
  small batches); x ``[num_seqs, T, dim]``.

Engine plan
-----------
Prefill (``prefill.py``): DMA transposed load of x (``dma_transpose``, 4-D access patterns,
up to 16 channel tiles x 515 tokens per instruction), pool halo gather /
new-state scatter with ``vector_offset`` inside the kernel; TensorE does the
W taps as accumulating matmuls with the shifted x window as stationary and
``diag(weight[:, k])`` as moving, which also turns the result token-major
(every 7th channel tile instead runs its taps on VectorE in float32 and is
transposed by TensorE, to share the load); ScalarE applies SiLU (or copy)
while evicting each PSUM bank; DMA stores contiguous rows of up to 4 KiB.
A one-item-ahead software pipeline overlaps the loads with the matmuls.

Decode (``decode.py``): (sequence, channel block) rows on partitions for
every HBM stream (contiguous per-row gathers/scatters of the pool), TensorE
transposes of the window to channel-major so weights are per-partition
scalars, ScalarE first tap + bias, VectorE fused multiply-adds, TensorE
transpose back, ScalarE SiLU on eviction, three-stage software pipeline;
for one channel block of bfloat16 data (batches >= 65 sequences) the taps
run on TensorE instead (diagonal weights, as in prefill).

Compile-time vs run-time
------------------------
Prefill: shapes, dtypes, W, the activation and the batch layout (sequence
token ranges, which sequences are padding) are compile-time: the kernel is
specialised per batch layout (it is in the NKI cache key). Decode: only
shapes (the sequence bucket), dtypes and layer config; the batch is run-time
tables (decode.py design note). Slots and
has_initial_state are run-time (the row tables). A run-time-boundary
version needs ``nl.fori_loop`` over sequences/chunks with ``scalar_offset``
DMAs reading ``cu_seqlens`` and masked partial token blocks.

Limits
------
Any dim (the last channel tile may be partial), W >= 2, any sequence length
(512-token chunks re-read W-1 tokens at each chunk boundary), empty
sequences, padding slots; x and pool float32 or bfloat16 (matmul operands
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

- prefill 16K tokens, one sequence: 1653 us, 325 GB/s = 88.3 % of DMA
  bandwidth (TensorE 99 %, DMA 96 %, VectorE 59 % busy).
- prefill 8 x 2K ragged: 1696 us, 317 GB/s = 86.2 % (DMA-bound, 97 % busy).
- decode 512 sequences x 1 token: 200.8 us = 1.10x the bytes-moved bound
  (182 us), 334 GB/s; DMA-bound (93 % busy), TensorE taps (runtime group
  loop over compacted live sequences, see decode.py).
- decode 32 sequences x 1 token: 21.9 us = 1.92x the bound (11.4 us);
  VectorE 66 %, DMA 79 %: latency of a 4-chunk pipeline over 4 MB.
- on trn3 (``--target trn3``, same trace): prefill 16K 1651 us = 61.6 % of
  its larger 528 GB/s (TensorE-bound: same clock, more DMA); decode 512
  155 us = 1.22x.

Other precision plans (2K tokens x dim 8192, bfloat16 unless said, scratch
measurement): with bias (one K=1 matmul per tile) 68 %; float32 x and pool
(quarter-rate float32 matmuls, half the tiles on VectorE) 53 %; bfloat16 x
with float32 weights that are not bfloat16 values (hi + lo split) 49 %
(float32 weights holding bfloat16 values skip the split: 81 %).
"""
