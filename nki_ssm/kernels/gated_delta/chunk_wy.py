"""The Gated DeltaNet chunked prefill's per-head steps of the WY (state-free) form (< 8
head groups: TP2 and up): the solve of [v | -e^c k] for [u | nw] off the state chain,
then S <- e^{c_last} S + kd^T u + (nw^T kd)^T S and o = M u + (qd + M nw) S (the design
note in ``chunk.py``). Plain functions: NKI inlines the calls."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa
from nki_ssm.kernels._common import tf32_view


def head_qd(d, qc, qs, h, hv, K):
    """qd = scale e^c q of value head hv (q/k head h; into ``d``), float32 [L, K]: the q S
    part of the WY form's output operand (group_wy). GpSimd: off the busier engines."""
    L = qc.shape[0]
    d["qd"] = nl.ndarray((L, K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d["qd"], data1=qc[:, h * K:(h + 1) * K],
                       data2=qs[:, hv:hv + 1].broadcast(1, K), op=nl.multiply,
                       engine=nisa.engine.gpsimd)


def head_rhs_wy(d, qk, vc, nec, hv, V, K):
    """B = [v | -e^c k] of value head hv (into d["R"]), float32 [L, V + K]: the WY form's
    right-hand sides, which do not read the state: the solve gives [u | nw] = (I + A)^{-1} B,
    and Y = u + nw S (group_wy). GpSimd: off the busier engines."""
    L = vc.shape[0]
    B = nl.ndarray((L, V + K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=B[:, 0:V], src=vc[:, hv * V:(hv + 1) * V], engine=nisa.engine.gpsimd)
    nisa.tensor_tensor(dst=B[:, V:V + K], data1=qk["kh"], data2=nec[:, hv:hv + 1].broadcast(1, K),
                       op=nl.multiply, engine=nisa.engine.gpsimd)
    d["R"] = B


def group_wy(ds, Xs, ident, L, K, V, fast):
    """The state-free operands of a group's heads' outputs and state updates, from the
    solves' X = [u | nw] (into ``ds``): with Y = u + nw S,
    ``S' = e^{c_last} S + kd^T u + (nw^T kd)^T S`` and ``o = M u + (qd + M nw) S``, so per
    head WT = [nw^T kd | qd^T + (M nw)^T] ``[K, K + L]``: one matmul of nw against
    [kd | MT], qd^T added by an identity matmul; two heads share a PSUM bank and one
    eviction (into the group's ``[K, heads, K + L]`` tile; ScalarE, then VectorE)."""
    nh = len(ds)
    WT = nl.ndarray((K, nh, K + L), dtype=nl.float32, buffer=nl.sbuf)
    for p0 in range(0, nh, 2):
        p1 = min(p0 + 2, nh)
        ps = nl.ndarray((K, p1 - p0, K + L), dtype=nl.float32, buffer=nl.psum)
        for i in range(p0, p1):
            nw = Xs[i][:, V:V + K]
            nisa.nc_matmul(dst=ps[:, i - p0, :], stationary=tf32_view(nw, fast),
                           moving=tf32_view(ds[i]["kdm"], fast), accumulate=False)
            nisa.nc_matmul(dst=ps[:, i - p0, K:K + L], stationary=tf32_view(ds[i]["qd"], fast),
                           moving=tf32_view(ident[0:L, 0:L], fast), accumulate=True)
        eng = nisa.engine.scalar
        if p0 > 0:
            eng = nisa.engine.vector
        nisa.tensor_copy(dst=WT[:, p0:p1, :], src=ps, engine=eng)
    for i in range(nh):
        ds[i]["WT"] = WT[:, i, :]


def group_out_wy(ds, Xs, S, oc, hvs, V, fast):
    """o columns of a group's value heads ``hvs`` in the WY form (into ``oc``, their
    ``[L, heads*V]`` columns): per head M u + (qd + M nw) S (group_wy), one PSUM
    accumulation in its columns of one bank, and one ScalarE eviction for the group."""
    L = Xs[0].shape[0]
    K = S.shape[0]
    nh = len(hvs)
    pm = nl.ndarray((L, nh * V), dtype=nl.float32, buffer=nl.psum)
    for i in range(nh):
        hv = hvs[i]
        nisa.nc_matmul(dst=pm[:, i * V:(i + 1) * V], stationary=tf32_view(ds[i]["MT"], fast),
                       moving=tf32_view(Xs[i][:, 0:V], fast), accumulate=False)
        nisa.nc_matmul(dst=pm[:, i * V:(i + 1) * V], stationary=tf32_view(ds[i]["WT"][:, K:K + L], fast),
                       moving=tf32_view(S[:, hv * V:(hv + 1) * V], fast), accumulate=True)
    nisa.tensor_copy(dst=oc, src=pm, engine=nisa.engine.scalar)


def head_state_wy(S, d, X, el, hv, K, V, fast):
    """S <- e^{c_last} S + kd^T u + (nw^T kd)^T S for value head hv (group_wy): kd^T u does
    not read the state, so the state's chain is one matmul and one VectorE update."""
    Sh = S[:, hv * V:(hv + 1) * V]
    su = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=su, stationary=tf32_view(d["kd"], fast), moving=tf32_view(X[:, 0:V], fast),
                   accumulate=False)
    nisa.nc_matmul(dst=su, stationary=tf32_view(d["WT"][:, 0:K], fast), moving=tf32_view(Sh, fast),
                   accumulate=True)
    nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply, operand0=el[:, hv:hv + 1],
                              op1=nl.add, operand1=su)
