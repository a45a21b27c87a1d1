"""The embedder base class, EmbeddingModel: a subclass that writes only its hook
(embed_texts) is a complete embedder, and output that breaks the contract is an
EmbeddingError naming the embedder."""

from __future__ import annotations

import numpy as np
import pytest

import ragdb
from ragdb.errors import EmbeddingError, InvalidInput, RagdbError
from ragdb.models.embeddings import (E5Embedder, EmbeddingModel, HashEmbedder, OpenAIEmbedder,
                                     SentenceTransformerEmbedder, UseEmbedder, WordLlamaEmbedder, embed_query)


class Letters(EmbeddingModel):
    """Counts of a, b, c: only the hook written. Records what the hook was given."""

    name = "letters-3"
    dimensions = 3

    def __init__(self) -> None:
        self.seen: list[tuple[list[str], bool]] = []

    def embed_texts(self, texts: list[str], *, query: bool) -> list[list[float]]:
        self.seen.append((list(texts), query))
        return [[t.count("a") + 0.5, t.count("b"), t.count("c") + (1 if query else 0)] for t in texts]


def test_every_builtin_embedder_is_an_embedding_model():
    for cls in (HashEmbedder, OpenAIEmbedder, WordLlamaEmbedder, E5Embedder, UseEmbedder,
                SentenceTransformerEmbedder):
        assert issubclass(cls, EmbeddingModel), cls
        assert "embed" not in vars(cls) and "embed_query" not in vars(cls), cls  # only the hook
        assert "embed_texts" in vars(cls), cls


def test_a_subclass_with_only_the_hook_embeds_normalized_rows():
    e = Letters()
    out = e.embed(["aab", "", "c", "  \n"])
    assert out.dtype == np.float32 and out.shape == (4, 3)
    want = np.array([[2.5, 1, 0], [0, 0, 0], [0.5, 0, 1], [0, 0, 0]], dtype=np.float32)
    want[0] /= np.linalg.norm(want[0])
    want[2] /= np.linalg.norm(want[2])
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert e.seen == [(["aab", "c"], False)]  # blank texts never reach the model


def test_the_hook_is_not_called_when_every_text_is_blank():
    e = Letters()
    assert e.embed([]).shape == (0, 3)
    assert not e.embed(["", " "]).any()
    assert not e.embed_query("\t").any()
    assert e.seen == []


def test_queries_reach_the_hook_as_queries():
    e = Letters()
    q = e.embed_query("c")
    assert q.shape == (3,)
    np.testing.assert_allclose(q, np.array([0.5, 0, 2]) / np.linalg.norm([0.5, 0, 2]), rtol=1e-6)
    assert e.seen == [(["c"], True)]
    np.testing.assert_array_equal(embed_query(e, "c"), q)


def test_bad_input_is_invalid_input():
    e = Letters()
    with pytest.raises(InvalidInput, match="single string"):
        e.embed("abc")
    with pytest.raises(InvalidInput, match=r"texts\[1\] is int"):
        e.embed(["a", 3])  # type: ignore[list-item]
    with pytest.raises(InvalidInput, match="query is bytes"):
        e.embed_query(b"a")  # type: ignore[arg-type]


class Broken(EmbeddingModel):
    name = "broken"
    dimensions = 3

    def __init__(self, output: object) -> None:
        self.output = output

    def embed_texts(self, texts: list[str], *, query: bool) -> object:
        return self.output


@pytest.mark.parametrize("output, message", [
    (np.zeros((2, 4)), r"'broken' returned shape \(2, 4\) for 2 texts, expected \(2, 3\)"),
    (np.zeros((1, 3)), r"shape \(1, 3\) for 2 texts"),
    (np.zeros(6), r"shape \(6,\)"),
    ([[1.0, float("nan"), 0.0], [1.0, 0.0, 0.0]], "'broken' returned NaN or infinite values"),
    ([[1.0, float("inf"), 0.0], [1.0, 0.0, 0.0]], "NaN or infinite"),
    ([["x", "y", "z"], [1, 2, 3]], "not an array of numbers"),
    (None, r"shape \(\)"),
    ([[1e300, 0.0, 0.0], [1.0, 0.0, 0.0]], "NaN or infinite"),      # past float32's range
    (np.full((2, 3), 1 + 2j), "not an array of numbers"),          # its imaginary parts were dropped
])
def test_output_that_breaks_the_contract_is_a_clear_error(output, message):
    with pytest.raises(EmbeddingError, match=message) as info:
        Broken(output).embed(["one", "two"])
    assert isinstance(info.value, RagdbError)


def test_output_that_breaks_the_contract_prints_nothing(capfd):
    """A value past float32's range, or complex values, printed numpy's RuntimeWarning or
    ComplexWarning on stderr (the library never prints); the second were stored without
    their imaginary parts."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for output in ([[1e300, 0.0, 0.0], [1.0, 0.0, 0.0]], np.full((2, 3), 1 + 2j)):
            with pytest.raises(EmbeddingError):
                Broken(output).embed(["one", "two"])
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("scale", [5e37, 1e20, 1e-30, 1e-37])
def test_rows_of_very_large_or_small_values_are_normalized(scale):
    """Finite float32 rows whose squares overflow or underflow float32: a row of 1e20s came out
    all zero (its norm overflowed to inf, with a RuntimeWarning), a row of 1e-30s was stored as
    it was (its norm underflowed to 0), far from unit length; either's chunk was then never
    found by vector search."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = Broken(np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 1.0]]) * scale).embed(["one", "two"])
    assert out == pytest.approx(np.array([[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]]), abs=1e-6)


def test_a_hook_only_embedder_serves_a_database(tmp_path):
    db = ragdb.open(str(tmp_path / "l.db"), embedder=Letters())
    db.add("aaa", source="a")
    db.add("ccc", source="c")
    db.embed()
    hits = db.search("c", scorer="vector", k=2)
    assert [h.source for h in hits] == ["c", "a"]
    db.close()


def test_a_subclass_without_the_hook_cannot_be_made() -> None:
    class NoHook(EmbeddingModel):
        name = "no-hook"
        dimensions = 4

    with pytest.raises(TypeError, match="embed_texts"):
        NoHook()  # type: ignore[abstract]


class _PlainEmbedder:
    """An Embedder that is not an EmbeddingModel (the protocol: name, dimensions, embed)."""

    name, dimensions = "plain", 3

    def __init__(self, row: list) -> None:
        self.row = row

    def embed(self, texts):
        return [self.row for _ in texts]


@pytest.mark.parametrize("row", [[1 + 2j, 1, 1], [10 ** 400, 1, 1], [1e300, 1.0, 1.0]])
def test_a_plain_embedders_output_that_is_not_float32_numbers_is_an_embedding_error(row):
    """EmbeddingModel's output was held to float32 numbers; a plain Embedder's was not (add, embed
    and the query each cast it on their own): complex values were stored without their imaginary
    parts, with a ComplexWarning on stderr, and the same query raised InternalError; values past
    float32's range gave a RuntimeWarning. Now one conversion, an EmbeddingError, no warning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        db = ragdb.open(":memory:")
        db.embedder = _PlainEmbedder(row)
        with pytest.raises(EmbeddingError, match="not an array of numbers|NaN or infinite"):
            db.add("hello world", source="a")
        db.embedder = _PlainEmbedder([1.0, 0.0, 0.0])
        db.embed()
        db.embedder = _PlainEmbedder(row)
        with pytest.raises(EmbeddingError):
            db.search("hello", scorer="vector")
        db.close()


@pytest.mark.parametrize("scorer", ["vector", "hybrid"])
def test_an_embedder_failing_on_a_query_is_an_embedding_error_naming_it(scorer):
    """An embedder's own exception while it embeds a query (a plugin's KeyError) was an
    InternalError ('search failed unexpectedly ... a bug in ragdb'), where the same failure in
    db.embed is an EmbeddingError naming the embedder."""
    class Flaky(HashEmbedder):
        def embed_query(self, text):
            raise KeyError("vocab")

    emb = Flaky(dimensions=16)
    with ragdb.open(":memory:") as d:
        d.add("The cat sat on the mat.", source="a.md")
        d.embed(emb)
        with pytest.raises(EmbeddingError, match=rf"{emb.name}.*KeyError"):
            d.search("cat", scorer=scorer, embedder=emb)
