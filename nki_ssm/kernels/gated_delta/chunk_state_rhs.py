"""The Gated DeltaNet chunked prefill's steps of the form with the state in the right-hand
side (>= 8 head groups, Qwen3-Next TP1): R = v - e^c (k S) solved for Y, o = scale e^c
(q S) + M Y, S <- e^{c_last} S + kd^T Y (the design note in ``chunk.py``); the per-head
scalars beta and beta e^{c_last - c} go into operands a whole head group shares (the
decays, the keys) by GpSimd, so A^T and M^T of two value heads take one VectorE pass.
Plain functions: NKI inlines the calls."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa
from nki_ssm.kernels._common import tf32_view


def head_rhs(d, qk, vc, nec, S, hv, V):
    """R = v - e^c (k S) of value head hv (into ``d``): the delta of every token against the
    chunk's entry state."""
    L = vc.shape[0]
    ps = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=tf32_view(qk["kT"], qk["fast"]),
                   moving=tf32_view(S[:, hv * V:(hv + 1) * V], qk["fast"]), accumulate=False)
    d["R"] = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d["R"], data=ps, op0=nl.multiply, operand0=nec[:, hv:hv + 1],
                              op1=nl.add, operand1=vc[:, hv * V:(hv + 1) * V])


def head_oq(d, qk, qs, S, hv, V):
    """oq = scale e^c (q S) of value head hv (into ``d``), the inter-chunk part of o."""
    L = qk["kh"].shape[0]
    pq = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pq, stationary=tf32_view(qk["qT"], qk["fast"]),
                   moving=tf32_view(S[:, hv * V:(hv + 1) * V], qk["fast"]), accumulate=False)
    d["oq"] = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d["oq"], op=nl.copy, data=pq, scale=qs[:, hv:hv + 1])



def head_state(S, kd, Y, el, hv, K, V, fast):
    """S <- e^{c_last} S + kd^T Y for value head hv."""
    Sh = S[:, hv * V:(hv + 1) * V]
    su = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=su, stationary=tf32_view(kd, fast), moving=tf32_view(Y, fast), accumulate=False)
    nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply, operand0=el[:, hv:hv + 1],
                              op1=nl.add, operand1=su)


def group_beta_decay(DT, beta, hvs, L):
    """DTb = beta_j DT ([j, i] layout) of a head group's value heads ``hvs`` from their decays
    DT ``[L, heads, L]``: one GpSimd multiply for the group (beta a zero-stride operand)."""
    n = len(hvs)
    hv0 = hvs[0]
    DTb = nl.ndarray((L, n, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=DTb, data1=DT,
                       data2=beta[:, hv0:hv0 + n].reshape((L, n, 1)).broadcast(2, L),
                       op=nl.multiply, engine=nisa.engine.gpsimd)
    return DTb


def qk_runs(hvs, qk_of):
    """The runs of consecutive value heads in ``hvs`` that read one q/k head: (first index,
    length, q/k head) each (trace-time Python: the runs are fixed by the layer's shape)."""
    runs = []
    i0 = 0
    while i0 < len(hvs):
        h = qk_of[hvs[i0]]
        r = 1
        while i0 + r < len(hvs) and qk_of[hvs[i0 + r]] == h:
            r = r + 1
        runs.append((i0, r, h))
        i0 = i0 + r
    return runs


def group_at_mt(qks, ds, DTb, hvs, qk_of, L):
    """A^T = beta_j kk DT and M^T = scale beta_j kq DT ([j, i] layout) of a head group's value
    heads ``hvs`` (into ``ds``; ``qks`` the q/k heads' products, the kq half scaled by the
    output scale: qk_products with kkq_mask_s; DTb ``[L, heads, L]`` the group's decays
    with beta in, group_beta_decay): each q/k head's [kk | kq] meets the DTb of the value
    heads that read it in one VectorE multiply ``[L, heads of the q/k head, 2, L]``: no per-head scalar left, so one
    instruction serves two value heads' A^T and M^T (Qwen3-Next: HV / H = 2)."""
    for run in qk_runs(hvs, qk_of):
        i0, r, h = run
        kkq = qks[str(h)]["kkq"]
        am = nl.ndarray((L, r, 2, L), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=am, data1=kkq.reshape((L, 1, 2, L)).broadcast(1, r),
                           data2=DTb[:, i0:i0 + r, :].reshape((L, r, 1, L)).broadcast(2, 2),
                           op=nl.multiply)
        for j in range(r):
            ds[i0 + j]["AT"] = am[:, j, 0, :]
            ds[i0 + j]["MT"] = am[:, j, 1, :]


def group_kd(ds, kc, dlb, hvs, qk_of, L, K):
    """The decayed keys kd = beta e^{c_last - c} k of a head group's value heads ``hvs`` (into
    ``ds``): one GpSimd multiply per q/k head, ``[L, its value heads, K]`` (the keys a
    zero-stride operand over the value heads, dlb one over the keys), off ScalarE and
    VectorE."""
    n = len(hvs)
    kd = nl.ndarray((L, n, K), dtype=nl.float32, buffer=nl.sbuf)
    for run in qk_runs(hvs, qk_of):
        i0, r, h = run
        hv = hvs[i0]
        nisa.tensor_tensor(dst=kd[:, i0:i0 + r, :],
                           data1=kc[:, h * K:(h + 1) * K].reshape((L, 1, K)).broadcast(1, r),
                           data2=dlb[:, hv:hv + r].reshape((L, r, 1)).broadcast(2, K),
                           op=nl.multiply, engine=nisa.engine.gpsimd)
        for j in range(r):
            ds[i0 + j]["kd"] = kd[:, i0 + j, :]


def group_out(ds, Ys, oc, ident, hvs, V, fast):
    """o columns of a head group's value heads ``hvs``: oq + (scale tril(q k^T) D diag(beta))
    Y, the heads' PSUM accumulations side by side in one bank ``[L, heads * V]``. ``fast``
    (bf16 callers): oq joins each accumulation through an identity matmul (tfloat32: its
    rounding, 2^-11, is a quarter of the bf16 output's), so one ScalarE copy evicts the
    group; float32 callers add oq per head on VectorE."""
    L = Ys[0].shape[0]
    n = len(hvs)
    pm = nl.ndarray((L, n * V), dtype=nl.float32, buffer=nl.psum)
    for i in range(n):
        nisa.nc_matmul(dst=pm[:, i * V:(i + 1) * V], stationary=tf32_view(ds[i]["MT"], fast),
                       moving=tf32_view(Ys[i], fast), accumulate=False)
        if fast:
            nisa.nc_matmul(dst=pm[:, i * V:(i + 1) * V],
                           stationary=tf32_view(ident[0:L, 0:L], fast),
                           moving=tf32_view(ds[i]["oq"], fast), accumulate=True)
    c0 = hvs[0] * V
    if fast:
        nisa.tensor_copy(dst=oc[:, c0:c0 + n * V], src=pm, engine=nisa.engine.scalar)
    else:
        for i in range(n):
            nisa.tensor_tensor(dst=oc[:, c0 + i * V:c0 + (i + 1) * V],
                               data1=pm[:, i * V:(i + 1) * V], data2=ds[i]["oq"], op=nl.add)
