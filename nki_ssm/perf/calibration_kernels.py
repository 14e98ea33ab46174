"""Micro kernels for the calibration rows that come from a published profile or measurement.

Each does the few instructions a published figure shows (one DMA, one exp,
one VectorE op, a dependent ScalarE chain), written here in the documented
NKI API; ``calibration.py`` compares their modeled time with the figure. The
published *kernels* (matrix multiplication, fused Mamba) are not here: the
calibration runs their own files from a checkout (``--kernels-from``).

``build()`` imports the simulator lazily and returns the kernels.
"""
from __future__ import annotations


def _nki():
    from nki_ssm.sim import isa as nisa
    from nki_ssm.sim import language as nl

    return nl, nisa


def build() -> dict:
    """name -> kernel function (plain NKI-style functions; run them with sim's simulate)."""
    nl, nisa = _nki()

    def dma_roundtrip(x):
        """x [rows, cols] HBM -> one SBUF tile -> out. Times one DMA load (and store)."""
        rows, cols = x.shape
        out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        return out

    def exp_kernel(x):
        """out = exp(x): one load, one ScalarE exp, one store (the DMA overview's profiled body)."""
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        e = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.activation(dst=e, op=nl.exp, data=t)
        nisa.dma_copy(dst=out, src=e)
        return out

    def vector_op(x):
        """out = 2 x on VectorE (one one-input op over the whole tile)."""
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        y = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out, src=y)
        return out

    def scalar_chain(x, steps):
        """`steps` dependent 1-element activations on [128, 1] (the published dependent-chain figure)."""
        rows, _ = x.shape
        out = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        cur = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=cur, src=x)
        for _ in range(steps):
            nxt = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=nxt, op=nl.exp, data=cur, scale=-1.0)
            cur = nxt
        nisa.dma_copy(dst=out, src=cur)
        return out

    return dict(dma_roundtrip=dma_roundtrip, exp_kernel=exp_kernel, vector_op=vector_op,
                scalar_chain=scalar_chain)
