"""Small NKI kernels that reproduce published Trainium measurements (nki_spec §9).

Written in this project from the published algorithm descriptions (the NKI
"Fused Mamba" tutorial text, nki_spec §10.1 and nki_anchors A2 / A11), in the
documented NKI API, and run on nki_ssm's simulator. They exist to be timed,
not used: ``calibration.py`` compares their modeled time with the published
one.

``build()`` imports the simulator's ``nki.language`` / ``nki.isa`` lazily and
returns the kernels (perf may import sim; sim may be absent or partial).
"""
from __future__ import annotations


def _nki():
    from nki_ssm.sim import isa as nisa
    from nki_ssm.sim import language as nl

    return nl, nisa


def build() -> dict:
    """name -> kernel function (plain NKI-style functions; run them with sim's simulate)."""
    nl, nisa = _nki()
    P = 128

    def dma_roundtrip(x):
        """x [rows, cols] HBM -> one SBUF tile -> out. Times one DMA load (and store)."""
        rows, cols = x.shape
        out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=out, src=t)
        return out

    def scalar_chain(x, steps):
        """`steps` dependent 1-element activations on [128, 1] (nki_spec §9 row 10)."""
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

    def _broadcast_row(row_sb, ones_sb, seq):
        # partition broadcast of a [1, seq] row on TensorE: ones[1,128]^T @ row -> PSUM [128, seq]
        bc = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=bc, stationary=ones_sb, moving=row_sb, is_stationary_onezero=True)
        return bc

    def _mamba_step(d_sb, u_sb, a_col, b_row, c_row, ones_sb, acc, seq, carry):
        """One (channel tile, state, seq tile) of the selective scan, tutorial steps 1-6."""
        dA = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=dA, op=nl.exp, data=d_sb, scale=a_col)          # exp(delta * A[:, n])
        b_bc = _broadcast_row(b_row, ones_sb, seq)
        dU = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dU, data1=d_sb, data2=u_sb, op=nl.multiply)
        dBu = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=dBu, data1=dU, data2=b_bc, op=nl.multiply)
        h = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=h, data0=dA, data1=dBu, initial=carry,
                                op0=nl.multiply, op1=nl.add)
        c_bc = _broadcast_row(c_row, ones_sb, seq)
        hc = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=hc, data1=h, data2=c_bc, op=nl.multiply)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=hc, op=nl.add)
        return h

    def _ones():
        ones = nl.ndarray((1, P), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=ones, value=1.0)
        return ones

    def _load(src, shape):
        t = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        return t

    def mamba_v1(delta, u, A, B, C):
        """Tutorial v1 loop order: batch -> state -> channel tile; delta/u loaded per (state, tile).

        delta, u [batch, channels, seq]; A [channels, state]; B, C [batch, state, seq]; fp32.
        """
        batch, channels, seq = delta.shape
        _, state = A.shape
        out = nl.ndarray((batch, channels, seq), dtype=delta.dtype, buffer=nl.shared_hbm)
        ones = _ones()
        for b in range(batch):
            accs = []
            for _ in range(channels // P):
                acc = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.sbuf)
                nisa.memset(dst=acc, value=0.0)
                accs.append(acc)
            for n in range(state):
                for t in range(channels // P):
                    c0 = t * P
                    d_sb = _load(delta[b, c0:c0 + P, :], (P, seq))
                    u_sb = _load(u[b, c0:c0 + P, :], (P, seq))
                    a_col = _load(A[c0:c0 + P, n:n + 1], (P, 1))
                    b_row = _load(B[b, n:n + 1, :], (1, seq))
                    c_row = _load(C[b, n:n + 1, :], (1, seq))
                    _mamba_step(d_sb, u_sb, a_col, b_row, c_row, ones, accs[t], seq, 0.0)
            for t in range(channels // P):
                nisa.dma_copy(dst=out[b, t * P:(t + 1) * P, :], src=accs[t])
        return out

    def mamba_v2(delta, u, A, B, C):
        """Tutorial v2: channel tile outer, delta/u loaded once per tile, state loop inside."""
        batch, channels, seq = delta.shape
        _, state = A.shape
        out = nl.ndarray((batch, channels, seq), dtype=delta.dtype, buffer=nl.shared_hbm)
        ones = _ones()
        for b in range(batch):
            for t in range(channels // P):
                c0 = t * P
                acc = nl.ndarray((P, seq), dtype=nl.float32, buffer=nl.sbuf)
                nisa.memset(dst=acc, value=0.0)
                d_sb = _load(delta[b, c0:c0 + P, :], (P, seq))
                u_sb = _load(u[b, c0:c0 + P, :], (P, seq))
                for n in range(state):
                    a_col = _load(A[c0:c0 + P, n:n + 1], (P, 1))
                    b_row = _load(B[b, n:n + 1, :], (1, seq))
                    c_row = _load(C[b, n:n + 1, :], (1, seq))
                    _mamba_step(d_sb, u_sb, a_col, b_row, c_row, ones, acc, seq, 0.0)
                nisa.dma_copy(dst=out[b, c0:c0 + P, :], src=acc)
        return out

    def mamba_v3(delta, u, A, B, C, seq_tile=512):
        """Tutorial v3: v2 plus sequence tiling; the scan carry passes through `initial`."""
        batch, channels, seq = delta.shape
        _, state = A.shape
        out = nl.ndarray((batch, channels, seq), dtype=delta.dtype, buffer=nl.shared_hbm)
        ones = _ones()
        F = min(seq_tile, seq)
        for b in range(batch):
            for t in range(channels // P):
                c0 = t * P
                carries = []
                for _ in range(state):
                    cr = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.memset(dst=cr, value=0.0)
                    carries.append(cr)
                for f in range(seq // F):
                    f0 = f * F
                    acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.memset(dst=acc, value=0.0)
                    d_sb = _load(delta[b, c0:c0 + P, f0:f0 + F], (P, F))
                    u_sb = _load(u[b, c0:c0 + P, f0:f0 + F], (P, F))
                    for n in range(state):
                        a_col = _load(A[c0:c0 + P, n:n + 1], (P, 1))
                        b_row = _load(B[b, n:n + 1, f0:f0 + F], (1, F))
                        c_row = _load(C[b, n:n + 1, f0:f0 + F], (1, F))
                        h = _mamba_step(d_sb, u_sb, a_col, b_row, c_row, ones, acc, F, carries[n])
                        nisa.tensor_copy(dst=carries[n], src=h[:, F - 1:F])
                    nisa.dma_copy(dst=out[b, c0:c0 + P, f0:f0 + F], src=acc)
        return out

    def selective_scan_v1(x, dt, A, B, C, initial_state):
        """nki-library selective_scan v1 as described (nki_anchors A2): carries through HBM.

        x, dt [batch, channels, L]; A [channels, N]; B, C [batch, N, L];
        initial_state [batch, channels, N]. Returns (y, final_state). B/C rows are
        broadcast to 128 partitions with 4 nc_stream_shuffle calls (one per
        32-partition quadrant); the per-state carry is stored to final_state
        after every free tile and reloaded from HBM for the next one.
        """
        batch, channels, L = x.shape
        _, N = A.shape
        F = min(512, L)
        y = nl.ndarray((batch, channels, L), dtype=x.dtype, buffer=nl.shared_hbm)
        final = nl.ndarray((batch, channels, N), dtype=nl.float32, buffer=nl.shared_hbm)
        for b in range(batch):
            for t in range(channels // P):
                c0 = t * P
                for f in range(L // F):
                    f0 = f * F
                    x_sb = _load(x[b, c0:c0 + P, f0:f0 + F], (P, F))
                    dt_sb = _load(dt[b, c0:c0 + P, f0:f0 + F], (P, F))
                    dtx = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.tensor_tensor(dst=dtx, data1=dt_sb, data2=x_sb, op=nl.multiply)
                    acc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.memset(dst=acc, value=0.0)
                    for n in range(N):
                        a_col = _load(A[c0:c0 + P, n:n + 1], (P, 1))
                        src = initial_state if f == 0 else final
                        carry = _load(src[b, c0:c0 + P, n:n + 1], (P, 1))
                        dA = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                        nisa.activation(dst=dA, op=nl.exp, data=dt_sb, scale=a_col)
                        b_full = _shuffle_broadcast(B[b, n:n + 1, f0:f0 + F], F)
                        dBx = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                        nisa.tensor_tensor(dst=dBx, data1=dtx, data2=b_full, op=nl.multiply)
                        h = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                        nisa.tensor_tensor_scan(dst=h, data0=dA, data1=dBx, initial=carry,
                                                op0=nl.multiply, op1=nl.add)
                        nisa.dma_copy(dst=final[b, c0:c0 + P, n:n + 1], src=h[:, F - 1:F])
                        c_full = _shuffle_broadcast(C[b, n:n + 1, f0:f0 + F], F)
                        hc = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
                        nisa.tensor_tensor(dst=hc, data1=h, data2=c_full, op=nl.multiply)
                        nisa.tensor_tensor(dst=acc, data1=acc, data2=hc, op=nl.add)
                    nisa.dma_copy(dst=y[b, c0:c0 + P, f0:f0 + F], src=acc)
        return y, final

    def _shuffle_broadcast(row_hbm, F):
        # the row lands on partition 0 of a 32-partition tile; each quadrant copies partition 0
        src = nl.ndarray((32, F), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=src[0:1, :], src=row_hbm)
        full = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)
        for q in range(P // 32):
            nisa.nc_stream_shuffle(dst=full[q * 32:(q + 1) * 32, :], src=src,
                                   shuffle_mask=[0] * 32)
        return full

    return dict(dma_roundtrip=dma_roundtrip, scalar_chain=scalar_chain, mamba_v1=mamba_v1,
                mamba_v2=mamba_v2, mamba_v3=mamba_v3, selective_scan_v1=selective_scan_v1)
