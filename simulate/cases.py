"""The cases of the main job: every op at the model shapes it is judged on.

A :class:`Case` names an op (family + entry), a model shape, the batch
layout (prefill: sequence lengths; decode: sequences x tokens) and dtypes,
and knows its algorithmic minimum FLOPs and HBM bytes for the roofline.

Sets: ``smoke`` (tiny, for the tests), ``default`` (every op at the judged model
shapes at sizes that run in a few minutes: 2K-token prefill of the Qwen3-Next conv,
Mamba-2 2.7B SSD and Qwen3-Next GDN TP1 and TP4, decode at 32 / 64 sequences, the
backwards at 512 tokens (conv: 2K) with their forwards, and a 128-token prefill of the
Mamba-2 conv, the Granite-4.0-H SSD and the Qwen3-Next GDN), ``judged`` (the shapes the performance goals
are stated at: conv 16K x 1 and 8 x 2K ragged, conv decode at 32 / 512 sequences,
Mamba-2 2.7B SSD 16K and 8 x 2K ragged, SSD decode at 1 / 32 / 512 sequences, GDN
prefill Qwen3-Next TP1 16K, 2K and 8 x 2K ragged, TP4 16K, GDN decode at 64 sequences;
the backward of conv, SSD and GDN TP1 at 16K),
``full`` (every shape at 128 / 2K / 16K / 64K tokens, 8 x 2K ragged, decode batches
1..512, backward at 2K / 16K / 8 x 2K).

Backward cases (entry "backward": ``ops.<family>_backward``) take the inputs of their
forward (:meth:`Case.forward`, the prefill case of the same shape, batch and dtypes),
float32 initial states, an output gradient in the data dtype and a float32 final-state
gradient.

Layer configuration (part of the case id, e.g. ``.../bf16,w-bf16,nobias,pool-bf16``):
the conv weights are in the model dtype and the conv state pool too (as vLLM
keeps the conv state), the conv has a bias
where the model's has one (Qwen3-Next: ``nn.Conv1d(..., bias=False)`` in
transformers' modeling_qwen3_next; Mamba-2 ``use_conv_bias=True``,
Granite-4.0-H ``mamba_conv_bias=True`` by default); SSD and GDN state pools
are float32 (the default of every GPU implementation of these layers).

FLOP models (stated so they can be checked; the "minimum" is the work of the
chunked TensorE formulation, counted as the H100 yardsticks of ``simulate/h100.py``
are, so TFLOP/s figures are comparable):
  * SSD prefill, per token per head: 2*C*(N + P) + 4*P*N, C = chunk_size.
  * GDN prefill, per token per value head: 6*K*V + 2*C*(3*K + 2*V), C = chunk_size.
  * short conv: 2*W per token per channel.
  * decode: SSD 4*P*N and GDN 6*K*V per token per (value) head (VectorE work).
  * backward: 2 x the forward's (each forward product gives two gradient products).
HBM bytes: every input array read once (data, parameters and the small
int / bool metadata), every output written once, named state slots read
(when has_initial_state, for prefill) and written once; backward: every argument
read once, every gradient written once.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

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
    ("short_conv", "backward"): "short_conv_backward", ("mamba2_ssd", "backward"): "ssd_backward",
    ("gated_delta", "backward"): "gated_delta_backward",
}
ENTRIES = ("prefill", "decode", "backward")
# does the model's short conv have a bias? (sources: module docstring)
CONV_BIAS = {"qwen3-next": False, "mamba2-2.7b": True, "granite-4.0-h": True}
# float64 reference chunk for SSD prefill: the chunked form is exact for any chunk size,
# and 64 runs ~2x faster in NumPy than the kernel's 128 (measured at Mamba-2 2.7B, 2K tokens)
SSD_REFERENCE_CHUNK = 64

_SHORT = {"bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}


def dtype_tag(dt) -> str:
    """Short dtype name for case ids: bf16, fp32, fp64."""
    name = np.dtype(dt).name
    return _SHORT.get(name, name)


def _pool_state_name(family: str) -> str:
    return "conv_states" if family == "short_conv" else "ssm_states"


@dataclass(frozen=True)
class Case:
    """One op call at one shape and layer configuration.

    ``pool_dtype`` None: the model dtype for the conv state, float32 for SSD /
    GDN states. ``weight_dtype`` None: the conv weight (and bias) in ``dtype``.
    ``bias``: whether the conv has a bias (conv only).
    """

    family: str
    entry: str                   # "prefill", "decode" or "backward" (of the prefill)
    model: str                   # key into reference.shapes tables
    shape: object                # ConvShape / SSDShape / GDNShape
    seqlens: tuple = ()          # prefill, backward
    num_seqs: int = 0            # decode
    T: int = 1                   # decode tokens per sequence
    dtype: np.dtype = BF16
    pool_dtype: np.dtype | None = None
    chunk_size: int = 0          # 0: the op's default
    weight_dtype: np.dtype | None = None
    bias: bool = True
    tags: tuple = field(default=())

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if self.entry not in ENTRIES:
            raise ValueError(f"entry must be one of {ENTRIES}, got {self.entry!r}")
        if self.pool_dtype is None:
            # the functional training ops take float32 initial states (backward: no pool)
            pool = self.dtype if self.family == "short_conv" and self.entry != "backward" else F32
            object.__setattr__(self, "pool_dtype", np.dtype(pool))
        if self.weight_dtype is None:
            object.__setattr__(self, "weight_dtype", np.dtype(self.dtype))

    @property
    def op(self) -> str:
        return OP_NAMES[(self.family, self.entry)]

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.T if self.entry == "decode" else int(sum(self.seqlens))

    def forward(self) -> "Case":
        """A backward case's forward: the prefill case of the same shape, batch and dtypes."""
        if self.entry != "backward":
            raise ValueError(f"forward() is for backward cases, got entry {self.entry!r}")
        return replace(self, entry="prefill", pool_dtype=None, tags=())

    @property
    def config(self) -> str:
        """dtypes and options of the layer, e.g. ``bf16,w-bf16,nobias,pool-bf16`` or ``bf16,state-fp32``."""
        if self.family == "short_conv":
            state = "state" if self.entry == "backward" else "pool"
            return (f"{dtype_tag(self.dtype)},w-{dtype_tag(self.weight_dtype)},"
                    f"{'bias' if self.bias else 'nobias'},{state}-{dtype_tag(self.pool_dtype)}")
        return f"{dtype_tag(self.dtype)},state-{dtype_tag(self.pool_dtype)}"

    @property
    def id(self) -> str:
        if self.entry != "decode":
            lens = self.seqlens
            layout = (f"{len(lens)}x{lens[0]}" if len(set(lens)) == 1 else f"ragged{len(lens)}:{sum(lens)}")
        else:
            layout = f"{self.num_seqs}seq" + (f"x{self.T}tok" if self.T != 1 else "")
        return f"{self.op}/{self.model}/{layout}/{self.config}"

    @property
    def chunk(self) -> int:
        if self.chunk_size:
            return self.chunk_size
        return {"mamba2_ssd": 128, "gated_delta": 64}.get(self.family, 0)

    @property
    def pool_name(self) -> str:
        return _pool_state_name(self.family)

    # ---- inputs ------------------------------------------------------------
    def make_inputs(self, seed: int = 0) -> dict:
        if self.entry == "backward":
            return _backward_inputs(self, seed)
        rng = np.random.default_rng(seed)
        s = self.shape
        if self.family == "short_conv":
            common = dict(dim=s.dim, W=s.W, dtype=self.dtype, pool_dtype=self.pool_dtype,
                          bias=self.bias, weight_dtype=self.weight_dtype)
            if self.entry == "prefill":
                kw = inp.make_short_conv_inputs(rng, seqlens=self.seqlens, **common)
            else:
                kw = inp.make_short_conv_decode_inputs(rng, num_seqs=self.num_seqs, T=self.T, **common)
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
                # None: the kernel's default chunk (min_flops keeps FLA's C = 64 count)
                kw["chunk_size"] = self.chunk_size or None
            else:
                kw = inp.make_gated_delta_decode_inputs(rng, num_seqs=self.num_seqs, T=self.T, H=s.H,
                                                        HV=s.HV, K=s.K, V=s.V, dtype=self.dtype,
                                                        pool_dtype=self.pool_dtype)
        return kw

    def pool_bytes(self) -> int:
        """Bytes of the state pool this case allocates (slots = num_seqs + 3, as the generators;
        backward: none, its states are per sequence)."""
        if self.entry == "backward":
            return 0
        s = self.shape
        per_slot = {"short_conv": lambda: s.dim * (s.W - 1),
                    "mamba2_ssd": lambda: s.H * s.P * s.N,
                    "gated_delta": lambda: s.HV * s.K * s.V}[self.family]()
        seqs = len(self.seqlens) if self.entry == "prefill" else self.num_seqs
        return int((seqs + 3) * per_slot * np.dtype(self.pool_dtype).itemsize)

    # ---- roofline inputs -----------------------------------------------------
    def min_flops(self) -> float:
        if self.entry == "backward":
            return BACKWARD_FLOPS_PER_FORWARD * self.forward().min_flops()
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
        """Every input array read once, the output written once, named pool slots read
        (when the sequence has an initial state) and written once."""
        kw = kwargs if kwargs is not None else self.make_inputs()
        if self.entry == "backward":
            return _backward_hbm_bytes(self, kw)
        pools = self.pool_name
        # every array counts, whatever its dtype (bfloat16's dtype kind is "V", not "f")
        total = float(sum(v.nbytes for name, v in kw.items()
                          if isinstance(v, np.ndarray) and name != pools))
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


# backward case arguments taken from the prefill inputs (the functional forward's), and the
# name of the output's gradient with the array it is shaped like
BACKWARD_ARGS = {
    "short_conv": ("x", "weight", "bias", "activation", "cu_seqlens"),
    "mamba2_ssd": ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "dt_limit",
                   "cu_seqlens", "chunk_size"),
    "gated_delta": ("q", "k", "v", "g", "beta", "a", "b", "A_log", "dt_bias", "scale",
                    "use_qk_l2norm", "cu_seqlens", "chunk_size"),
}
OUTPUT_GRAD = {"short_conv": ("dy", "x"), "mamba2_ssd": ("dy", "x"), "gated_delta": ("do", "v")}
# gradients of a backward call and the input each has the shape and dtype of
# (d_initial_states: float32, like the states)
BACKWARD_GRADS = {
    "short_conv": dict(dx="x", dweight="weight", dbias="bias", d_initial_states="initial_states"),
    "mamba2_ssd": dict(dx="x", ddt="dt", dA="A", dB="B", dC="C", dD="D", dz="z",
                       ddt_bias="dt_bias", d_initial_states="initial_states"),
    "gated_delta": dict(dq="q", dk="k", dv="v", dg="g", dbeta="beta", da="a", db="b",
                        dA_log="A_log", ddt_bias="dt_bias", d_initial_states="initial_states"),
}
# backward FLOPs = 2 x the forward's minimum: each forward product A.B gives the two
# gradient products dA and dB (the usual training-step count; recomputation not counted)
BACKWARD_FLOPS_PER_FORWARD = 2.0


def _backward_inputs(case: Case, seed: int) -> dict:
    """Arguments of ``nki_ssm.ops.<family>_backward``: the forward case's prefill inputs,
    every sequence starting from its pool slot's state (float32 ``initial_states``), a
    standard-normal output gradient in the data dtype and float32 ``d_final_states``."""
    kw = case.forward().make_inputs(seed)
    rng = np.random.default_rng(seed + 1)
    args = {name: kw[name] for name in BACKWARD_ARGS[case.family]}
    grad, like = OUTPUT_GRAD[case.family]
    args[grad] = rng.standard_normal(kw[like].shape).astype(case.dtype)
    states = np.asarray(kw[case.pool_name])[np.asarray(kw["state_indices"])].astype(case.pool_dtype)
    args["initial_states"] = states
    args["d_final_states"] = rng.standard_normal(states.shape).astype(case.pool_dtype)
    return args


def _backward_hbm_bytes(case: Case, kw: dict) -> float:
    """Every argument array read once, every gradient written once (each the size of its
    input; d_initial_states that of the states)."""
    arrays = [v for v in kw.values() if isinstance(v, np.ndarray)]
    grads = [kw[src] for src in BACKWARD_GRADS[case.family].values() if kw.get(src) is not None]
    return float(sum(a.nbytes for a in arrays) + sum(a.nbytes for a in grads))


def _backward(family, model, shape, lens, **kw):
    if family == "short_conv":
        kw.setdefault("bias", CONV_BIAS.get(model, True))
    return Case(family, "backward", model, shape, seqlens=tuple(lens), **kw)


def _prefill(family, model, shape, lens, **kw):
    if family == "short_conv":
        kw.setdefault("bias", CONV_BIAS.get(model, True))
    return Case(family, "prefill", model, shape, seqlens=tuple(lens), **kw)


def _decode(family, model, shape, num_seqs, T=1, **kw):
    if family == "short_conv":
        kw.setdefault("bias", CONV_BIAS.get(model, True))
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
        _backward("short_conv", "tiny", conv, [100, 28], tags=("smoke",)),
        _backward("mamba2_ssd", "tiny", ssd, [64], tags=("smoke",)),
        _backward("gated_delta", "tiny", gdn, [64], tags=("smoke",)),
    ]


def judged_cases() -> list[Case]:
    """The cases the performance goals are stated at (bf16 activations): the forwards at 16K
    tokens and the other judged batches, decode up to 512 sequences, the backwards at 16K."""
    conv, m2 = S.CONV_SHAPES["qwen3-next"], S.SSD_SHAPES["mamba2-2.7b"]
    q3, q3tp4 = S.GDN_SHAPES["qwen3-next"], S.GDN_SHAPES["qwen3-next-tp4"]
    return [
        _prefill("short_conv", "qwen3-next", conv, [16384]),
        _prefill("short_conv", "qwen3-next", conv, [2048] * 8),
        _decode("short_conv", "qwen3-next", conv, 32),
        _decode("short_conv", "qwen3-next", conv, 512),
        _prefill("mamba2_ssd", "mamba2-2.7b", m2, [16384]),
        _prefill("mamba2_ssd", "mamba2-2.7b", m2, [2048] * 8),
        _decode("mamba2_ssd", "mamba2-2.7b", m2, 1),
        _decode("mamba2_ssd", "mamba2-2.7b", m2, 32),
        _decode("mamba2_ssd", "mamba2-2.7b", m2, 512),
        _prefill("gated_delta", "qwen3-next", q3, [16384]),
        _prefill("gated_delta", "qwen3-next", q3, [2048]),
        _prefill("gated_delta", "qwen3-next", q3, [2048] * 8),
        _prefill("gated_delta", "qwen3-next-tp4", q3tp4, [16384]),
        _decode("gated_delta", "qwen3-next", q3, 64),
    ] + backward_judged_cases()


def backward_judged_cases() -> list[Case]:
    """The backward of each family at its forward's judged 16K shape (bf16 I/O)."""
    return [_backward("short_conv", "qwen3-next", S.CONV_SHAPES["qwen3-next"], [16384]),
            _backward("mamba2_ssd", "mamba2-2.7b", S.SSD_SHAPES["mamba2-2.7b"], [16384]),
            _backward("gated_delta", "qwen3-next", S.GDN_SHAPES["qwen3-next"], [16384])]


# The default set's backward cases: (family, model, tokens), each with its forward. 512 tokens
# for SSD and GDN (their float64 reference backward keeps 5-8 MB of states per token, and the
# kernel simulation at 2K took minutes); the conv's 2K backward is cheap.
DEFAULT_BACKWARD = (("short_conv", "qwen3-next", 2048), ("mamba2_ssd", "mamba2-2.7b", 512),
                    ("gated_delta", "qwen3-next", 512))


def default_cases() -> list[Case]:
    """Every op at the judged model shapes, at sizes a first run can wait for (a few minutes
    on 2 cores, under 4 GB): the 2K-token prefill of the Qwen3-Next conv (dim 8192), Mamba-2
    2.7B SSD and Qwen3-Next GDN TP1 and TP4; decode at 32 sequences (conv, SSD; SSD also at 1)
    and 64 (GDN); the backwards of :data:`DEFAULT_BACKWARD` with their forwards; and a
    128-token prefill of the Mamba-2 conv (with bias), the Granite-4.0-H SSD (8 groups) and
    the Qwen3-Next GDN (one chunk).
    ``--set judged`` runs the 16K / 512-sequence shapes the performance goals are stated at."""
    conv, m2 = S.CONV_SHAPES["qwen3-next"], S.SSD_SHAPES["mamba2-2.7b"]
    q3, q3tp4 = S.GDN_SHAPES["qwen3-next"], S.GDN_SHAPES["qwen3-next-tp4"]
    out = [
        _prefill("short_conv", "qwen3-next", conv, [2048]),
        _decode("short_conv", "qwen3-next", conv, 32),
        _prefill("mamba2_ssd", "mamba2-2.7b", m2, [2048]),
        _decode("mamba2_ssd", "mamba2-2.7b", m2, 1),
        _decode("mamba2_ssd", "mamba2-2.7b", m2, 32),
        _prefill("gated_delta", "qwen3-next", q3, [2048]),
        _prefill("gated_delta", "qwen3-next-tp4", q3tp4, [2048]),
        _decode("gated_delta", "qwen3-next", q3, 64),
        _prefill("short_conv", "mamba2-2.7b", S.CONV_SHAPES["mamba2-2.7b"], [128]),
        _prefill("mamba2_ssd", "granite-4.0-h", S.SSD_SHAPES["granite-4.0-h"], [128]),
        _prefill("gated_delta", "qwen3-next", q3, [128]),
    ]
    for family, model, n in DEFAULT_BACKWARD:
        bwd = _backward(family, model, dict(_FAMILY_SHAPES)[family][model], [n])
        if bwd.forward().id not in {c.id for c in out}:
            out.append(bwd.forward())
        out.append(bwd)
    return out


_FAMILY_SHAPES = (("short_conv", S.CONV_SHAPES), ("mamba2_ssd", S.SSD_SHAPES),
                  ("gated_delta", S.GDN_SHAPES))


def full_cases() -> list[Case]:
    """Everything: all shapes, 128 / 2K / 16K / 64K tokens, ragged 8x2048, decode 1..512
    (+ 4-token decode for GDN, the speculative-verification case)."""
    out = []
    for family, shapes in _FAMILY_SHAPES:
        for key, shape in shapes.items():
            out += [_prefill(family, key, shape, [n]) for n in (128, 2048, 16384, 65536)]
            out.append(_prefill(family, key, shape, [2048] * 8))
            out += [_decode(family, key, shape, b) for b in S.DECODE_BATCHES]
            if family == "gated_delta":
                out.append(_decode(family, key, shape, 128, T=4))
            out += [_backward(family, key, shape, lens) for lens in ([2048], [16384], [2048] * 8)]
    return out


def state_elements(case: Case) -> int:
    """Elements of one sequence's state (conv: dim x (W - 1); SSD: H x P x N; GDN: HV x K x V)."""
    s = case.shape
    return {"short_conv": lambda: s.dim * (s.W - 1), "mamba2_ssd": lambda: s.H * s.P * s.N,
            "gated_delta": lambda: s.HV * s.K * s.V}[case.family]()


# Seconds per 1e9 (token x state element) a case takes at --lnc both (the kernel simulated at
# both LNCs, the 15 scheduling passes of the 10-90 % interval, the float64 reference), from
# the default set's cases on 2 cores; with a fixed second per case, for the progress estimate.
SECONDS_PER_GIGA_WORK = {
    ("short_conv", "prefill"): 119.0, ("short_conv", "decode"): 254.0, ("short_conv", "backward"): 358.0,
    ("mamba2_ssd", "prefill"): 12.2, ("mamba2_ssd", "decode"): 229.0, ("mamba2_ssd", "backward"): 44.7,
    ("gated_delta", "prefill"): 37.2, ("gated_delta", "decode"): 238.0, ("gated_delta", "backward"): 74.6,
}


def expected_seconds(case: Case) -> float:
    """A rough expected run time of ``case`` in ``python -m simulate`` on 2 idle cores."""
    work = case.num_tokens * state_elements(case) / 1e9
    return 1.0 + SECONDS_PER_GIGA_WORK[(case.family, case.entry)] * work


SETS = {"smoke": smoke_cases, "judged": judged_cases, "default": default_cases, "full": full_cases}


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
