"""Checks shared by the tests of every layer: pool slots, padding rows, untouched
arrays, and "two forms of one op agree". numpy only (no pytest): plain ``assert``.

The batch dicts are the keyword arguments of a reference or host-API call (as
``inputs.make_*_inputs`` builds them): ``state_indices [num_seqs]`` names each
sequence's pool slot (-1 = padding); prefill batches carry ``cu_seqlens
[num_seqs + 1]``, decode batches do not.
"""

from __future__ import annotations

import numpy as np

from .metrics import rel_fro

__all__ = ["FORMS_TOL", "named_slots", "unnamed_slots", "padding_rows", "array_snapshot",
           "assert_arrays_unchanged", "assert_forms_agree", "assert_padding_outputs_zero",
           "assert_pool_hygiene", "assert_reads_bf16_exactly", "token_range", "one_sequence"]

FORMS_TOL = 1e-10  # two float64 forms of one op agree to 1e-10


def named_slots(state_indices) -> np.ndarray:
    """The pool slots a batch names, in batch order (padding -1 dropped), int64 `[n]`."""
    idx = np.asarray(state_indices).astype(np.int64)
    return idx[idx >= 0]


def unnamed_slots(state_indices, slots: int) -> np.ndarray:
    """The pool slots of `[0, slots)` the batch does not name, ascending, int64."""
    return np.setdiff1d(np.arange(slots, dtype=np.int64), named_slots(state_indices))


def padding_rows(batch: dict) -> list:
    """Index expressions of the output rows of padding sequences (state_indices == -1):
    token ranges of a prefill batch (``cu_seqlens`` given), sequence rows of a decode batch."""
    pad = np.flatnonzero(np.asarray(batch["state_indices"]) < 0)
    if "cu_seqlens" not in batch:
        return [np.s_[int(i)] for i in pad]
    cu = np.asarray(batch["cu_seqlens"])
    return [np.s_[int(cu[i]):int(cu[i + 1])] for i in pad]


def token_range(batch: dict, start: int, stop: int, token_args) -> dict:
    """``batch`` cut to tokens [start, stop) as one sequence: the per-token arrays named in
    ``token_args`` sliced (None ones skipped), ``cu_seqlens = [0, stop - start]``; every
    other argument as it is (so state_indices / has_initial_state must already be length 1)."""
    return dict(batch, cu_seqlens=np.array([0, stop - start], np.int32),
                **{k: batch[k][start:stop] for k in token_args if batch.get(k) is not None})


def one_sequence(batch: dict, n: int, token_args) -> dict:
    """Sequence ``n`` of a prefill batch alone: its tokens, slot and has_initial_state."""
    cu = np.asarray(batch["cu_seqlens"])
    return dict(token_range(batch, int(cu[n]), int(cu[n + 1]), token_args),
                state_indices=batch["state_indices"][n:n + 1],
                has_initial_state=batch["has_initial_state"][n:n + 1])


def assert_padding_outputs_zero(out, batch: dict) -> int:
    """Every output row of a padding sequence is 0 (no NaN). -> number of padding sequences,
    for the caller to check that the batch had some."""
    rows = padding_rows(batch)
    for r in rows:
        assert not np.asarray(out[r], dtype=np.float64).any(), f"padding output rows {r} not 0"
    return len(rows)


def array_snapshot(batch: dict, names=None) -> dict:
    """dtype, shape and raw bytes of the array arguments (all, or those in ``names``):
    what :func:`assert_arrays_unchanged` compares bit for bit (NaN payloads, -0.0 included)."""
    return {n: (a.dtype, a.shape, a.tobytes()) for n, a in batch.items()
            if isinstance(a, np.ndarray) and (names is None or n in names)}


def assert_arrays_unchanged(batch: dict, before: dict, what: str = "modified") -> None:
    """The arrays of ``before`` (an :func:`array_snapshot`) are all still there, bit-identical."""
    names = set(before)
    after = array_snapshot(batch, names)
    assert after.keys() == before.keys(), f"arrays {sorted(names - after.keys())} gone"
    for n in before:
        assert after[n] == before[n], f"{n} {what}"


def assert_forms_agree(truth, other, batch: dict, tol: float = FORMS_TOL):
    """``truth(**batch)`` and ``other(**batch)`` (each -> (out, pool)) agree to ``tol``
    relative Frobenius, on the output, the whole pool and each named slot alone (the
    untouched slots would otherwise dilute the error); ``other`` is finite.
    Returns ``truth``'s (out, pool)."""
    out_t, pool_t = truth(**batch)
    out_o, pool_o = other(**batch)
    assert np.all(np.isfinite(out_o)) and np.all(np.isfinite(pool_o))
    assert rel_fro(out_o, out_t) <= tol
    assert rel_fro(pool_o, pool_t) <= tol
    for s in named_slots(batch["state_indices"]):
        assert rel_fro(pool_o[s], pool_t[s]) <= tol, int(s)
    return out_t, pool_t


def assert_reads_bf16_exactly(fn, batch: dict) -> None:
    """``fn(**batch)`` with bfloat16 arrays equals, bit for bit, ``fn`` on their exact float64
    values (a reference widens its inputs, it never rounds them); ``batch`` has some bf16."""
    wide = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.name == "bfloat16"
                else v) for k, v in batch.items()}
    assert any(wide[k] is not batch[k] for k in batch), "no bfloat16 array in the batch"
    for got, exact in zip(fn(**batch), fn(**wide), strict=True):
        np.testing.assert_array_equal(got, exact)


def assert_pool_hygiene(pool_out, batch: dict, *, pool_name: str, every_named: bool = False):
    """Slots the batch does not name keep their input values exactly; the named slots of
    non-empty sequences (of every named slot with ``every_named``) did change, so the first
    check is not vacuous. ``pool_out`` is the returned pool (any float dtype)."""
    pool_in = batch[pool_name]
    idx = np.asarray(batch["state_indices"])
    for s in unnamed_slots(idx, pool_in.shape[0]):
        np.testing.assert_array_equal(pool_out[s], pool_in[s].astype(pool_out.dtype),
                                      err_msg=f"unnamed slot {s}")
    lengths = (np.diff(np.asarray(batch["cu_seqlens"])) if "cu_seqlens" in batch
               else np.ones(idx.shape[0], np.int64))   # decode: every sequence has tokens
    for n, slot in enumerate(idx):
        if slot >= 0 and (every_named or lengths[n] > 0):
            assert not np.array_equal(pool_out[slot], pool_in[slot].astype(pool_out.dtype)), \
                f"named slot {int(slot)} unchanged"
