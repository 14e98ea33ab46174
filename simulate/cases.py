"""The cases of the main job: every op at the model shapes of DESIGN.md.

A :class:`Case` names an op (family + entry), a model shape, the batch
layout (prefill: sequence lengths; decode: sequences x tokens) and dtypes,
and knows its algorithmic minimum FLOPs and HBM bytes for the roofline.

Sets: ``smoke`` (tiny, for the test), ``default`` (model shapes: one 2K-token
prefill per family, 128 tokens for the other shapes, 64-sequence decode; a
few minutes on 2 cores), ``full`` (adds 16K / 64K tokens, 512-sequence decode,
ragged batches, every shape).

FLOP models (stated so they can be checked; the "minimum" is the work of the
chunked TensorE formulation, counted as peers.md §10.1 counts the H100
yardsticks, so TFLOP/s figures are comparable):
  * SSD prefill, per token per head: 2*C*(N + P) + 4*P*N, C = chunk_size.
  * GDN prefill, per token per value head: 6*K*V + 2*C*(3*K + 2*V), C = chunk_size.
  * short conv: 2*W per token per channel.
  * decode: SSD 4*P*N and GDN 6*K*V per token per (value) head (VectorE work).
HBM bytes: every input read once, every output written once, named state
slots read (when has_initial_state, for prefill) and written once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from nki_ssm.reference import inputs as inp
from nki_ssm.reference import shapes as S

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)

FAMILIES = ("short_conv", "mamba2_ssd", "gated_delta")
# op name as in nki_ssm.ops for (family, entry)
OP_NAMES = {
    ("short_conv", "prefill"): "short_conv_prefill", ("short_conv", "decode"): "short_conv_decode",
    ("mamba2_ssd", "prefill"): "ssd_prefill", ("mamba2_ssd", "decode"): "ssd_decode",
    ("gated_delta", "prefill"): "gated_delta_prefill", ("gated_delta", "decode"): "gated_delta_decode",
}


@dataclass(frozen=True)
class Case:
    """One op call at one shape."""

    family: str
    entry: str                   # "prefill" or "decode"
    model: str                   # key into reference.shapes tables
    shape: object                # ConvShape / SSDShape / GDNShape
    seqlens: tuple = ()          # prefill
    num_seqs: int = 0            # decode
    T: int = 1                   # decode tokens per sequence
    dtype: np.dtype = BF16
    pool_dtype: np.dtype = F32
    chunk_size: int = 0          # 0: the op's default
    tags: tuple = field(default=())

    @property
    def op(self) -> str:
        return OP_NAMES[(self.family, self.entry)]

    @property
    def num_tokens(self) -> int:
        return int(sum(self.seqlens)) if self.entry == "prefill" else self.num_seqs * self.T

    @property
    def id(self) -> str:
        if self.entry == "prefill":
            lens = self.seqlens
            layout = (f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else f"ragged{len(lens)}:{sum(lens)}")
        else:
            layout = f"{self.num_seqs}seq" + (f"x{self.T}tok" if self.T != 1 else "")
        return f"{self.op}/{self.model}/{layout}/{np.dtype(self.dtype).name}"

    @property
    def chunk(self) -> int:
        if self.chunk_size:
            return self.chunk_size
        return {"mamba2_ssd": 128, "gated_delta": 64}.get(self.family, 0)

    # ---- inputs ------------------------------------------------------------
    def make_inputs(self, seed: int = 0) -> dict:
        rng = np.random.default_rng(seed)
        s = self.shape
        if self.family == "short_conv":
            if self.entry == "prefill":
                kw = inp.make_short_conv_inputs(rng, seqlens=self.seqlens, dim=s.dim, W=s.W,
                                                dtype=self.dtype, pool_dtype=self.pool_dtype)
            else:
                kw = inp.make_short_conv_decode_inputs(rng, num_seqs=self.num_seqs, T=self.T, dim=s.dim,
                                                       W=s.W, dtype=self.dtype, pool_dtype=self.pool_dtype)
        elif self.family == "mamba2_ssd":
            if self.entry == "prefill":
                kw = inp.make_ssd_inputs(rng, seqlens=self.seqlens, H=s.H, P=s.P, N=s.N, G=s.G,
                                         dtype=self.dtype, pool_dtype=self.pool_dtype)
                kw["chunk_size"] = self.chunk
            else:
                kw = inp.make_ssd_decode_inputs(rng, num_seqs=self.num_seqs,
                                                T=None if self.T == 1 else self.T, H=s.H, P=s.P,
                                                N=s.N, G=s.G, dtype=self.dtype,
                                                pool_dtype=self.pool_dtype)
        else:
            if self.entry == "prefill":
                kw = inp.make_gated_delta_inputs(rng, seqlens=self.seqlens, H=s.H, HV=s.HV, K=s.K,
                                                 V=s.V, dtype=self.dtype, pool_dtype=self.pool_dtype)
                kw["chunk_size"] = self.chunk
            else:
                kw = inp.make_gated_delta_decode_inputs(rng, num_seqs=self.num_seqs, T=self.T, H=s.H,
                                                        HV=s.HV, K=s.K, V=s.V, dtype=self.dtype,
                                                        pool_dtype=self.pool_dtype)
        return kw

    def pool_bytes(self) -> int:
        """Bytes of the state pool this case allocates (slots = num_seqs + 3, as the generators)."""
        s = self.shape
        per_slot = {"short_conv": lambda: s.dim * (s.W - 1),
                    "mamba2_ssd": lambda: s.H * s.P * s.N,
                    "gated_delta": lambda: s.HV * s.K * s.V}[self.family]()
        seqs = len(self.seqlens) if self.entry == "prefill" else self.num_seqs
        return int((seqs + 3) * per_slot * np.dtype(self.pool_dtype).itemsize)

    # ---- roofline inputs -----------------------------------------------------
    def min_flops(self) -> float:
        s, n = self.shape, self.num_tokens
        if self.family == "short_conv":
            return 2.0 * s.W * s.dim * n
        if self.family == "mamba2_ssd":
            if self.entry == "prefill":
                return float(n * s.H * (2 * self.chunk * (s.N + s.P) + 4 * s.P * s.N))
            return float(n * s.H * 4 * s.P * s.N)
        if self.entry == "prefill":
            return float(n * s.HV * (6 * s.K * s.V + 2 * self.chunk * (3 * s.K + 2 * s.V)))
        return float(n * s.HV * 6 * s.K * s.V)

    def min_hbm_bytes(self, kwargs: dict | None = None) -> float:
        """Inputs read once, outputs written once, named pool slots read (if needed) and written."""
        kw = kwargs if kwargs is not None else self.make_inputs()
        pools = {"short_conv": "conv_states"}.get(self.family, "ssm_states")
        total = 0.0
        for name, v in kw.items():
            if isinstance(v, np.ndarray) and name != pools and v.dtype.kind in "fc":
                total += v.nbytes
        pool = kw[pools]
        idx = np.asarray(kw["state_indices"])
        live = idx >= 0
        slot_bytes = pool.nbytes / pool.shape[0]
        reads = (np.asarray(kw["has_initial_state"])[live].sum() if "has_initial_state" in kw
                 else live.sum())
        total += slot_bytes * (reads + live.sum())
        out_like = {"short_conv": "x", "mamba2_ssd": "x", "gated_delta": "v"}[self.family]
        total += kw[out_like].nbytes  # output has the shape and dtype of x (v for GDN)
        return float(total)


def _prefill(family, model, shape, lens, **kw):
    return Case(family, "prefill", model, shape, seqlens=tuple(lens), **kw)


def _decode(family, model, shape, num_seqs, T=1, **kw):
    return Case(family, "decode", model, shape, num_seqs=num_seqs, T=T, **kw)


def smoke_cases() -> list[Case]:
    """Tiny shapes (not model shapes): the main job's mechanics in seconds."""
    conv = S.ConvShape("tiny conv", dim=256, W=4)
    ssd = S.SSDShape("tiny SSD", H=2, P=64, N=128, G=1)
    gdn = S.GDNShape("tiny GDN", H=1, HV=2, K=128, V=128)
    return [
        _prefill("short_conv", "tiny", conv, [100, 28], tags=("smoke",)),
        _decode("short_conv", "tiny", conv, 4, tags=("smoke",)),
        _prefill("mamba2_ssd", "tiny", ssd, [64], tags=("smoke",)),
        _decode("mamba2_ssd", "tiny", ssd, 2, tags=("smoke",)),
        _prefill("gated_delta", "tiny", gdn, [64], tags=("smoke",)),
        _decode("gated_delta", "tiny", gdn, 2, tags=("smoke",)),
    ]


def default_cases() -> list[Case]:
    """Model shapes; one 2K-token prefill per family, 128 tokens for the other shapes,
    64-sequence decode (a few minutes on 2 cores)."""
    q3, q3tp4 = S.GDN_SHAPES["qwen3-next"], S.GDN_SHAPES["qwen3-next-tp4"]
    m2, gr = S.SSD_SHAPES["mamba2-2.7b"], S.SSD_SHAPES["granite-4.0-h"]
    return [
        _prefill("short_conv", "qwen3-next", S.CONV_SHAPES["qwen3-next"], [2048]),
        _prefill("short_conv", "mamba2-2.7b", S.CONV_SHAPES["mamba2-2.7b"], [128]),
        _decode("short_conv", "qwen3-next", S.CONV_SHAPES["qwen3-next"], 64),
        _prefill("mamba2_ssd", "mamba2-2.7b", m2, [2048]),
        _prefill("mamba2_ssd", "granite-4.0-h", gr, [128]),
        _decode("mamba2_ssd", "mamba2-2.7b", m2, 64),
        _prefill("gated_delta", "qwen3-next-tp4", q3tp4, [2048]),
        _prefill("gated_delta", "qwen3-next", q3, [128]),
        _decode("gated_delta", "qwen3-next", q3, 64),
    ]


def full_cases() -> list[Case]:
    """Everything: all shapes, 128 / 2K / 16K / 64K tokens, ragged 8x2048, decode 1..512 (+T=4)."""
    out = []
    for key, conv in S.CONV_SHAPES.items():
        for n in (128, 2048, 16384, 65536):
            out.append(_prefill("short_conv", key, conv, [n]))
        out.append(_prefill("short_conv", key, conv, [2048] * 8))
        for b in S.DECODE_BATCHES:
            out.append(_decode("short_conv", key, conv, b))
    for key, ssd in S.SSD_SHAPES.items():
        for n in (128, 2048, 16384, 65536):
            out.append(_prefill("mamba2_ssd", key, ssd, [n]))
        out.append(_prefill("mamba2_ssd", key, ssd, [2048] * 8))
        for b in S.DECODE_BATCHES:
            out.append(_decode("mamba2_ssd", key, ssd, b))
    for key, gdn in S.GDN_SHAPES.items():
        for n in (128, 2048, 16384, 65536):
            out.append(_prefill("gated_delta", key, gdn, [n]))
        out.append(_prefill("gated_delta", key, gdn, [2048] * 8))
        for b in S.DECODE_BATCHES:
            out.append(_decode("gated_delta", key, gdn, b))
        out.append(_decode("gated_delta", key, gdn, 128, T=4))
    return out


def select(cases: list[Case], models=None, ops=None) -> list[Case]:
    """Filter by model key substring(s) and op / family name(s)."""
    out = []
    for c in cases:
        if models and not any(m in c.model for m in models):
            continue
        if ops and not any(o in (c.op, c.family, c.entry) or o in c.op for o in ops):
            continue
        out.append(c)
    return out
