"""A chunker that is not ragdb's own (a plugin's, or an object given as ``chunker=``) is held to
the contract: its spans are checked before anything is written (ragdb.text.chunking.split_checked)."""

from __future__ import annotations

import numpy as np
import pytest

import ragdb
from ragdb.errors import InvalidInput

TEXT = "alpha beta gamma delta epsilon"


class Fixed:
    """A chunker whose split returns ``out`` (or calls it)."""

    name = "fixed"

    def __init__(self, out: object) -> None:
        self.out = out

    def spec(self) -> str:
        return "fixed"

    def split(self, text: str) -> object:
        return self.out(text) if callable(self.out) else self.out


@pytest.mark.parametrize("out, message", [
    ([(-5, 10)], r"span 0 \(-5, 10\), outside"),      # stored: a chunk of no text, never found
    ([(0, 1000)], r"span 0 \(0, 1000\), outside"),
    ([(10, 2)], "outside"),
    ([(3, 3)], "or empty"),
    ([(11, 16), (0, 5)], "starting before"),
    ([(0.0, 5.5)], "not a pair of integers"),         # raised TypeError
    ([("0", "5")], "not a pair of integers"),
    (["alpha", "beta"], "not a pair of integers"),     # raised ValueError
    ([(0, 5, 9)], "not a pair of integers"),
    ([(False, True)], "not a pair of integers"),
    ([(0, 2 ** 70)], "outside"),                       # raised OverflowError
    (None, "returned a NoneType"),
    (lambda text: 1 / 0, "failed: ZeroDivisionError"),
])
def test_a_chunker_breaking_the_contract_is_refused_naming_it(tmp_path, out, message):
    with ragdb.open(tmp_path / "kb.db") as db:
        with pytest.raises(InvalidInput, match=message) as info:
            db.add(TEXT, source="x", chunker=Fixed(out))
        assert "document 'x': chunker 'fixed'" in str(info.value)
        assert db.count(principals=ragdb.ALL) == 0     # nothing written


def test_numpy_spans_are_stored_as_integers(tmp_path):
    """numpy integers were stored as their bytes (ragdb check: the chunk's text differs)."""
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add(TEXT, source="x", chunker=Fixed(np.array([[0, 5], [6, 10]])))
        assert sorted((h.start, h.end, h.text) for h in db.search("alpha beta", k=5)) == [
            (0, 5, "alpha"), (6, 10, "beta")]
        assert not db.check()


def test_overlapping_spans_in_order_are_kept(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add(TEXT, source="x", chunker=Fixed(lambda text: iter([(0, 16), (6, 22), (6, 30)])))
        assert sorted((h.start, h.end) for h in db.search("beta", k=5)) == [(0, 16), (6, 22), (6, 30)]
