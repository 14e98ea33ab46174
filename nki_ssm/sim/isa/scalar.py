"""ScalarE instructions: ``activation`` and ``activation_reduce``."""
from __future__ import annotations

import numpy as np

from . import _alu as A
from . import _core as C
from . import _state as S
from ._enums import check_enum, reduce_cmd as _rc

_F32 = np.float32


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=_rc.idle, name=None):
    """``dst = op(data * scale + bias)`` on ScalarE in float32, with optional add-reduction.

    ``scale``: float32 scalar or ``(P, 1)`` float32 tile. ``bias``: ``(P, 1)``
    tile of any dtype but tfloat32, or (NeuronCore-v3+) a scalar.
    ``reduce_cmd`` drives ScalarE ``reduce_regs``: reset / reset_reduce zero
    them; reduce / reset_reduce add the free-dim sum of the activated values;
    ``reduce_res`` (P, 1) receives the registers. ``reduce_op`` must be nl.add.
    """
    inst = "activation"
    C.check_name(inst, name)
    reduce_cmd = check_enum(inst, "reduce_cmd", reduce_cmd, _rc)
    fn_name = A.op_name(op)
    if fn_name not in A.ACTIVATIONS:
        C.fail(inst, f"op must be an activation function (nl.exp, nl.silu, nl.copy, ...), got {op!r}")
    C.tile(inst, "dst", dst)
    C.tile(inst, "data", data)
    C.same_shape(inst, "data", data, "dst", dst)
    P = data.shape[0]
    if reduce_op is not None:
        A.require_op(inst, "reduce_op", reduce_op, ("add",), "nl.add")
    if reduce_cmd in (_rc.reduce, _rc.reset_reduce) and reduce_op is None:
        C.fail(inst, f"reduce_cmd={reduce_cmd} needs reduce_op=nl.add")
    if reduce_cmd is _rc.load_reduce:
        C.fail(inst, "reduce_cmd.load_reduce is not supported by activation (idle, reset, reduce, reset_reduce)")
    if reduce_res is not None:
        C.column(inst, "reduce_res", reduce_res, P)
    # scale
    sc = C.scalar_or_column(inst, "scale", scale, P, fp32=True)
    # bias
    if bias is None:
        b = None
    elif C.is_tensor(bias):
        C.column(inst, "bias", bias, P)
        if bias.dtype.name == "tfloat32":
            C.fail(inst, "bias cannot be tfloat32")
        b = C.read_f32(bias)
    else:
        if C.target().nc_version < 3:
            C.fail(inst, f"a scalar bias needs NeuronCore-v3 or newer (use a ({P}, 1) tile on "
                         f"{C.target().name}), got {bias!r}")
        b = C.scalar_or_column(inst, "bias", bias, P, fp32=True)
    x = C.read_f32(data)
    with np.errstate(all="ignore"):
        if not (isinstance(sc, np.float32) and sc == 1.0):
            x = x * sc
        if b is not None:
            x = x + b
        y = np.asarray(A.ACTIVATIONS[fn_name](np.asarray(x, dtype=_F32)), dtype=_F32)
    C.write(dst, y)
    regs = S.scalar_regs()
    lanes = slice(data.partition_start, data.partition_start + P)
    if reduce_cmd in (_rc.reset, _rc.reset_reduce):
        regs[lanes] = 0.0
    if reduce_cmd in (_rc.reduce, _rc.reset_reduce):
        regs[lanes] = regs[lanes] + y.sum(axis=1, dtype=_F32)
    if reduce_res is not None:
        C.write(reduce_res, regs[lanes].reshape(P, 1))
    reads = [data] + [t for t in (bias, scale) if C.is_tensor(t)]
    F = dst.elements_per_partition
    return C.emit(inst, "scalar", name, reads=reads,
                  writes=[dst] + ([reduce_res] if reduce_res is not None else []),
                  num_partitions=P, free=data.elements_per_partition, num_inputs=1,
                  nbytes=P * F * dst.dtype.itemsize,
                  compute=(dst, data), reduce=reduce_cmd in (_rc.reduce, _rc.reset_reduce),
                  attrs={"reduce_res": reduce_res is not None, "function": fn_name},
                  operands={"dst": dst, "data": data, "reduce_res": reduce_res})


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation(..., reduce_cmd=reset_reduce)``: ``reduce_res = sum(op(data*scale + bias))`` per partition."""
    return activation(dst=dst, op=op, data=data, bias=bias, scale=scale, reduce_op=reduce_op,
                      reduce_res=reduce_res, reduce_cmd=_rc.reset_reduce, name=name)
