"""The Gated DeltaNet chunked prefill's per-head steps of the form with the state in the
right-hand side (>= 8 head groups, Qwen3-Next TP1): R = v - e^c (k S) solved for Y, o =
scale e^c (q S) + M Y, S <- e^{c_last} S + kd^T Y (the design note in ``chunk.py``).
Plain functions: NKI inlines the calls."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa
from nki_ssm.kernels.gated_delta.chunk_utils import tf32_view


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


def head_out(d, Y, oc, ident, hv, V, fast):
    """o columns of value head hv: oq + (scale tril(q k^T) D diag(beta)) Y. ``fast`` (bf16
    callers): oq joins the product's PSUM accumulation through an identity matmul
    (tfloat32: its rounding, 2^-11, is a quarter of the bf16 output's), so the eviction is
    a plain copy ScalarE can do (modeled: VectorE was the busiest engine)."""
    L = Y.shape[0]
    pm = nl.ndarray((L, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=pm, stationary=tf32_view(d["MT"], fast), moving=tf32_view(Y, fast), accumulate=False)
    if fast:
        nisa.nc_matmul(dst=pm, stationary=tf32_view(ident[0:L, 0:L], fast), moving=tf32_view(d["oq"], fast),
                       accumulate=True)
        nisa.tensor_copy(dst=oc[:, hv * V:(hv + 1) * V], src=pm, engine=nisa.engine.scalar)
    else:
        nisa.tensor_tensor(dst=oc[:, hv * V:(hv + 1) * V], data1=pm, data2=d["oq"], op=nl.add)


def head_state(S, kd, Y, el, hv, K, V, fast):
    """S <- e^{c_last} S + kd^T Y for value head hv."""
    Sh = S[:, hv * V:(hv + 1) * V]
    su = nl.ndarray((K, V), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=su, stationary=tf32_view(kd, fast), moving=tf32_view(Y, fast), accumulate=False)
    nisa.scalar_tensor_tensor(dst=Sh, data=Sh, op0=nl.multiply, operand0=el[:, hv:hv + 1],
                              op1=nl.add, operand1=su)
