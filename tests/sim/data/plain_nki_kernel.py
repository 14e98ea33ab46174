"""A kernel written for the Neuron SDK, unmodified: it imports `nki` itself.

Used by tests/sim/test_install.py, which imports it after
nki_ssm.sim.install() so `import nki` resolves to the simulator.
"""
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def add_rows_kernel(a, b):
    """out = a + b for [N, F] inputs, tiled over 128-row blocks; under LNC=2 the blocks
    alternate between the two programs."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    n, f = a.shape
    for i in range(nl.program_id(0), (n + nl.tile_size.pmax - 1) // nl.tile_size.pmax,
                   nl.num_programs(0)):
        r0 = i * nl.tile_size.pmax
        rows = min(nl.tile_size.pmax, n - r0)
        ta = nl.ndarray((rows, f), dtype=a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray((rows, f), dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a[r0:r0 + rows, :])
        nisa.dma_copy(dst=tb, src=b[r0:r0 + rows, :])
        tc = nl.ndarray((rows, f), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=tc, data1=ta, data2=tb, op=nl.add)
        nisa.dma_copy(dst=out[r0:r0 + rows, :], src=tc)
    return out
