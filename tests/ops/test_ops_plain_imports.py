"""Each op reaches its launcher and kernel through plain imports (DESIGN.md, layers).

Read statically (``ast``, nothing imported): no module under ``nki_ssm/ops/`` looks
modules up by name, and following the names a function uses -- through the
imports of its module, its own function-level imports and the functions of the
modules it reaches -- leads from ``nki_ssm.ops.gated_delta_prefill`` (the op
that takes ``cu_seqlens``) through its launcher to the chunked kernel's file.
"""
from __future__ import annotations

import ast
import functools
import pathlib

import pytest

import nki_ssm

PACKAGE_ROOT = pathlib.Path(nki_ssm.__file__).parent
ROOT = PACKAGE_ROOT.parent
DYNAMIC_IMPORTS = {"importlib", "import_module", "__import__"}


@functools.lru_cache(maxsize=None)
def _path_of(module: str) -> pathlib.Path | None:
    """The source file of a dotted ``nki_ssm`` module name (None outside the package)."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_of(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Module:
    """A parsed module: its top-level definitions (functions, classes, assigned names ->
    the node whose names they use) and the names its imports bind."""

    def __init__(self, name: str):
        self.name, self.path = name, _path_of(name)
        self.tree = ast.parse(self.path.read_text())
        self.functions = {}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.functions[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.functions[target.id] = node.value
        self.bindings = bind_imports(self, self.tree.body)


@functools.lru_cache(maxsize=None)
def _parsed(name: str) -> Module:
    return Module(name)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def bind_imports(module: Module, statements) -> dict:
    """name -> ("module", dotted) or ("attr", dotted module, attribute) for the imports
    directly in ``statements`` (not inside nested functions)."""
    bound = {}
    for node in statements:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = ("module", alias.name)
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = ("module", top)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                name = alias.asname or alias.name
                if _path_of(f"{source}.{alias.name}") is not None:
                    bound[name] = ("module", f"{source}.{alias.name}")
                else:
                    bound[name] = ("attr", source, alias.name)
    return bound


def _local_imports(function) -> list:
    return [n for n in ast.walk(function) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _references(function, bindings: dict) -> set:
    """(module, function-or-None) pairs that ``function`` names: ``f``, ``m.f``, ``m``."""
    found = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = bindings.get(node.value.id)
            if target and target[0] == "module":
                found.add((target[1], node.attr))
        elif isinstance(node, ast.Name):
            target = bindings.get(node.id)
            if target and target[0] == "module":
                found.add((target[1], None))
            elif target:
                found.add((target[1], target[2]))
    return found


def follow(module: str, function: str) -> dict:
    """Every (module, name) reachable from ``module.function`` by following names (into
    functions, classes and module-level assignments) -> the (module, name) it was first
    reached from."""
    start = (module, function)
    came_from = {start: None}
    todo = [start]
    while todo:
        mod_name, fn_name = todo.pop()
        if _path_of(mod_name) is None:
            continue                      # outside the package (numpy, ...)
        mod = _parsed(mod_name)
        if fn_name is None:
            continue                      # a module named as a whole: its file is reached
        fn = mod.functions.get(fn_name)
        if fn is None:
            bound = mod.bindings.get(fn_name)   # a re-export: on to where it is defined
            if bound is not None:
                ref = (bound[1], bound[2] if bound[0] == "attr" else None)
                if ref not in came_from:
                    came_from[ref] = (mod_name, fn_name)
                    todo.append(ref)
            continue
        bindings = {**mod.bindings, **bind_imports(mod, _local_imports(fn))}
        bindings.update({n: ("attr", mod_name, n) for n in mod.functions if n not in bindings})
        for ref in _references(fn, bindings):
            if ref not in came_from:
                came_from[ref] = (mod_name, fn_name)
                todo.append(ref)
                if ref[1] is not None and _path_of(ref[0]) is not None:
                    # a function reached also makes its module's file reached
                    came_from.setdefault((ref[0], None), (mod_name, fn_name))
    return came_from


def _chain(came_from: dict, node) -> list:
    chain = []
    while node is not None:
        chain.append(node)
        node = came_from[node]
    return chain[::-1]


def test_no_module_lookup_by_name_under_ops():
    for path in sorted((PACKAGE_ROOT / "ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]] + [a.name for a in node.names]
            elif isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            bad = DYNAMIC_IMPORTS.intersection(names)
            assert not bad, f"{path.relative_to(ROOT)}:{node.lineno} uses {sorted(bad)}"


def test_gated_delta_prefill_reaches_the_chunk_kernel_by_its_imports():
    came_from = follow("nki_ssm.ops.gated_delta", "gated_delta_prefill")
    kernel = "nki_ssm.kernels.gated_delta.chunk"
    reached = [n for n in came_from if n[0] == kernel]
    assert reached, "nki_ssm/kernels/gated_delta/chunk.py is not reached by following imports"
    chain = _chain(came_from, reached[0])
    modules = [m for m, _ in chain]
    assert modules[0] == "nki_ssm.ops.gated_delta"
    # through the op's own launcher, whose entry takes cu_seqlens
    assert ("nki_ssm.ops.launch.gated_delta", "prefill") in chain, chain
    launcher = Module("nki_ssm.ops.launch.gated_delta").functions["prefill"]
    assert "cu_seqlens" in [a.arg for a in launcher.args.kwonlyargs + launcher.args.args]


@pytest.mark.parametrize("op,launch,kernels", [
    ("short_conv_prefill", "short_conv", "short_conv"),
    ("short_conv_decode", "short_conv", "short_conv"),
    ("ssd_prefill", "mamba2_ssd", "mamba2_ssd"),
    ("ssd_decode", "mamba2_ssd", "mamba2_ssd"),
    ("gated_delta_prefill", "gated_delta", "gated_delta"),
    ("gated_delta_decode", "gated_delta", "gated_delta"),
])
def test_every_op_reaches_its_launcher_and_a_kernel_of_its_family(op, launch, kernels):
    came_from = follow(f"nki_ssm.ops.{launch}", op)
    entry = op.rsplit("_", 1)[1]
    assert (f"nki_ssm.ops.launch.{launch}", entry) in came_from
    assert any(m.startswith(f"nki_ssm.kernels.{kernels}.") for m, _ in came_from), op


def test_the_walker_follows_re_exports_and_stops_at_other_packages():
    """The walker itself (so the tests above fail for the right reason): the package's
    re-export of an op leads to the op's module; a name lookup by string leads nowhere."""
    assert _module_of(_path_of("nki_ssm.ops.launch")) == "nki_ssm.ops.launch"
    assert _path_of("nki_ssm.kernels.gated_delta.chunk").name == "chunk.py"
    assert _path_of("numpy") is None
    came_from = follow("nki_ssm.ops", "gated_delta_prefill")
    assert ("nki_ssm.ops.gated_delta", "gated_delta_prefill") in came_from
    assert any(m == "nki_ssm.kernels.gated_delta.chunk" for m, _ in came_from)
    backend = follow("nki_ssm.backend", "resolve")      # importlib.import_module("nki")
    assert not any(m.startswith("nki_ssm.kernels") for m, _ in backend)


def test_launchers_import_nothing_from_the_host_api():
    """Layers point down: ``nki_ssm.ops.launch`` (module- and function-level imports alike)
    imports the kernels, the backend and its own modules, never the host API above it
    (``nki_ssm.ops.<op>`` / ``_dispatch`` / ``_validate``)."""
    launch = PACKAGE_ROOT / "ops" / "launch"
    bad = []
    for path in sorted(launch.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.level:
                    names = [("nki_ssm.ops.launch." if node.level == 1 else "nki_ssm.ops.")
                             + node.module]
                else:
                    names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("nki_ssm.ops.") and not name.startswith("nki_ssm.ops.launch"):
                    bad.append(f"{path.name}:{node.lineno} {name}")
    assert bad == []
