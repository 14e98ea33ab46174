"""Run a kernel the way the NKI front end evaluates it: the trace-time rules that depend on values.

The front end (github.com/leanprover/KLR at 7ccd18c) does not run the kernel's
Python; it parses it and evaluates it with its own semantics. Where those
differ from CPython on values only known while tracing, the static subset
check (``subset.py``) cannot see the difference. So the simulator executes a
rewritten copy of the kernel and of every helper it reaches by name (the
functions ``subset.check_kernel`` walked), with the same source lines:

- ``x[a:b:c]`` on a tuple or list: KLR raises "slice index out of bounds" when
  a bound (negative bounds counted from the end) falls outside ``[0, len]``
  and rejects a zero or negative step (KLR/Trace/Term.lean 312-320), where
  Python clamps. Any subscript of a str is "string subscript not
  implemented" (Term.lean 426).
- ``a in b`` / ``a not in b``: only on a tuple, list or str (KLR/Trace/Python.lean
  58-72; the front end rewrites the operator to ``builtin.op.in``,
  KLR/NKI/Simplify.lean 209-212): ``in`` on a dict, a tensor or an int fails.
- ``a is b`` / ``a is not b`` (other than ``is None``): the front end compares
  with ``==`` / ``!=`` (Simplify.lean 83-88), so the copy does too.
- ``for x in it`` (not a range loop): the front end iterates a tuple, a list or
  None (no iterations), nothing else (Python.lean 246-254); ``dict.keys()`` /
  ``values()`` / ``items()`` are lists there (Python.lean 360-370).
- list / dict methods: only those the front end has (KLR/Trace/Term.lean
  475-498); ``list.count`` / ``list.pop(i)`` / ``list.sort`` are rejected (the
  front end returns the length, ignores ``i``, has no sort: Python.lean
  293-312), ``list.index`` returns None when absent and ``list.remove`` drops
  every equal item, as there (Python.lean 301-316); tuples and strs have no
  methods; ``lst[i] = v`` needs ``0 <= i < len`` and ``d[k] = v`` a str key
  (KLR/Trace/NKI.lean 340-360).
- ``while cond:``: evaluated while tracing and unrolled, unless ``cond`` is a
  VirtualRegister: then a runtime loop that runs while the register is non-zero
  (nki-dynamic-loops.rst, "Using while with a VirtualRegister"; the
  VirtualRegister API page: supported by the parser front end), deprecated
  by NKI 0.6.0 (``sim.control.dynamic_while``).
- module-level lists and dicts a kernel reads are constants copied when the
  kernel is traced (KLR interop/klr/gather.c ``const_expr``): the copy gets
  fresh copies at every launch, so a kernel never changes module state.

The copy runs only inside a launch; decorators, defaults and annotations come
from the original function. Functions reached another way (a module
attribute ``mod.f``, a method) run unchanged.
"""
from __future__ import annotations

import ast
import copy
import sys
import types

from . import control as _control
from .errors import NkiValidationError
from .isa.registers import VirtualRegister
from .subset import RANGE_NAMES, Checked, _tail

RT_NAME = "__nki_frontend__"


# ----------------------------------------------------------------- run-time rules

def _where() -> str:
    """``file:function:line`` of the kernel code that made the call (the innermost frame
    outside this module)."""
    f = sys._getframe(1)
    while f is not None and f.f_globals.get("__name__") == __name__:
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_code.co_name}:{f.f_lineno}" if f else "?"


def _reject(what: str) -> None:
    raise NkiValidationError(f"{_where()}: the NKI compiler rejects {what}")


def _check_slice(seq, key: slice) -> None:
    n = len(seq)
    start = 0 if key.start is None else key.start
    stop = n if key.stop is None else key.stop
    step = 1 if key.step is None else key.step
    kind = type(seq).__name__
    if step <= 0:
        raise NkiValidationError(
            f"{_where()}: the NKI compiler rejects a {kind} slice with step {step} (\"slice step "
            "cannot be zero or negative\", KLR/Trace/Term.lean 316)")
    s = n + start if start < 0 else start
    e = n + stop if stop < 0 else stop
    if s < 0 or s > n or e < 0 or e > n:
        raise NkiValidationError(
            f"{_where()}: the NKI compiler rejects the slice [{key.start}:{key.stop}] of a {kind} "
            f"of length {n} (\"slice index out of bounds\", KLR/Trace/Term.lean 317-320; Python "
            "would clamp it): slice to at most the length")


class _Runtime:
    """The helpers the rewritten code calls (bound to ``__nki_frontend__`` in its globals)."""

    @staticmethod
    def getitem(value, key):
        t = type(value)
        if (t is tuple or t is list) and type(key) is slice:
            _check_slice(value, key)
        elif t is str:
            _reject("a subscript of a str (\"string subscript not implemented\", "
                    "KLR/Trace/Term.lean 426)")
        return value[key]

    @staticmethod
    def contains(item, container):
        _check_in(item, container)
        return item in container

    @staticmethod
    def not_contains(item, container):
        _check_in(item, container)
        return item not in container

    @staticmethod
    def method(obj, name, *args, **kw):
        t = type(obj)
        if t is list:
            return _list_method(obj, name, args, kw)
        if t is dict:
            return _dict_method(obj, name, args, kw)
        if t is tuple or t is str:
            _reject(f"{t.__name__}.{name}() (a {t.__name__} has no attributes in the front "
                    "end, KLR/Trace/Term.lean 469-545)")
        return getattr(obj, name)(*args, **kw)

    @staticmethod
    def setitem(obj, key, value):
        t = type(obj)
        if t is list and (type(key) is not int or not 0 <= key < len(obj)):
            _reject(f"list item assignment at index {key!r} of a list of length {len(obj)} (the "
                    "front end takes an index 0 <= i < len, KLR/Trace/NKI.lean 340-350)")
        if t is dict and type(key) is not str:
            _reject(f"dict item assignment with a {type(key).__name__} key (dict keys are strs, "
                    "KLR/Trace/NKI.lean 352-360)")
        obj[key] = value

    @staticmethod
    def while_(cond):
        """``while <cond>:``: unrolled while ``cond()`` is a Python value (the front end
        evaluates it while tracing); a runtime loop when it is a VirtualRegister."""
        v = cond()
        if isinstance(v, VirtualRegister):
            yield from _control.dynamic_while(v, cond)
            return
        while v:
            yield None
            v = cond()

    @staticmethod
    def iterate(value):
        t = type(value)
        if t is tuple or t is list:
            return value
        if value is None:
            return ()
        if isinstance(value, (type({}.keys()), type({}.values()), type({}.items()))):
            return list(value)
        _reject(f"iterating over a {t.__name__} (the front end's for-loop takes range(...), a "
                "tuple, a list or None; KLR/Trace/Python.lean 246-254)")


# methods the front end has (KLR/Trace/Term.lean 475-498; builtins in KLR/Trace/Python.lean
# 281-383); tuples and strs have no attributes there (Term.lean 469-545)
_LIST_METHODS = frozenset({"append", "clear", "copy", "count", "extend", "index", "pop",
                           "remove", "reverse", "sort"})
_DICT_METHODS = frozenset({"clear", "copy", "get", "items", "keys", "pop", "setdefault",
                           "values"})
WATCHED_METHODS = _LIST_METHODS | _DICT_METHODS | {"insert", "update", "popitem"}


def _list_method(obj: list, name: str, args, kw):
    if name not in _LIST_METHODS:
        _reject(f"list.{name}() (\"{name} is not an attribute of list\", "
                "KLR/Trace/Term.lean 475-487)")
    if name == "sort":
        _reject("list.sort() (named in KLR/Trace/Term.lean 486 but the front end has no "
                "builtin.list.sort)")
    if name == "count":
        _reject("list.count(x) (the front end's list.count returns the list's length, "
                "KLR/Trace/Python.lean 293-295)")
    if name == "pop" and (args or kw):
        _reject("list.pop(i) (the front end pops the last item and ignores i, "
                "KLR/Trace/Python.lean 309-312)")
    if name == "extend":
        return obj.extend(_Runtime.iterate(args[0]) if args else ())
    if name == "index":        # None when absent (KLR/Trace/Python.lean 301-306), no error
        value = args[0]
        start = args[1] if len(args) > 1 else 0
        stop = args[2] if len(args) > 2 else len(obj)
        for i, v in enumerate(obj):
            if v == value:
                return i if start <= i < stop else None
        return None
    if name == "remove":       # every equal item (KLR/Trace/Python.lean 314-316)
        obj[:] = [v for v in obj if v != args[0]]
        return None
    return getattr(obj, name)(*args, **kw)


def _dict_method(obj: dict, name: str, args, kw):
    if name not in _DICT_METHODS:
        _reject(f"dict.{name}() (\"{name} is not an attribute of dict\", "
                "KLR/Trace/Term.lean 488-498)")
    if name in ("get", "pop", "setdefault") and args and type(args[0]) is not str:
        _reject(f"dict.{name}() with a {type(args[0]).__name__} key (dict keys are strs, "
                "KLR/Trace/Python.lean 354-383)")
    if name in ("items", "keys", "values"):    # lists in the front end (Python.lean 360-370)
        return list(getattr(obj, name)())
    return getattr(obj, name)(*args, **kw)


def _check_in(item, container) -> None:
    t = type(container)
    if t is tuple or t is list:
        return
    if t is str and type(item) is str:
        return
    raise NkiValidationError(
        f"{_where()}: the NKI compiler rejects 'in' on a {type(item).__name__} and a "
        f"{t.__name__} (the front end's 'in' takes a tuple, a list or two strs, "
        "KLR/Trace/Python.lean 58-72; for a dict use d.get(key) != None)")


# ----------------------------------------------------------------- the rewrite

def _rt(attr: str) -> ast.Attribute:
    return ast.Attribute(value=ast.Name(id=RT_NAME, ctx=ast.Load()), attr=attr, ctx=ast.Load())


def _call(attr: str, args: list, like: ast.AST) -> ast.Call:
    return ast.copy_location(ast.Call(func=_rt(attr), args=args, keywords=[]), like)


class _Rewrite(ast.NodeTransformer):
    def visit_Subscript(self, node):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        key = node.slice
        if isinstance(key, ast.Slice):
            key = _slice_call(key)
        elif isinstance(key, ast.Tuple):
            key = ast.copy_location(ast.Tuple(elts=[_slice_call(e) if isinstance(e, ast.Slice) else e
                                                    for e in key.elts], ctx=ast.Load()), key)
        return _call("getitem", [node.value, key], node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        ops = node.ops
        if len(ops) == 1 and isinstance(ops[0], (ast.In, ast.NotIn)):
            fn = "contains" if isinstance(ops[0], ast.In) else "not_contains"
            return _call(fn, [node.left, node.comparators[0]], node)
        if len(ops) == 1 and isinstance(ops[0], (ast.Is, ast.IsNot)) \
                and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None:
            return node       # x is None: the same test in both (Simplify.lean 205-208)
        node.ops = [ast.Eq() if isinstance(op, ast.Is) else ast.NotEq() if isinstance(op, ast.IsNot)
                    else op for op in ops]
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in WATCHED_METHODS:
            return ast.copy_location(
                ast.Call(func=_rt("method"), args=[f.value, ast.Constant(value=f.attr), *node.args],
                         keywords=node.keywords), node)
        return node

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
            t = node.targets[0]
            key = t.slice
            if isinstance(key, ast.Slice):
                key = _slice_call(key)
            return ast.copy_location(ast.Expr(value=_call("setitem", [t.value, key, node.value],
                                                          node)), node)
        return node

    def visit_For(self, node):
        self.generic_visit(node)
        it = node.iter
        if not (isinstance(it, ast.Call) and _tail(it.func) in RANGE_NAMES):
            node.iter = _call("iterate", [it], it)
        return node


    def visit_While(self, node):
        # for _ in while_(lambda: test): body -- the test re-evaluated before each iteration
        self.generic_visit(node)
        test = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], vararg=None,
                                             kwonlyargs=[], kw_defaults=[], kwarg=None,
                                             defaults=[]), body=node.test)
        loop = ast.For(target=ast.Name(id="__nki_while__", ctx=ast.Store()),
                       iter=_call("while_", [ast.copy_location(test, node.test)], node.test),
                       body=node.body, orelse=[])
        return ast.copy_location(loop, node)


def _slice_call(s: ast.Slice) -> ast.Call:
    none = ast.Constant(value=None)
    args = [s.lower or none, s.upper or none, s.step or none]
    return ast.copy_location(ast.Call(func=_rt("slice"), args=args, keywords=[]), s)


_Runtime.slice = slice     # the key type itself (a global named slice cannot shadow it)


def _strip(fn_node) -> None:
    """Decorators, defaults and annotations stay with the original function object."""
    fn_node.decorator_list = []
    a = fn_node.args
    a.defaults = []
    a.kw_defaults = [None] * len(a.kwonlyargs)
    for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
        arg.annotation = None
    fn_node.returns = None


_code_cache: dict = {}


def _rewritten_code(f, fn_node, file: str) -> types.CodeType:
    code = _code_cache.get(f.__code__)
    if code is not None:
        return code
    node = copy.deepcopy(fn_node)
    _strip(node)
    node = _Rewrite().visit(node)
    free = list(f.__code__.co_freevars)
    outer = ast.FunctionDef(
        name="__nki_make__",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in free], vararg=None,
                           kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=[node, ast.Return(value=ast.Name(id=node.name, ctx=ast.Load()))],
        decorator_list=[], returns=None, type_comment=None)
    ast.copy_location(outer, node)
    mod = ast.Module(body=[outer], type_ignores=[])
    ast.fix_missing_locations(mod)
    top = compile(mod, file, "exec")
    make = next(c for c in top.co_consts if isinstance(c, types.CodeType))
    code = next(c for c in make.co_consts if isinstance(c, types.CodeType) and c.co_name == node.name)
    _code_cache[f.__code__] = code
    return code


def _substitute(value, mapping: dict):
    """``value`` with every function in ``mapping`` replaced (inside tuples and lists too)."""
    if isinstance(value, types.FunctionType):
        return mapping.get(value, value)
    if isinstance(value, (tuple, list)) and any(isinstance(v, (types.FunctionType, tuple, list))
                                               for v in value):
        new = [_substitute(v, mapping) for v in value]
        return type(value)(new) if isinstance(value, list) else tuple(new)
    return value


def prepare(fn, checked: Checked | None):
    """The function a launch runs for kernel ``fn``: its rewritten copy (see module doc) with
    fresh copies of the module lists and dicts it reads, or ``fn`` itself when its source is
    not available."""
    if checked is None or not checked.functions or checked.functions[0][0] is not fn:
        return fn
    globs: dict = {}            # id(original globals) -> new globals
    funcs: dict = {}            # original function -> rewritten function
    fill: list = []             # (new closure cell, original contents)
    for f, node, file in checked.functions:
        g0 = f.__globals__
        g = globs.get(id(g0))
        if g is None:
            g = dict(g0)
            g[RT_NAME] = _Runtime
            for name in checked.global_reads.get(id(g0), ()):
                v = g0.get(name)
                if isinstance(v, (list, dict)):
                    g[name] = copy.deepcopy(v)
            globs[id(g0)] = g
        code = _rewritten_code(f, node, file)
        cells = dict(zip(f.__code__.co_freevars, f.__closure__ or ()))
        closure = []
        for name in code.co_freevars:
            cell = cells[name]
            try:
                v = cell.cell_contents
            except ValueError:
                closure.append(cell)
                continue
            if isinstance(v, (types.FunctionType, tuple, list)):
                cell = types.CellType()          # filled once every copy exists
                fill.append((cell, v))
            closure.append(cell)
        new = types.FunctionType(code, g, f.__name__, f.__defaults__, tuple(closure) or None)
        new.__kwdefaults__ = f.__kwdefaults__
        new.__qualname__ = f.__qualname__
        new.__module__ = f.__module__
        new.__doc__ = f.__doc__
        funcs[f] = new
    # calls by name reach the rewritten helpers: globals and closure cells
    for g in globs.values():
        for name, v in list(g.items()):
            s = _substitute(v, funcs)
            if s is not v:
                g[name] = s
    for cell, v in fill:
        cell.cell_contents = _substitute(v, funcs)
    return funcs[fn]


__all__ = ["prepare"]
