"""How the short conv kernels share their channels between the programs of an LNC launch.

Both kernels are depthwise: every channel is independent, so an LNC=2 launch splits
the channels in two halves, program p taking channels ``[p * Dp, (p + 1) * Dp)``,
each program running the same code on its ``Dp`` channels (the same program size;
released form: nki-library d2ad3a5 experimental/conv/depthwise_conv1d.py:146-156,
``C_per_shard = C // nl.num_programs()``, ``c_global_start = shard_id * C_per_shard +
...``). No two programs share an output byte or a pool byte, and nothing is reduced
across channels, so the results equal the LNC=1 results.

Plain Python evaluated at trace time (and by the launcher, to build the tables).
"""

TILE = 128          # channels of one partition tile: the unit of work


def program_channels(dim, programs):
    """(Dp, parts): each of the ``parts`` programs that share the work takes ``Dp``
    channels. Two halves when there are two programs, at least two 128-channel tiles
    (dim > 128) and an even dim; else (one tile, an odd dim, or one program) program 0
    takes every channel and a second program gets no work (parts = 1)."""
    if programs == 2 and dim > TILE and dim % 2 == 0:
        return (dim // 2, 2)
    return (dim, 1)
