"""Pieces of the Gated DeltaNet chunked kernels (prefill and backward): the chunk's
input gathers and table rows, scratch state blocks, constants, matmul helpers, and the
steps both solve forms share (q / k transposes and products, decays, A^T, the decayed
keys). Plain functions: NKI inlines the calls."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa
from nki_ssm.kernels._common import tf32_view
from nki_ssm.kernels.gated_delta._common import consecutive_groups
from nki_ssm.kernels.scaffold import at_row


BLOCK = 32           # rows per exactly-inverted diagonal block
PACK = 4             # most heads whose blocks share one 128-partition packed solve
_L2NORM_EPS = 1e-6


def state_block(scratch, row, block, K, c0, c1):
    """Columns c0:c1 of the ``[K, width]`` scratch block ``block`` (static) plus the run-time
    block row ``row`` (an ``NkiScalar``, or None)."""
    width = scratch.shape[1]
    return at_row(scratch, row, [[width, K], [1, c1 - c0]], block * K * width + c0)


def head_groups(HV):
    """The value heads of each software-pipeline group (and packed solve): PACK per group,
    128 partitions, so the packed solve's ops serve 4 heads each."""
    return consecutive_groups(HV, PACK)


def few_groups(HV):
    """Whether a chunk has fewer than 8 head groups (TP2, TP4, TP8 of Qwen3-Next): its state
    chains would then bind (the body's chunks follow one another's state), so the solve
    takes the state-free WY form (the design note in ``chunk.py``) and leaves the chain; with 8 or more
    (TP1) ScalarE and VectorE bind and the width-V solve on the chain costs less."""
    return len(head_groups(HV)) < 8


def table_rows(table, r, C, plus):
    """Token rows of chunk ``plus`` (a static int) of row ``r`` (an ``NkiScalar``; None: row
    0) of an int32 ``[entries, n*C]`` table as a ``[C, 1]`` SBUF column."""
    t = nl.ndarray((C, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=at_row(table, r, [[1, C], [1, 1]], plus * C))
    return t


# in the order the chunk's first jobs read them: the transposes k and q, the decays g and beta,
# the right-hand sides v (so the first jobs start while v is still in flight)
INPUTS = ("k", "q", "g", "beta", "v")


def gather_chunk(buf, io, table, r, plus, C):
    """Gather the token rows of chunk ``plus`` of row ``r`` of ``table`` into the chunk tiles
    (the program's columns of io["hbm"]'s inputs, from io["cols"]); returns the rows."""
    rows = table_rows(table, r, C, plus)
    for name in INPUTS:
        nisa.dma_copy(dst=buf[name], src=rows_view(io["hbm"][name], rows, C, io["cols"][name],
                                                    buf[name].shape[1]))
    return rows


def rows_view(x, rows, C, c0, width):
    """Columns c0 .. c0 + width of rows ``rows[p]`` of HBM ``x [n, w]``, one row per partition
    (indirect gather / scatter)."""
    return x.ap(pattern=[[x.shape[1], C], [1, width]], offset=c0, vector_offset=rows,
                indirect_dim=0)


def constants(C, K, mdt):
    """Cumsum operator tri_up [C, C], identity [128, 128] and ones [128, 128] (float32)."""
    cst = {}
    ones = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    cst["ones"] = ones
    # tri_up[p, f] = 1 if f >= p (cumsum operator: c_j = sum_{m <= j} g_m)
    cst["tri_up"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["tri_up"], pattern=[[1, C]], channel_multiplier=-1,
                       on_true_tile=ones[0:C, 0:C], on_false_value=0.0, cmp_op=nl.greater_equal)
    # tri_lo[p, f] = 1 if p > f (segment sums over m > j)
    cst["tri_lo"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["tri_lo"], pattern=[[-1, C]], channel_multiplier=1, offset=-1,
                       on_true_tile=ones[0:C, 0:C], on_false_value=0.0, cmp_op=nl.greater_equal)
    # tri_su[p, f] = 1 if f > p (strictly upper: the pairs j < i in [j, i] layout)
    cst["tri_su"] = nl.ndarray((C, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["tri_su"], pattern=[[1, C]], channel_multiplier=-1, offset=-1,
                       on_true_tile=ones[0:C, 0:C], on_false_value=0.0, cmp_op=nl.greater_equal)
    # [tri_su | tri_up]: the masks of k k^T and k q^T side by side
    cst["kkq_mask"] = nl.ndarray((C, 2, C), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=cst["kkq_mask"][:, 0, :], src=cst["tri_su"])
    nisa.tensor_copy(dst=cst["kkq_mask"][:, 1, :], src=cst["tri_up"])
    cst["ident"] = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=cst["ident"], pattern=[[-1, 128]], channel_multiplier=1,
                       on_true_tile=ones, on_false_value=0.0, cmp_op=nl.equal)
    # the packed solve's compact identity, once per block: cIb [(h, m), b, c] = [m == c],
    # and the head-quadrant mask bd [(h, m), h', c] = [h == h'] (float32)
    nq = 128 // BLOCK
    cst["cIb"] = nl.ndarray((128, nq, BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    cst["bd"] = nl.ndarray((128, nq, BLOCK), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=cst["bd"], value=0.0)
    for h in range(nq):
        q0 = h * BLOCK
        for b in range(nq):
            nisa.tensor_copy(dst=cst["cIb"][q0:q0 + BLOCK, b, :],
                             src=cst["ident"][0:BLOCK, 0:BLOCK])
        nisa.memset(dst=cst["bd"][q0:q0 + BLOCK, h, :], value=1.0)
    return cst


def mm(st, mv, M, N, onezero=False):
    """SBUF [M, N] = st^T @ mv through PSUM (``onezero``: st holds only 0 / 1)."""
    ps = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, is_stationary_onezero=onezero,
                   accumulate=False)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=ps, engine=nisa.engine.scalar)
    return out


def l2norm_rows(x, L, H, K):
    """x [L, H*K] (SBUF, in place): each head's K values divided by sqrt(sum x^2 + eps)."""
    sq = nl.ndarray((L, H * K), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=sq, data1=x, data2=x, op=nl.multiply)
    ss = nl.ndarray((L, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=ss, op=nl.add, data=sq.reshape((L, H, K)), axis=(2,))
    nisa.tensor_scalar(dst=ss, data=ss, op0=nl.add, operand0=_L2NORM_EPS)
    nisa.activation(dst=ss, op=nl.rsqrt, data=ss)
    nisa.tensor_tensor(dst=x.reshape((L, H, K)), data1=x.reshape((L, H, K)),
                       data2=ss.reshape((L, H, 1)).broadcast(2, K), op=nl.multiply)


def exp_of_mm(st, mv, M, N):
    """SBUF [M, N] = exp(st^T @ mv), the exp reading PSUM (st holds only 0 / 1)."""
    ps = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=st, moving=mv, is_stationary_onezero=True,
                   accumulate=False)
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=out, op=nl.exp, data=ps)
    return out


def qk_transposes(kc, qc, h, L, K, fast):
    """q/k head h of one chunk: its keys kh [L, K] and k^T, q^T [K, L] side by side in one
    ``[K, 2, L]`` tile (one PSUM bank and one eviction for both), float32 (``fast``: bf16
    callers, read as tfloat32 operands: exact for bf16 inputs, and the state they
    multiply keeps 10 mantissa bits instead of a bf16 copy's 7) or the input dtype."""
    d = {}
    d["kh"] = kc[:, h * K:(h + 1) * K]
    odt = kc.dtype
    if fast:
        odt = nl.float32
    ps = nl.ndarray((K, 2 * L), dtype=kc.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=ps[:, 0:L], data=d["kh"], engine=nisa.engine.tensor)
    nisa.nc_transpose(dst=ps[:, L:2 * L], data=qc[:, h * K:(h + 1) * K], engine=nisa.engine.tensor)
    d["kqT"] = nl.ndarray((K, 2, L), dtype=odt, buffer=nl.sbuf)
    nisa.tensor_copy(dst=d["kqT"].reshape((K, 2 * L)), src=ps, engine=nisa.engine.scalar)
    d["kT"] = d["kqT"][:, 0, :]
    d["qT"] = d["kqT"][:, 1, :]
    d["fast"] = fast
    return d


def qk_products(cst, d, L):
    """The masked products of a q/k head (into ``d``): kk[j, i] = k_j . k_i (j < i) and
    kq[j, i] = k_j . q_i (j <= i), float32, both in [j, i] layout, from one matmul and one
    masked eviction (k^T against [k^T | q^T]), also as ``d["kkq"]`` ``[L, 2, L]``. The masks
    (cst["kkq_mask"]; the prefill with >= 8 head groups puts the output scale on its kq
    half) ride on the eviction, so no decay matrix needs one."""
    K = d["kqT"].shape[0]
    ps = nl.ndarray((L, 2 * L), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=tf32_view(d["kT"], d["fast"]),
                   moving=tf32_view(d["kqT"].reshape((K, 2 * L)), d["fast"]), accumulate=False)
    kkq = nl.ndarray((L, 2, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=kkq.reshape((L, 2 * L)), data1=ps,
                       data2=cst["kkq_mask"][0:L, :, 0:L].reshape((L, 2 * L)), op=nl.multiply)
    d["kkq"] = kkq
    d["kk"] = kkq[:, 0, :]
    d["kq"] = kkq[:, 1, :]


def head_gu(gU, cst, g, hv, L):
    """gU[m, i] = g_m (m <= i) of value head hv (into the ``[L, L]`` tile ``gU``): the
    moving operand of its segment sums."""
    nisa.activation(dst=gU, op=nl.copy, data=cst["tri_up"][0:L, 0:L], scale=g[:, hv:hv + 1])


def group_decay(cst, ds, gU, L):
    """DT[j, i] = e^{seg(j, i]} ([j, i] layout; 1 where j >= i) of each head of a group (into
    ``ds``; returned as ``[L, heads, L]``) from direct segment sums seg(j, i] =
    sum_{j < m <= i} g_m (an fp32 matmul with a
    0/1 operator), never c_i - c_j of two running sums (that cancels): the heads' gU side
    by side (``[L, heads, L]``, one PSUM bank for 4 heads at L = 128), so one matmul and
    one exp serve the group."""
    nh = gU.shape[1]
    DT = exp_of_mm(cst["tri_lo"][0:L, 0:L], gU.reshape((L, nh * L)), L, nh * L)
    DT = DT.reshape((L, nh, L))
    for i in range(nh):
        ds[i]["DT"] = DT[:, i, :]
    return DT


def head_at(qk, d, beta, hv, L):
    """AT = beta_j kk DT = (K K^T * D diag(beta))^T of value head hv, with beta folded into
    the unknown (v_new = beta * Y): (I + K K^T * D diag(beta)) Y = R (module docstring;
    R in head_rhs). kk carries the strictly-lower mask."""
    d["AT"] = nl.ndarray((L, L), dtype=nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=d["AT"], data=qk["kk"], op0=nl.multiply,
                              operand0=beta[:, hv:hv + 1], op1=nl.multiply, operand1=d["DT"])


def head_post_ops(qk, d, bs, dlb, hv, L, K):
    """The operands the products with Y need (into ``d``): MT = scale beta_j tril(q k^T) D
    ([j, i] layout) and the decayed keys kd = beta e^{c_last - c} k."""
    kdm = nl.ndarray((L, K + L), dtype=nl.float32, buffer=nl.sbuf)   # [kd | MT]: one operand
    MT = kdm[:, K:K + L]
    nisa.scalar_tensor_tensor(dst=MT, data=qk["kq"], op0=nl.multiply, operand0=bs[:, hv:hv + 1],
                              op1=nl.multiply, operand1=d["DT"])
    kd = kdm[:, 0:K]
    nisa.activation(dst=kd, op=nl.copy, data=qk["kh"], scale=dlb[:, hv:hv + 1])
    d["MT"] = MT
    d["kd"] = kd
    d["kdm"] = kdm
