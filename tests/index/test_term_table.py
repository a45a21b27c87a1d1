"""The writer's term -> id table (ragdb/index/terms.py): the compiled one (ragdb/index/cterms.pyx)
answers as the dict it replaces, whatever the terms (ASCII or not, empty, with lone surrogates)
and however many; and a worker's term numbers held joined (ragdb.text.analysis.WorkerNames)
give back each number's term in any order."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragdb.index import kernel
from ragdb.index.terms import TermDict, new_table
from ragdb.text.analysis import WorkerNames

try:
    from ragdb.index.cterms import TermTable
except ImportError:  # pragma: no cover - a platform without the extension
    TermTable = None


@pytest.fixture(scope="module")
def compiled_table():
    if TermTable is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the compiled term table is not installed (setup.py could not build it)")
        pytest.skip("the compiled term table is not installed")
    return TermTable


# Terms: plain words, CJK, accented, astral characters, lone surrogates (which have no UTF-8 of
# their own), the empty string; few enough distinct ones that operations meet the same terms.
term_st = st.one_of(
    st.sampled_from(["", "a", "ab", "中", "中文", "é", "e\u0301", "\U0001F600", "\ud800", "a\udfff", "x" * 300]),
    st.text(alphabet=st.sampled_from("ab中é\ud800\U00020000"), max_size=6),
)
op_st = st.one_of(
    st.tuples(st.just("set"), term_st, st.integers(0, 2**40)),
    st.tuples(st.just("get"), term_st),
    st.tuples(st.just("missing"), st.lists(term_st, max_size=6)),
    st.tuples(st.just("ids_of"), st.lists(term_st, max_size=6)),
    st.tuples(st.just("update"), st.lists(st.tuples(term_st, st.integers(0, 1000)), max_size=6)),
    st.tuples(st.just("clear")),
)


@settings(max_examples=400, deadline=None)
@given(ops=st.lists(op_st, max_size=40))
def test_the_compiled_table_answers_as_the_dict(compiled_table, ops):
    table, ref = compiled_table(), TermDict()
    for op in ops:
        kind = op[0]
        if kind == "set":
            table[op[1]] = op[2]
            ref[op[1]] = op[2]
        elif kind == "get":
            assert (op[1] in table) == (op[1] in ref)
            assert table.get(op[1], -7) == ref.get(op[1], -7)
            if op[1] in ref:
                assert table[op[1]] == ref[op[1]]
            else:
                with pytest.raises(KeyError):
                    table[op[1]]
        elif kind == "missing":
            assert table.missing(op[1]) == ref.missing(op[1])
            assert sorted(table.missing(set(op[1]))) == sorted(ref.missing(set(op[1])))
        elif kind == "ids_of":
            if all(t in ref for t in op[1]):
                assert table.ids_of(op[1]).tolist() == ref.ids_of(op[1]).tolist()
            else:
                with pytest.raises(KeyError):
                    table.ids_of(op[1])
        elif kind == "update":
            table.update(op[1])
            ref.update(op[1])
        else:
            table.clear()
            ref.clear()
        assert len(table) == len(ref)


def test_the_compiled_table_holds_many_terms_through_its_growth(compiled_table):
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(60_000)] + ["中" * (1 + i % 5) + str(i) for i in range(60_000)]
    order = rng.permutation(len(words)).tolist()
    table = compiled_table()
    table.update((words[i], 3 * i + 1) for i in order)
    assert len(table) == len(words)
    assert table.ids_of(words).tolist() == [3 * i + 1 for i in range(len(words))]
    assert table.missing(["w-1", "w1", "中中中", "中0", ""]) == ["w-1", "中中中", ""]
    table["w5"] = 99  # a held term: a new id, no second entry
    assert table["w5"] == 99 and len(table) == len(words)
    table.clear()
    assert len(table) == 0 and "w1" not in table and table.missing(["w1"]) == ["w1"]
    table["w1"] = 2
    assert table["w1"] == 2


class _Str(str):
    """A str subclass (as numpy's ``str_`` is): a dict takes it as its characters."""


def test_the_compiled_table_takes_only_str_terms_and_ids(compiled_table):
    table, ref = compiled_table(), TermDict()
    for t in (table, ref):
        t["a"] = 1
        t[_Str("b")] = 2
        t[np.str_("中")] = 3
    for t in (table, ref):
        assert _Str("a") in t and t[_Str("a")] == 1 and t["b"] == 2 and t.get(np.str_("b")) == 2 and t["中"] == 3
        assert t.missing([_Str("a"), np.str_("z"), "b"]) == [np.str_("z")] and len(t) == 3
        assert t.ids_of([_Str("b"), np.str_("a")]).tolist() == [2, 1]
    assert None not in table and table.get(None) is None
    with pytest.raises(TypeError):
        table.missing([None])
    with pytest.raises(TypeError):
        table.ids_of(["a", None])
    table = compiled_table()
    table["a"] = 1
    assert 1 not in table and b"a" not in table and table.get(b"a") is None
    with pytest.raises(KeyError):
        table[b"a"]
    with pytest.raises(TypeError):
        table[b"a"] = 1
    with pytest.raises(TypeError):
        table["b"] = "1"
    with pytest.raises(ValueError):
        table["b"] = -1
    with pytest.raises(TypeError):
        table.missing([1])
    assert "b" not in table and len(table) == 1


@pytest.mark.usefixtures("each_kernel")
def test_writers_get_the_table_of_the_kernel_that_runs():
    expected = TermDict if kernel.name() == "numpy" or TermTable is None else TermTable
    assert type(new_table()) is expected


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(st.lists(st.text(alphabet=st.sampled_from("ab中 é"), max_size=4), min_size=1, max_size=5),
                       max_size=6),
       picks=st.lists(st.integers(0, 10**6), max_size=20))
def test_worker_names_give_each_number_its_term_in_any_order(blocks, picks):
    names = WorkerNames()
    flat: list[str] = []
    for block in blocks:
        names.add("\0".join(block))
        flat.extend(block)
    assert len(names) == len(flat)
    assert names.many(range(len(flat))) == flat
    if flat:
        numbers = [p % len(flat) for p in picks]
        assert names.many(numbers) == [flat[n] for n in numbers]
        assert names.many(np.array(numbers, dtype=np.uint32)) == [flat[n] for n in numbers]
        assert [names[n] for n in numbers] == [flat[n] for n in numbers]
    with pytest.raises(IndexError):
        names.many([len(flat)])
    with pytest.raises(IndexError):
        names.many([-1])
