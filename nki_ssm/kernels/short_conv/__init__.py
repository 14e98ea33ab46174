"""Short causal depthwise conv1d kernels (NKI): ragged prefill and decode with a state pool.

Math (per sequence, per channel c; weight[:, W-1] multiplies the current token):
``y[t, c] = act(bias[c] + sum_k weight[c, k] * xx[t + k, c])`` over the
window stream ``xx = (state ++ x)``; the state is the last W-1 inputs.

Layouts
-------
- x ``[num_tokens, dim]`` (prefill, ragged by compile-time sequence ranges)
  and y ``[num_tokens, dim]``, token-major as serving engines hold them;
  decode x ``[num_seqs * T, dim]`` is the same stream with T tokens per
  sequence.
- conv state pool ``[slots, dim, W-1]`` (oldest first), passed as its
  ``[slots * dim, W-1]`` row view and updated in place; gather/scatter row
  tables int32 ``[num_seqs, dim]`` (``slot * dim + channel``).
- On chip: channels on the 128 partitions and tokens on the free axis for the
  input window ``xw [128 ch, tiles, W-1 + 512 tok]``; tokens on partitions
  for the PSUM result ``[128 tok, 512 ch]`` and the output tile, so both
  HBM streams are contiguous rows.

Engine plan
-----------
DMA transposed load of x (``dma_transpose``, 3-D, 16 channel tiles x up to
515 tokens per instruction), pool halo gather / new-state scatter with
``vector_offset`` inside the kernel; TensorE does the W taps as accumulating
matmuls with the shifted x window as stationary and ``diag(weight[:, k])``
as moving, which also turns the result token-major; ScalarE applies SiLU (or
copy) while evicting each PSUM bank; DMA stores contiguous 4 KiB rows. See
``prefill.py`` for the details and the precision flags.

Compile-time vs run-time
------------------------
Shapes, dtypes, W, the activation and the batch layout (sequence token
ranges, which sequences are padding) are compile-time: the kernel is
specialised per batch layout (it is in the NKI cache key). Slots and
has_initial_state are run-time (the row tables). A run-time-boundary
version needs ``nl.fori_loop`` over sequences/chunks with ``scalar_offset``
DMAs reading ``cu_seqlens`` and masked partial token blocks.

Limits
------
Any dim (the last channel tile may be partial), W >= 2, any sequence length
(512-token chunks re-read W-1 tokens at each chunk boundary), empty
sequences, padding slots; x and pool float32 or bfloat16 (matmul operands
are float32 when either is float32: quarter TensorE rate); ``slots * dim``
< 2^31. Decode runs through the same kernel with T tokens per sequence.

Performance (modeled, trn2, one NeuronCore, LNC=1)
--------------------------------------------------
Command: ``PYTHONPATH=. python3 tests/kernels/short_conv_perf.py`` (Qwen3-Next
conv shape: dim 8192, W 4, bfloat16 x / weight / pool, no bias, SiLU; the
bound is the minimal HBM bytes over the core's 368 GB/s DMA bandwidth).

- prefill 16K tokens, one sequence: 1763 us, 305 GB/s = 82.8 % of DMA
  bandwidth; TensorE-bound (99 % busy; 4 taps x 128 cycles per 128 x 128
  block is the ceiling, 83 %), DMA 90 % busy.
- prefill 8 x 2K ragged: 1763 us, 305 GB/s = 82.9 %.
- decode 512 sequences: 258 us = 1.41x the bytes-moved bound (183 us);
  VectorE-bound (93 %), GpSimd 88 %, DMA 77 %.
- decode 32 sequences: 33.7 us = 2.96x the bound (11.4 us): latency-bound,
  4 MB moved in 4 pipelined chunks; the engines' arithmetic alone is ~15 us.

Costs not in those figures: a bias adds one K=1 matmul per PSUM bank (+25 %
TensorE in prefill); float32 x or pool makes the prefill matmuls float32
(quarter rate: ~4x TensorE time); float32 weights with bfloat16 x double the
prefill matmuls (hi + lo split).
"""
