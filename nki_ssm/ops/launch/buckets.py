"""Shape buckets: the sizes the launchers pad a batch up to, so a serving loop
compiles a small fixed set of kernel programs.

Every kernel is specialised by its tensor shapes (the NKI cache key is the
shapes, dtypes and non-tensor argument values). The launchers therefore pad
``num_tokens`` (prefill) and ``num_seqs`` (prefill and decode) up to the next
bucket: powers of two, from ``MIN_TOKEN_BUCKET`` tokens and
``MIN_SEQ_BUCKET`` sequences. Padding tokens belong to no sequence, padding
sequences have ``state_indices == -1`` and length 0; neither touches a pool
or a real token's output, and the host slices outputs back to the caller's
sizes.

A serving engine at up to 64K tokens and 512 sequences per step thus sees at
most 10 token buckets x 10 sequence buckets per layer shape.
"""
from __future__ import annotations

MIN_TOKEN_BUCKET = 128
MIN_SEQ_BUCKET = 1


def _next_pow2(n: int, minimum: int) -> int:
    n = max(int(n), minimum)
    return 1 << (n - 1).bit_length()


def token_bucket(num_tokens: int) -> int:
    """Tokens a prefill kernel is compiled for: the next power of two >= num_tokens (min 128)."""
    return _next_pow2(num_tokens, MIN_TOKEN_BUCKET)


def seq_bucket(num_seqs: int) -> int:
    """Sequences a kernel is compiled for: the next power of two >= num_seqs (min 1)."""
    return _next_pow2(num_seqs, MIN_SEQ_BUCKET)
