"""The simulator rejects kernel Python the NKI compiler's front end rejects (sim/subset.py).

Each negative case is a tiny kernel using one construct; the error must name
the construct. Sources: NKI migration guide 0.3.0, NKI language guide, and the
front end's source (github.com/leanprover/KLR, interop/klr/gather.c,
KLR/NKI/Simplify.lean, KLR/Trace/Python.lean).
"""
import numpy as np
import pytest

from nki_ssm.sim import isa as nisa
from nki_ssm.sim import language as nl
from nki_ssm.sim.jit import jit, simulate
from nki_ssm.sim.errors import NkiValidationError
from nki_ssm.sim.subset import check_kernel

X = np.ones((4, 8), np.float32)


def _copy(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out


def k_listcomp(x):
    ts = [i for i in range(2)]
    return _copy(x)


def k_genexp(x):
    n = max(i for i in range(2))
    return _copy(x)


def k_lambda(x):
    f = lambda v: v  # noqa: E731
    return _copy(x)


def k_raise(x):
    if x.shape[0] > 128:
        raise ValueError("too big")
    return _copy(x)


def k_try(x):
    try:
        n = 1
    except ValueError:
        n = 2
    return _copy(x)


def k_is(x):
    if x is None:
        return None
    return _copy(x)


def k_kwonly(x, *, flag=False):
    return _copy(x)


def k_varargs(x, *rest):
    return _copy(x)


def k_for_tuple(x):
    for (a, b) in ((1, 2), (3, 4)):
        n = a + b
    return _copy(x)


def k_in_dict(x):
    d = {}
    d["a"] = 1
    if "a" in d:
        n = 1
    return _copy(x)


def k_dict_int_key(x):
    d = {1: 2}
    return _copy(x)


def k_zip(x):
    for p in zip((1, 2), (3, 4)):
        n = p
    return _copy(x)


def k_enumerate(x):
    for p in enumerate((1, 2)):
        n = p
    return _copy(x)


def k_format_spec(x):
    s = f"{1.5:.2f}"
    return _copy(x)


def k_nested_def(x):
    def inner(v):
        return v
    return _copy(x)


def k_del(x):
    t = 1
    del t
    return _copy(x)


def k_with_as(x):
    with nl.no_reorder() as r:
        n = 1
    return _copy(x)


def k_kwexpand(x):
    kw = {"dst": x}
    return _copy(x, **kw)


def k_for_else(x):
    for i in range(2):
        n = i
    else:
        n = 0
    return _copy(x)


def k_range_value(x):
    r = list(range(3))
    return _copy(x)


def k_tuple_subscript_target(x):
    d = {}
    d["a"], n = 1, 2
    return _copy(x)


def k_two_sets(x):
    a = [0]
    b = [0]
    a[0] = b[0] = 1
    return _copy(x)


def k_set(x):
    s = {1, 2}
    return _copy(x)


def k_in_chain(x):
    if 1 in (1, 2) == True:  # noqa: E712
        n = 1
    return _copy(x)


def _helper_bad(x):
    return [v for v in (1, 2)]


def k_helper(x):
    _helper_bad(x)
    return _copy(x)


_TABLE = (_helper_bad,)


def k_table(x):
    fns = _TABLE
    fns[0](x)
    return _copy(x)


@pytest.mark.parametrize("kernel, words", [
    (k_listcomp, "list comprehensions"), (k_genexp, "generator expressions"),
    (k_lambda, "lambda"), (k_raise, "'raise'"), (k_try, "'try'"),
    (k_kwonly, "keyword-only"), (k_varargs, "varargs"), (k_for_tuple, "for-loop target"),
    (k_in_dict, "'in' on a dict"), (k_dict_int_key, "dict literal keys"),
    (k_zip, "zip()"), (k_enumerate, "enumerate()"), (k_format_spec, "format specifiers"),
    (k_nested_def, "inner function"), (k_del, "'del'"), (k_with_as, "with-statements"),
    (k_kwexpand, "keyword expansion"), (k_for_else, "for/while ... else"),
    (k_tuple_subscript_target, "assignment targets other than names"),
    (k_two_sets, "several mutating targets"), (k_set, "set literals"), (k_range_value, "range() outside"), (k_in_chain, "chained comparison"),
    (k_helper, "list comprehensions"), (k_table, "list comprehensions"),
])
def test_rejected_construct_names_itself(kernel, words, monkeypatch):
    if kernel is k_nested_def:      # inner defs are NKI 0.6.0 loop bodies; 0.5.0 rejects them
        monkeypatch.setenv("NKI_SSM_NKI_VERSION", "0.5.0")
    with pytest.raises(NkiValidationError, match="NKI compiler rejects") as e:
        simulate(jit(kernel))(X)
    assert words in str(e.value)
    assert kernel.__name__ in str(e.value) or "_helper_bad" in str(e.value)


def k_allowed(x, flag, n):
    """Constructs the front end accepts: the check must not reject them."""
    d = {}
    d["k" + str(n)] = [None] * n
    lst = [1, 2]
    lst.append(3)
    v = d.get("k1")
    if v != None and 0 <= n < 4 and 2 in lst and 1 in (1, 2):  # noqa: E711
        m = n if flag else 0
    a0, (b0, c0) = 1, (2, 3)
    lst[0] = v2 = 7
    i = 0
    while i < 2:
        i += 1
    for j in range(3):
        if j == 1:
            continue
    msg = f"{n} tiles"
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    with nl.no_reorder():
        nisa.dma_copy(dst=t, src=x)
    assert len(lst) == 3, msg
    return _copy(x)


def test_allowed_constructs_run():
    np.testing.assert_array_equal(simulate(jit(k_allowed))(X, True, 1), X)


def test_check_is_cached_and_repeats_its_error():
    check_kernel(k_allowed)
    check_kernel(k_allowed)
    for _ in range(2):
        with pytest.raises(NkiValidationError, match="lambda"):
            check_kernel(k_lambda)


def test_project_kernels_pass_the_subset_check():
    """Every @nki.jit kernel under nki_ssm/kernels (and the helpers it reaches)."""
    import importlib
    import pkgutil

    import nki_ssm.kernels as K
    from nki_ssm import backend
    from nki_ssm.sim.jit import Kernel
    if backend.name() != "sim":
        pytest.skip("kernels are built on the Neuron SDK here; its compiler does this check")
    found = []
    for m in pkgutil.walk_packages(K.__path__, "nki_ssm.kernels."):
        mod = importlib.import_module(m.name)
        for v in vars(mod).values():
            if isinstance(v, Kernel) and v.func.__module__ == m.name:
                check_kernel(v.func)
                found.append(v.func.__name__)
    assert {"short_conv_prefill_kernel", "short_conv_decode_kernel"} <= set(found)


def test_compile_time_ints_are_32_bit():
    def k(x, n):
        return _copy(x)
    np.testing.assert_array_equal(simulate(jit(k))(X, 2**31 - 1), X)
    with pytest.raises(NkiValidationError, match="32-bit"):
        simulate(jit(k))(X, 2**31)
    with pytest.raises(NkiValidationError, match="32-bit"):
        simulate(jit(k))(X, (1, -2**31 - 1))


@jit
def _jit_helper(x):
    return _copy(x)


def k_calls_jit(x):
    return _jit_helper(x)


def test_jit_decorated_helper_warns_citing_released_use():
    from nki_ssm.sim.subset import NkiFrontendWarning
    with pytest.warns(NkiFrontendWarning, match="decorated with nki.jit.*moe_cte.py:351"):
        np.testing.assert_array_equal(simulate(jit(k_calls_jit))(X), X)


def test_numpy_scalar_kernel_args_rejected():
    def k(x, n):
        return _copy(x)
    for bad in (np.int32(3), np.int64(3), np.float32(1.5), np.bool_(True), (1, np.int64(2))):
        with pytest.raises(TypeError, match="NumPy scalar"):
            simulate(jit(k))(X, bad)
    np.testing.assert_array_equal(simulate(jit(k))(X, np.float64(1.5)), X)   # a float subclass


_MUTABLE = [1, 2]


def k_mutable_global(x):
    n = _MUTABLE[0]
    return _copy(x)


def test_module_global_list_read_is_accepted_with_a_warning():
    """KLR interop/klr/gather.c const_expr turns a module-level list a kernel reads into a
    constant; the docs warn only that later edits are not seen (kernel caching)."""
    from nki_ssm.sim.subset import NkiFrontendWarning
    with pytest.warns(NkiFrontendWarning, match="module global '_MUTABLE'"):
        np.testing.assert_array_equal(simulate(jit(k_mutable_global))(X), X)


def test_inner_def_is_a_060_loop_body():
    """NKI 0.6.0's nl.fori_loop docstring defines its body inside the kernel."""
    np.testing.assert_array_equal(simulate(jit(k_nested_def))(X), X)


def k_numpy_constant(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=-np.inf)
    nisa.dma_copy(dst=out, src=t)
    return out


def k_numpy_call(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=t, value=np.float32(1.0))
    nisa.dma_copy(dst=out, src=t)
    return out


def test_numpy_constant_warns_citing_the_released_kernel_and_numpy_calls_fail():
    from nki_ssm.sim.subset import NkiFrontendWarning
    with pytest.warns(NkiFrontendWarning, match=r"np\.inf.*attention_tkg\.py:1040"):
        y = simulate(jit(k_numpy_constant))(X)
    assert np.isneginf(y).all()
    with pytest.raises(NkiValidationError, match=r"numpy \(np\.float32\)"):
        simulate(jit(k_numpy_call))(X)
