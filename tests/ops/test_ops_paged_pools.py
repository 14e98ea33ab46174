"""Pools laid out as a serving engine lays them: each slot a strided view into a page of a
byte buffer that also holds another state and padding (vLLM's MambaBase.bind_kv_cache).

The host API reads and writes such a pool slot by slot: the reference and the launchers see
a compact pool of the named slots, whatever the pool's size; results match the same call on
a C-contiguous pool; nothing outside the named slots' elements changes (the page's other
state and padding included); a rejected or failed call changes nothing."""
from __future__ import annotations

import numpy as np
import pytest
from ops_case_inputs import FAMILY, OPS, base, pool_name

import nki_ssm.ops._dispatch as dispatch
from nki_ssm.ops import gated_delta, mamba2_ssd, short_conv
from nki_ssm.ops.launch import buckets
from nki_ssm.ops.launch import gated_delta as gated_delta_launch
from nki_ssm.ops.launch import mamba2_ssd as ssd_launch
from nki_ssm.ops.launch import short_conv as conv_launch

OP_MODULES = {"short_conv": short_conv, "mamba2_ssd": mamba2_ssd, "gated_delta": gated_delta}
LAUNCH_MODULES = {"short_conv": conv_launch, "mamba2_ssd": ssd_launch,
                  "gated_delta": gated_delta_launch}
LEAD_BYTES, PAD_BYTES = 96, 200     # another state before ours in the page, padding after


def paged(pool: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """(view, backing): a ``slots``-slot pool whose first slots hold ``pool``'s values, each
    slot inside a page of ``backing`` (uint8, random bytes elsewhere)."""
    state_bytes = pool[0].nbytes
    backing = np.random.default_rng(7).integers(
        0, 256, (slots, LEAD_BYTES + state_bytes + PAD_BYTES), dtype=np.uint8)
    view = backing[:, LEAD_BYTES:LEAD_BYTES + state_bytes].view(pool.dtype)
    view = view.reshape((slots,) + pool.shape[1:])
    view[: pool.shape[0]] = pool
    assert not view.flags.c_contiguous
    return view, backing


def _page_call(op: str, slots: int, **extra):
    kw = base(op, **extra)
    name = pool_name(kw)
    dense = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    kw[name], backing = paged(kw[name], slots)
    return kw, dense, name, backing


def _expect_only_named_changed(kw: dict, name: str, backing: np.ndarray, before: bytes,
                               dense_pool: np.ndarray) -> None:
    named = kw["state_indices"][kw["state_indices"] >= 0]
    was = np.frombuffer(before, np.uint8).reshape(backing.shape)
    unchanged = np.ones(backing.shape[0], bool)
    unchanged[named] = False
    assert backing[unchanged].tobytes() == was[unchanged].tobytes()
    state = slice(LEAD_BYTES, LEAD_BYTES + kw[name][0].nbytes)
    assert backing[named][:, :LEAD_BYTES].tobytes() == was[named][:, :LEAD_BYTES].tobytes()
    assert backing[named][:, state.stop:].tobytes() == was[named][:, state.stop:].tobytes()
    np.testing.assert_array_equal(kw[name][named], dense_pool[named])


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_paged_pool_matches_contiguous_pool(op, backend):
    slots = base(op)[pool_name(base(op))].shape[0] + 5
    kw, dense, name, backing = _page_call(op, slots)
    dense[name] = np.concatenate([dense[name], kw[name][dense[name].shape[0]:]])
    before = backing.tobytes()
    out = OPS[op](**kw, backend=backend)
    out_dense = OPS[op](**dense, backend=backend)
    for got, want in zip(out if isinstance(out, tuple) else (out,),
                         out_dense if isinstance(out_dense, tuple) else (out_dense,)):
        np.testing.assert_array_equal(got, want)
    _expect_only_named_changed(kw, name, backing, before, dense[name])


class PoolSizes:
    """Wraps a reference or a launcher: records the slot count of the pool it is handed."""

    def __init__(self, fn):
        self.fn, self.slots = fn, []

    def __call__(self, **kw):
        self.slots.append(kw[pool_name(kw)].shape[0])
        return self.fn(**kw)


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_work_follows_the_batch_not_the_pool(op, backend, monkeypatch):
    """A 4,096-slot paged pool: the reference / launcher get the named slots only (rounded up
    to the sequence bucket for a launcher), never a copy of the whole pool."""
    family, entry = FAMILY[op]
    if backend == "reference":
        attr = f"_reference_{entry}"
        spy = PoolSizes(getattr(OP_MODULES[family], attr))
        monkeypatch.setattr(OP_MODULES[family], attr, spy)
    else:
        spy = PoolSizes(getattr(LAUNCH_MODULES[family], entry))
        monkeypatch.setattr(LAUNCH_MODULES[family], entry, spy)
    kw, _, name, backing = _page_call(op, 4096)
    named = int((kw["state_indices"] >= 0).sum())
    OPS[op](**kw, backend=backend)
    expected = named if backend == "reference" else buckets.seq_bucket(named)
    assert spy.slots == [expected]


@pytest.mark.parametrize("op", sorted(OPS))
def test_failed_launch_on_paged_pool_changes_nothing(op, monkeypatch):
    family, entry = FAMILY[op]
    real = getattr(LAUNCH_MODULES[family], entry)

    def failing(**kw):
        real(**kw)                                     # writes its (working) pool
        raise RuntimeError("kernel failed after writing")

    monkeypatch.setattr(LAUNCH_MODULES[family], entry, failing)
    kw, _, name, backing = _page_call(op, 40)
    before = backing.tobytes()
    with pytest.raises(RuntimeError, match="kernel failed after writing"):
        OPS[op](**kw, backend="sim")
    assert backing.tobytes() == before


def test_compact_renumbers_named_slots_in_batch_order():
    pool = np.arange(6 * 2, dtype=np.float32).reshape(6, 2)
    kw = {"state_indices": np.array([4, -1, 1, 5], np.int32), "p": pool}
    out = dispatch.compact(kw, ("p",), size=4)
    np.testing.assert_array_equal(out["state_indices"], [0, -1, 1, 2])
    np.testing.assert_array_equal(out["p"], [[8, 9], [2, 3], [10, 11], [0, 0]])
    assert out["p"].flags.c_contiguous and kw["p"] is pool
