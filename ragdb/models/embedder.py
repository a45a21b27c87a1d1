"""The embedder contract: what ragdb needs from an embedding model, and the checks that hold
every embedder, built-in or a plugin's, to it (shape, finite values, L2-normalized rows, a
zero row for blank text).

This module depends on nothing but numpy and :mod:`ragdb.errors`, so the vector index
(:mod:`ragdb.index.vectors`), the engine and the embedders (:mod:`ragdb.models.embeddings`)
all import it without importing each other.
"""

from __future__ import annotations

import abc

from collections.abc import Sequence
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from ragdb.errors import EmbeddingError, InvalidInput, RagdbError

__all__ = ["Embedder", "EmbeddingModel", "as_float32", "check_texts", "dimensions_of", "embed_batched", "embed_query", "is_blank", "normalize_rows"]


@runtime_checkable
class Embedder(Protocol):
    """What ragdb needs from an embedding model.

    ``embed`` returns float32 ``(len(texts), dimensions)`` with L2-normalized
    rows (zero rows for empty texts).  An embedder may also define
    ``embed_query(text) -> ndarray (dimensions,)`` when queries must be
    embedded differently from documents (e5's ``"query: "`` prefix); callers
    use :func:`embed_query`, which falls back to ``embed([text])[0]``.
    """

    name: str

    @property
    def dimensions(self) -> int:
        """The vector size (an attribute or a read-only property)."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def as_float32(got: Any, name: str) -> np.ndarray:
    """An embedder's output as a float32 array, or :class:`EmbeddingError` where it is not numbers:
    complex values (numpy's cast drops their imaginary parts, with a warning), an integer past any
    float, strings. A value past float32's range becomes inf, which the callers refuse, with no
    RuntimeWarning on stderr. The one conversion of every embedder's output (an
    :class:`EmbeddingModel`'s, a plain :class:`Embedder`'s on add, embed and query)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            if np.iscomplexobj(got):
                raise TypeError("complex values")
            return np.asarray(got, dtype=np.float32)
    except (ValueError, TypeError, OverflowError) as e:  # numpy could not read the output as numbers
        raise EmbeddingError(f"embedder {name!r} returned something that is not an array of numbers "
                             f"({e})") from None


def embed_query(embedder: Embedder, text: str) -> np.ndarray:
    """Embed one query: ``embedder.embed_query(text)`` if defined, else ``embed([text])[0]``."""
    fn = getattr(embedder, "embed_query", None)
    try:
        got = fn(text) if callable(fn) else embedder.embed([text])
    except RagdbError:
        raise
    except Exception as e:  # the embedder's own failure (a plugin's KeyError, say), not ragdb's
        raise EmbeddingError(f"embedder {embedder.name!r} failed to embed the query "
                             f"({type(e).__name__}: {_said(e)})") from e
    vec = as_float32(got, embedder.name)
    if not callable(fn):
        if vec.ndim != 2 or vec.shape[0] != 1:
            raise EmbeddingError(
                f"embedder {embedder.name!r} returned shape {vec.shape} for one query"
            )
        vec = vec[0]
    dims = dimensions_of(embedder)
    if vec.shape != (dims,):
        raise EmbeddingError(
            f"embedder {embedder.name!r} returned a query vector of shape {vec.shape}, "
            f"expected ({dims},)"
        )
    return vec


def _said(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # (an exception whose message cannot be made)
        return "?"


def embed_batched(embedder: Embedder, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """Embed ``texts`` in batches of ``batch_size`` and check every batch's output.

    Returns float32 ``(len(texts), embedder.dimensions)``.  Raises
    :class:`EmbeddingError` if the embedder returns a wrong shape or non-finite
    values, so a misbehaving custom embedder cannot corrupt a database.
    """
    if isinstance(texts, str):
        raise InvalidInput("texts must be a sequence of strings, not a single string")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    texts = list(texts)
    dims = dimensions_of(embedder)
    out = np.empty((len(texts), dims), dtype=np.float32)
    for start in range(0, len(texts), batch_size):
        batch = texts[start : start + batch_size]
        vecs = as_float32(embedder.embed(batch), embedder.name)
        if vecs.shape != (len(batch), dims):
            raise EmbeddingError(
                f"embedder {embedder.name!r} returned shape {vecs.shape} for a batch of "
                f"{len(batch)} texts, expected ({len(batch)}, {dims})"
            )
        if not np.all(np.isfinite(vecs)):
            raise EmbeddingError(f"embedder {embedder.name!r} returned NaN or infinite values")
        out[start : start + len(batch)] = vecs
    return out


def check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise InvalidInput("texts must be a sequence of strings, not a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InvalidInput(f"texts[{i}] is {type(t).__name__}, expected str")
    return texts


def normalize_rows(mat: np.ndarray) -> np.ndarray:
    """L2-normalize rows in place (float32); all-zero rows stay zero. The norms are taken in
    float64: in float32 the squares of values past ~1.8e19 overflowed (the row came out all
    zero, with a RuntimeWarning on stderr) and those under ~1e-23 underflowed (the row stayed
    as it was, far from unit length). A row holding inf or NaN comes out NaN, with no warning
    printed (the library never prints): the callers refuse rows that are not finite."""
    wide = mat.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(wide, axis=1, keepdims=True)
        mat[...] = np.divide(wide, norms, out=np.zeros_like(wide), where=norms > 0)
    return mat


def is_blank(text: str) -> bool:
    return not text.strip()


def dimensions_of(embedder: Embedder) -> int:
    """``embedder.dimensions``, a custom embedder's failure there an :class:`EmbeddingError`."""
    try:
        d = int(embedder.dimensions)
    except EmbeddingError:
        raise
    except Exception as e:  # a custom embedder's property failing
        raise EmbeddingError(f"embedder {getattr(embedder, 'name', embedder)!r}: cannot read dimensions ({e})") from e
    return d


class EmbeddingModel(abc.ABC):
    """The base class of embedders: it holds every embedder to the contract, so that a
    subclass writes only how its model embeds texts (llm's ``EmbeddingModel`` is the model).

    A subclass sets ``name`` and ``dimensions`` (an attribute or a property) and
    implements :meth:`embed_texts`. :meth:`embed` and :meth:`embed_query` then

    1. check the input (a sequence of strings, not one string: :class:`InvalidInput`),
    2. leave out blank texts (empty or whitespace only): their rows are zero, and the
       model never sees them,
    3. call :meth:`embed_texts` with the rest (nothing at all when every text is blank),
    4. check its output: shape ``(len(texts), dimensions)`` and finite values, else an
       :class:`EmbeddingError` naming the embedder,
    5. L2-normalize the rows (float32).

    ``dimensions`` is read after the hook ran, so a model that learns its size from its
    first reply (an HTTP endpoint) can set it there.
    """

    name: str

    @abc.abstractmethod
    def embed_texts(self, texts: list[str], *, query: bool) -> Any:
        """The hook: vectors of ``texts`` (none of them blank), as anything numpy reads as
        ``(len(texts), dimensions)`` numbers. ``query``: the texts are search queries
        (an asymmetric model embeds them differently; most ignore it). Abstract: a
        subclass without it cannot be instantiated."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``(len(texts), dimensions)``, L2-normalized rows; zero rows for blank texts."""
        return self._embed_checked(check_texts(texts), query=False)

    def embed_query(self, text: str) -> np.ndarray:
        """The vector of one search query (``(dimensions,)``; zero when ``text`` is blank)."""
        if not isinstance(text, str):
            raise InvalidInput(f"query is {type(text).__name__}, expected str")
        return self._embed_checked([text], query=True)[0]

    def _embed_checked(self, texts: list[str], *, query: bool) -> np.ndarray:
        todo = [i for i, t in enumerate(texts) if not is_blank(t)]
        if not todo:
            return np.zeros((len(texts), dimensions_of(cast(Embedder, self))), dtype=np.float32)
        vecs = as_float32(self.embed_texts([texts[i] for i in todo], query=query), self.name)
        dims = dimensions_of(cast(Embedder, self))
        if vecs.shape != (len(todo), dims):
            raise EmbeddingError(f"embedder {self.name!r} returned shape {vecs.shape} for {len(todo)} texts, "
                                 f"expected ({len(todo)}, {dims})")
        if not np.all(np.isfinite(vecs)):
            raise EmbeddingError(f"embedder {self.name!r} returned NaN or infinite values")
        out = np.zeros((len(texts), dims), dtype=np.float32)
        out[todo] = vecs
        return normalize_rows(out)
