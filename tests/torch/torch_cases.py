"""Small valid calls of the six custom ops as torch tensors (tests/torch helpers)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import nki_ssm.torch  # noqa: F401  (registers torch.ops.nki_ssm)
from nki_ssm.reference import inputs as gen
from nki_ssm.torch._convert import from_numpy

OPS = ("short_conv_prefill", "short_conv_decode", "ssd_prefill", "ssd_decode",
       "gated_delta_prefill", "gated_delta_decode")
POOL_NAMES = ("conv_states", "ssm_states")
# an empty sequence, one not a multiple of the chunk (16), and one padding sequence
SEQLENS = [5, 0, 19]


def numpy_case(op: str, *, seed: int = 0, dtype=np.float32, pool_dtype=np.float32) -> dict:
    """Keyword arguments of a valid host-API call of ``op`` (NumPy)."""
    rng = np.random.default_rng(seed)
    common = dict(dtype=dtype, pool_dtype=pool_dtype, padding=1)
    if op == "short_conv_prefill":
        return gen.make_short_conv_inputs(rng, seqlens=SEQLENS, dim=8, W=4, **common)
    if op == "short_conv_decode":
        return gen.make_short_conv_decode_inputs(rng, num_seqs=3, T=2, dim=8, W=4, **common)
    if op == "ssd_prefill":
        kw = gen.make_ssd_inputs(rng, seqlens=SEQLENS, H=4, P=8, N=16, G=2, z=True, **common)
        return dict(kw, chunk_size=16, precision="fp32")
    if op == "ssd_decode":
        return gen.make_ssd_decode_inputs(rng, num_seqs=3, T=2, H=4, P=8, N=16, G=2, z=True,
                                          **common)
    if op == "gated_delta_prefill":
        kw = gen.make_gated_delta_inputs(rng, seqlens=SEQLENS, H=2, HV=4, K=16, V=8, **common)
        return dict(kw, chunk_size=16)
    if op == "gated_delta_decode":
        return gen.make_gated_delta_decode_inputs(rng, num_seqs=3, T=2, H=2, HV=4, K=16, V=8,
                                                  **common)
    raise KeyError(op)


def to_torch(kw: dict) -> dict:
    """The same call with every array a fresh CPU tensor."""
    return {k: from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}


def op_args(op: str, tkw: dict, backend: str) -> tuple:
    """Positional arguments of torch.ops.nki_ssm.<op> (schema order) from keyword arguments."""
    schema = getattr(torch.ops.nki_ssm, op).default._schema
    defaults = {"bias": None, "D": None, "z": None, "dt_bias": None, "g": None, "beta": None,
                "a": None, "b": None, "A_log": None, "scale": None, "dt_softplus": False,
                "dt_limit": [0.0, float("inf")], "use_qk_l2norm": False,
                "return_intermediate_states": False, "backend": backend}
    args = []
    for arg in schema.arguments:
        value = tkw.get(arg.name, defaults.get(arg.name))
        if arg.name == "dt_limit":
            value = list(value)
        args.append(value)
    return tuple(args)


def pool_name(kw: dict) -> str:
    return next(n for n in POOL_NAMES if n in kw)


def rel(actual: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error in float64."""
    a, r = actual.double(), ref.double()
    return float(torch.linalg.vector_norm(a - r) / max(float(torch.linalg.vector_norm(r)), 1e-30))


def ref_conv(x, w, b=None, initial_states=None, activation=None):
    """[B, D, T] causal depthwise conv (F.conv1d), initial_states prepended: (out, final)."""
    width = w.shape[1]
    pre = x.new_zeros(x.shape[0], x.shape[1], width - 1) if initial_states is None else initial_states
    full = torch.cat([pre, x], dim=-1)
    if x.shape[2] == 0:
        return x.clone(), full
    out = F.conv1d(full, w.unsqueeze(1), b, groups=x.shape[1])
    out = out if activation is None else F.silu(out)
    return out, full[..., -(width - 1):]


def ref_conv_update(x, state, w, b=None, activation=None, cache_seqlens=None):
    """The peer's update semantics on a [B, D, S] state (in place), x [B, D, T]."""
    width, S = w.shape[1], state.shape[2]
    T = x.shape[2]
    if cache_seqlens is None:
        full = torch.cat([state, x], dim=-1)
        state.copy_(full[..., -S:])
    else:
        win = torch.remainder(cache_seqlens[:, None].long() + torch.arange(-(width - 1), 0), S)
        full = torch.cat([state.gather(2, win[:, None].expand(-1, x.shape[1], -1)), x], -1)
        put = torch.remainder(cache_seqlens[:, None].long() + torch.arange(T), S)
        state.scatter_(2, put[:, None].expand(-1, x.shape[1], -1), x)
    out = F.conv1d(full, w.unsqueeze(1), b, groups=x.shape[1])[..., -T:]
    return out if activation is None else F.silu(out)


def fla_gdn_inputs(B=2, T=13, H=2, HV=4, K=16, V=8, seed=0, decay=0.5) -> dict:
    """FLA-layout gated delta rule inputs: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, log
    decays g = -decay * softplus(N(0, 1)) and beta ``[B, T, HV]``, initial_state
    ``[B, HV, K, V]`` (float32 torch tensors)."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V),
                g=-F.softplus(r(B, T, HV)) * decay, beta=torch.rand(B, T, HV, generator=gen),
                initial_state=r(B, HV, K, V) * 0.1)
