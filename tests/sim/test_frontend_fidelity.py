"""Issue 14: the simulator accepts what the NKI front end accepts and rejects what it rejects.

One small kernel per rule, each docstring citing the source: the public front end
github.com/leanprover/KLR at commit 7ccd18c (file and lines) or the NKI docs in
github.com/aws-neuron/aws-neuron-sdk (nki/...). Rejections name the construct and the
kernel line. (Capacity by access liveness, rule 1, is in test_capacity.py.)
"""
from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.subset import NkiFrontendWarning

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


def _line_of(fn, text: str) -> int:
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, s in enumerate(lines) if text in s)


def _rejects(kernel, *args, words: str, line_text: str | None = None):
    with pytest.raises(NkiValidationError, match="NKI compiler rejects") as e:
        simulate(jit(kernel))(X, *args)
    msg = str(e.value)
    assert words in msg, msg
    if line_text is not None:
        assert f"{kernel.__name__}:{_line_of(kernel, line_text)}:" in msg, msg
    return msg


def _runs(kernel, *args):
    np.testing.assert_array_equal(simulate(jit(kernel))(X, *args), X)


# ---- 2. is / is not / in ----------------------------------------------------------------

def k_is_none(x, bias):
    if bias is None:
        return _copy(x)
    return _copy(bias)


def k_is_lists(x):
    a = [1, 2]
    b = [1, 2]
    assert a is b, "the front end compares with =="
    assert not (a is not b)
    return _copy(x)


def test_is_and_is_not_compare_with_equality():
    """KLR/NKI/Simplify.lean 205-208: ``x is None`` / ``is not None`` become ``== None`` /
    ``!= None``; 83-88: any other ``is`` becomes ``==`` with a warning ("the 'is' operator is
    not supported in NKI, use =="). Released nki-library code uses ``is None`` throughout.
    Two equal lists are therefore ``is`` in NKI (not in CPython)."""
    _runs(k_is_none, None)
    with pytest.warns(NkiFrontendWarning, match="'is' operator"):
        _runs(k_is_lists)


def k_in_tuple(x, n):
    assert n in (1, 2, 3) and "a" in "abc" and 7 not in [1, 2]
    return _copy(x)


def k_in_dict_runtime(x, table):
    if "k" in table:
        return _copy(x)
    return _copy(x)


def k_in_chained(x, n):
    if 0 < n in (1, 2):
        return _copy(x)
    return _copy(x)


def test_in_takes_tuple_list_or_str_only():
    """KLR/NKI/Simplify.lean 209-212: a single ``in`` / ``not in`` becomes
    ``builtin.op.in``, defined on a tuple, a list or two strs (KLR/Trace/Python.lean 58-72:
    otherwise "in operator not support on types ..."); inside a chained comparison it is
    "the 'in' operator is not supported in NKI" (Simplify.lean 89-90)."""
    _runs(k_in_tuple, 2)
    _rejects(k_in_dict_runtime, {"k": 1}, words="'in' on a str and a dict",
             line_text='"k" in table')
    _rejects(k_in_chained, 1, words="'in' inside a chained comparison",
             line_text="0 < n in (1, 2)")


# ---- 3. memset of an int into a float tile ------------------------------------------------

def k_memset_int_into_float(x):
    t = nl.ndarray((2, 4), nl.bfloat16, buffer=nl.sbuf)
    nisa.memset(dst=t, value=3)
    out = nl.ndarray((2, 4), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def k_memset_float_into_int(x):
    t = nl.ndarray((2, 4), nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=3.0)
    return _copy(x)


def test_memset_int_into_float_accepted_float_into_int_rejected():
    """NKI 0.3.0 release notes (release-notes/components/nki.rst 396): memset rejects "float
    values to integer-typed tensors"; the other direction is not forbidden, KLR's memset
    takes any Immediate (KLR/Trace/ISA.lean 679-693), nki-library writes ``value=0`` into
    float tiles (output_projection_cte_tensor_io.py 414)."""
    np.testing.assert_array_equal(simulate(jit(k_memset_int_into_float))(X), np.full((2, 4), 3.0))
    with pytest.raises(NkiValidationError, match="memset: value must be an int"):
        simulate(jit(k_memset_float_into_int))(X)


# ---- 4. module-level dict / list ---------------------------------------------------------

_CONFIG = {"scale": 2, "names": ["a", "b"]}
_SIZES = [1, 2, 3]


def k_reads_globals(x):
    assert _CONFIG["scale"] == 2 and len(_SIZES) == 3 and _CONFIG.get("names")[1] == "b"
    return _copy(x)


def k_mutates_global_dict(x):
    _CONFIG["scale"] = 3
    return _copy(x)


def k_mutates_global_list(x):
    _SIZES.append(4)
    return _copy(x)


def k_mutates_alias(x):
    sizes = _SIZES
    sizes.append(4)          # not visible statically: the launch works on a copy
    return _copy(x)


def test_module_dict_and_list_reads_accepted_mutation_rejected():
    """KLR interop/klr/gather.c ``const_expr`` (489-560) turns a module-level tuple, list or
    dict the kernel reads into a constant copied at trace time; the docs only warn that a
    cached kernel does not see later edits (NKI 0.5.0 release notes, known issues: kernels
    must be pure functions of their arguments), which is also why mutating one is rejected.
    A mutation through an alias changes only the launch's copy."""
    with pytest.warns(NkiFrontendWarning) as rec:
        _runs(k_reads_globals)
    assert sorted(re.search(r"module global '(\w+)'", str(w.message)).group(1)
                  for w in rec) == ["_CONFIG", "_SIZES"]
    with pytest.warns(NkiFrontendWarning):
        _rejects(k_mutates_global_dict, words="mutating the module global '_CONFIG'",
                 line_text='_CONFIG["scale"] = 3')
    with pytest.warns(NkiFrontendWarning):
        _rejects(k_mutates_global_list, words="mutating the module global '_SIZES' (.append())",
                 line_text="_SIZES.append(4)")
    with pytest.warns(NkiFrontendWarning):
        _runs(k_mutates_alias)
    assert _SIZES == [1, 2, 3] and _CONFIG["scale"] == 2


# ---- 5. errors in source order -----------------------------------------------------------

def _helper_with_error(x):
    return [v for v in (1, 2)]


def k_three_errors(x):
    n = sorted((3, 1))                                # line A: a builtin NKI lacks
    y = {1: (lambda v: v)}                            # line B: int key and a lambda
    _helper_with_error(x)
    z = [i for i in range(2)]                          # line C
    return _copy(x)


def test_errors_are_reported_in_source_order():
    """gather.c collects every error (add_msg, up to 100) instead of stopping at the first;
    the simulator lists all of them, kernel first, each function's in line order, the same
    on every run (the walk no longer depends on set order)."""
    msgs = []
    for _ in range(2):
        with pytest.raises(NkiValidationError) as e:
            simulate(jit(k_three_errors))(X)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    lines = msgs[0].splitlines()
    assert "sorted()" in lines[0] and "(5 violations" in lines[1]
    body = lines[2:]
    where = [int(re.search(r":(\d+): the NKI", s).group(1)) for s in body]
    assert where[:4] == sorted(where[:4]) and "k_three_errors" in body[3]
    assert "_helper_with_error" in body[4]          # helpers after the kernel
    assert ["sorted()" in body[0], "not string constants" in body[1], "lambda" in body[2],
            "list comprehensions" in body[3]] == [True] * 4


_THIS = sys.modules[__name__]


def k_helper_by_attribute(x):
    _THIS._helper_with_error(x)
    return _copy(x)


def test_helpers_reached_as_module_attributes_are_checked():
    """gather.c ``reference`` (Attribute_kind) follows ``module.function`` paths to the
    functions a kernel calls, so their Python is checked too."""
    _rejects(k_helper_by_attribute, words="list comprehensions")


# ---- 6. min / max ------------------------------------------------------------------------

def k_min_three(x, a, b, c):
    n = min(a, b, c)
    return _copy(x)


def k_min_forms(x, a, b):
    assert min(a, b) == 1 and max((a, b, 7)) == 7 and min([a, b]) == 1
    return _copy(x)


def test_min_max_take_one_sequence_or_two_values():
    """KLR/Trace/Python.lean 150-191 (``builtin.python.min`` / ``max``): ``[] -> error``,
    one list or tuple, or exactly two values; anything else is "invalid arguments"."""
    _runs(k_min_forms, 1, 2)
    _rejects(k_min_three, 1, 2, 3, words="min() with 3 positional argument(s)",
             line_text="min(a, b, c)")


# ---- 7. tuple / list slices --------------------------------------------------------------

def k_slice(x, seq, lo, hi, step):
    part = seq[lo:hi:step]
    return _copy(x)


def test_list_and_tuple_slices_stay_inside_the_sequence():
    """KLR/Trace/Term.lean 312-320 (``listAccess``): bounds, after counting negative ones
    from the end, must lie in [0, len] ("slice index out of bounds"), and the step must be
    positive ("slice step cannot be zero or negative"); Python clamps instead."""
    _runs(k_slice, (1, 2, 3), 0, 3, 1)
    _runs(k_slice, (1, 2, 3), -2, None, None)
    _runs(k_slice, (1, 2, 3), 2, 1, None)            # empty, in bounds
    _rejects(k_slice, (1, 2, 3), 1, 4, None, words="the slice [1:4] of a tuple of length 3",
             line_text="seq[lo:hi:step]")
    _rejects(k_slice, (1, 2, 3), -5, None, None, words="slice index out of bounds")
    _rejects(k_slice, (1, 2, 3), None, None, -1, words="step -1")


def k_str_subscript(x, s):
    c = s[0]
    return _copy(x)


def test_str_subscript_rejected():
    """KLR/Trace/Term.lean 426: "string subscript not implemented"."""
    _rejects(k_str_subscript, "abc", words="a subscript of a str", line_text="s[0]")


# ---- list / dict / tuple methods and item assignment ------------------------------------

def k_list_methods(x):
    lst = [3, 1, 3, 2]
    lst.remove(3)                      # the front end drops every 3
    assert lst == [1, 2] and lst.index(7) == None and lst.index(2) == 1  # noqa: E711
    lst.extend((5,))
    assert lst.pop() == 5 and lst.copy() == [1, 2]
    d = {"a": 1}
    assert d.keys() == ["a"] and d.items() == [("a", 1)] and d.get("b", 0) == 0
    lst[1] = 9
    d["b"] = 2
    return _copy(x)


def k_list_count(x):
    n = [1, 1, 2].count(1)
    return _copy(x)


def k_list_pop_index(x):
    lst = [1, 2, 3]
    v = lst.pop(0)
    return _copy(x)


def k_list_insert(x):
    lst = [1]
    lst.insert(0, 2)
    return _copy(x)


def k_tuple_index(x):
    t = (1, 2)
    i = t.index(2)
    return _copy(x)


def k_dict_update(x):
    d = {"a": 1}
    d.update({"b": 2})
    return _copy(x)


def k_negative_item_assignment(x):
    lst = [1, 2]
    lst[-1] = 3
    return _copy(x)


def test_list_dict_methods_follow_the_front_end():
    """KLR/Trace/Term.lean 475-498: the methods a list / dict has (tuples and strs have none,
    469-545); KLR/Trace/Python.lean 281-383 their meaning: ``remove`` drops every equal item,
    ``index`` returns None when absent, ``keys``/``items``/``values`` are lists; ``count``
    returns the length and ``pop`` ignores an index (so both are rejected here: the result
    would differ from Python's); ``lst[i] = v`` needs 0 <= i < len (KLR/Trace/NKI.lean
    340-350)."""
    _runs(k_list_methods)
    _rejects(k_list_count, words="list.count(x)", line_text=".count(1)")
    _rejects(k_list_pop_index, words="list.pop(i)", line_text="lst.pop(0)")
    _rejects(k_list_insert, words="list.insert()", line_text="lst.insert(0, 2)")
    _rejects(k_tuple_index, words="tuple.index()", line_text="t.index(2)")
    _rejects(k_dict_update, words="dict.update()", line_text="d.update(")
    _rejects(k_negative_item_assignment, words="list item assignment at index -1",
             line_text="lst[-1] = 3")


# ---- 8. builtins and Python forms --------------------------------------------------------

def k_accepted_forms(x, n):
    """Everything here is accepted by KLR (see the test docstring)."""
    q, r = divmod(n, 2)
    assert isinstance(n, int) and abs(-n) == n and int(2.5) == 2 and float(n) == 2.0
    assert type(n) == int and bool(n) and str(n) == "2" and len((1, 2)) == 2
    s = slice(0, 2)
    msg = f"{n!r} tiles of {q}"
    print(msg)
    lst = list((1, 2))
    lst.append(3)
    d = dict()
    d["a"] = 1
    for kv in d.items():
        k = kv[0]
    assert math.ceil(1.5) == 2 and math.sqrt(4.0) == 2.0 and math.pi > 3
    t = (1, 2) + (3,)
    a, (b, c) = 1, (2, 3)
    i = 0
    while i < 2:
        i += 1
    for j in range(0, 4, 2):
        if j == 2:
            break
    for j in nl.affine_range(2):
        continue
    for e in None if n > 5 else (1,):
        i = e
    with nl.no_reorder():
        out = _copy(x)
    return out


def test_accepted_builtins_and_forms_run():
    """KLR/Trace/Python.lean 45-400: the builtins abs, bool, dict, divmod, float, int,
    isinstance, len, list (+ append ...), max, min, print, slice, str, tuple, type; the math
    module's ceil/floor/gcd/log2/log10/pow/sqrt/pi/e/inf/nan (34-39, 405-424); dict.items()
    is a list (360-362); a for-loop over a tuple, list or None (246-254);
    f-strings with !r/!s/!a (KLR/NKI/Simplify.lean 226-232); assert (Simplify.lean 350);
    nested tuple targets (293-330); ``range`` / ``nl.affine_range`` loop headers
    (KLR/NKI/Annotations.lean 115-138); ``with nl.no_reorder()`` (Annotations 140-143)."""
    _runs(k_accepted_forms, 2)


def k_sorted(x):
    s = sorted((2, 1))
    return _copy(x)


def k_comprehension(x):
    s = [i for i in range(2)]
    return _copy(x)


def k_star_call(x):
    args = (1, 2)
    m = max(*args)
    return _copy(x)


def k_nested_def(x):
    def inner(v):
        return v
    return _copy(x)


def k_lambda(x):
    f = lambda v: v  # noqa: E731
    return _copy(x)


def k_format_spec(x, n):
    s = f"{n:>4}"
    return _copy(x)


def k_math_exp(x):
    e = math.exp(1.0)
    return _copy(x)


def k_numpy(x):
    d = np.float32
    return _copy(x)


def k_list_target(x):
    [a, b] = (1, 2)
    return _copy(x)


def k_ellipsis_value(x):
    e = ...
    return _copy(x)


def k_iterate_dict(x):
    for key in {"a": 1}:
        k = key
    return _copy(x)


def k_range_keyword(x):
    for i in range(0, 4, step=2):
        k = i
    return _copy(x)


def k_affine_range_value(x):
    r = nl.affine_range(3)
    return _copy(x)


def k_dict_keywords(x):
    d = dict(a=1)
    return _copy(x)


def k_with_other(x):
    with nl.no_reorder_ish():
        k = 1
    return _copy(x)


def k_str_method(x, n):
    s = "{}".format(n)
    return _copy(x)


def _cached(f):
    return f


@_cached
def _decorated_helper(x):
    return x


def k_decorated_helper(x):
    return _copy(_decorated_helper(x))


@pytest.mark.parametrize("kernel, words, line_text", [
    (k_sorted, "the Python builtin sorted()", "sorted((2, 1))"),
    (k_comprehension, "list comprehensions", "[i for i in"),
    (k_star_call, "tuple expansion", "max(*args)"),
    (k_nested_def, "inner function definitions", "def inner"),
    (k_lambda, "lambda expressions", "lambda v"),
    (k_format_spec, "format specifiers", 'f"{n:>4}"'),
    (k_math_exp, "math.exp", "math.exp"),
    (k_numpy, "numpy (np.float32)", "np.float32"),
    (k_list_target, "assignment targets other than names", "[a, b] ="),
    (k_ellipsis_value, "'...' outside an index", "e = ..."),
    (k_iterate_dict, "iterating over a dict", 'for key in {"a": 1}'),
    (k_range_keyword, "range() with keywords", "range(0, 4, step=2)"),
    (k_affine_range_value, "affine_range() outside a for-loop header", "nl.affine_range(3)"),
    (k_dict_keywords, "dict() with keyword arguments", "dict(a=1)"),
    (k_with_other, "the with-context nl.no_reorder_ish()", "with nl.no_reorder_ish"),
    (k_str_method, "the str method .format()", '"{}".format'),
    (k_decorated_helper, "the decorator @_cached", None),
])
def test_rejected_forms_name_construct_and_line(kernel, words, line_text, monkeypatch):
    """Rejections and their sources: builtins outside KLR/Trace/Python.lean's table;
    comprehensions, lambda (interop/klr/gather.c 1077-1080 "unsupported expression");
    star-args (KLR/NKI/Simplify.lean 224); inner def (gather.c 1322-1324); format specifiers
    (gather.c 1055-1058); math beyond ceil/floor/gcd/log2/log10/pow/sqrt (Python.lean
    405-424); numpy (KLR/Trace/NKI.lean 549-560); list targets (Simplify.lean 293-316);
    ``...`` as a value (Simplify.lean 60); iterating a dict (Python.lean 246-254); range with
    keywords or as a value (KLR/NKI/Annotations.lean 115-138); dict(**kw) (Python.lean 340);
    with-contexts other than no_reorder (Annotations.lean 140-143); str methods (no str
    attributes, KLR/Trace/Term.lean 469-530); decorators other than staticmethod /
    dataclass / nki.jit (Simplify.lean 432-443)."""
    if kernel is k_nested_def:      # NKI 0.6.0 takes inner defs (its loop bodies); 0.5.0 not
        monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.5.0")
    args = (2,) if kernel in (k_format_spec, k_str_method) else ()
    msg = _rejects(kernel, *args, words=words, line_text=line_text)
    if kernel is k_decorated_helper:
        assert "_decorated_helper" in msg


# ---- 9. float tensor_tensor on GpSimd ----------------------------------------------------

def k_gpsimd_float_add(x):
    a = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    nisa.tensor_tensor(dst=a, data1=a, data2=a, op=nl.add, engine=nisa.engine.gpsimd)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a)
    return out


def test_float_tensor_tensor_on_gpsimd_is_accepted():
    """Settled from the ISA reference and the KLR signature: ``nki.isa.tensor_tensor``
    "Perform[s] an element-wise operation ... using Vector Engine or GpSimd Engine", takes
    ``engine=nki.isa.engine.gpsimd``, and for float types "the engine casts input data types
    to float32" (aws-neuron-sdk nki/api/nki/isa/__init__.py 1019-1078); KLR's
    ``builtin.isa.tensor_tensor`` takes any ``engine`` with no dtype condition
    (KLR/Trace/ISA.lean 335-354). Only PSUM operands are excluded on GpSimd."""
    np.testing.assert_array_equal(simulate(jit(k_gpsimd_float_add))(X), 2 * X)
