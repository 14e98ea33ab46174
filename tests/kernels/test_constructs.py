"""The construct table (nki_ssm/kernels/constructs.py): what the reader calls a construct, and
that every construct our kernels use has evidence (issue 25, item 5)."""
from __future__ import annotations

import textwrap

import pytest

from nki_ssm.kernels import constructs


def _read(src: str) -> dict:
    return constructs.read_source(textwrap.dedent(src), "k.py")


def test_positional_and_keyword_arguments_are_one_form():
    a = _read("nisa.nc_matmul(d, s, m)\n")
    b = _read("nisa.nc_matmul(dst=d, stationary=s, moving=m)\n")
    assert list(a) == list(b) == ["nisa.nc_matmul(dst, moving, stationary)"]


@pytest.mark.parametrize("pos, form", [("(0, 64)", "(0, c)"), ("(32, 0)", "(r, 0)"),
                                       ("(64, 64)", "(r, c)"), ("tp", "computed")])
def test_tile_positions_are_named_by_form(pos, form):
    found = _read(f"nisa.nc_matmul(dst=d, stationary=s, moving=m, tile_position={pos})\n")
    assert f"nisa.nc_matmul tile_position={form}" in found


def test_transpose_mode_tiles_are_their_own_construct():
    found = _read("nisa.nc_matmul(dst=d, stationary=s, moving=m, is_transpose=True, "
                  "tile_position=(0, 0))\n")
    assert "nisa.nc_matmul tile_position with is_transpose=True" in found


NESTED = """
@nki.jit
def kernel(x, counts):
    n = nisa.register_alloc()
    nisa.register_load(dst=n, src=counts)
    def outer(i):
        r = nisa.register_alloc()
        def inner(j):
            nisa.dma_copy(dst=t, src=x.ap(pattern=[[4, 1], [1, 4]], offset=0, scalar_offset=j,
                                          indirect_dim=0))
        nl.fori_loop(0, n, inner)
        helper(x, i)
    nl.fori_loop(0, n, outer)

def helper(x, row):
    nisa.dma_copy(dst=t, src=x.ap(pattern=[[4, 1], [1, 4]], offset=0, scalar_offset=row,
                                  indirect_dim=1))
    nisa.dma_copy(dst=t, src=x.ap(pattern=[[4, 1], [1, 4]], offset=0, scalar_offset=tile,
                                  indirect_dim=0))
"""


def test_the_forms_without_evidence_are_seen():
    found = _read(NESTED)
    assert [u.line for u in found["runtime loop nested in a runtime loop's body"]] == [11]
    assert [u.line for u in found["nisa.register_alloc inside a runtime-loop body"]] == [7]
    assert "nisa.register_load from a kernel input (HBM)" in found
    assert "nl.fori_loop body: an inner def" in found
    ap = "(indirect_dim, offset, pattern, scalar_offset)"
    # a loop index reaches helper() through its parameter: the reader follows the call
    assert f".ap{ap} indirect_dim=0 scalar_offset=scalar" in found
    assert f".ap{ap} indirect_dim=1 scalar_offset=scalar" in found
    assert f".ap{ap} indirect_dim=0 scalar_offset=tensor" in found
    assert all(constructs.forbidden(c) for c in (
        "runtime loop nested in a runtime loop's body", "nisa.register_alloc()",
        "nisa.register_alloc inside a runtime-loop body"))


SCAFFOLDED = """
@nki.jit
def kernel(x, counts, table, n2):
    trips, flag = trip_counts(counts)
    acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    banks = []
    banks.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum))
    def body(i, cells):
        ps = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=ps, stationary=a, moving=b)
        nisa.nc_matmul(dst=acc[:, 0:128], stationary=a, moving=b)
        nisa.nc_transpose(banks[0], t)
        nisa.dma_copy(dst=t, src=x.ap(pattern=[[4, 1], [1, 4]], offset=0,
                                      scalar_offset=cells[1], indirect_dim=0))
        def inner(j):
            nisa.memset(dst=t, value=0.0)
        work_loop(n2, inner)
    for_each_row(trips, table, body)
    k = nisa.scalar_load(t[0:1, 0:1])
    st = {}
    st["at"] = nisa.scalar_load(u)
    nisa.dma_copy(dst=t, src=x.ap(pattern=[[4, 1], [1, 4]], offset=0, scalar_offset=k + 1,
                                  indirect_dim=0))
    nisa.dma_copy(dst=t, src=x.ap(pattern=[[4, 1], [1, 4]], offset=0, scalar_offset=st["at"],
                                  indirect_dim=0))
    nisa.tensor_tensor(dst=t, data1=t, data2=w.reshape((128, 1)).broadcast(1, 4), op=nl.add)
"""


def test_the_scaffolding_is_read_as_loops_and_scalars():
    """A body passed to the scaffolding's work_loop / for_each_row is a runtime-loop body
    (a loop inside it is nested; a PSUM tile allocated outside it and written inside it is
    flagged, one allocated inside is not); counts, cells, scalar_load results, arithmetic on
    them and dict entries holding them are device scalars; .broadcast(dim, n) is a form."""
    found = _read(SCAFFOLDED)
    assert [u.line for u in found["runtime loop nested in a runtime loop's body"]] == [17]
    assert [u.line for u in found[constructs.PSUM_OUTSIDE]] == [11, 12]
    assert "for_each_row (scaffold: nl.fori_loop) body: an inner def" in found
    ap = ".ap(indirect_dim, offset, pattern, scalar_offset) indirect_dim=0 scalar_offset="
    assert len(found[ap + "scalar"]) == 3 and ap + "tensor" not in found
    assert "nisa.scalar_load src=a slice of a tile" in found
    assert "nisa.scalar_load src=a tile" in found
    assert ".broadcast(_, _)" in found
    assert constructs.forbidden(constructs.PSUM_OUTSIDE)


def test_a_loop_after_a_loop_is_not_nested():
    found = _read("""
    def kernel(x):
        def a(i):
            nisa.memset(dst=t, value=0.0)
        def b(i):
            nisa.memset(dst=t, value=1.0)
        nl.fori_loop(0, 4, a)
        nl.fori_loop(0, 4, b)
    """)
    assert "runtime loop nested in a runtime loop's body" not in found
    assert len(found["nl.fori_loop body: an inner def"]) == 2


# constructs the kernels must not use; nobody may give them evidence
FORBIDDEN = ("runtime loop nested in a runtime loop's body",
             "nisa.register_alloc inside a runtime-loop body",
             "nisa.register_load from a kernel input (HBM)",
             "nisa.nc_matmul tile_position=(r, c)",
             "nisa.nc_matmul tile_position with is_transpose=True",
             constructs.PSUM_OUTSIDE)


def test_forbidden_forms_have_no_evidence():
    evidence = constructs.load_evidence()
    assert [c for c in FORBIDDEN if c in evidence] == []
    assert [c for c in evidence if constructs.forbidden(c)] == []


def test_every_evidence_entry_is_a_citation():
    for c, e in constructs.load_evidence().items():
        if "doc" in e:
            assert e["doc"].strip(), c
        else:
            assert e["repo"].count("/") == 1 and len(e["commit"]) == 40, c
            assert e["path"].endswith(".py") and e["line"] > 0, c


def test_doc_is_generated_from_kernels_and_evidence():
    text = constructs.render(constructs.scan(), constructs.load_evidence())
    assert constructs.DOC_FILE.read_text() == text, \
        "docs/constructs.md is stale: python -m nki_ssm.kernels.constructs --write"


def test_a_for_loop_over_an_nl_runtime_iterator_is_a_runtime_loop():
    found = _read("""
    def kernel(x, n):
        for i in nl.affine_range(4):
            def body(j):
                nisa.memset(dst=t, value=0.0)
            nl.fori_loop(0, n, body)
        for i in nl.dynamic_range(n):
            def body2(j):
                nisa.memset(dst=t, value=1.0)
            nl.fori_loop(0, n, body2)
    """)
    assert [u.line for u in found["runtime loop nested in a runtime loop's body"]] == [10]
    assert "for _ in nl.dynamic_range(_)" in found
    assert "for _ in nl.affine_range(_)" not in found      # unrolled: no runtime loop


def test_every_construct_the_kernels_use_has_evidence():
    found = constructs.scan()
    gaps = [f"{c} ({found[c][0].path}:{found[c][0].line})"
            for c in constructs.missing(found, constructs.load_evidence())]
    assert gaps == [], "constructs without evidence (add a released use or a doc section to " \
                       "nki_ssm/kernels/constructs_evidence.toml):\n" + "\n".join(gaps)


def test_no_kernel_names_the_deprecated_runtime_iterator():
    """NKI 0.6.0 deprecates it (release notes, 0.6.0); not even a comment keeps it alive."""
    hits = [str(p) for p in constructs.kernel_files() + [constructs.EVIDENCE_FILE,
                                                           constructs.KERNELS_DIR / "constructs.py"]
            if "dynamic" + "_range" in p.read_text()]
    assert hits == []
