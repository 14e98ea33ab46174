"""Static check of a kernel's Python against the subset the NKI compiler accepts.

The simulator runs kernels as ordinary Python, so without this check any
construct would "work" here and fail to compile on a real Neuron SDK. The NKI
0.5.0 compiler front end (the "parser" frontend: it parses the kernel's source,
it does not run it) accepts a fixed subset of Python. The rules below come from
(a) the NKI migration guide, 0.3.0 section (no ``is`` / ``is not``, no ``*``
keyword-only separator, no list kernel arguments) and the NKI language guide
(dict keys are strings; ``range``/list/tuple loops; classes inherit only
NKIObject), and (b) the front end's public source, github.com/leanprover/KLR
at 7ccd18c (``interop/klr/gather.c``: statements and expressions it turns into
errors; ``KLR/NKI/Simplify.lean``: for-loop targets must be one name, no
``in`` inside chained comparisons, no ``*`` / ``**`` expansion, no ``@``;
``KLR/Trace/Python.lean``: the builtins that exist and ``in`` only on
tuple / list / str).

``check_kernel(fn)`` walks the kernel function and every plain Python function
it reaches by name (module helpers, functions stored in module-level tuples)
and raises ``NkiValidationError`` naming the file, line and construct.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import types

from .errors import NkiValidationError

# Python builtins the NKI front end defines (KLR/Trace/*.lean ``builtin.python.*``) plus
# ``range`` (for-loop headers only). Any other builtin called in a kernel is an error.
NKI_BUILTINS = frozenset({
    "abs", "bool", "dict", "divmod", "float", "int", "isinstance", "len", "list", "max", "min",
    "print", "slice", "str", "tuple", "type", "range",
})

_REJECTED_STMTS = {
    ast.FunctionDef: "inner function definitions (def inside a kernel function)",
    ast.AsyncFunctionDef: "async functions",
    ast.ClassDef: "class definitions inside a function",
    ast.Delete: "'del' statements",
    ast.Raise: "'raise' statements (use assert)",
    ast.Try: "'try' statements",
    ast.Import: "'import' inside a function",
    ast.ImportFrom: "'import' inside a function",
    ast.Global: "'global' statements",
    ast.Nonlocal: "'nonlocal' statements",
    ast.AsyncFor: "async for",
    ast.AsyncWith: "async with",
}
for _name, _why in (("Match", "'match' statements"), ("TryStar", "'try' statements"),
                    ("TypeAlias", "'type' statements")):
    if hasattr(ast, _name):
        _REJECTED_STMTS[getattr(ast, _name)] = _why

_REJECTED_EXPRS = {
    ast.Lambda: "lambda expressions",
    ast.ListComp: "list comprehensions",
    ast.SetComp: "set comprehensions",
    ast.DictComp: "dict comprehensions",
    ast.GeneratorExp: "generator expressions",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield from",
    ast.NamedExpr: "assignment expressions (:=)",
    ast.Set: "set literals",
    ast.Starred: "tuple expansion (*x)",
}


def _fail(where: str, node: ast.AST, what: str) -> None:
    raise NkiValidationError(f"{where}:{getattr(node, 'lineno', '?')}: the NKI compiler rejects "
                             f"{what}")


def _dict_names(fn_node: ast.AST) -> set:
    """Names bound to a dict ({...} or dict()) anywhere in the function."""
    out = set()
    for node in ast.walk(fn_node):
        if isinstance(node, ast.Assign):
            v = node.value
            is_dict = isinstance(v, ast.Dict) or (
                isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict")
            if is_dict:
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out.add(t.id)
    return out


def _check_body(fn_node: ast.AST, where: str, is_kernel: bool, local_names: set) -> set:
    """Check one function's AST; returns the global names it loads."""
    args = fn_node.args
    if args.vararg is not None:
        _fail(where, fn_node, f"*{args.vararg.arg} parameters (varargs)")
    if is_kernel and args.kwonlyargs:
        _fail(where, fn_node, "a '*' keyword-only separator in a kernel signature (NKI 0.3.0 "
                              "migration guide)")
    dicts = _dict_names(fn_node)
    loop_iters = {id(n.iter) for n in ast.walk(fn_node) if isinstance(n, ast.For)}
    loads = set()
    for node in ast.walk(fn_node):
        if node is not fn_node:
            for cls, why in _REJECTED_STMTS.items():
                if isinstance(node, cls):
                    _fail(where, node, why)
        for cls, why in _REJECTED_EXPRS.items():
            if isinstance(node, cls):
                _fail(where, node, why)
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if isinstance(op, (ast.Is, ast.IsNot)):
                    _fail(where, node, "'is' / 'is not' (use == / != None; NKI 0.3.0 "
                                       "migration guide)")
            if any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                if len(node.ops) > 1:
                    _fail(where, node, "'in' inside a chained comparison")
                rhs = node.comparators[0]
                if isinstance(rhs, (ast.Dict, ast.DictComp)) or (
                        isinstance(rhs, ast.Name) and rhs.id in dicts):
                    _fail(where, node, "'in' on a dict (the front end's 'in' takes a tuple, "
                                       "list or str; use d.get(key) != None)")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            _fail(where, node, "the @ operator")
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                if k is None:
                    _fail(where, node, "dict unpacking (**d)")
                if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    _fail(where, node, "dict literal keys that are not string constants")
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg is None:
                    _fail(where, node, "keyword expansion (**kwargs) in a call")
            f = node.func
            if isinstance(f, ast.Name) and f.id == "range" and "range" not in local_names \
                    and id(node) not in loop_iters:
                # KLR/Trace/NKI.lean: "range, but only in a for-loop context"
                _fail(where, node, "range() outside a for-loop header")
            if isinstance(f, ast.Name) and f.id not in local_names and f.id not in NKI_BUILTINS \
                    and f.id in _PY_BUILTINS:
                _fail(where, node, f"the Python builtin {f.id}() (NKI defines only "
                                   f"{', '.join(sorted(NKI_BUILTINS))})")
        elif isinstance(node, ast.Assign):
            # KLR/NKI/Simplify.lean letSet / pattern: a tuple target holds names only, and at
            # most one target of a chained assignment mutates (a[i] = ..., x.f = ...)
            sets = 0
            for t in node.targets:
                if isinstance(t, (ast.Tuple, ast.List)):
                    if not all(isinstance(e, ast.Name) or isinstance(e, (ast.Tuple, ast.List))
                               for e in ast.walk(t) if e is not t and not isinstance(e, ast.expr_context)):
                        _fail(where, node, "tuple assignment targets other than plain names "
                                           "(assign subscripts / attributes one per statement)")
                elif not isinstance(t, ast.Name):
                    sets += 1
            if sets > 1:
                _fail(where, node, "several mutating targets in one assignment")
        elif isinstance(node, (ast.For, ast.While)):
            if node.orelse:
                _fail(where, node, "for/while ... else")
            if isinstance(node, ast.For) and not isinstance(node.target, ast.Name):
                _fail(where, node, "a for-loop target that is not a single name (unpack the "
                                   "tuple in the loop body)")
        elif isinstance(node, ast.With):
            ok = (len(node.items) == 1 and node.items[0].optional_vars is None
                  and isinstance(node.items[0].context_expr, ast.Call)
                  and not node.items[0].context_expr.args
                  and not node.items[0].context_expr.keywords)
            if not ok:
                _fail(where, node, "with-statements other than one argument-less call without 'as'")
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            _fail(where, node, "format specifiers in f-strings")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads.add(node.id)
    return loads


_PY_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))


def _parse(fn):
    try:
        src = inspect.getsource(fn)
        file = inspect.getsourcefile(fn) or "<kernel>"
        _, line0 = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None, None
    tree = ast.parse(textwrap.dedent(src))
    ast.increment_lineno(tree, line0 - 1)
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None, None
    return node, file


def _reachable(value, out: list) -> None:
    """Plain Python functions in a global value (a function, or a tuple/list of them)."""
    if isinstance(value, types.FunctionType):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _reachable(v, out)


_checked: dict = {}


def check_kernel(fn) -> None:
    """Raise NkiValidationError if ``fn`` or a helper it reaches uses Python the NKI compiler
    rejects. Results are cached per function object (a kernel is checked once)."""
    key = getattr(fn, "__code__", None)
    if key is None:
        return
    err = _checked.get(key)
    if err is not None:
        if err:
            raise NkiValidationError(err)
        return
    try:
        _check_tree(fn)
    except NkiValidationError as e:
        _checked[key] = str(e)
        raise
    _checked[key] = ""


def _check_tree(fn) -> None:
    seen = set()
    todo = [(fn, True)]
    while todo:
        f, is_kernel = todo.pop()
        if f.__code__ in seen:
            continue
        seen.add(f.__code__)
        node, file = _parse(f)
        if node is None:
            continue
        mod = getattr(f, "__module__", "") or ""
        if mod.startswith("nki_ssm.sim") or mod.startswith("nki.") or mod == "nki":
            continue        # the NKI API itself, not kernel code
        local_names = {a.arg for a in node.args.args + node.args.kwonlyargs}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                local_names.add(sub.id)
        where = f"{file}:{f.__name__}"
        loads = _check_body(node, where, is_kernel, local_names)
        glb = getattr(f, "__globals__", {})
        closure = {}
        for nm, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            if _cell_ok(cell):
                closure[nm] = cell.cell_contents
        for name in loads - local_names:
            val = closure.get(name, glb.get(name))
            if type(val).__name__ == "Kernel" and type(val).__module__.endswith("sim.jit"):
                # migration guide, "Remove nki.jit decorator on sub-kernels": the
                # compiler rejects a call to a jit-decorated function from a kernel
                raise NkiValidationError(
                    f"{where}: calls {name}, which is decorated with nki.jit; helpers called "
                    f"from a kernel must be plain functions (the NKI compiler inlines them)")
            if isinstance(val, (list, dict, set, bytearray)) and name not in closure:
                # the compiler copies a global into the kernel at trace time; the simulator
                # would share (and let the kernel mutate) one object across calls, and the
                # kernel cache would keep the first value (language guide, "pure functions")
                raise NkiValidationError(
                    f"{where}: reads the mutable module global {name!r} "
                    f"({type(val).__name__}); kernels must be pure functions of their "
                    f"arguments: use a tuple or pass it in")
            found = []
            _reachable(val, found)
            for g in found:
                todo.append((g, False))


def _cell_ok(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


__all__ = ["check_kernel", "NKI_BUILTINS"]
