"""Kernel entry points: ``jit``, ``Kernel``, ``simulate``, ``simulate_kernel``.

``simulate(kernel)(*args, **kwargs)`` runs a kernel eagerly on the CPU:

1. NumPy arrays (and torch CPU tensors) become HBM tensors holding copies;
   Python ints/floats/bools/str/None, tuples of them, enums and NKIObject
   instances pass through as compile-time values; lists are rejected (NKI
   0.3.0: "no list kernel arguments").
2. The function runs once per program of the LNC grid. ``kernel[2]``: programs
   0 and 1 run at once over the same HBM, as on the two physical cores of an
   LNC=2 logical core and in the SDK simulator (two threads, one
   ``program_id`` each: aws-neuron-sdk nki/guides/nki_simulator.rst,
   "Execution"), here in deterministic lock-step epochs between
   ``nisa.core_barrier`` / ``nisa.sendrecv`` synchronisations (``sim.lnc``),
   each with its own SBUF/PSUM, registers, loop state and capacity
   accounting; ``nl.shared_hbm`` allocations are shared between programs (the
   k-th shared allocation of program 1 is program 0's k-th); the two programs
   touching the same HBM bytes in one epoch, one of them writing, is an
   ``NkiRaceError`` (``sim.races``).
3. Returned tensors (one, or a tuple) must be in ``nl.shared_hbm`` (the NKI
   0.3.0 compiler rejects other outputs) and come back as NumPy arrays, read
   when every program has finished.
4. Inputs the kernel modified are written back into the caller's arrays —
   only when every program completed, so a failed launch changes nothing.

Before the first run the kernel's source (and every helper it reaches) is
checked against the Python subset the NKI compiler accepts (``subset.py``).
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from . import control as _control
from . import dtypes as _dt
from . import frontend as _frontend
from . import lnc as _lnc
from . import memory as _memory
from . import races as _races
from . import subset as _subset
from . import tensor as _tensor
from . import trace as _trace
from .errors import NkiValidationError
from .targets import Target, current_target

MAX_LNC = 2
_ml_bf16 = ml_dtypes.bfloat16


# ----------------------------------------------------------------- launch state

@dataclass
class _Launch:
    target: Target
    num_programs: int
    grid_ndim: int
    program_id: int = 0
    shared: list = field(default_factory=list)   # shared_hbm tensors of program 0, in order
    shared_cursor: int = 0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    arguments: frozenset = frozenset()                 # storage ids of the kernel's arguments
    scalar_accessed: dict = field(default_factory=dict)   # storage id -> "scalar_load" / "_store"


_launches: list[_Launch] = []
_last_usage: list[dict] = []


def last_memory_usage() -> list[dict]:
    """Per-program SBUF/PSUM usage (live, peak, limit) of the last completed launch."""
    return list(_last_usage)


def current_program_id() -> int:
    """``nl.program_id(0)`` of the running program (0 outside a launch)."""
    return _launches[-1].program_id if _launches else 0


def current_num_programs() -> int:
    return _launches[-1].num_programs if _launches else 1


def current_program_ndim() -> int:
    return _launches[-1].grid_ndim if _launches else 0


def is_kernel_argument(storage) -> bool:
    """``storage`` belongs to a tensor passed to the running kernel."""
    return bool(_launches) and storage.id in _launches[-1].arguments


def note_scalar_access(storage, inst: str) -> None:
    """``scalar_load`` / ``scalar_store`` touched ``storage`` (NKI 0.8.0: a returned tensor
    must not have been; checked when the kernel returns)."""
    if _launches:
        _launches[-1].scalar_accessed.setdefault(storage.id, inst)


def _tensors_in(value):
    if isinstance(value, _tensor.NkiTensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)


def _check_scalar_returned(launch: _Launch, result) -> None:
    for t in _tensors_in(result):
        inst = launch.scalar_accessed.get(t.storage.id)
        if inst is not None:
            raise NkiValidationError(
                f"kernel output: a returned tensor ({t.storage.name or 'unnamed'}) was used by "
                f"nisa.{inst}; scalar loads and stores operate on internal tiles (scalar_load / "
                "scalar_store API pages, SDK 2.34: \"Kernel arguments and returned tensors "
                "cannot be used directly\"): use an internal tile and dma_copy it")


def launch_rng() -> np.random.Generator:
    return _launches[-1].rng if _launches else np.random.default_rng(0)


def seed_launch_rng(seed: int) -> None:
    if _launches:
        _launches[-1].rng = np.random.default_rng(seed)


def allocate_in_launch(shape, dtype, buffer, name, fill) -> _tensor.NkiTensor:
    """nl.ndarray inside a launch: shared_hbm tensors are shared by the programs."""
    region = _tensor.as_region(buffer, "nl.ndarray buffer")
    launch = _launches[-1] if _launches else None
    if launch is None or region is not _tensor.MemoryRegion.shared_hbm or launch.num_programs == 1:
        return _tensor.allocate(shape, dtype, region, name, fill)
    if launch.program_id == 0:
        t = _tensor.allocate(shape, dtype, region, name, fill)
        launch.shared.append(t)
        _races.note_allocation(t.storage)
        return t
    k = launch.shared_cursor
    launch.shared_cursor += 1
    if k >= len(launch.shared):
        raise NkiValidationError(
            f"nl.ndarray: program {launch.program_id} allocates more shared_hbm tensors than "
            "program 0 (LNC programs must run identical control flow)")
    t = launch.shared[k]
    from .dtypes import as_dtype
    if tuple(t.shape) != tuple(shape) or t.dtype != as_dtype(dtype):
        raise NkiValidationError(
            f"nl.ndarray: shared_hbm allocation #{k} of program {launch.program_id} is "
            f"{tuple(shape)} {dtype}, program 0's is {t.shape} {t.dtype} (LNC programs must "
            "allocate the same shared tensors)")
    return t


# ----------------------------------------------------------------- arguments

def _is_torch_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "numpy")


_COMPILE_TIME = (int, float, bool, str, type(None), enum.Enum, np.integer, np.floating, np.bool_)


def _convert_arg(name: str, value, inputs: list, region=_tensor.MemoryRegion.private_hbm):
    """Kernel argument -> NkiTensor (arrays) or compile-time value; records arrays in ``inputs``.

    Arrays become ``nl.hbm`` tensors (``nl.shared_hbm`` under LNC2), as in the SDK simulator.
    """
    from .language import NKIObject
    if isinstance(value, _tensor.NkiTensor):
        return value
    if isinstance(value, np.ndarray) or _is_torch_tensor(value):
        arr = _to_numpy_from_torch(value) if _is_torch_tensor(value) else value
        try:
            t = _tensor.from_array(arr, region, name)
        except TypeError as e:
            raise TypeError(f"kernel argument {name!r}: {e}") from None
        inputs.append((value, t))
        return t
    if isinstance(value, list):
        raise TypeError(f"kernel argument {name!r}: lists are not accepted as kernel arguments "
                        "(NKI 0.3.0); pass a tuple")
    if isinstance(value, tuple):
        return tuple(_convert_arg(f"{name}[{i}]", v, inputs, region) for i, v in enumerate(value))
    if isinstance(value, (np.integer, np.bool_)) or (isinstance(value, np.floating)
                                                     and not isinstance(value, float)):
        # the front end converts Python bool/int/float only (KLR interop/klr/gather.c
        # const_expr / value); a NumPy scalar is not one (np.float64 is a float subclass)
        raise TypeError(f"kernel argument {name!r}: NumPy scalar {value!r} "
                        f"({type(value).__name__}); pass a Python int, float or bool")
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
            and not -2**31 <= int(value) < 2**31:
        # the front end holds compile-time ints as 32-bit (KLR interop/klr/gather.c)
        raise NkiValidationError(f"kernel argument {name!r}: integer {int(value)} is outside the "
                                 f"32-bit range NKI compile-time ints have")
    if isinstance(value, _COMPILE_TIME) or isinstance(value, NKIObject):
        return value
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise TypeError(f"kernel argument {name!r}: dict keys must be str, got {bad[0]!r}")
        return {k: _convert_arg(f"{name}[{k!r}]", v, inputs, region) for k, v in value.items()}
    raise TypeError(f"kernel argument {name!r}: expected a NumPy array, a scalar, str, None, "
                    f"a tuple, an Enum or an NKIObject, got {type(value).__name__}")


def _convert_output(value, where: str = "output", read: bool = True, arguments=frozenset()):
    """Returned shared_hbm tensors -> NumPy (``read=False``: only check they may be returned).

    A returned kernel argument (storage id in ``arguments``) is accepted in any HBM: a kernel
    that updates an input in place and returns it (its caller's buffer is the state) gives
    back the updated values, and the caller's array is updated too (``_write_back``), as on
    the device, where the returned tensor is the argument's own memory."""
    if value is None:
        return None
    if isinstance(value, _tensor.NkiTensor):
        if value.storage.kind is not _tensor.MemoryRegion.shared_hbm \
                and value.storage.id not in arguments:
            raise NkiValidationError(
                f"kernel {where}: returned tensors must be allocated in nl.shared_hbm "
                f"(NKI 0.3.0), got a tensor in {value.storage.kind.value}")
        out = value.read()
        # NKI_PRECISE_FP=0 holds bf16 / fp8 as float32 inside the kernel; the caller gets the
        # output's own dtype (rounded once, here)
        return out.astype(value.dtype.np) if value.storage.widened else out
    if isinstance(value, (tuple, list)):
        return tuple(_convert_output(v, f"{where}[{i}]", read, arguments)
                     for i, v in enumerate(value))
    raise NkiValidationError(f"kernel {where}: a kernel returns shared_hbm tensors (or a tuple "
                             f"of them, or None), got {type(value).__name__}")


def _to_torch(value):
    """NumPy outputs -> torch tensors (when the kernel was given torch tensors)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(_to_torch(v) for v in value)
    import torch  # only reached with a torch argument
    if value.dtype == np.dtype(_ml_bf16):
        return torch.from_numpy(np.ascontiguousarray(value).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(value))


def _to_numpy_from_torch(t) -> np.ndarray:
    import torch  # only reached with a torch argument
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(_ml_bf16)
    return t.numpy()


def _write_back(inputs) -> None:
    for orig, t in inputs:
        new = t.storage.data.reshape(t.shape)
        if _is_torch_tensor(orig):
            before = np.ascontiguousarray(_to_numpy_from_torch(orig))
            if not np.array_equal(before.view(np.uint8), np.ascontiguousarray(new).view(np.uint8)):
                orig.data.copy_(_to_torch(np.array(new)))
            continue
        if not _bytes_equal(orig, new):
            orig[...] = new.reshape(orig.shape)


# bytes compared at once by _bytes_equal: a whole-array comparison would allocate one bool
# per byte (1.3 GB for a 512-sequence fp32 SSD decode pool)
_COMPARE_BYTES = 1 << 24


def _bytes_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` hold the same bytes (compared block by block)."""
    a = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    b = np.ascontiguousarray(b).view(np.uint8).reshape(-1)
    if a.size != b.size:
        return False
    for i in range(0, a.size, _COMPARE_BYTES):
        if not np.array_equal(a[i:i + _COMPARE_BYTES], b[i:i + _COMPARE_BYTES]):
            return False
    return True


# ----------------------------------------------------------------- specialisations

_specialisations: dict[str, set] = {}


def _static_key(value):
    """The cache-key part of one kernel argument: shape and dtype for arrays (and tensors),
    the value itself for compile-time constants (NKI language guide, "Kernel Caching")."""
    if isinstance(value, np.ndarray) or _is_torch_tensor(value):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, tuple):
        return ("tuple", tuple(_static_key(v) for v in value))
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__qualname__, value.name)
    try:
        hash(value)
        return (type(value).__qualname__, value)
    except TypeError:
        return (type(value).__qualname__, repr(value))


def _note_specialisation(fn, num_programs, args, kwargs) -> None:
    from .targets import current_target
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    key = (current_target().name, num_programs, tuple(_static_key(a) for a in args),
           tuple(sorted((k, _static_key(v)) for k, v in kwargs.items())))
    _specialisations.setdefault(name, set()).add(key)


def specialisations() -> dict[str, int]:
    """For each kernel launched in this process: how many distinct programs the real toolchain
    would have compiled (distinct cache keys: tensor shapes and dtypes, the value of every
    non-tensor argument, the LNC grid and the target)."""
    return {name: len(keys) for name, keys in _specialisations.items()}


def reset_specialisations() -> None:
    """Forget every kernel seen so far (tests count specialisations from a clean slate)."""
    _specialisations.clear()


# ----------------------------------------------------------------- running

def _run(fn, num_programs: int, grid_ndim: int, args, kwargs, kernel=None):
    if _launches:
        # (only reached when the outer source cannot be read: the subset check rejects
        # calls to jit kernels from a kernel) run it inline
        return fn(*args, **kwargs)
    _dt.precise_fp()        # NKI_PRECISE_FP=0|1 (sim.dtypes): a bad value fails before the run
    # the compiler parses the source: Python it rejects fails here, before anything runs;
    # the launch runs a copy that applies the front end's trace-time rules (sim.frontend)
    runner = _frontend.prepare(fn, _subset.check_kernel(fn))
    _note_specialisation(fn, num_programs, args, kwargs)
    target = current_target()
    tr = _trace.current()
    if tr is not None and not tr.target:
        tr.target = target.name
    inputs: list = []
    names = _arg_names(fn, len(args))
    region = _tensor.MemoryRegion.shared_hbm if num_programs > 1 else _tensor.MemoryRegion.private_hbm
    cargs = tuple(_convert_arg(n, a, inputs, region) for n, a in zip(names, args))
    ckwargs = {k: _convert_arg(k, v, inputs, region) for k, v in kwargs.items()}
    launch = _Launch(target=target, num_programs=num_programs, grid_ndim=grid_ndim,
                     arguments=frozenset(t.storage.id for t in _tensors_in((cargs, ckwargs))))

    def program(pid: int):
        """One program: its own loop state and SBUF/PSUM accounting; (result, usage, its
        control flow)."""
        _control.begin_program()
        try:
            with _memory.launch(target) as tracker:
                result = runner(*cargs, **ckwargs)
                # outputs must be shared_hbm (or a kernel argument)
                _convert_output(result, read=False, arguments=launch.arguments)
                if launch.scalar_accessed:
                    _check_scalar_returned(launch, result)
                return result, tracker.usage(), _control.flow_record()
        finally:
            _control.end_program()

    _launches.append(launch)
    try:
        if num_programs == 1:
            ran = [program(0)]
        else:
            # LNC=2: both programs at once over the same HBM, in lock-step (sim.lnc)
            ran = _lnc.Lockstep(launch, program).run()
    finally:
        _launches.remove(launch)
    # outputs are read once every program has finished (program 0's return value: both
    # programs return the same shared tensors)
    out = _convert_output(ran[0][0], arguments=launch.arguments)
    if num_programs > 1:
        # one control flow for every program (sim.control.check_same_flow)
        _control.check_same_flow([flow for _, _, flow in ran])
    usage = [u for _, u, _ in ran]
    if kernel is not None:
        kernel.last_memory_usage = usage
    global _last_usage
    _last_usage = usage
    _write_back(inputs)
    if any(_is_torch_tensor(orig) for orig, _ in inputs):
        out = _to_torch(out)
    return out


def _arg_names(fn, n: int) -> list[str]:
    code = getattr(fn, "__code__", None)
    names = list(code.co_varnames[:code.co_argcount]) if code is not None else []
    return [names[i] if i < len(names) else f"arg{i}" for i in range(n)]


class Kernel:
    """A ``@nki.jit`` kernel. ``kernel[lnc]`` sets the LNC grid (1 or 2);
    calling it with NumPy arrays simulates it (no Neuron device here)."""

    def __init__(self, fn, **kwargs):
        for bad in ("platform_target", "mode"):
            if bad in kwargs:
                raise NkiValidationError(
                    f"nki.jit: '{bad}=' is not accepted since NKI 0.3.0; set "
                    "NEURON_PLATFORM_TARGET_OVERRIDE and use nki.simulate(kernel) instead")
        self.func = fn
        self.kwargs = dict(kwargs)
        self.grid = 1
        self.last_memory_usage: list[dict] = []
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid) -> "Kernel":
        if isinstance(grid, tuple):
            if len(grid) != 1:
                raise NkiValidationError(f"kernel[grid]: only a 1-D LNC grid is supported, got {grid}")
            grid = grid[0]
        if isinstance(grid, bool) or not isinstance(grid, (int, np.integer)) or not 1 <= grid <= MAX_LNC:
            raise NkiValidationError(f"kernel[lnc]: lnc must be 1 or 2 (one LNC spans at most two "
                                     f"physical cores), got {grid!r}")
        k = Kernel.__new__(Kernel)
        k.__dict__.update(self.__dict__)
        k.grid = int(grid)
        k.last_memory_usage = []
        return k

    def simulate(self, *args, **kwargs):
        return _run(self.func, self.grid, 1 if self.grid > 1 else 0, args, kwargs, self)

    def __call__(self, *args, **kwargs):
        return self.simulate(*args, **kwargs)

    def with_schedule(self, schedule) -> "Kernel":
        """Scheduling hints change nothing in program-order execution."""
        return self

    def __repr__(self):
        return f"nki.jit({getattr(self.func, '__name__', self.func)!r}, grid={self.grid})"


def jit(fn=None, **kwargs):
    """``@nki.jit`` or ``@nki.jit(**options)``: wrap a kernel function in a Kernel."""
    if fn is None:
        return lambda f: Kernel(f, **kwargs)
    if isinstance(fn, Kernel):
        return fn
    if not callable(fn):
        raise TypeError(f"nki.jit: expected a function, got {type(fn).__name__}")
    return Kernel(fn, **kwargs)


def simulate(kernel):
    """``nki.simulate(kernel)(*args, **kwargs)`` -> NumPy outputs (see module doc)."""
    if isinstance(kernel, Kernel):
        return kernel.simulate
    if callable(kernel):
        k = Kernel(kernel)
        return k.simulate
    raise TypeError(f"nki.simulate: expected a kernel, got {type(kernel).__name__}")


def simulate_kernel(kernel, *args, **kwargs):
    """Older spelling: ``simulate_kernel(kernel, *arrays)``."""
    return simulate(kernel)(*args, **kwargs)


__all__ = ["Kernel", "jit", "specialisations", "reset_specialisations", "simulate", "simulate_kernel", "current_program_id", "last_memory_usage",
           "is_kernel_argument", "note_scalar_access",
           "current_num_programs", "current_program_ndim", "MAX_LNC"]
