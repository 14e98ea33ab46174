"""The NKI 0.7 / 0.8 rules beyond the scalar API, one control flow for both LNC programs, and
four defects the released NKI-Lib 2.33 Gated DeltaNet kernels exposed.

Each test's docstring names its source.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim import nki_lnc
from nki_ssm.sim.errors import (NkiReleasedUseWarning, NkiSyncError, NkiValidationError,
                                NkiWeakEvidenceWarning)
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.trace import record

pytestmark = pytest.mark.usefixtures("nki08")

ROWS, COLS = 4, 8


def _x():
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


# ----------------------------------------------------------------- deprecations, removals

@jit
def register_bound(x, counts):
    """out row 0 = x row 0 + counts[0, 0], one add per iteration of a register-bounded loop."""
    out = nl.ndarray((1, COLS), x.dtype, buffer=nl.shared_hbm)
    c = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=counts)
    n = nisa.register_alloc()
    nisa.register_load(n, c)
    t = nl.ndarray((1, COLS), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[0:1, :])

    def body(i):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    nl.fori_loop(0, n, body)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_register_apis_warn_at_the_kernel_line_under_0_8():
    """NKI 0.8.0 deprecates nisa.register_alloc / register_load / register_move /
    register_store and VirtualRegister: "When your kernel uses one of them, NKI raises a
    DeprecationWarning" (announce-intent-eos-nki-virtualregister-lnc-apis, Neuron 2.34.0)."""
    with pytest.warns(DeprecationWarning) as got:
        out = simulate(register_bound)(_x(), np.array([[3]], np.int32))
    np.testing.assert_array_equal(out, _x()[0:1] + 3)
    msgs = {str(w.message).split()[0]: w for w in got if w.category is DeprecationWarning}
    assert {"nki.isa.register_alloc", "nki.isa.register_load"} <= set(msgs)
    w = msgs["nki.isa.register_load"]
    assert w.filename == __file__ and "scalar_load" in str(w.message)


def test_register_apis_do_not_warn_under_0_7(nki07):
    """The deprecation arrived with NKI 0.8.0 (same announcement)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        simulate(register_bound)(_x(), np.array([[2]], np.int32))


@jit
def isa_lnc_calls(x):
    """Program p swaps row p with the other program through nisa.sendrecv, then a barrier."""
    pid = nl.program_id(0)
    out = nl.ndarray((2, COLS), x.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((1, COLS), x.dtype, buffer=nl.sbuf)
    got = nl.ndarray((1, COLS), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=x[pid:pid + 1, :])
    nisa.sendrecv(src=mine, dst=got, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    nisa.dma_copy(dst=out[pid:pid + 1, :], src=got)
    nisa.core_barrier(out, (0, 1))
    return out


def test_isa_lnc_calls_warn_under_0_8():
    """NKI 0.8.0: nisa.sendrecv / sendrecv_compute / core_barrier are deprecated wrappers of
    nki.lnc's (same announcement; nki.lnc API page)."""
    with pytest.warns(DeprecationWarning, match="nki.isa.sendrecv .*nki.lnc.sendrecv without "
                                                "pipe_id"):
        with pytest.warns(DeprecationWarning, match="nki.isa.core_barrier"):
            out = simulate(isa_lnc_calls[2])(_x())
    np.testing.assert_array_equal(out, _x()[[1, 0]])


@pytest.mark.parametrize("alias", ["affine_range", "sequential_range", "static_range"])
def test_range_aliases_warn_from_0_7(alias, nki07):
    """NKI 0.7.0: nl.affine_range / sequential_range / static_range are deprecated and mean
    range (nki/deep-dives/nki-loops, SDK 2.33)."""
    with pytest.warns(DeprecationWarning, match=f"nl.{alias} .*range"):
        assert list(getattr(nl, alias)(2, 5)) == [2, 3, 4]


def test_range_aliases_do_not_warn_under_0_6(monkeypatch):
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.6.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert list(nl.affine_range(3)) == [0, 1, 2]


def test_dynamic_range_is_removed_from_0_7(nki07):
    """NKI 0.7.0 "removes the dynamic loop constructs deprecated in NKI 0.6.0" (nki/migration,
    "Migrating from NKI 0.6.0 to NKI 0.7.0")."""
    with pytest.raises(NkiValidationError, match="removed in NKI 0.7.0.*fori_loop"):
        nl.dynamic_range(3)


@jit
def while_register(x):
    r = nisa.register_alloc(1)
    while r:
        nisa.register_move(r, 0)
    return None


def test_while_register_is_removed_from_0_7(nki07):
    """Same migration note: ``while reg:`` is gone with the parser front end."""
    with pytest.raises(TypeError, match="while_loop"):
        simulate(while_register)(_x())


@jit
def python_if_on_scalar(x, flags):
    f = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=f, src=flags)
    t = nl.ndarray((1, COLS), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[0:1, :])
    if nisa.scalar_load(f) > 0:
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    return None


def test_a_scalar_in_a_python_if_is_a_type_error():
    """nki.isa.scalar_alu API page (SDK 2.34): a comparison result "cannot be used as a Python
    if or while condition"; use nl.if_else."""
    with pytest.raises(TypeError, match="nl.if_else"):
        simulate(python_if_on_scalar)(_x(), np.array([[1]], np.int32))


# ----------------------------------------------------------------- one control flow under LNC=2

@jit
def per_program_trips(x, counts):
    """Program p adds 1 to its row counts[p] times (its trip count from its own counts row)
    and, when flags says so, 100 more in an if_else."""
    pid = nl.program_id(0)
    out = nl.ndarray((2, COLS), x.dtype, buffer=nl.shared_hbm)
    c = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c, src=counts[pid:pid + 1, :])
    n = nisa.scalar_load(c[0:1, 0:1])
    flag = nisa.scalar_load(c[0:1, 1:2])
    t = nl.ndarray((1, COLS), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[pid:pid + 1, :])

    def body(i):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)

    def hundred():
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=100.0)

    nl.fori_loop(0, n, body)
    nl.if_else(flag > 0, hundred)
    nisa.dma_copy(dst=out[pid:pid + 1, :], src=t)
    return out


def test_both_programs_with_the_same_flow_run_and_the_trace_records_it():
    """The trace keeps, per program, each runtime loop's entries / iterations and each
    if_else's outcomes (docs/contracts.md, the trace contract)."""
    with record() as tr:
        out = simulate(per_program_trips[2])(_x(), np.array([[2, 1], [2, 1]], np.int32))
    np.testing.assert_array_equal(out, _x()[0:2] + 102)
    for pid in (0, 1):
        lp = tr.loops[(pid, (0,))]
        assert (lp.entries, lp.iterations) == (1, 2)
        assert tr.branches[(pid, ("if", 0))].outcomes == [True]


@pytest.mark.parametrize("counts,match", [
    ([[2, 1], [1, 1]], r"nl.fori_loop \(0,\) .*program 0 runs 2 iterations, program 1 runs 1 "
                       r"iteration"),
    ([[2, 1], [2, 0]], r"nl.if_else \('if', 0\) .*program 0 takes the then branch, program 1 "
                       r"takes the else branch"),
])
def test_programs_with_different_control_flow_are_rejected(counts, match):
    """"Dynamic control flow that differs between cores is undefined, and you will likely
    receive an error at runtime" (aws-neuron-sdk 81ce03ae nki/get-started/about/lnc.rst
    l.141-149): a planted kernel whose programs differ in a trip count or a branch outcome."""
    with pytest.raises(NkiSyncError, match="programs 0 and 1 take different control flow.*"
                                           + match):
        simulate(per_program_trips[2])(_x(), np.array(counts, np.int32))


def test_lnc_1_has_one_flow():
    out = simulate(per_program_trips)(_x(), np.array([[3, 0]], np.int32))
    np.testing.assert_array_equal(out[0], _x()[0] + 3)


# ----------------------------------------------------------------- PSUM outside a runtime loop

def _psum_kernel(inside: bool):
    @jit
    def kernel(a, b, counts):
        """out = counts[0] matmuls a.T @ b, each evicted and accumulated in SBUF."""
        out = nl.ndarray((COLS, COLS), nl.float32, buffer=nl.shared_hbm)
        sa = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        sb = nl.ndarray(b.shape, b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sa, src=a)
        nisa.dma_copy(dst=sb, src=b)
        acc = nl.ndarray((COLS, COLS), nl.float32, buffer=nl.sbuf)
        nisa.memset(acc, 0.0)
        c = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=c, src=counts)
        outside = nl.ndarray((COLS, COLS), nl.float32, buffer=nl.psum)

        def body(i):
            ps = nl.ndarray((COLS, COLS), nl.float32, buffer=nl.psum) if inside else outside
            nisa.nc_matmul(ps, sa, sb, accumulate=False)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=ps, op=nl.add)

        nl.fori_loop(0, nisa.scalar_load(c), body)
        nisa.dma_copy(dst=out, src=acc)
        return out
    return kernel


def test_psum_allocated_outside_a_runtime_loop_and_written_inside_warns():
    """Released runtime-loop kernels allocate PSUM inside the body; third-party reports of
    NCC_IBIR092 for the other form are weak evidence, so the simulator warns (once per
    tile) instead of rejecting."""
    a = np.eye(ROWS, COLS, dtype=np.float32)
    b = np.ones((ROWS, COLS), np.float32)
    with pytest.warns(NkiWeakEvidenceWarning, match="allocated before the loop began") as got:
        out = simulate(_psum_kernel(inside=False))(a, b, np.array([[3]], np.int32))
    assert sum(w.category is NkiWeakEvidenceWarning for w in got) == 1
    np.testing.assert_array_equal(out, 3 * (a.T @ b))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiWeakEvidenceWarning)
        simulate(_psum_kernel(inside=True))(a, b, np.array([[3]], np.int32))


# ----------------------------------------------------------------- released-kernel defects

def test_tensor_engine_is_the_engine_constant():
    """nki.isa.tensor_engine is the engine constant "(deprecated: use engine.tensor)" (nki.isa
    module source, SDK 2.33); nki-library e9ef98fc experimental/gdn/gdn_cte.py passes
    engine=nisa.vector_engine / scalar_engine the same way. A submodule named tensor_engine
    once shadowed it."""
    assert nisa.tensor_engine is nisa.engine.tensor
    assert nisa.vector_engine is nisa.engine.vector and nisa.scalar_engine is nisa.engine.scalar


@jit
def group_load(k, batch_id, group_base):
    """The released group load of nki-library e9ef98fc experimental/gdn/gdn_cte.py:
    ``k[batch_id].ap(pattern=[[D, CHUNK], [CHUNK * D, cpg], [1, D]], offset=group_base * D)``
    brings chunk c of the group to free columns [c*D, (c+1)*D) (its comment: "Device-verified
    (... batch-indexed .ap all OK)")."""
    _, S, D = k.shape
    chunk, cpg = 4, 2
    out = nl.ndarray((chunk, cpg * D), k.dtype, buffer=nl.shared_hbm)
    kg = nl.ndarray((chunk, cpg * D), k.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=kg, src=k[batch_id].ap(pattern=[[D, chunk], [chunk * D, cpg], [1, D]],
                                             offset=group_base * D))
    nisa.dma_copy(dst=out, src=kg)
    return out


@pytest.mark.parametrize("batch_id,group_base", [(0, 0), (1, 0), (2, 8)])
def test_ap_offset_composes_with_a_sliced_views_offset(batch_id, group_base):
    """NkiTensor.ap: "offset: element offset added to the view's base storage offset"
    (aws-neuron-sdk 81ce03ae nki/api/nki/language/__init__.py l.504-507), as the released
    gdn_cte uses it; ignoring the view's offset read batch 0 for every batch (silently
    wrong numbers)."""
    B, S, D = 3, 16, 4
    k = np.arange(B * S * D, dtype=np.float32).reshape(B, S, D)
    out = simulate(group_load)(k, batch_id, group_base)
    want = np.concatenate([k[batch_id, group_base + 4 * c:group_base + 4 * c + 4]
                           for c in range(2)], axis=1)
    np.testing.assert_array_equal(out, want)


@jit
def decay_state_in_place(state, factor):
    """state *= factor in place; returns state itself (the caller's buffer is the state)."""
    pid = nl.program_id(0)
    rows = state.shape[0] // nl.num_programs(0)
    t = nl.ndarray((rows, state.shape[1]), state.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=state[pid * rows:(pid + 1) * rows, :])
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=state[pid * rows:(pid + 1) * rows, :], src=t)
    return state


@pytest.mark.parametrize("lnc", [1, 2])
def test_a_kernel_returning_its_updated_input_updates_the_callers_buffer(lnc):
    """A kernel may return an input it updated in place: the returned tensor is the argument's
    own memory, so the caller's array holds the result too (the returned-tensor rule,
    "allocated in nl.shared_hbm", applies to tensors the kernel allocates)."""
    state = _x()
    before = state.copy()
    out = simulate(decay_state_in_place[lnc])(state, 0.5)
    np.testing.assert_array_equal(out, before * 0.5)
    np.testing.assert_array_equal(state, before * 0.5)


@jit
def transpose_no_dge(x):
    out = nl.ndarray((x.shape[1], x.shape[0]), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((x.shape[1], x.shape[0]), x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=x, dge_mode=nisa.dge_mode.none)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("ver", ["0.7.0", "0.8.0"])
def test_direct_dma_transpose_with_dge_mode_none_from_0_7(ver, monkeypatch):
    """NKI-Lib 2.33's experimental/gdn kernels call dma_transpose(..., dge_mode=
    nisa.dge_mode.none) on a direct transpose, which the API page's "unknown and hwdge" does
    not list: released kernels win from NKI 0.7.0 on (with NkiReleasedUseWarning); the 0.6
    rule stands for 0.6.0."""
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", ver)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    with pytest.warns(NkiReleasedUseWarning, match="dge_mode=none"):
        out = simulate(transpose_no_dge)(x)
    np.testing.assert_array_equal(out, x.T)
    monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.6.0")
    with pytest.raises(NkiValidationError, match="unknown or hwdge"):
        simulate(transpose_no_dge)(x)


def test_nki_lnc_core_barrier_does_not_warn():
    @jit
    def barrier(x):
        nki_lnc.core_barrier(x, (0, 1))
        return None

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        simulate(barrier[2])(_x())
