"""Custom ops torch.ops.nki_ssm.*: the host API on tensors, in place, opcheck, compile."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_cases import OPS, numpy_case, op_args, pool_name, to_torch  # noqa: E402

from nki_ssm import ops as host  # noqa: E402
from nki_ssm.torch import ops as tops  # noqa: E402
from nki_ssm.torch._convert import to_numpy  # noqa: E402


def _result(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("backend", ["reference", "sim"])
@pytest.mark.parametrize("op", OPS)
def test_matches_host_api_and_updates_pool_in_place(op, backend):
    kw = numpy_case(op)
    tkw = to_torch(kw)
    pool = tkw[pool_name(tkw)]
    ptr = pool.data_ptr()
    expected = getattr(host, op)(**kw, backend=backend)
    got = getattr(tops, op)(**tkw, backend=backend)
    np.testing.assert_array_equal(to_numpy(got), expected)
    assert got.dtype == torch.float32
    assert pool.data_ptr() == ptr
    np.testing.assert_array_equal(to_numpy(pool), kw[pool_name(kw)])


def test_bfloat16_round_trip_and_intermediate_states():
    import ml_dtypes

    kw = numpy_case("gated_delta_decode", dtype=ml_dtypes.bfloat16, pool_dtype=ml_dtypes.bfloat16)
    kw["return_intermediate_states"] = True
    tkw = to_torch(kw)
    o_ref, inter_ref = host.gated_delta_decode(**kw, backend="reference")
    o, inter = tops.gated_delta_decode(**tkw, backend="reference")
    assert o.dtype == inter.dtype == torch.bfloat16
    np.testing.assert_array_equal(to_numpy(o), o_ref)
    np.testing.assert_array_equal(to_numpy(inter), inter_ref)
    np.testing.assert_array_equal(to_numpy(tkw["ssm_states"]), kw["ssm_states"])


def test_strided_pool_view_is_updated_in_the_callers_tensor():
    kw = numpy_case("ssd_decode")
    tkw = to_torch(kw)
    big = torch.zeros((2,) + tuple(tkw["ssm_states"].shape))
    big[1] = tkw["ssm_states"]
    tkw["ssm_states"] = big[1].transpose(0, 1).contiguous().transpose(0, 1)  # strided
    host.ssd_decode(**kw, backend="reference")
    tops.ssd_decode(**tkw, backend="reference")
    np.testing.assert_array_equal(to_numpy(tkw["ssm_states"]), kw["ssm_states"])


@pytest.mark.parametrize("op", OPS)
def test_invalid_call_names_the_argument_and_leaves_pool_untouched(op):
    tkw = to_torch(numpy_case(op))
    name = pool_name(tkw)
    before = tkw[name].clone()
    tkw["state_indices"] = tkw["state_indices"].clone()
    tkw["state_indices"][0] = tkw[name].shape[0]      # out of range
    with pytest.raises(ValueError, match="state_indices"):
        getattr(tops, op)(**tkw, backend="sim")
    assert torch.equal(tkw[name], before)


@pytest.mark.parametrize("op", OPS)
def test_opcheck(op):
    tkw = to_torch(numpy_case(op))
    torch.library.opcheck(getattr(torch.ops.nki_ssm, op).default, op_args(op, tkw, "reference"))


@pytest.mark.parametrize("op", ["short_conv_prefill", "gated_delta_decode"])
def test_compiles_fullgraph_and_matches_eager(op):
    kw = numpy_case(op)
    eager, compiled = to_torch(kw), to_torch(kw)
    name = pool_name(kw)

    def f(**call):
        return _result(getattr(tops, op)(**call, backend="reference")) * 2.0

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(**compiled)
    want = f(**eager)
    assert torch.equal(got, want)
    assert torch.equal(compiled[name], eager[name])
