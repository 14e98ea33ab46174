"""Put the nki_ssm kernels under a Hugging Face transformers model: ``patch(model)``.

transformers (5.x) routes every kernel call of its Gated DeltaNet and Mamba-2
layers through module-level functions (``causal_conv1d_fn``,
``causal_conv1d_update``, ``torch_chunk_gated_delta_rule``,
``torch_recurrent_gated_delta_rule``, ``mamba2_chunk_scan``,
``mamba2_selective_state_update``), each the hub-kernel mapping's
``use_kernel_func_from_hub_with_fallback`` wrapper around the package
(FLA, causal-conv1d, mamba_ssm) or the torch fallback. Those names are the
same peer functions our drop-ins mirror, so ``patch`` swaps them *for the
patched layers only*: each known layer's ``forward`` is replaced (on the
instance) by a copy of its class's forward whose globals map those names to
``nki_ssm.torch.fla`` / ``.causal_conv1d`` / ``.mamba_ssm``, behind the same
keyword filtering the mapping applies (keyword arguments a function does not
take are dropped). transformers' decorators on ``forward`` (accelerate hooks,
deprecated keyword names) are kept. Other models and other instances of the
same class keep the stock path; nothing in transformers is modified.

Why not the hub mapping itself: it resolves each name through the ``kernels``
package to a Hub repository per device type (``cuda``, ``rocm``, ``xpu``,
``mps``, ``npu``; no ``neuron`` or ``cpu``), once, at import, for every model
of the process. Swapping the same names per layer gives the same effect for
the layers asked for, needs no ``kernels`` package or download, and keeps
the patched layer traceable by ``torch.compile(fullgraph=True)`` (the patched
globals live in a module registered in ``sys.modules``, which dynamo needs to
build its guards).

Known layers: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE Gated DeltaNet; the Mamba-2
mixers of Mamba2, Bamba, FalconH1, NemotronH, GraniteMoeHybrid and Zamba2
(those the installed transformers ships). ``patch`` returns the
``(qualified name, class name)`` of every layer it patched and raises
ValueError for a model with none of them. Patching twice is a no-op for
already patched layers. The backend is ``nki_ssm.torch.get_backend()`` at call
time (``use_backend("reference")`` to run the float64 reference).
"""
from __future__ import annotations

import functools
import inspect
import sys
import types

import torch

from . import causal_conv1d as _conv
from . import fla as _fla
from . import mamba_ssm as _mamba

_GDN_NAMES = {
    "causal_conv1d_fn": _conv.causal_conv1d_fn,
    "causal_conv1d_update": _conv.causal_conv1d_update,
    "torch_chunk_gated_delta_rule": _fla.chunk_gated_delta_rule,
    "torch_recurrent_gated_delta_rule": _fla.fused_recurrent_gated_delta_rule,
}
_MAMBA2_NAMES = {
    "causal_conv1d_fn": _conv.causal_conv1d_fn,
    "causal_conv1d_update": _conv.causal_conv1d_update,
    "mamba2_chunk_scan": _mamba.mamba_chunk_scan_combined,
    "mamba2_selective_state_update": _mamba.selective_state_update,
}
# class name -> (transformers model family, names swapped in its forward)
KNOWN_LAYERS = {
    "Qwen3NextGatedDeltaNet": ("qwen3_next", _GDN_NAMES),
    "Qwen3_5GatedDeltaNet": ("qwen3_5", _GDN_NAMES),
    "Qwen3_5MoeGatedDeltaNet": ("qwen3_5_moe", _GDN_NAMES),
    "Mamba2Mixer": ("mamba2", _MAMBA2_NAMES),
    "BambaMixer": ("bamba", _MAMBA2_NAMES),
    "FalconH1Mixer": ("falcon_h1", _MAMBA2_NAMES),
    "NemotronHMamba2Mixer": ("nemotron_h", _MAMBA2_NAMES),
    "GraniteMoeHybridMambaLayer": ("granitemoehybrid", _MAMBA2_NAMES),
    "Zamba2MambaMixer": ("zamba2", _MAMBA2_NAMES),
}
_MARK = "_nki_ssm_patched"


def _filtered(fn):
    """``fn`` called with only the keyword arguments it names (as the hub mapping does)."""
    params = frozenset(n for n, p in inspect.signature(fn).parameters.items()
                       if p.kind is not inspect.Parameter.VAR_KEYWORD)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **{k: v for k, v in kwargs.items() if k in params})

    return call


def _is_known(module) -> bool:
    entry = KNOWN_LAYERS.get(type(module).__name__)
    return entry is not None and type(module).__module__.startswith(
        f"transformers.models.{entry[0]}.")


def _with_globals(func, replacements: dict):
    """A copy of ``func`` (and of the functools.wraps decorators around it) whose innermost
    function resolves the names in ``replacements`` to the given objects."""
    inner = getattr(func, "__wrapped__", None)
    if inner is None:
        missing = [n for n in replacements if n not in func.__globals__]
        if missing:
            raise ValueError(f"{func.__qualname__} no longer calls {', '.join(missing)}: this "
                             f"transformers version is not supported by nki_ssm.torch.hf")
        new = types.FunctionType(func.__code__, _scope(func, replacements), func.__name__,
                                 func.__defaults__, func.__closure__)
    else:
        new_inner = _with_globals(inner, replacements)
        cells, swapped = [], False
        for cell in func.__closure__ or ():
            try:
                holds_inner = cell.cell_contents is inner
            except ValueError:           # empty cell
                holds_inner = False
            cells.append(types.CellType(new_inner) if holds_inner else cell)
            swapped = swapped or holds_inner
        if not swapped:
            raise ValueError(f"cannot rebuild the decorator around {func.__qualname__}")
        new = types.FunctionType(func.__code__, func.__globals__, func.__name__,
                                 func.__defaults__, tuple(cells))
        new.__dict__.update(func.__dict__)
        new.__wrapped__ = new_inner
    new.__kwdefaults__ = func.__kwdefaults__
    new.__qualname__ = func.__qualname__
    new.__doc__ = func.__doc__
    return new


def _scope(func, replacements: dict) -> dict:
    """Globals for the patched copy of ``func``: its module's, with ``replacements``.

    They live in a module registered in ``sys.modules`` under its own name, because
    torch.compile re-imports a function's globals by their ``__name__`` when it
    builds guards (a bare dict named like the transformers module would make it
    guard on the stock functions instead of ours).
    """
    source = func.__globals__
    name = f"{__name__}._patched.{source['__name__']}.{func.__qualname__}"
    module = types.ModuleType(name, f"{func.__qualname__} on the nki_ssm drop-ins")
    module.__dict__.update({k: v for k, v in source.items()
                            if k not in ("__name__", "__spec__", "__loader__", "__doc__")})
    module.__dict__.update(replacements)
    sys.modules[name] = module
    return module.__dict__


def _require_plain_functions(cls, names) -> None:
    """ValueError unless every name the patch swaps is a plain function in ``cls``'s module.

    From transformers 5.25 on those names are ``kernels`` function modules that the layer
    reaches through helpers (``causal_conv1d_forward``, ``mamba2_scan_forward``): swapping
    them in ``forward``'s globals would leave the calls inside the helpers on the stock
    path, so the patch would run only part of the layer on the kernels, silently."""
    scope = sys.modules[cls.__module__].__dict__
    modules = [n for n in names if n in scope and not inspect.isfunction(scope[n])]
    if modules:
        import transformers

        raise ValueError(
            f"nki_ssm.torch.hf.patch: transformers {transformers.__version__} wraps "
            f"{', '.join(modules)} of {cls.__name__} as function modules, which the patch does "
            f"not reach; install transformers<5.25 (as nki-ssm's torch extra does)")


@functools.lru_cache(maxsize=None)
def _patched_forward(cls):
    """The forward of ``cls`` running on the nki_ssm drop-ins (built once per class)."""
    _, names = KNOWN_LAYERS[cls.__name__]
    _require_plain_functions(cls, names)
    return _with_globals(cls.forward, {n: _filtered(f) for n, f in names.items()})


def _require_module(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def patch(model) -> list:
    """Run ``model``'s Gated DeltaNet / Mamba-2 layers on the nki_ssm kernels.

    Returns ``[(qualified_name, class_name), ...]`` of the patched layers (in
    ``named_modules`` order, already patched ones included). ValueError when the
    model has no layer nki_ssm knows (see ``KNOWN_LAYERS``); TypeError for anything but a
    ``torch.nn.Module``.
    """
    _require_module(model)
    patched = []
    for name, module in model.named_modules():
        if not _is_known(module):
            continue
        if not getattr(module, _MARK, False):
            module.forward = types.MethodType(_patched_forward(type(module)), module)
            setattr(module, _MARK, True)
        patched.append((name, type(module).__name__))
    if not patched:
        raise ValueError(
            f"nki_ssm.torch.hf.patch: {type(model).__name__} has no layer nki_ssm knows; "
            f"supported layers: {', '.join(sorted(KNOWN_LAYERS))}")
    return patched


def unpatch(model) -> list:
    """Undo ``patch``: the stock forward again. Returns the layers restored."""
    _require_module(model)
    restored = []
    for name, module in model.named_modules():
        if getattr(module, _MARK, False):
            del module.forward
            delattr(module, _MARK)
            restored.append((name, type(module).__name__))
    return restored
