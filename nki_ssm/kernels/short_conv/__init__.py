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
Prefill (``prefill.py``, design note there): every runtime loop an
``nl.fori_loop`` at the kernel's top level, none inside another. A zero loop
writes zeros over the slots of sequences without initial state (DMAs only). A
stream loop per channel group runs over fixed 512-token chunks of the whole
token stream, each window one indirect (gather) ``dma_transpose`` of up to 16
channel tiles x 528 tokens by an index tile computed on chip; TensorE does the
W taps as accumulating matmuls with the shifted x window as stationary and
``diag(weight[:, k])`` as moving, which also turns the result token-major
(with float32 operands every 2nd channel tile, with split weights every 4th,
instead runs its taps on VectorE in float32 and is transposed by TensorE, to
share the load; bfloat16 operands keep every tile on TensorE); ScalarE applies SiLU (or copy)
while evicting each PSUM bank; one ``scalar_offset`` DMA stores a chunk's
rows. Sequence boundaries are handled afterwards by a head loop over live
sequences: the first W-1 outputs are recomputed from the old state (VectorE
taps over every channel tile at once) and written over the stream's values;
the H + 1 candidate new states (one per case ``min(length, W-1)``) go to a
scratch HBM block and the one of the sequence's case goes to its slot, chosen
by a DMA offset.

Decode (``decode.py``): (sequence, channel block) rows on partitions for
every HBM stream (contiguous per-row gathers/scatters of the pool), TensorE
transposes of the window to channel-major, then (wide layout) per step of up to 4
sub-tiles ONE VectorE multiply of all taps by zero-stride weights and the tap sums
split between a VectorE reduction and TensorE identity matmuls (general path:
ScalarE first tap + bias and VectorE multiply-adds per sub-tile), TensorE
transpose back, ScalarE SiLU on eviction, three-stage software pipeline;
for one channel block of bfloat16 data (batches >= 65 sequences) the taps
run on TensorE instead (diagonal weights built by VectorE once per launch). Each row layout is one top-level ``nl.fori_loop`` over its groups;
the layout the launcher did not pick gets a stop of 0.

LNC (two programs per logical core)
-----------------------------------
Launched as ``kernel[2]`` (``NEURON_LOGICAL_NC_CONFIG=2``; the launchers build their
tables for ``call.lnc`` programs), both kernels split the channels: program p
(``nl.program_id(0)``) takes channels ``[p * dim / 2, (p + 1) * dim / 2)`` of every
token and sequence (``split.program_channels``) and runs the whole plan above on
them -- prefill: its stream groups, its part of every pool row in the zero and head
loops, its own block of y rows; decode: both row layouts over its half, the pool
viewed with 2R rows per slot. Both read the one counts row (``scaffold.trip_counts``),
so they run the same trip counts and branches. The channels are independent, so the
programs share no written HBM byte, need no synchronisation, trace the same
instructions (equal program sizes) and give LNC=1's results bit for bit. When the
channels do not split (dim <= 128 or odd) program 1 runs program 0's channels, the
same loops, into dumps (its own y block, private dumps of the pool and of decode's y:
``scaffold.destination``): it writes nothing real.

Compile-time vs run-time
------------------------
Both kernels take only shapes (the token / sequence buckets), dtypes and layer
config (W, activation, bias and precision flags) as compile-time arguments;
sequence lengths, slots, padding and has_initial_state are run-time tables
built by a few vectorised array ops in the launcher, and every loop that grows
with tokens or sequences is a runtime loop whose bound is an ``NkiScalar``
(``nisa.scalar_load`` of an SBUF copy of the counts row; design notes in prefill.py
and decode.py). One
program per bucket: prefill 15,959 static instructions at 16K x 1 and 8 x 2K
(dim 8192, W 4, bf16, LNC=1; the first stream loop's body holds 5 chunk pairs);
decode 1,068, 571 per program at LNC=2 (``Trace.program_instructions``, every loop
body and both sides of every ``nl.if_else`` counted once).

Limits
------
Any dim (the last channel tile may be partial), W >= 2 (prefill: W - 1 <=
64), any sequence length, empty sequences, padding slots; x and pool float32
or bfloat16 (matmul operands are float32 when either is float32: quarter
TensorE rate), weight / bias any float dtype; prefill ``slots * dim * (W-1)``
< 2^31, decode ``slots * dim`` < 2^31. Decode: any T >= 1 (speculative
steps), any number of sequences (groups of up to 128 rows); padding rows must
carry finite x. Kernels are
written for trn2 limits (PSUM N <= 512, 8 banks) and run unchanged on trn3.

Performance (modeled, trn2, one NeuronCore, LNC=1)
--------------------------------------------------
Command: ``PYTHONPATH=. python -m simulate --op short_conv --no-calibration``
(16K and 8 x 2K: ``--set judged --op short_conv_prefill --model qwen3``)
(Qwen3-Next conv shape: dim 8192, W 4, bfloat16 x / weight / pool, no bias,
SiLU; the bound is the minimal HBM bytes -- x, y and the named slots' state in
and out -- over the core's 368 GB/s DMA bandwidth; central figure and 10-90 %
interval of nki_ssm.perf as of this commit; prefill: central figures).

- prefill 16K tokens, one sequence: 2.18 ms, 246 GB/s = 66.9 % of DMA
  bandwidth; DMA queues 86 % busy (the windows and the stores), TensorE 80 %
  (32,768 matmuls), ScalarE 56 % (the evictions). Each stream-loop iteration
  loads its own first windows (nothing is prefetched across iterations,
  NKI-1582), with 5 chunk pairs per iteration.
- prefill 8 x 2K ragged: 2.34 ms, 62.4 % of DMA bandwidth; 1 x 2K: 393 us (46.5 %).
- decode 512 sequences x 1 token: 288 us (276-338) = 1.58x the bytes-moved
  bound (63.5 % of DMA bandwidth); DMA (75 %) with VectorE (64 %: the taps' PSUM
  evictions and the diagonals) behind.
- decode 32 sequences x 1 token: 23.1 us (23.1-28.2) = 1.99x the bound (50.2 %;
  wide layout, one group, 4 fused steps): VectorE (72 %: one multiply and one tap
  reduction per step) with ~4 us of table-row -> state-gather latency before the
  first step and ~3 us of tail after the last (``python -m simulate --set judged
  --case short_conv_decode --no-calibration``).

Performance at LNC=2 (modeled, trn2, one logical core = two physical cores;
command: ``PYTHONPATH=. python tests/kernels/short_conv_perf.py judged``, the judged
cases of ``simulate.cases``): each program timed alone on its own core (the cost model
over that program's instructions), against LNC=1:

- prefill 16K x 1: 1.10 ms = 0.50x LNC=1; 8 x 2K: 1.24 ms = 0.53x (the head loop's
  per-sequence DMA latencies do not halve; the same figures from ``python -m simulate
  --set judged --op short_conv_prefill --model qwen3``);
- decode 32 sequences: 15.8 us = 0.69x (the ~7 us of latency chains at the start and
  the end of the group iteration do not halve); 512 sequences: 153 us = 0.53x.

Timed as one trace, today's cost model also makes program 1's first run-time-addressed
stores and pool gathers wait for program 0's last writes to the same tensor (their
byte spans cannot be told apart, as within one program; across the two cores no
such order exists), which gives 0.80-1.05x; shared HBM bandwidth is not modeled yet.

Other precision plans (not re-measured with this commit): float32 x and pool
take quarter-rate float32 matmuls and half the tiles on VectorE, and the
gather transpose is 2-byte only, so float32 windows are gathered token-major
(one x row per partition) and transposed on TensorE (5 fp32 transposes + a
ScalarE eviction per tile and chunk), with the channel group halved (4
tiles); bfloat16 x with float32 weights that are not bfloat16 values takes a
hi + lo split (twice the TensorE work); float32 weights holding bfloat16
values skip the split.
"""
