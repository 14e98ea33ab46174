"""``nki.isa.constants``: the ISA enums under the module path nki-library imports
(``from nki.isa.constants import dge_mode, oob_mode``).

Absolute import on purpose: when ``nki_ssm.sim.install()`` serves this
package as ``nki.isa``, a relative import would load a second copy of the
enum classes and ``nisa.*`` calls would reject the members.
"""
from nki_ssm.sim.isa._enums import (dge_mode, dma_engine, engine, matmul_perf_mode, nc_version,
                                    oob_mode, reduce_cmd)

__all__ = ["dge_mode", "dma_engine", "engine", "matmul_perf_mode", "nc_version", "oob_mode",
           "reduce_cmd"]
