"""Pieces shared by the SSD prefill and decode kernels (plain functions: NKI
inlines the calls; never decorate them with ``nki.jit``)."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa


def load_f32(src, rows, cols):
    """``src`` [rows, cols] float32 (HBM) -> a new SBUF tile, or None for None."""
    if src == None:  # noqa: E711  (NKI has no `is`)
        return None
    out = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=out, src=src)
    return out


def dt_prime(dt_in, bias_sb, rows, cols, dt_softplus, dt_lo, dt_hi):
    """dt' = clip(softplus(dt + dt_bias), dt_lo, dt_hi) as a new fp32 SBUF tile [rows, cols].

    ``dt_in`` [rows, cols] fp32 SBUF (raw dt); ``bias_sb`` None or an SBUF
    tile whose first ``rows`` partitions hold the matching dt_bias values.
    dt_hi >= 3e38 means no upper clip (one instruction fewer).
    """
    dtp = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf)
    src = dt_in
    if bias_sb != None:  # noqa: E711
        nisa.tensor_tensor(dst=dtp, data1=dt_in, data2=bias_sb[0:rows, :], op=nl.add)
        src = dtp
    if dt_softplus:
        nisa.activation(dst=dtp, op=nl.softplus, data=src)
        src = dtp
    if dt_hi < 3.0e38:
        nisa.tensor_scalar(dst=dtp, data=src, op0=nl.maximum, operand0=dt_lo,
                           op1=nl.minimum, operand1=dt_hi)
    else:
        nisa.tensor_scalar(dst=dtp, data=src, op0=nl.maximum, operand0=dt_lo)
    return dtp
