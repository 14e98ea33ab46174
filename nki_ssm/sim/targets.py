"""Trainium targets the simulator can check a kernel against.

The target is chosen the way the Neuron SDK chooses it: the environment
variable ``NEURON_PLATFORM_TARGET_OVERRIDE`` (``trn1|gen2|inf2``,
``trn2|gen3``, ``trn3|gen4``), read again at every query so tests and users
can switch it between launches. Unlike the SDK simulator (which defaults to
trn3), the default here is trn2: the suite is written for Trainium2.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"
DEFAULT = "trn2"

KiB = 1024

# Usable SBUF per partition = physical size minus this reserve. The SDK does
# not document the number behind nl.tile_size.sbuf_fmax_bytes ("total minus
# reserved bytes"); the compiler keeps part of every partition for spill/reload
# staging, DMA descriptor rings and semaphores. We reserve 16 KiB (7 % of a
# trn2 partition), so a kernel accepted here leaves the compiler that much
# headroom instead of relying on an undocumented figure.
SBUF_RESERVED_BYTES = 16 * KiB


@dataclass(frozen=True)
class Target:
    """Per-NeuronCore limits of one Trainium generation (nki_spec.md §3)."""

    name: str                     # "trn1" | "trn2" | "trn3"
    nc_version: int               # NeuronCore version: 2, 3, 4
    sbuf_bytes_per_partition: int
    sbuf_reserved_bytes: int = SBUF_RESERVED_BYTES
    pmax: int = 128
    psum_bank_bytes: int = 2 * KiB
    psum_num_banks: int = 8
    # nc_matmul: contraction K (partitions) <= 128, stationary free M <= 128,
    # moving free N <= one PSUM bank (512 fp32) on gen2/gen3; gen4 accepts up to
    # 4096 fp32 / 8192 bf16 destination columns.
    matmul_k_max: int = 128
    matmul_m_max: int = 128
    matmul_n_max_fp32: int = 512
    matmul_n_max_bf16: int = 512
    matmul_bf16_dst: bool = False  # gen4 may write bf16 into PSUM
    bn_stats_fmax: int = 512

    @property
    def nc_version_name(self) -> str:
        return f"gen{self.nc_version}"

    @property
    def sbuf_usable_bytes(self) -> int:
        """SBUF bytes per partition a kernel may keep live at once."""
        return self.sbuf_bytes_per_partition - self.sbuf_reserved_bytes

    @property
    def psum_bytes_per_partition(self) -> int:
        return self.psum_bank_bytes * self.psum_num_banks

    @property
    def psum_bank_fmax(self) -> int:
        return self.psum_bank_bytes // 4

    def matmul_n_max(self, dst_itemsize: int) -> int:
        """Largest moving free size N for a destination of ``dst_itemsize`` bytes."""
        return self.matmul_n_max_bf16 if dst_itemsize == 2 else self.matmul_n_max_fp32


TRN1 = Target(name="trn1", nc_version=2, sbuf_bytes_per_partition=192 * KiB)
TRN2 = Target(name="trn2", nc_version=3, sbuf_bytes_per_partition=224 * KiB)
TRN3 = Target(name="trn3", nc_version=4, sbuf_bytes_per_partition=256 * KiB,
              matmul_n_max_fp32=4096, matmul_n_max_bf16=8192, matmul_bf16_dst=True)

TARGETS = {"trn1": TRN1, "trn2": TRN2, "trn3": TRN3}
_ALIASES = {
    "trn1": "trn1", "gen2": "trn1", "inf2": "trn1",
    "trn2": "trn2", "gen3": "trn2",
    "trn3": "trn3", "gen4": "trn3",
}


def psum_usable_banks(target: Target | None = None) -> int:
    """PSUM banks a kernel may use: 8, or 7 when NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true
    on trn2+ (bank 7 is then reserved for transposes, nl.tile_size docs)."""
    t = target or current_target()
    flag = os.environ.get("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "").strip().lower() in ("1", "true")
    return t.psum_num_banks - 1 if (flag and t.nc_version >= 3) else t.psum_num_banks


def get_target(name: str | Target) -> Target:
    """The Target for ``name`` (any alias the SDK accepts, case-insensitive)."""
    if isinstance(name, Target):
        return name
    if not isinstance(name, str):
        raise TypeError(f"target: expected a str such as 'trn2', got {type(name).__name__}")
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        raise ValueError(f"target: expected one of {sorted(_ALIASES)}, got {name!r}")
    return TARGETS[key]


def current_target() -> Target:
    """The target named by NEURON_PLATFORM_TARGET_OVERRIDE (read now), default trn2."""
    value = os.environ.get(ENV_VAR, "")
    if not value.strip():
        return TARGETS[DEFAULT]
    try:
        return get_target(value)
    except ValueError:
        raise ValueError(
            f"{ENV_VAR}: expected one of {sorted(_ALIASES)}, got {value!r}") from None


__all__ = ["Target", "TARGETS", "TRN1", "TRN2", "TRN3", "ENV_VAR", "DEFAULT",
           "SBUF_RESERVED_BYTES", "psum_usable_banks", "get_target", "current_target"]
