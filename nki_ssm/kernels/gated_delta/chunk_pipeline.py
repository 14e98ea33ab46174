"""The loop body of the Gated DeltaNet chunked prefill (``chunk.py``): a software
pipeline over head groups and the chunks of a body (``run_body``), each group's work a
list of jobs, one per dependent step (``_group_jobs``), dispatched to the two solve forms
(``chunk_state_rhs``: >= 8 head groups; ``chunk_wy``: fewer) and the block solve
(``chunk_block_solve``). Plain functions: NKI inlines the calls."""
from __future__ import annotations

from nki_ssm.backend import nl, nisa
from nki_ssm.kernels.gated_delta.chunk_block_solve import (block_rows, pack_rhs,
                                                           solve_apply_block, solve_place,
                                                           solve_rhs_block, solve_round,
                                                           solve_setup, solve_update)
from nki_ssm.kernels.gated_delta.chunk_state_rhs import (group_at_mt, group_beta_decay,
                                                          group_kd, group_out, head_oq, head_rhs,
                                                          head_state)
from nki_ssm.kernels.gated_delta.chunk_wy import (group_out_wy, group_wy, head_qd, head_rhs_wy,
                                                  head_state_wy)
from nki_ssm.kernels.gated_delta.chunk_utils import (BLOCK, exp_of_mm, gather_chunk,
                                                     group_decay, head_at, head_groups,
                                                     head_gu, head_post_ops, l2norm_rows, mm,
                                                     qk_products, qk_transposes, rows_view,
                                                     state_block)
from nki_ssm.kernels.scaffold import row_cells


_CHUNK_STEP = 6       # steps between the starts of a body's chunks (chunk_stride)
_ONE_GROUP_STEP = 2   # ... with one head group and compact tiles: the whole body in flight
_FIRST_LEAD = 2       # extra steps chunk 0 runs alone in a body of 4 or more chunks (_body_plan)


def _chunk_prologue(buf, o, cst, rows, T1, H, HV, K, V, raw_gates, use_qk_l2norm, scale, C):
    """The per-token decays of one chunk (every head at once) from its tiles ``buf``."""
    L = C
    g = buf["g"]
    beta = buf["beta"]
    if raw_gates:
        # g = -exp(A_log) softplus(a + dt_bias); beta = sigmoid(b). The zero row's a = 0
        # would give g != 0: rows past the sequence end get g = 0 (no decay of S).
        nisa.tensor_tensor(dst=g, data1=g, data2=cst["dtb"][0:L, :], op=nl.add)
        nisa.activation(dst=g, op=nl.softplus, data=g)
        live = nl.ndarray((L, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=live, data=rows, op0=nl.less, operand0=T1 - 1)
        nisa.scalar_tensor_tensor(dst=g, data=g, op0=nl.multiply, operand0=live,
                                  op1=nl.multiply, operand1=cst["negA"][0:L, :])
        nisa.activation(dst=beta, op=nl.sigmoid, data=beta)
    if use_qk_l2norm:
        l2norm_rows(buf["q"], L, H, K)
        l2norm_rows(buf["k"], L, H, K)
    # per-token decays of every head at once (fp32, 0/1 stationaries):
    #   c_i = sum_{m <= i} g_m,  to_end_i = sum_{m > i} g_m (direct segment sums),
    #   c_last on K partitions (decay of S over the chunk)
    ch = {}
    ch["rows"] = rows
    c_col = mm(cst["tri_up"][0:L, 0:L], g, L, HV, True)
    ec = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=ec, op=nl.exp, data=c_col)
    ch["qs"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)    # scale e^{c_i}
    nisa.tensor_scalar(dst=ch["qs"], data=ec, op0=nl.multiply, operand0=scale)
    ch["nec"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)   # -e^{c_i}
    nisa.tensor_scalar(dst=ch["nec"], data=ec, op0=nl.multiply, operand0=-1.0)
    ch["bs"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)    # scale beta_j
    nisa.tensor_scalar(dst=ch["bs"], data=beta, op0=nl.multiply, operand0=scale)
    dl = exp_of_mm(cst["tri_lo"][0:L, 0:L], g, L, HV)                  # e^{c_last - c_i}
    ch["dlb"] = nl.ndarray((L, HV), dtype=nl.float32, buffer=nl.sbuf)   # beta_i e^{c_last - c_i}
    nisa.tensor_tensor(dst=ch["dlb"], data1=dl, data2=beta, op=nl.multiply)
    ch["el"] = exp_of_mm(cst["ones"][0:L, 0:K], g, K, HV)             # e^{c_last}
    ch["oc"] = nl.ndarray((L, HV * V), dtype=o.dtype, buffer=nl.sbuf)
    ch["qk"] = {}
    return ch


def run_body(bufs, n, io, cst, solve, S, c, K, V, win, raw_gates, use_qk_l2norm, scale, C):
    """Row ``c`` (an ``NkiScalar``) of the work list io["rows"] / io["state"]: n consecutive
    chunks of one sequence, gathered into the tiles bufs[0 .. n - 1] at the start of the
    body (rows past the sequence end read the zero row). S is loaded from the row's source
    scratch block, carried through the n chunks and stored to its destination block; o rows
    scattered (rows past the end to the trash row).

    A software pipeline over groups of value heads (head_groups) and the n chunks
    (_body_plan): a group's work is a list of jobs, one per dependent step (_group_jobs),
    so every in-order engine queue holds work of several groups between one group's
    dependent steps."""
    L = C
    o = io["o"]
    HV = win["nhv"]
    groups = head_groups(HV)
    G = len(groups)
    jobs, jarg = _group_jobs(win["few"], L)
    stride = chunk_stride(G, io["compact"])
    order, off, nslot = _body_plan(jobs, G, n, stride, win["few"])
    table = io["rows"]
    # chunk 0's inputs first (its first job reads them), then the state entering the row,
    # per head group (group 0's first: its k S comes first), then the other chunks' inputs
    rows = [gather_chunk(bufs[0], io, table, c, 0, C)]
    cells = row_cells(io["state"], c)
    for hvs in groups:
        c0 = hvs[0] * V
        c1 = (hvs[len(hvs) - 1] + 1) * V
        nisa.dma_copy(dst=S[:, c0:c1], src=state_block(io["scratch"], cells[0], io["blk0"], K,
                                                        c0, c1))
    for k in range(1, n):
        rows.append(gather_chunk(bufs[k], io, table, c, k, C))
    chs = []
    pres = []
    gdat = []
    items = []
    for k in range(n):
        chs.append(None)
        pres.append({})
        gdat.append({})
        items.append({})
    for t in range(nslot):
        for k in range(n):
            for r in range(len(order[k])):
                i = len(order[k]) - 1 - r        # later stages first
                u = t - off[k][i]
                if u < 0 or u >= G:
                    continue
                if chs[k] == None:  # noqa: E711  (NKI has no `is`)
                    chs[k] = _chunk_prologue(bufs[k], o, cst, rows[k], io["T1"], win["nh"], HV,
                                             K, V, raw_gates, use_qk_l2norm, scale, C)
                s = order[k][i]
                _group_job(jobs[s], jarg[s], u, groups[u], chs[k], bufs[k], pres[k], gdat[k],
                           items[k], o, cst, solve[k], S, K, V, win, L, C)
                if k == n - 1 and jobs[s] == "state":
                    # the group's state leaves as soon as the row's last chunk updated it
                    c0 = groups[u][0] * V
                    c1 = (groups[u][len(groups[u]) - 1] + 1) * V
                    nisa.dma_copy(dst=state_block(io["scratch"], cells[1], io["blk0"], K, c0,
                                                   c1), src=S[:, c0:c1])


_STATE_JOBS = ("rhs", "oq", "sub", "apply", "post_ops", "out", "state")
_WY_STATE_JOBS = ("out", "state")     # few_groups: the solve does not read the state


def chunk_stride(G, compact):
    """Steps between the starts of a body's chunks (_body_plan) for G head groups:
    _CHUNK_STEP, where the groups' jobs interleave between one group's dependent steps;
    with one group (TP4 at LNC=2, TP8) _ONE_GROUP_STEP, so all 8 chunks of a body are in
    flight at once and each chunk's dependent steps hide behind the other chunks' (modeled
    trn2, TP4 16K at LNC=2: 1.74 ms against 2.07 ms at _CHUNK_STEP; 10-90 % draws 1.71-2.48
    against 2.00-2.51 ms). Only ``compact`` tiles (compact_inputs) fit SBUF with the body
    in flight."""
    if G == 1 and compact:
        return _ONE_GROUP_STEP
    return _CHUNK_STEP


def _body_plan(jobs, G, n, stride, few):
    """The issue order of a loop body of n chunks: ``order[k]`` the job indices of chunk k in
    stage order and ``off[k][i]`` the step at which group 0 runs its stage i (group u at step
    off + u); ``nslot`` steps in all. Chunk 0 runs its jobs as listed; a later chunk runs its
    state-independent jobs first, from step stride * k (chunk_stride; + _FIRST_LEAD in a body
    of 4 or more chunks: chunk 0's doubling, which the body's first chain waits for, then
    shares the queues with fewer of the later chunks' jobs), and its jobs from k S on
    (_STATE_JOBS) once the chunk before has updated that group's state (program order is the
    state's data order)."""
    order = []
    off = []
    nslot = 0
    lead = 0
    if n >= 4:
        lead = _FIRST_LEAD
    for k in range(n):
        ok = []
        if k == 0:
            for s in range(len(jobs)):
                ok.append(s)
        else:
            for s in range(len(jobs)):
                if not _is_state_job(jobs[s], few):
                    ok.append(s)
            for s in range(len(jobs)):
                if _is_state_job(jobs[s], few):
                    ok.append(s)
        fk = []
        shift = 0
        for i in range(len(ok)):
            step = k * stride + i + shift
            if k > 0:
                step = step + lead
            if k > 0 and shift == 0 and _is_state_job(jobs[ok[i]], few):
                # the first state job: one step after the chunk before updates the state
                prev = off[k - 1][len(off[k - 1]) - 1]
                shift = max(prev + 1 - step, 0)
                step = step + shift
            fk.append(step)
        order.append(ok)
        off.append(fk)
        nslot = max(nslot, fk[len(fk) - 1] + G)
    return order, off, nslot


def _is_state_job(name, few):
    """Whether job ``name`` reads the state entering the chunk (directly or through k S;
    ``few``: the WY variant, where only the outputs and the state update read it)."""
    names = _STATE_JOBS
    if few:
        names = _WY_STATE_JOBS
    for x in names:
        if x == name:
            return True
    return False


def _group_jobs(few, L):
    """The jobs of one head group, in order (one per software-pipeline stage), and their
    arguments: q/k transposes, their masked products, gU, the decays, A^T, the packed
    solve's layout moves, the right-hand sides (k S), q S, the solve setup, per doubling
    round its squaring and inverse update, per substitution block its packed right-hand
    side and its application, the product operands, the outputs, the state update. The
    state-dependent k S and R go in early: they do not wait for the solve. The order
    differs with the head groups a chunk has:

    - < 8 groups (TP2, TP4, TP8, the WY form): the right-hand sides are [v | -e^c k] (no
      k S, no q S); the off-diagonal blocks are placed by their own job (``place_off``,
      DMAs) just before the solve setup; after the product operands ``wy`` forms
      nw^T kd and qd^T + (M nw)^T, and only the outputs and the state update read S;
    - >= 8 groups (TP1): q S after the second substitution block instead of beside k S,
      out of ScalarE's busiest stretch.

    ``few``: the first (``few_groups`` of the layer's value heads, so a program of an LNC
    grid computes its heads as LNC=1 does)."""
    nround = 0
    covered = 2
    while covered < BLOCK and covered < L:
        nround = nround + 1
        covered = covered * 2
    nblk = len(block_rows(L))
    jobs = ["qk_t", "qk_mm", "gu", "decay", "at", "place", "rhs", "place_off", "setup"]
    if not few:
        jobs = ["qk_t", "qk_mm", "gu", "decay", "at", "place", "rhs", "setup"]
    jarg = []
    for name in jobs:
        if name == "place":
            jarg.append(1 - few)        # the off-diagonal blocks too?
        else:
            jarg.append(0)
    for r in range(nround):
        jobs.append("square")
        jarg.append(2 ** (r + 1))
        jobs.append("update")
        jarg.append(2 ** (r + 1))
    for b in range(nblk):
        jobs.append("sub")
        jarg.append(b)
        jobs.append("apply")
        jarg.append(b)
        if not few and b == min(1, nblk - 1):
            jobs.append("oq")
            jarg.append(0)
    # >= 8 groups: M^T comes with A^T (group_at_mt) and kd in the place job; one step of
    # slack before the outputs, for the SBUF-to-SBUF DMAs that unpack the last block's solution
    tail = ["slack", "out", "state"]
    if few:
        tail = ["post_ops", "wy", "out", "state"]
    for name in tail:
        jobs.append(name)
        jarg.append(0)
    return jobs, jarg


def _group_job(job, x, u, hvs, ch, buf, pres, gdat, items, o, cst, solve, S, K, V, win, L, C):
    """Job ``job`` (argument ``x``) of head group ``u`` (the program's value heads ``hvs``,
    numbered within its window ``win``; see _group_jobs) of the chunk in ``buf`` / ``ch``."""
    qk_of = win["qk"]
    key = str(u)
    qk = ch["qk"]
    xdt = buf["v"].dtype
    few = win["few"]
    N = V               # width of the solve's right-hand sides: v, or [v | -e^c k] (WY)
    if few:
        N = V + K
    if job == "qk_t":
        pre = []
        for hv in hvs:
            pre.append({})
        pres[key] = pre
        gd = {}
        gd["X"] = []
        gdat[key] = gd
        for hv in hvs:
            h = qk_of[hv]
            if qk.get(str(h)) == None:  # noqa: E711  (NKI has no `is`)
                qk[str(h)] = qk_transposes(buf["k"], buf["q"], h, L, K, xdt != nl.float32)
                qk[str(h)]["group"] = u
        if few:
            # q's last reader (the next chunk's q lands after this job)
            for i in range(len(hvs)):
                head_qd(pre[i], buf["q"], ch["qs"], qk_of[hvs[i]], hvs[i], K)
    elif job == "qk_mm":
        for hv in hvs:
            d = qk[str(qk_of[hv])]
            if d["group"] == u and d.get("kk") == None:  # noqa: E711 (once per q/k head)
                qk_products(cst, d, L)
    elif job == "gu":
        gdat[key]["gU"] = nl.ndarray((L, len(hvs), L), dtype=nl.float32, buffer=nl.sbuf)
        for i in range(len(hvs)):
            head_gu(gdat[key]["gU"][:, i, :], cst, buf["g"], hvs[i], L)
    elif job == "decay":
        gdat[key]["DT"] = group_decay(cst, pres[key], gdat[key]["gU"], L)
        if not few:
            gdat[key]["DTb"] = group_beta_decay(gdat[key]["DT"], buf["beta"], hvs, L)
    elif job == "at" and not few:
        group_at_mt(qk, pres[key], gdat[key]["DTb"], hvs, qk_of, L)
    elif job == "at":
        for i in range(len(hvs)):
            head_at(qk[str(qk_of[hvs[i]])], pres[key][i], buf["beta"], hvs[i], L)
    elif job == "place":
        if not few and win["compact"]:
            # the decayed keys here: GpSimd's, off the late stages that VectorE binds (in
            # the slack step without compact tiles: SBUF)
            group_kd(pres[key], buf["k"], ch["dlb"], hvs, qk_of, L, K)
        ATs = []
        for d in pres[key]:
            ATs.append(d["AT"])
        solve_place(ATs, L, solve[u], True, x == 1, False, cst.get("sel"), xdt != nl.float32)
    elif job == "place_off":
        ATs = []
        for d in pres[key]:
            ATs.append(d["AT"])
        solve_place(ATs, L, solve[u], False, True, True)
    elif job == "setup":
        items[key] = solve_setup(len(hvs), L, cst, xdt, solve[u])
    elif job == "square":
        solve_round(items[key], x, xdt)
    elif job == "update":
        solve_update(items[key], x, xdt)
    elif job == "rhs":
        Rs = []
        for i in range(len(hvs)):
            if few:
                head_rhs_wy(pres[key][i], qk[str(qk_of[hvs[i]])], buf["v"], ch["nec"], hvs[i],
                             V, K)
            else:
                head_rhs(pres[key][i], qk[str(qk_of[hvs[i]])], buf["v"], ch["nec"], S, hvs[i],
                          V)
            Rs.append(pres[key][i]["R"])
        gdat[key]["Rs"] = Rs
        gdat[key]["Rp"] = None
        if solve[u]["G"] == None:  # noqa: E711  (packed unless place_g moves the inverses)
            gdat[key]["Rp"] = pack_rhs(Rs, L, V)
    elif job == "oq":
        for i in range(len(hvs)):
            head_oq(pres[key][i], qk[str(qk_of[hvs[i]])], ch["qs"], S, hvs[i], V)
    elif job == "sub":
        solve_rhs_block(items[key], gdat[key]["Rp"], x, N)
    elif job == "apply":
        if x == 0:
            for i in range(len(hvs)):
                gdat[key]["X"].append(nl.ndarray((L, N), dtype=nl.float32, buffer=nl.sbuf))
        solve_apply_block(items[key], gdat[key]["X"], x, N, gdat[key]["Rs"])
    elif job == "slack":
        if not win["compact"]:
            group_kd(pres[key], buf["k"], ch["dlb"], hvs, qk_of, L, K)
    elif job == "post_ops":
        for i in range(len(hvs)):
            head_post_ops(qk[str(qk_of[hvs[i]])], pres[key][i], ch["bs"], ch["dlb"], hvs[i],
                           L, K)
    elif job == "wy":
        group_wy(pres[key], gdat[key]["X"], cst["ident"], L, K, V, xdt != nl.float32)
    elif job == "out":
        c0 = hvs[0] * V
        c1 = (hvs[len(hvs) - 1] + 1) * V
        if few:
            group_out_wy(pres[key], gdat[key]["X"], S, ch["oc"][:, c0:c1], hvs, V,
                          xdt != nl.float32)
        else:
            group_out(pres[key], gdat[key]["X"], ch["oc"], cst["ident"], hvs, V,
                      xdt != nl.float32)
        # each group's o columns leave as soon as they are done
        nisa.dma_copy(dst=rows_view(o, ch["rows"], C, win["hv0"] * V + c0, c1 - c0),
                      src=ch["oc"][:, c0:c1])
    elif few:
        for i in range(len(hvs)):
            head_state_wy(S, pres[key][i], gdat[key]["X"][i], ch["el"], hvs[i], K, V,
                           xdt != nl.float32)
    else:
        for i in range(len(hvs)):
            head_state(S, pres[key][i]["kd"], gdat[key]["X"][i], ch["el"], hvs[i], K, V,
                        xdt != nl.float32)
