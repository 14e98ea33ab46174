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

Performance (modeled, trn2, one NeuronCore): see ``PERF_NOTE`` below.
"""

PERF_NOTE = """modeled figures not yet measured"""
