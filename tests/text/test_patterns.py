"""``ragdb.patterns.LazyPattern``: a regular expression compiled on its first use."""

import copy
import re

from hypothesis import given, strategies as st

from ragdb.patterns import LazyPattern


def test_a_lazy_pattern_compiles_on_first_use_and_then_keeps_its_methods():
    p = LazyPattern(r"(\d+)-(\d+)")
    assert not p.compiled
    assert p.fullmatch("12-34").groups() == ("12", "34")
    assert p.compiled
    assert p.fullmatch is p.fullmatch  # looked up once, kept on the object
    assert p.pattern == r"(\d+)-(\d+)"


def test_flags_are_the_compiled_patterns():
    p = LazyPattern(r"^(postgresql|postgres)://", re.I)
    assert p.match("PostgreSQL://host/db") is not None
    assert LazyPattern(r"a.b").match("a\nb") is None
    assert LazyPattern(r"a.b", re.S).match("a\nb") is not None


def test_copying_does_not_compile_or_break():
    p = LazyPattern(r"x+")
    q = copy.deepcopy(p)
    assert not p.compiled and not q.compiled
    assert q.findall("axxbx") == ["xx", "x"]


@given(st.text(max_size=40))
def test_a_lazy_pattern_answers_as_re_does(text):
    source = r"[^\W_]+(?:(?:\.|_+|::)[^\W_]+)*"
    assert LazyPattern(source).findall(text) == re.findall(source, text)
