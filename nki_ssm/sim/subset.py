"""Static check of a kernel's Python against the subset the NKI front end accepts.

The simulator runs kernels as ordinary Python, so without this check any
construct would "work" here and fail to compile on a real Neuron SDK (or be
rejected here although the compiler takes it). The NKI front end parses the
kernel's source and traces it; its public source is github.com/leanprover/KLR.
Every rule below cites KLR at commit 7ccd18c (file and lines), or the NKI docs
where they say more:

- ``interop/klr/gather.c``: the Python it converts. Expressions (``expr``,
  lines 904-1081): constants, names, attributes, tuple/list/dict displays,
  subscripts and slices, boolean/binary/unary operators, comparisons,
  conditional expressions, calls, starred (rejected later), f-strings without
  format specifiers (1053-1058); anything else is "unsupported expression"
  (1077-1080): comprehensions, generator expressions, lambda, set displays,
  ``:=``, await/yield. Statements (``stmt``, 1220-1375): pass, expression,
  assert, return, assignments, if, for, break, continue, while, with; inner
  ``def``/``class`` (1322-1328), ``del`` (1330), ``type`` (1334), async
  (1338-1342), ``match`` (1344), ``raise`` (1348), ``try`` (1352-1355),
  ``import`` (1357-1360), ``global``/``nonlocal`` (1362-1368) are errors.
- ``KLR/NKI/Simplify.lean``: ``is``/``is not`` become ``==``/``!=`` (83-88,
  with a warning; ``is None`` silently, 205-208); a single ``in``/``not in``
  becomes ``builtin.op.in`` (209-212) but ``in`` inside a chained comparison
  is "not supported" (89-90); ``@`` (106); starred expansion (224); keyword
  expansion (263-264); f-string conversions other than !r/!s/!a (226-231);
  assignment targets (293-330: names and nested tuples of names, at most one
  subscript/attribute target); for-loop target a single name (372); for/while
  ``else`` (370-381); ``with`` a single argument-less call without ``as``
  (382-393); ``*args`` parameters (415-416; ``**kwargs`` only warned,
  417-418); decorators only staticmethod / dataclass / nki.jit (432-443);
  ``...`` only as an index (60, 237).
- ``KLR/NKI/Annotations.lean``: ``range`` and the ``nl.*_range`` loops only as
  a for-loop iterator with 1-3 positional arguments (115-138); ``with`` only
  ``no_reorder`` (140-143).
- ``KLR/Trace/Python.lean``: the Python builtins that exist (45-400: abs,
  bool, dict, divmod, float, int, isinstance, len, list, max, min, print,
  slice, str, tuple, type); ``min``/``max`` take one tuple/list or exactly two
  values (150-191); ``in`` only on a tuple, list or str (58-72); the math
  module has only ceil, floor, gcd, log2, log10, pow, sqrt, pi, e, inf, nan
  (34-39, 405-424); ``dict()`` takes no keywords (340).
- ``KLR/Trace/NKI.lean`` 549-560: globals from the numpy module are dropped, so
  a kernel cannot use numpy; except that a numpy float constant read (not
  called), e.g. ``-np.inf``, only warns: nki-library's attention_tkg.py
  (d2ad3a5, line 1040) passes one to ``nisa.memset``, and released kernels win.
- gather.c ``const_expr`` (489-560): a module-level tuple, list or dict a
  kernel reads becomes a compile-time constant (a set or bytearray silently
  becomes None, so it is rejected here).
- NKI 0.3.0 release notes (release-notes/components/nki.rst 412): no ``*``
  keyword-only separator in a kernel signature. KLR itself binds keyword-only
  parameters (KLR/Python.lean 191-192); the docs are followed here because the
  restriction is on the ``nki.jit`` entry point, not the tracer.

What depends on run-time values (a slice of a list past its end, ``in`` on a
dict, iterating over a dict, a str subscript) is checked while the kernel runs,
by ``frontend.py``, which executes a rewritten copy of the kernel.

``check_kernel(fn)`` walks the kernel function and every plain Python function
it reaches by name (module helpers, functions stored in module-level tuples),
and raises ``NkiValidationError`` listing every violation in source order
(kernel first, then helpers in the order the kernel reaches them), each with
file, function and line.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import math
import textwrap
import types
import warnings

from . import version
from .errors import NkiValidationError


class NkiFrontendWarning(UserWarning):
    """What the front end accepts with a warning (``is``, ``**kwargs``, reading a module
    global list or dict)."""


# Python builtins the NKI front end defines (KLR/Trace/Python.lean ``builtin.python.*``) plus
# ``range`` (for-loop headers only). Any other builtin used in a kernel is an error.
NKI_BUILTINS = frozenset({
    "abs", "bool", "dict", "divmod", "float", "int", "isinstance", "len", "list", "max", "min",
    "print", "slice", "str", "tuple", "type", "range",
})
# the math module as the front end defines it (KLR/Trace/Python.lean 34-39, 405-424)
MATH_NAMES = frozenset({"ceil", "floor", "gcd", "log2", "log10", "pow", "sqrt",
                        "pi", "e", "inf", "nan"})
# loop iterators the front end turns into loops (KLR/NKI/Annotations.lean 115-121)
RANGE_NAMES = frozenset({"range", "static_range", "affine_range", "sequential_range",
                         "dynamic_range"})
_DECORATORS = frozenset({"jit", "staticmethod", "dataclass"})
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update",
                       "setdefault", "sort", "reverse", "popitem", "__setitem__"})

_REJECTED_STMTS = {
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

_PY_BUILTINS = frozenset(n for n in dir(builtins) if not n.startswith("_"))
# a jit-decorated kernel called from a kernel in released code
_JIT_SUBKERNEL_USE = ("aws-neuron/nki-library d2ad3a5 src/nkilib_src/nkilib/core/moe/moe_cte/"
                      "moe_cte.py:351")
# a numpy float constant read in released kernel code (``nisa.memset(bufs.qk, value=-np.inf)``)
_NUMPY_CONSTANT_USE = ("aws-neuron/nki-library d2ad3a5 src/nkilib_src/nkilib/core/attention/"
                       "attention_tkg.py:1040")
_MISSING = object()


def _tail(node: ast.AST) -> str | None:
    """The last name of ``a.b.c`` / ``c`` (None for other expressions)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_pattern(t: ast.AST) -> bool:
    """A let-pattern: a name, or a tuple of patterns (KLR/NKI/Simplify.lean 293-308)."""
    if isinstance(t, ast.Name):
        return True
    return isinstance(t, ast.Tuple) and all(_is_pattern(e) for e in t.elts)


class _FunctionCheck:
    """The static rules for one function; collects (line, col, message) errors."""

    def __init__(self, fn_node, where: str, is_kernel: bool, local_names: set, resolve,
                 closure_names=frozenset()):
        self.fn = fn_node
        self.where = where
        self.is_kernel = is_kernel
        self.local = local_names
        self.resolve = resolve          # name -> value in the function's scope, or _MISSING
        self.closure_names = closure_names
        self.errors: list = []
        self.warnings: list = []
        self.loads: list = []           # global names read, in source order
        self.attr_refs: list = []       # values of module.attr reads, in source order
        self.dicts = self._dict_names()
        self.range_headers = set()      # id() of Call nodes that are for-loop range headers
        self.subscript_index = set()    # id() of Constant(...) nodes used as an index
        self.called = set()             # id() of the func expression of every call

    def fail(self, node, what: str) -> None:
        self.errors.append((getattr(node, "lineno", 0), getattr(node, "col_offset", 0),
                            f"{self.where}:{getattr(node, 'lineno', '?')}: the NKI compiler "
                            f"rejects {what}"))

    def warn(self, node, what: str) -> None:
        self.warnings.append(f"{self.where}:{getattr(node, 'lineno', '?')}: {what}")

    def _dict_names(self) -> set:
        """Names bound to a dict ({...} or dict()) anywhere in the function."""
        out = set()
        for node in ast.walk(self.fn):
            if isinstance(node, ast.Assign):
                v = node.value
                if isinstance(v, ast.Dict) or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                                               and v.func.id == "dict"):
                    out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        return out

    def _global(self, name: str):
        if name in self.local:
            return _MISSING
        return self.resolve(name)

    def _builtin(self, name: str) -> bool:
        """``name`` is the Python builtin (not a local or module global of that name)."""
        return name in _PY_BUILTINS and name not in self.local and self.resolve(name) is _MISSING

    def run(self) -> None:
        fn = self.fn
        args = fn.args
        if args.vararg is not None:
            self.fail(fn, f"*{args.vararg.arg} parameters (varargs; KLR/NKI/Simplify.lean 415)")
        if args.kwarg is not None:
            self.warn(fn, f"**{args.kwarg.arg}: variable keyword arguments are not supported in "
                          "NKI (KLR/NKI/Simplify.lean 417-418: a warning; it must stay empty)")
        if self.is_kernel and args.kwonlyargs:
            self.fail(fn, "a '*' keyword-only separator in a kernel signature (NKI 0.3.0 release "
                          "notes)")
        for dec in fn.decorator_list:
            d = dec.func if isinstance(dec, ast.Call) else dec
            if _tail(d) not in _DECORATORS:
                self.fail(dec, f"the decorator @{ast.unparse(dec)} (only staticmethod, dataclass "
                               "and nki.jit; KLR/NKI/Simplify.lean 432-443)")
        for node in ast.walk(fn):
            if isinstance(node, ast.For) and isinstance(node.iter, ast.Call) \
                    and _tail(node.iter.func) in RANGE_NAMES:
                self.range_headers.add(id(node.iter))
            elif isinstance(node, ast.Subscript):
                for e in (node.slice.elts if isinstance(node.slice, ast.Tuple) else (node.slice,)):
                    self.subscript_index.add(id(e))
            if isinstance(node, ast.Call):
                self.called.add(id(node.func))
        todo = list(reversed(fn.body))
        while todo:
            node = todo.pop()
            if self.node(node):
                todo.extend(reversed(list(ast.iter_child_nodes(node))))

    def node(self, node) -> bool:
        """Check one node; False when it is rejected as a whole (its inside is not checked:
        the front end stops at it too)."""
        if isinstance(node, ast.FunctionDef):
            return self._inner_def(node)
        why = _REJECTED_STMTS.get(type(node)) or _REJECTED_EXPRS.get(type(node))
        if why is not None:
            self.fail(node, why)
            return False
        meth = getattr(self, "n_" + type(node).__name__, None)
        if meth is not None:
            meth(node)
        return True

    def _inner_def(self, node) -> bool:
        """An inner ``def``: rejected by the 0.5.0 front end (KLR gather.c 1322-1328); NKI
        0.6.0 documents it as the body of its runtime loops (``nl.fori_loop`` docstring,
        aws-neuron-sdk nki/api/nki/language/__init__.py l.2431: ``def body(i): ...`` inside
        the kernel, then ``nl.fori_loop(0, ub, body)``). Its body is checked by the same rules."""
        if not version.at_least("0.6.0"):
            self.fail(node, "inner function definitions (def inside a kernel function) before "
                            "NKI 0.6.0 (KLR interop/klr/gather.c 1322-1328)")
            return False
        args = node.args
        if args.vararg is not None:
            self.fail(node, f"*{args.vararg.arg} parameters (varargs; KLR/NKI/Simplify.lean 415)")
        if node.decorator_list:
            self.fail(node, "decorators on an inner function")
        return True

    # -- expressions
    def n_Compare(self, node) -> None:
        ops = node.ops
        if len(ops) == 1 and isinstance(ops[0], (ast.Is, ast.IsNot)) \
                and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None:
            pass        # x is None / x is not None: == / != None (Simplify.lean 205-208)
        elif any(isinstance(op, (ast.Is, ast.IsNot)) for op in ops):
            self.warn(node, "the 'is' operator is not supported in NKI; the front end compares "
                            "with == / != instead (KLR/NKI/Simplify.lean 83-88)")
        if any(isinstance(op, (ast.In, ast.NotIn)) for op in ops):
            if len(ops) > 1:
                self.fail(node, "'in' inside a chained comparison (KLR/NKI/Simplify.lean 89-90)")
                return
            rhs = node.comparators[0]
            if isinstance(rhs, ast.Dict) or (isinstance(rhs, ast.Name) and rhs.id in self.dicts):
                self.fail(node, "'in' on a dict (the front end's 'in' takes a tuple, list or str, "
                                "KLR/Trace/Python.lean 58-72; use d.get(key) != None)")

    def n_BinOp(self, node) -> None:
        if isinstance(node.op, ast.MatMult):
            self.fail(node, "the @ operator (KLR/NKI/Simplify.lean 106)")

    def n_Dict(self, node) -> None:
        for k in node.keys:
            if k is None:
                self.fail(node, "dict unpacking (**d)")
            elif not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                self.fail(node, "dict literal keys that are not string constants "
                                "(KLR/NKI/Simplify.lean 194-199)")

    def n_Constant(self, node) -> None:
        if node.value is Ellipsis and id(node) not in self.subscript_index:
            self.fail(node, "'...' outside an index (KLR/NKI/Simplify.lean 60)")

    def n_FormattedValue(self, node) -> None:
        if node.format_spec is not None:
            self.fail(node, "format specifiers in f-strings (KLR interop/klr/gather.c 1055-1058)")

    def n_Attribute(self, node) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            self.fail(node, f"the str method .{node.attr}() (strings have no attributes in the "
                            "front end, KLR/Trace/Term.lean 469-530; use an f-string)")
        elif isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load):
            mod = self._global(node.value.id)
            if isinstance(mod, types.ModuleType):
                self.attr_refs.append(getattr(mod, node.attr, None))
            if mod is math and node.attr not in MATH_NAMES:
                self.fail(node, f"math.{node.attr} (the front end's math module has only "
                                f"{', '.join(sorted(MATH_NAMES))}; KLR/Trace/Python.lean 34-39, "
                                "405-424)")
            elif isinstance(mod, types.ModuleType) and mod.__name__.split(".")[0] == "numpy":
                if id(node) not in self.called and isinstance(getattr(mod, node.attr, None), float):
                    self.warn(node, f"numpy constant {node.value.id}.{node.attr} inside a kernel: "
                                    "the front end drops numpy globals (KLR/Trace/NKI.lean "
                                    "549-560), but a released kernel reads one "
                                    f"({_NUMPY_CONSTANT_USE}); accepted")
                else:
                    self.fail(node, f"numpy ({node.value.id}.{node.attr}) inside a kernel (the "
                                    "front end drops numpy globals, KLR/Trace/NKI.lean 549-560; "
                                    "use nl dtypes and nisa instructions)")

    def n_Name(self, node) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        name = node.id
        if name not in self.local:
            self.loads.append(name)
        if self._builtin(name) and name not in NKI_BUILTINS:
            self.fail(node, f"the Python builtin {name}() (NKI defines only "
                            f"{', '.join(sorted(NKI_BUILTINS))}; KLR/Trace/Python.lean)")

    def n_Call(self, node) -> None:
        for kw in node.keywords:
            if kw.arg is None:
                self.fail(node, "keyword expansion (**kwargs) in a call (KLR/NKI/Simplify.lean "
                                "263-264)")
        f = node.func
        name = _tail(f)
        if name in RANGE_NAMES and (isinstance(f, ast.Attribute) or self._builtin(name)):
            if id(node) not in self.range_headers:
                self.fail(node, f"{name}() outside a for-loop header (KLR/NKI/Annotations.lean "
                                "115-138: range loops are a for-loop form only)")
            elif node.keywords or not 1 <= len(node.args) <= 3:
                self.fail(node, f"{name}() with keywords or other than 1-3 positional arguments "
                                "(KLR/NKI/Annotations.lean 127-137)")
        if isinstance(f, ast.Name) and self._builtin(f.id):
            if f.id in ("min", "max") and (node.keywords or len(node.args) not in (1, 2)):
                self.fail(node, f"{f.id}() with {len(node.args)} positional argument(s)"
                                f"{' and keywords' if node.keywords else ''} (the front end's "
                                f"{f.id} takes one tuple/list or exactly two values; "
                                "KLR/Trace/Python.lean 150-191)")
            elif f.id == "dict" and node.keywords:
                self.fail(node, "dict() with keyword arguments (KLR/Trace/Python.lean 340: use "
                                "a {'key': value} literal)")
        # mutating a module-level list/dict through its name
        if isinstance(f, ast.Attribute) and f.attr in _MUTATORS and isinstance(f.value, ast.Name):
            self._global_mutation(node, f.value.id, f".{f.attr}()")

    # -- statements
    def _global_mutation(self, node, name: str, how: str) -> None:
        if name in self.local or name in self.closure_names:
            return
        val = self.resolve(name)
        if isinstance(val, (list, dict)):
            self.fail(node, f"mutating the module global {name!r} ({how}): the compiler works on "
                            "a copy taken when the kernel is traced and caches the result, so a "
                            "kernel must not depend on or change module state (NKI 0.5.0 release "
                            "notes, known issues: kernels are pure functions of their arguments)")

    def n_Assign(self, node) -> None:
        sets = 0
        for t in node.targets:
            if isinstance(t, ast.Name):
                continue
            if isinstance(t, ast.Tuple) and _is_pattern(t):
                continue
            if isinstance(t, (ast.Tuple, ast.List)):
                self.fail(node, "assignment targets other than names and tuples of names (list "
                                "patterns, subscripts or attributes inside a tuple; "
                                "KLR/NKI/Simplify.lean 293-316)")
                return
            sets += 1
            self._target_mutation(node, t)
        if sets > 1:
            self.fail(node, "several mutating targets in one assignment (KLR/NKI/Simplify.lean "
                            "316)")

    def _target_mutation(self, node, t) -> None:
        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
            self._global_mutation(node, t.value.id, "item assignment")

    def n_AugAssign(self, node) -> None:
        self._target_mutation(node, node.target)

    def n_For(self, node) -> None:
        if node.orelse:
            self.fail(node, "for/while ... else (KLR/NKI/Simplify.lean 370-371)")
        if not isinstance(node.target, ast.Name):
            self.fail(node, "a for-loop target that is not a single name (unpack the tuple in the "
                            "loop body; KLR/NKI/Simplify.lean 372)")

    def n_While(self, node) -> None:
        if node.orelse:
            self.fail(node, "for/while ... else (KLR/NKI/Simplify.lean 379-380)")

    def n_With(self, node) -> None:
        items = node.items
        ok = (len(items) == 1 and items[0].optional_vars is None
              and isinstance(items[0].context_expr, ast.Call)
              and not items[0].context_expr.args and not items[0].context_expr.keywords)
        if not ok:
            self.fail(node, "with-statements other than one argument-less call without 'as' "
                            "(KLR/NKI/Simplify.lean 382-393)")
        elif _tail(items[0].context_expr.func) != "no_reorder":
            self.fail(node, f"the with-context {ast.unparse(items[0].context_expr)} (only "
                            "nl.no_reorder(); KLR/NKI/Annotations.lean 140-143)")


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


def _local_names(node) -> set:
    """Parameters and assigned names of ``node`` and of the inner functions it defines."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.FunctionDef):
            if sub is not node:
                names.add(sub.name)
            names.update(a.arg for a in sub.args.posonlyargs + sub.args.args + sub.args.kwonlyargs)
            names.update(a.arg for a in (sub.args.vararg, sub.args.kwarg) if a is not None)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.add(sub.id)
    return names


def _closure(f) -> dict:
    out = {}
    for nm, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
        try:
            out[nm] = cell.cell_contents
        except ValueError:
            pass
    return out


def _is_api(f) -> bool:
    mod = getattr(f, "__module__", "") or ""
    return mod.startswith("nki_ssm.sim") or mod.startswith("nki.") or mod == "nki"


class Checked:
    """The result of checking one kernel: the functions reached (kernel first), their parsed
    definitions and the module globals they read."""

    def __init__(self):
        self.functions: list = []        # (function, ast node, file)
        self.global_reads: dict = {}     # id(globals dict) -> set of names read
        self.errors: list = []
        self.warnings: list = []


def _check_tree(fn) -> Checked:
    out = Checked()
    seen = set()
    todo = [(fn, True)]
    order = 0
    while todo:
        f, is_kernel = todo.pop(0)           # breadth first, in the order names are read
        if f.__code__ in seen or _is_api(f):
            continue
        seen.add(f.__code__)
        node, file = _parse(f)
        if node is None:
            continue
        glb = getattr(f, "__globals__", {})
        closure = _closure(f)

        def resolve(name, glb=glb, closure=closure):
            if name in closure:
                return closure[name]
            return glb.get(name, _MISSING)

        where = f"{file}:{f.__name__}"
        chk = _FunctionCheck(node, where, is_kernel, _local_names(node), resolve, set(closure))
        chk.run()
        out.functions.append((f, node, file))
        out.errors.extend((order, line, col, msg) for line, col, msg in chk.errors)
        out.warnings.extend(chk.warnings)
        order += 1
        reads = out.global_reads.setdefault(id(glb), set())
        done = set()
        for name in chk.loads:
            if name in done:
                continue
            done.add(name)
            val = resolve(name)
            if val is _MISSING:
                continue
            if name not in closure:
                reads.add(name)
            if type(val).__name__ == "Kernel" and type(val).__module__.endswith("sim.jit"):
                # the migration guide ("Remove nki.jit decorator on sub-kernels") asks for plain
                # helpers, but released kernels call jit-decorated kernels from kernels
                # (nki-library d2ad3a5 core/moe/moe_cte/moe_cte.py:351 calls
                # bwmm_shard_on_block, experimental/transformer/attention_block_tkg.py:366
                # calls qkv): accepted, inlined, and checked as a helper
                out.warnings.append(
                    f"{where}: calls {name}, which is decorated with nki.jit; the migration guide "
                    "asks for plain sub-kernels, but released kernels do this "
                    f"({_JIT_SUBKERNEL_USE}); it is inlined")
                todo.append((val.func, False))
                continue
            elif isinstance(val, (set, frozenset, bytearray)) and name not in closure:
                # gather.c const_expr turns a set into None (it is no tuple, list or dict)
                out.errors.append((order - 1, 0, 0,
                                   f"{where}: reads the module global {name!r} "
                                   f"({type(val).__name__}); the front end converts only tuples, "
                                   "lists and dicts of constants (KLR interop/klr/gather.c "
                                   "const_expr): use a tuple"))
            elif isinstance(val, (list, dict)) and name not in closure:
                out.warnings.append(
                    f"{where}: reads the module global {name!r} ({type(val).__name__}); the "
                    "compiler copies it when the kernel is traced and caches the kernel, so "
                    "later edits to it are not seen (NKI 0.5.0 release notes, known issues)")
            found = []
            _reachable(val, found)
            todo.extend((g, False) for g in found)
        # helpers reached as module.attr (gather.c reference(), Attribute_kind, follows them
        # too); only the kernel's own package: the NKI API and the stdlib are not kernel code
        top = (getattr(fn, "__module__", "") or "").split(".")[0]
        for val in chk.attr_refs:
            if isinstance(val, types.FunctionType) and top \
                    and (val.__module__ or "").split(".")[0] == top:
                todo.append((val, False))
    out.errors.sort()
    return out


_checked: dict = {}


def check_kernel(fn) -> Checked | None:
    """Raise NkiValidationError if ``fn`` or a helper it reaches uses Python the NKI compiler
    rejects (every violation, in source order); warn (NkiFrontendWarning) where it only
    warns. Results are cached per function object (a kernel is checked once)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    key = (code, version.nki_version())
    res = _checked.get(key)
    if res is None:
        res = _check_tree(fn)
        _checked[key] = res
        for w in res.warnings:
            warnings.warn(w, NkiFrontendWarning, stacklevel=3)
    if res.errors:
        lines = [msg for _, _, _, msg in res.errors]
        head = lines[0] if len(lines) == 1 else (
            f"{lines[0]}\n({len(lines)} violations, in source order:)\n" + "\n".join(lines))
        raise NkiValidationError(head)
    return res


__all__ = ["check_kernel", "NKI_BUILTINS", "MATH_NAMES", "NkiFrontendWarning", "Checked"]
