"""The NKI constructs our kernels use, and the evidence that each one compiles.

Nothing in this repository has been compiled by the Neuron compiler, so every
distinct NKI construct a kernel uses must be used the same way by a released
kernel (nki-library, nki-samples, NxD Inference contrib) or be documented
without contradiction (the project's rule: every construct has evidence). This module
reads the kernels' source (it imports none of them) and lists the constructs:

- a call of the API with its argument form: ``nisa.nc_matmul(accumulate, dst,
  moving, stationary)`` (keywords sorted, ``_`` for each positional);
- a value of the API a kernel names: ``nl.psum``, ``nl.exp``,
  ``nisa.gpsimd_engine`` (buffers, activation and ALU functions, dtypes, engines);
- an access-pattern form: ``.ap(indirect_dim, offset, pattern, scalar_offset)
  indirect_dim=0`` (the offset kind is the keyword set, plus the indirect axis);
- tensor methods: ``.reshape(_)``;
- the forms that matter beyond the keyword set: a matmul tile position
  (``nisa.nc_matmul tile_position=(0, c)``; ``(r, c)`` is both offsets, ``computed``
  a position not written as a tuple), a tile in transpose mode, a runtime loop
  whose body is an inner ``def``, a runtime loop lexically inside another one's
  body, a register allocated inside a runtime-loop body, ``register_load`` straight
  from a kernel input, ``scalar_load`` from a slice of a tile or a whole tile, a
  ``scalar_offset`` that is a device scalar (``NkiScalar``: a ``scalar_load`` result,
  a loop's iteration value, scalar arithmetic) or a tensor, a PSUM tile allocated
  outside a runtime loop and written inside it.

Runtime loops and conditionals are read through the kernels' scaffolding too
(``nki_ssm/kernels/scaffold.py``): a function passed to ``work_loop`` /
``for_each_row`` is a runtime-loop body, and the values ``trip_counts`` /
``row_cells`` return are device scalars.

Forbidden forms (``FORBIDDEN``): what NKI 0.8.0 deprecates or removes (registers,
``nisa.sendrecv`` / ``core_barrier``, the range iterators) and the forms released
kernels avoid (a runtime loop nested in another, a PSUM tile allocated outside the
runtime loop that writes it). ``--check`` fails on any of them, evidence or not.

The evidence map, ``constructs_evidence.toml`` beside this file, gives each
construct a released use (repository, commit, path, line) or a doc section.
``--find-evidence DIR`` runs the same reader over a checkout of released kernels
and proposes the first released use of every construct (a construct is "the
same" when this reader names it the same), so the map can be regenerated; doc
entries are written by hand. ``docs/constructs.md`` is generated from both.

Usage::

    python -m nki_ssm.kernels.constructs                  # the table, to stdout
    python -m nki_ssm.kernels.constructs --write          # regenerate docs/constructs.md
    python -m nki_ssm.kernels.constructs --check          # exit 1: no evidence, or doc stale
    python -m nki_ssm.kernels.constructs --find-evidence REPO_DIR [--repo owner/name]
"""
from __future__ import annotations

import argparse
import ast
import functools
import inspect
import subprocess
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from nki_ssm import backend

KERNELS_DIR = Path(__file__).resolve().parent
REPO_ROOT = KERNELS_DIR.parents[1]
EVIDENCE_FILE = KERNELS_DIR / "constructs_evidence.toml"
DOC_FILE = REPO_ROOT / "docs" / "constructs.md"

API_MODULES = ("nl", "nisa", "nki")
# NKI tensor methods (nki_spec.md §3.6: access patterns and views)
TENSOR_METHODS = frozenset({"ap", "reshape", "view", "bitcast", "permute", "slice", "select",
                            "broadcast", "broadcast_to", "expand_dims"})
# runtime loops: (api name, index of the body argument)
RUNTIME_LOOPS = {"nl.fori_loop": 2, "nl.while_loop": 1}
# the scaffolding's runtime loops (nki_ssm/kernels/scaffold.py): (function, index of the body)
SCAFFOLD_LOOPS = {"work_loop": 1, "for_each_row": 2}
# calls whose result holds device scalars (the scaffolding's lists of them included)
SCALAR_SOURCES = frozenset({"nisa.scalar_load", "nisa.register_alloc", "nisa.scalar_alu",
                            "trip_counts", "row_cells"})
PSUM_OUTSIDE = "PSUM tile allocated outside a runtime loop and written inside it"
NESTED = "runtime loop nested in a runtime loop's body"
# NKI 0.8.0 deprecates these (announce-intent-eos-nki-virtualregister-lnc-apis, Neuron
# 2.34.0) or removed them in 0.7.0 (nki/migration: the runtime range iterator; the aliases mean
# `range`); the last three: forms released runtime-loop kernels avoid (sdk234 facts)
FORBIDDEN = ("nisa.VirtualRegister", "nisa.register_", "nisa.sendrecv", "nisa.core_barrier",
             "for _ in nl.", "nl.affine_range", "nl.sequential_range", "nl.static_range",
             NESTED, "nisa.register_alloc inside a runtime-loop body", PSUM_OUTSIDE)


def forbidden(construct: str) -> bool:
    """Whether ``construct`` is one of the FORBIDDEN forms."""
    return any(construct.startswith(f) for f in FORBIDDEN)
# a for loop over an nl iterator is a runtime loop unless it is one of the unrolled aliases of
# range (nki_spec.md §2: NKI 0.5's runtime iterator, deprecated in 0.6.0)
STATIC_ITERATORS = frozenset({"nl.affine_range", "nl.sequential_range", "nl.static_range"})


def _runtime_iterator(call) -> bool:
    name = _api_name(call.func) if isinstance(call, ast.Call) else None
    return name is not None and name.startswith("nl.") and name not in STATIC_ITERATORS
# keyword arguments whose value is itself part of the form
_FORM_KEYWORDS = ("indirect_dim",)


@dataclass(frozen=True)
class Use:
    """One place a construct is used."""

    path: str       # relative to the scanned root
    line: int


def _api_name(node) -> str | None:
    """The dotted name of an API attribute chain rooted at ``nl`` / ``nisa`` / ``nki``
    (``nki.isa.x`` read as ``nisa.x``, ``nki.language.x`` as ``nl.x``), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not parts or not isinstance(node, ast.Name) or node.id not in API_MODULES:
        return None
    parts.append(node.id)
    parts.reverse()
    if parts[0] == "nki" and len(parts) > 2 and parts[1] in ("isa", "language"):
        parts[:2] = ["nisa" if parts[1] == "isa" else "nl"]
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def _parameters(name: str) -> list[str] | None:
    """The positional parameter names of API function ``name`` (``nisa.nc_matmul``), from the
    NKI implementation the backend exports (the SDK's when installed, else the simulator's,
    which follows the documented signatures); None when unknown."""
    mod, _, attr = name.partition(".")
    target = {"nl": backend.nl, "nisa": backend.nisa, "nki": backend.nki}.get(mod)
    for part in attr.split("."):
        target = getattr(target, part, None)
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _form(call: ast.Call, name: str | None = None) -> str:
    """The argument form: keywords sorted, positionals named by the API's signature where
    known (so ``nc_matmul(d, s, m)`` and ``nc_matmul(dst=d, stationary=s, moving=m)`` are one
    form), else ``_``."""
    npos = sum(1 for a in call.args if not isinstance(a, ast.Starred))
    params = _parameters(name) if name is not None and npos else None
    if params is not None and npos <= len(params):
        named, pos = params[:npos], []
    else:
        named, pos = [], ["_"] * npos
    kws = sorted(named + [k.arg for k in call.keywords if k.arg is not None])
    return "(" + ", ".join(pos + kws) + ")"


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _tile_form(value) -> str:
    """The tile position as a form: (0, 0), (0, c), (r, 0), (r, c) or computed."""
    if not isinstance(value, ast.Tuple) or len(value.elts) != 2:
        return "computed"

    def zero(e):
        return isinstance(e, ast.Constant) and e.value == 0

    r, c = value.elts
    return f"({'0' if zero(r) else 'r'}, {'0' if zero(c) else 'c'})"


def _is_true(value) -> bool:
    return isinstance(value, ast.Constant) and value.value is True


class _Reader(ast.NodeVisitor):
    """Collects the constructs of one module."""

    def __init__(self, path: str, found: dict, scalars: tuple | None = None):
        self.path = path
        self.found = found
        # ({id(function node): names holding device scalars there}, dict keys holding them)
        self.scalars, self.scalar_keys = scalars or ({}, set())
        self.register_stack: list[set] = []
        self.psum_stack: list[set] = []      # per enclosing function: names of PSUM tiles
        self.outer_psum: list[set] = []      # PSUM names of the functions a loop body is in
        self.kernel_params: list[set] = []   # parameters of enclosing @nki.jit functions
        self.loop_bodies: list[bool] = []    # per enclosing function: is it a runtime-loop body?
        self.body_names: list[set] = []      # per enclosing function: names passed as loop bodies
        self.inner_defs: list[set] = []      # per enclosing function: names of its inner defs
        self.dynamic_for_depth = 0

    def add(self, construct: str, node) -> None:
        self.found[construct].append(Use(self.path, getattr(node, "lineno", 0)))

    # -- functions
    def visit_FunctionDef(self, node) -> None:
        is_jit = any(_api_name(d.func if isinstance(d, ast.Call) else d) == "nki.jit"
                     for d in node.decorator_list)
        is_body = bool(self.body_names) and node.name in self.body_names[-1]
        if self.inner_defs:
            self.inner_defs[-1].add(node.name)
        params = {a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs}
        self.kernel_params.append(params if is_jit else (self.kernel_params[-1] if
                                                          self.kernel_params else set()))
        self.loop_bodies.append(is_body or (bool(self.loop_bodies) and self.loop_bodies[-1]))
        self.body_names.append(_loop_body_names(node))
        self.inner_defs.append(set())
        self.register_stack.append(self.scalars.get(id(node), set()))
        # PSUM tiles a runtime-loop body sees from outside it: those of every enclosing
        # function up to (and including) the one that runs the loop
        outer = set()
        if is_body:
            for names in self.psum_stack:
                outer |= names
        elif self.outer_psum:
            outer = set(self.outer_psum[-1])
        self.outer_psum.append(outer)
        self.psum_stack.append(_psum_names(node))
        if is_body:
            self._psum_writes(node, outer - self.psum_stack[-1])
        self.generic_visit(node)
        for stack in (self.kernel_params, self.loop_bodies, self.body_names, self.inner_defs,
                      self.register_stack, self.psum_stack, self.outer_psum):
            stack.pop()

    def _psum_writes(self, body, outside: set) -> None:
        """A loop body's instructions whose destination is a PSUM tile allocated outside."""
        for sub in ast.walk(body):
            if not isinstance(sub, ast.Call) or _api_name(sub.func) is None:
                continue
            dst = _keyword(sub, "dst")
            if dst is None and sub.args and _api_name(sub.func).startswith("nisa."):
                dst = sub.args[0]
            root = _root_name(dst)
            if root is not None and root in outside:
                self.add(PSUM_OUTSIDE, sub)

    def _in_runtime_body(self) -> bool:
        return (bool(self.loop_bodies) and self.loop_bodies[-1]) or self.dynamic_for_depth > 0

    # -- for loops over a runtime iterator
    def visit_For(self, node) -> None:
        it = node.iter
        runtime = _runtime_iterator(it)
        if runtime:
            if self._in_runtime_body():
                self.add("runtime loop nested in a runtime loop's body", node)
            self.add(f"for _ in {_api_name(it.func)}{_form(it)}", node)
            for a in list(it.args) + [k.value for k in it.keywords]:
                self.visit(a)
            self.dynamic_for_depth += 1
            for s in node.body:
                self.visit(s)
            self.dynamic_for_depth -= 1
            return
        self.generic_visit(node)

    # -- calls and values
    def visit_Call(self, node) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in SCAFFOLD_LOOPS:
            if self._in_runtime_body():
                self.add(NESTED, node)
            self.add(f"{node.func.id} (scaffold: nl.fori_loop) body: "
                     f"{'an inner def' if self._inner_def_arg(node) else 'not an inner def'}",
                     node)
        name = _api_name(node.func)
        if name is not None:
            self.add(f"{name}{_form(node, name)}", node)
            self._call_forms(name, node)
            for a in node.args:
                self.visit(a)
            for k in node.keywords:
                self.visit(k.value)
            return
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in TENSOR_METHODS:
            form = f".{f.attr}{_form(node)}"
            for kw in _FORM_KEYWORDS:
                v = _keyword(node, kw)
                if v is not None:
                    form += f" {kw}={ast.unparse(v)}"
            off = _keyword(node, "scalar_offset")
            if off is not None:
                form += f" scalar_offset={self._offset_kind(off)}"
            self.add(form, node)
        self.generic_visit(node)

    def _inner_def_arg(self, node) -> bool:
        idx = SCAFFOLD_LOOPS[node.func.id]
        body = node.args[idx] if len(node.args) > idx else _keyword(node, "body")
        return isinstance(body, ast.Name) and bool(self.inner_defs) \
            and body.id in self.inner_defs[-1]

    def _offset_kind(self, value) -> str:
        """``scalar`` (a device scalar: a loop's iteration value, a ``scalar_load`` /
        ``register_alloc`` result or the scaffolding's, arithmetic on them, or a parameter
        some call passes one to) or ``tensor`` (anything else: an SBUF tile)."""
        names = self.register_stack[-1] if self.register_stack else set()
        return "scalar" if _holds_scalar(value, names, self.scalar_keys) else "tensor"

    def _call_forms(self, name: str, node) -> None:
        if name == "nisa.nc_matmul":
            tp = _keyword(node, "tile_position")
            if tp is not None:
                self.add(f"nisa.nc_matmul tile_position={_tile_form(tp)}", node)
                if _is_true(_keyword(node, "is_transpose")):
                    self.add("nisa.nc_matmul tile_position with is_transpose=True", node)
        elif name in RUNTIME_LOOPS:
            if self._in_runtime_body():
                self.add("runtime loop nested in a runtime loop's body", node)
            idx = RUNTIME_LOOPS[name]
            body = node.args[idx] if len(node.args) > idx else _keyword(node, "body_fun")
            if isinstance(body, ast.Name) and self.inner_defs and body.id in self.inner_defs[-1]:
                self.add(f"{name} body: an inner def", node)
            else:
                self.add(f"{name} body: not an inner def of the caller", node)
        elif name == "nisa.register_alloc" and self._in_runtime_body():
            self.add("nisa.register_alloc inside a runtime-loop body", node)
        elif name == "nisa.scalar_load":
            src = _keyword(node, "src") or (node.args[0] if node.args else None)
            sliced = isinstance(src, ast.Subscript) and not (
                isinstance(src.slice, ast.Constant) and isinstance(src.slice.value, str))
            self.add("nisa.scalar_load src=" + ("a slice of a tile" if sliced else "a tile"),
                     node)
        elif name == "nisa.register_load":
            src = _keyword(node, "src") or (node.args[1] if len(node.args) > 1 else None)
            root = src
            while isinstance(root, (ast.Subscript, ast.Attribute, ast.Call)):
                root = root.value if not isinstance(root, ast.Call) else root.func
            if isinstance(root, ast.Name) and self.kernel_params \
                    and root.id in self.kernel_params[-1]:
                self.add("nisa.register_load from a kernel input (HBM)", node)

    def visit_Attribute(self, node) -> None:
        name = _api_name(node)
        if name is not None and isinstance(node.ctx, ast.Load):
            self.add(name, node)
            return
        self.generic_visit(node)


def _root_name(node):
    """The name a subscript / attribute / method-call chain starts from (``banks[j % 2]`` ->
    ``banks``), else None."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_psum_alloc(v) -> bool:
    if not isinstance(v, ast.Call) or _api_name(v.func) not in ("nl.ndarray", "nl.zeros"):
        return False
    buf = _keyword(v, "buffer")
    return buf is not None and _api_name(buf) == "nl.psum"


def _psum_names(fn) -> set:
    """Names a function binds to PSUM tiles in its own statements: ``t = nl.ndarray(...,
    buffer=nl.psum)``, or lists ``banks.append(<such an allocation>)``."""
    out = set()
    todo = list(fn.body)
    while todo:
        n = todo.pop()
        if isinstance(n, ast.FunctionDef):
            continue
        if isinstance(n, ast.Assign) and _is_psum_alloc(n.value):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out.add(t.id)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr == "append" and n.args and _is_psum_alloc(n.args[0]):
            root = _root_name(n.func.value)
            if root is not None:
                out.add(root)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _holds_scalar(expr, names: set, keys: set) -> bool:
    """Whether ``expr`` holds a device scalar: it names one (or a list / tuple of them), calls
    a scalar source, or reads a dict key a scalar was stored under."""
    if expr is None:
        return False
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Name) and sub.id in names:
            return True
        if isinstance(sub, ast.Call):
            f = sub.func
            fname = _api_name(f) or (f.id if isinstance(f, ast.Name) else None)
            if fname in SCALAR_SOURCES:
                return True
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) \
                and sub.slice.value in keys:
            return True
    return False


def _scalar_names(tree) -> tuple:
    """``({id(function node): names that hold device scalars there}, dict keys that do)``:
    NkiScalars (``scalar_load`` results, the scaffolding's counts and cells, arithmetic on
    them), VirtualRegisters (``register_alloc`` results), runtime-iterator loop targets,
    runtime-loop body parameters (``nl.fori_loop`` / ``nl.while_loop`` and the scaffolding's
    loops), names visible from an enclosing function, and parameters that some call in this
    module passes one to (propagated until nothing changes)."""
    funcs, parent = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            funcs.append(node)
            for sub in ast.iter_child_nodes(node):
                for inner in ast.walk(sub):
                    if isinstance(inner, ast.FunctionDef):
                        parent.setdefault(id(inner), node)
    by_name: dict = defaultdict(list)
    for f in funcs:
        by_name[f.name].append(f)
    regs = {id(f): set() for f in funcs}
    keys: set = set()

    def params(f):
        return [a.arg for a in f.args.posonlyargs + f.args.args]

    def visible(f):
        out = set(regs[id(f)])
        p = parent.get(id(f))
        while p is not None:
            out |= regs[id(p)]
            p = parent.get(id(p))
        return out

    def own_statements(f):
        """The nodes of ``f`` outside its inner functions."""
        todo = list(f.body)
        while todo:
            n = todo.pop()
            yield n
            todo.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, ast.FunctionDef))

    def target_names(t):
        if isinstance(t, ast.Name):
            return {t.id}
        if isinstance(t, (ast.Tuple, ast.List)):
            out = set()
            for e in t.elts:
                out |= target_names(e)
            return out
        return set()

    for f in funcs:
        for body in _loop_body_names(f, scaffold=True):
            for g in by_name.get(body, ()):
                if parent.get(id(g)) is f and params(g):
                    regs[id(g)] |= set(params(g))
    changed = True
    while changed:
        changed = False
        for f in funcs:
            seen = visible(f)
            mine = regs[id(f)]
            for n in own_statements(f):
                new = set()
                if isinstance(n, ast.Assign) and _holds_scalar(n.value, seen, keys):
                    for t in n.targets:
                        new |= target_names(t)
                        if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) \
                                and t.slice.value not in keys:
                            keys.add(t.slice.value)
                            changed = True
                elif isinstance(n, ast.For) and isinstance(n.iter, ast.Call) \
                        and _runtime_iterator(n.iter) \
                        and isinstance(n.target, ast.Name):
                    new.add(n.target.id)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
                    for g in by_name.get(n.func.id, ()):
                        ps = params(g)
                        for i, a in enumerate(n.args):
                            if i < len(ps) and _holds_scalar(a, seen, keys) \
                                    and ps[i] not in regs[id(g)]:
                                regs[id(g)].add(ps[i])
                                changed = True
                        for k in n.keywords:
                            if k.arg in ps and _holds_scalar(k.value, seen, keys) \
                                    and k.arg not in regs[id(g)]:
                                regs[id(g)].add(k.arg)
                                changed = True
                if new - mine:
                    mine |= new
                    seen |= new
                    changed = True
    return {id(f): visible(f) for f in funcs}, keys


def _loop_body_names(fn, scaffold: bool = True) -> set:
    """Names a function passes as the body of a runtime loop (in its own statements): to
    ``nl.fori_loop`` / ``nl.while_loop``, and with ``scaffold`` to the scaffolding's loops."""
    out = set()
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Call):
            name = _api_name(sub.func)
            body = None
            if name in RUNTIME_LOOPS:
                idx = RUNTIME_LOOPS[name]
                body = sub.args[idx] if len(sub.args) > idx else _keyword(sub, "body_fun")
            elif scaffold and isinstance(sub.func, ast.Name) and sub.func.id in SCAFFOLD_LOOPS:
                idx = SCAFFOLD_LOOPS[sub.func.id]
                body = sub.args[idx] if len(sub.args) > idx else _keyword(sub, "body")
            if isinstance(body, ast.Name):
                out.add(body.id)
    return out


def read_source(text: str, path: str, found: dict | None = None) -> dict:
    """``{construct: [Use, ...]}`` for one module's source."""
    found = defaultdict(list) if found is None else found
    tree = ast.parse(text)
    _Reader(path, found, _scalar_names(tree)).visit(tree)
    return found


def kernel_files(root: Path = KERNELS_DIR) -> list[Path]:
    """The kernel modules (every .py under nki_ssm/kernels but this reader)."""
    return sorted(p for p in root.rglob("*.py") if p.name != "constructs.py")


def scan(files=None, root: Path = REPO_ROOT) -> dict:
    """``{construct: [Use, ...]}`` over our kernels, constructs sorted."""
    found: dict = defaultdict(list)
    for p in files if files is not None else kernel_files():
        read_source(p.read_text(), str(p.resolve().relative_to(root)), found)
    return dict(sorted(found.items()))


def load_evidence(path: Path = EVIDENCE_FILE) -> dict:
    """The evidence map: ``{construct: {"repo", "commit", "path", "line"} or {"doc", ...}}``."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return data.get("construct", {})


def cite(entry: dict) -> str:
    """One evidence entry as text."""
    if "doc" in entry:
        out = f"doc: {entry['doc']}"
    else:
        out = f"{entry['repo']}@{entry['commit'][:10]} `{entry['path']}`:{entry['line']}"
    if entry.get("note"):
        out += f" ({entry['note']})"
    return out


def missing(found: dict, evidence: dict) -> list[str]:
    """Constructs our kernels use that have no evidence entry."""
    return [c for c in found if c not in evidence]


def render(found: dict, evidence: dict) -> str:
    """docs/constructs.md."""
    lines = [
        "# NKI constructs used by the kernels, and their evidence",
        "",
        "Generated by `python -m nki_ssm.kernels.constructs --write` from the kernels' source",
        "(`nki_ssm/kernels/`) and the evidence map `nki_ssm/kernels/constructs_evidence.toml`; "
        "do not edit",
        "by hand. Evidence is a released kernel that uses the construct in the same form",
        "(repository@commit `path`:line) or a documentation section (`doc:`). "
        "`tests/kernels/test_constructs.py`",
        "fails when a kernel uses a construct without evidence, or when this file is stale.",
        "",
        f"{len(found)} constructs.",
        "",
        "| construct | uses | first use | evidence |",
        "|---|---|---|---|",
    ]
    for c, uses in found.items():
        ev = evidence.get(c)
        first = f"`{uses[0].path}`:{uses[0].line}"
        lines.append(f"| `{c.replace('|', '/')}` | {len(uses)} | {first} | "
                     f"{cite(ev) if ev else '**none**'} |")
    return "\n".join(lines) + "\n"


def _git(repo_dir: Path, *args) -> str:
    return subprocess.run(["git", "--git-dir" if (repo_dir / "HEAD").is_file() else "-C",
                           str(repo_dir), *args], check=True, capture_output=True,
                          text=True).stdout


def _released_sources(repo_dir: Path):
    """``(commit, [(path, text), ...])`` of the .py files at HEAD of a git checkout or bare
    git directory (the snapshot the search tool's fetch brings), else of a plain folder."""
    try:
        commit = _git(repo_dir, "rev-parse", "HEAD").strip()
        paths = [p for p in _git(repo_dir, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
                 if p.endswith(".py")]
    except (OSError, subprocess.CalledProcessError):
        return "", [(str(p.relative_to(repo_dir)), p.read_text(errors="replace"))
                    for p in sorted(repo_dir.rglob("*.py"))]
    out = []
    for p in sorted(paths):
        try:
            out.append((p, _git(repo_dir, "show", f"HEAD:{p}")))
        except (subprocess.CalledProcessError, UnicodeDecodeError):
            continue
    return commit, out


def _is_kernel_source(path: str, text: str) -> bool:
    """A released module that is NKI kernel code: it imports the NKI language or ISA and is no
    test, no torch wrapper and no reference implementation."""
    name = path.rsplit("/", 1)[-1]
    if "/test" in f"/{path}" or name.startswith("test_") or name.endswith(("_torch.py",
                                                                           "_ref.py")):
        return False
    return any(s in text for s in ("import nki.language", "import nki.isa", "nki.language as",
                                   "nki.isa as", "from nki import isa", "from nki import language"))


def find_evidence(repo_dir: Path, repo: str, constructs) -> dict:
    """The first use of each construct in the .py files of released kernels (a git checkout,
    a bare git directory or a plain folder), as evidence entries."""
    commit, sources = _released_sources(Path(repo_dir))
    # a form the reader could not resolve ("computed") is no match for another such form
    want = {c for c in constructs if "computed" not in c}
    out: dict = {}
    for rel, text in sources:
        if not _is_kernel_source(rel, text):
            continue
        try:
            found = read_source(text, rel)
        except (SyntaxError, ValueError):
            continue
        for c, uses in found.items():
            if c in want and c not in out:
                out[c] = {"repo": repo, "commit": commit, "path": uses[0].path,
                          "line": uses[0].line}
    return out


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_evidence(evidence: dict) -> str:
    """The evidence map as TOML (``[construct."<name>"]`` tables)."""
    lines = []
    for c in sorted(evidence):
        e = evidence[c]
        lines.append(f"[construct.{_toml_str(c)}]")
        for k in ("repo", "commit", "path", "line", "doc", "note"):
            if k in e:
                v = e[k]
                lines.append(f"{k} = {v if isinstance(v, int) else _toml_str(str(v))}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nki_ssm.kernels.constructs",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="regenerate docs/constructs.md")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a construct has no evidence or docs/constructs.md is stale")
    ap.add_argument("--find-evidence", metavar="DIR", type=Path,
                    help="propose evidence from a checkout of released kernels; with "
                         "--update, add the entries the map lacks")
    ap.add_argument("--repo", default="aws-neuron/nki-library",
                    help="owner/name of the --find-evidence checkout")
    ap.add_argument("--update", action="store_true",
                    help="with --find-evidence: write the new entries into the evidence map")
    args = ap.parse_args(argv)
    found = scan()
    evidence = load_evidence()
    if args.find_evidence:
        proposed = find_evidence(args.find_evidence, args.repo, missing(found, evidence))
        for c, e in proposed.items():
            print(f"{c}\t{cite(e)}")
        if args.update:
            # released entries of constructs no kernel uses any more go (they are found
            # again by a new scan); doc entries are written by hand and stay
            kept = {c: e for c, e in evidence.items() if c in found or "doc" in e}
            EVIDENCE_FILE.write_text(render_evidence({**kept, **proposed}))
        return 0
    text = render(found, evidence)
    if args.write:
        DOC_FILE.write_text(text)
    if args.check:
        gaps = missing(found, evidence)
        banned = [c for c in found if forbidden(c)]
        stale = not DOC_FILE.exists() or DOC_FILE.read_text() != text
        for c in gaps:
            print(f"no evidence: {c} (first use {found[c][0].path}:{found[c][0].line})")
        for c in banned:
            uses = ", ".join(f"{u.path}:{u.line}" for u in found[c])
            print(f"forbidden: {c} ({uses})")
        if stale:
            print(f"{DOC_FILE.relative_to(REPO_ROOT)} is stale: run with --write")
        return 1 if gaps or banned or stale else 0
    if not args.write:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
