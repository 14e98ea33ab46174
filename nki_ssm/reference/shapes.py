"""The model shapes the suite is judged on, as data.

Used by simulate/ (the main job) and by model-shape tests. Each layer shape
is a frozen dataclass; `SSD_SHAPES`, `GDN_SHAPES`, `CONV_SHAPES` map a short
name to the shape, `SEQ_LENS` and `DECODE_BATCHES` are the sequence lengths
and decode batch sizes the project is judged on.

Derived numbers (stated so they can be checked):
  * Mamba-2 2.7B: d_model 2560, expand 2 -> d_inner 5120 = H * P = 80 * 64;
    conv over xBC: conv_dim = d_inner + 2 * G * N = 5120 + 256 = 5376.
  * Granite-4.0-H / Nemotron-H-like: d_inner = 128 * 64 = 8192,
    conv_dim = 8192 + 2 * 8 * 128 = 10240.
  * Falcon-H1-like: only N = 256 is fixed; H = 128 and G = 1 follow
    transformers' FalconH1Config defaults (mamba_n_heads, mamba_n_groups),
    P = 64 is our choice (as the other SSD shapes).
  * Qwen3-Next / Qwen3.5 GDN: conv over [q, k, v] channels:
    conv_dim = 2 * H * K + HV * V = 4096 + 4096 = 8192; tensor-parallel
    shards divide H, HV and conv_dim by tp.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ConvShape", "SSDShape", "GDNShape",
    "SSD_SHAPES", "GDN_SHAPES", "CONV_SHAPES", "SEQ_LENS", "DECODE_BATCHES",
    "gdn_tp_shard",
]


@dataclass(frozen=True)
class ConvShape:
    """Short causal depthwise conv: `dim` channels, width `W`."""
    name: str
    dim: int
    W: int


@dataclass(frozen=True)
class SSDShape:
    """Mamba-2 SSD layer: heads H, head dim P, dstate N, groups G, and its conv."""
    name: str
    H: int
    P: int
    N: int
    G: int
    W: int = 4

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv over [x, B, C]: H*P + 2*G*N."""
        return self.H * self.P + 2 * self.G * self.N

    @property
    def conv(self) -> ConvShape:
        return ConvShape(name=f"{self.name} conv", dim=self.conv_dim, W=self.W)


@dataclass(frozen=True)
class GDNShape:
    """Gated DeltaNet layer: q/k heads H, v heads HV, key dim K, value dim V."""
    name: str
    H: int
    HV: int
    K: int
    V: int
    W: int = 4
    tp: int = 1

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv over [q, k, v]: 2*H*K + HV*V."""
        return 2 * self.H * self.K + self.HV * self.V

    @property
    def conv(self) -> ConvShape:
        return ConvShape(name=f"{self.name} conv", dim=self.conv_dim, W=self.W)


def gdn_tp_shard(shape: GDNShape, tp: int) -> GDNShape:
    """The per-rank shape of `shape` under tensor parallelism `tp` (heads split)."""
    if tp < 1 or shape.H % tp or shape.HV % tp:
        raise ValueError(
            f"tp must be >= 1 and divide H = {shape.H} and HV = {shape.HV}, got {tp}"
        )
    return GDNShape(name=f"{shape.name} TP{tp}", H=shape.H // tp, HV=shape.HV // tp,
                    K=shape.K, V=shape.V, W=shape.W, tp=shape.tp * tp)


SSD_SHAPES: dict[str, SSDShape] = {
    "mamba2-2.7b": SSDShape("Mamba-2 2.7B", H=80, P=64, N=128, G=1),
    "granite-4.0-h": SSDShape("Granite-4.0-H / Nemotron-H-like", H=128, P=64, N=128, G=8),
    "falcon-h1": SSDShape("Falcon-H1-like", H=128, P=64, N=256, G=1),
}

_QWEN3_NEXT = GDNShape("Qwen3-Next-80B-A3B / Qwen3.5", H=16, HV=32, K=128, V=128)

GDN_SHAPES: dict[str, GDNShape] = {
    "qwen3-next": _QWEN3_NEXT,
    "qwen3-next-tp2": gdn_tp_shard(_QWEN3_NEXT, 2),
    "qwen3-next-tp4": gdn_tp_shard(_QWEN3_NEXT, 4),
    "qwen3-next-tp8": gdn_tp_shard(_QWEN3_NEXT, 8),
}

CONV_SHAPES: dict[str, ConvShape] = {
    "qwen3-next": _QWEN3_NEXT.conv,          # dim 8192
    "mamba2-2.7b": SSD_SHAPES["mamba2-2.7b"].conv,   # dim 5376
    "granite-4.0-h": SSD_SHAPES["granite-4.0-h"].conv,
}

# Tokens per sequence for prefill (1 = decode) and sequences per decode batch.
SEQ_LENS: tuple[int, ...] = (1, 128, 2048, 16384, 65536)
DECODE_BATCHES: tuple[int, ...] = (1, 8, 64, 128, 512)
