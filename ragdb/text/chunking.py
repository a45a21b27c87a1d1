"""Chunkers: split a document into spans of its text.

Every chunker returns ``(start, end)`` character spans into the original
text, so a chunk can always be traced back (and highlighted) in its
document. Spans never cover only whitespace.

* ``window``: a sliding window over tokens (words; each CJK character is one
  token) with overlap, as in the seeds' first tutorial.
* ``paragraph``: blank-line separated paragraphs.
* ``recursive``: split on the coarsest separator that makes pieces small
  enough (paragraphs, lines, Chinese and English sentence ends, clause
  marks, spaces), then pack pieces into chunks of at most ``size``
  characters with ``overlap`` characters carried over.
* ``none``: the whole document is one chunk.

A chunker spec is a name with optional parameters: ``"window"``,
``"window:size=200,overlap=50"``, ``"recursive:size=800,overlap=100"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable, Sequence

from ragdb.text.analysis import token_spans
from ragdb.errors import InvalidInput, RagdbError

Span = tuple[int, int]


@runtime_checkable
class Chunker(Protocol):
    # Read-only, so that frozen dataclasses (the built-in chunkers) satisfy it.
    @property
    def name(self) -> str: ...

    def spec(self) -> str: ...

    def split(self, text: str) -> list[Span]: ...


def _strip(text: str, start: int, end: int) -> Span | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


@dataclass(frozen=True)
class NoneChunker:
    """Keep the document as one chunk."""

    name: str = "none"

    def spec(self) -> str:
        return "none"

    def split(self, text: str) -> list[Span]:
        s = _strip(text, 0, len(text))
        return [s] if s else []


@dataclass(frozen=True)
class WindowChunker:
    """Sliding window of ``size`` tokens, consecutive windows sharing ``overlap`` tokens."""

    size: int = 200
    overlap: int = 40
    name: str = "window"

    def __post_init__(self) -> None:
        _check_size_overlap("window", self.size, self.overlap)

    def spec(self) -> str:
        return f"window:size={self.size},overlap={self.overlap}"

    def split(self, text: str) -> list[Span]:
        spans = list(token_spans(text))
        if not spans:
            s = _strip(text, 0, len(text))
            return [s] if s else []
        step = self.size - self.overlap
        out: list[Span] = []
        i = 0
        n = len(spans)
        while True:
            j = min(i + self.size, n)
            # The window's tokens, and the text around them no window holds (what comes
            # before the first token, after the last, and between windows that do not
            # overlap: "$100 fee." lost its "$" and "."), less the whitespace at its edges
            start = spans[i][0] if i else 0
            end = len(text) if j >= n else max(spans[j - 1][1], spans[i + step][0])
            out.append(_strip(text, start, end) or (spans[i][0], spans[j - 1][1]))
            if j >= n:
                break
            i += step
        return out


@dataclass(frozen=True)
class ParagraphChunker:
    """Paragraphs separated by blank lines."""

    name: str = "paragraph"

    def spec(self) -> str:
        return "paragraph"

    def split(self, text: str) -> list[Span]:
        out: list[Span] = []
        pos = 0
        for m in re.finditer(r"\n[ \t\r\f\v]*\n", text):
            s = _strip(text, pos, m.start())
            if s:
                out.append(s)
            pos = m.end()
        s = _strip(text, pos, len(text))
        if s:
            out.append(s)
        return out


# Coarsest first. Sentence ends keep their punctuation (split after them).
_RECURSIVE_SEPARATORS: tuple[str, ...] = (
    r"\n[ \t]*\n", r"\n", r"(?<=[。！？!?])", r"(?<=[.;；])\s", r"(?<=[，,、:：])", r"\s", "",
)


@dataclass(frozen=True)
class RecursiveChunker:
    """Recursive separator splitting packed into chunks of at most ``size`` characters."""

    size: int = 800
    overlap: int = 100
    name: str = "recursive"

    def __post_init__(self) -> None:
        _check_size_overlap("recursive", self.size, self.overlap)

    def spec(self) -> str:
        return f"recursive:size={self.size},overlap={self.overlap}"

    def split(self, text: str) -> list[Span]:
        pieces = self._pieces(text, 0, len(text), 0)
        return self._pack(text, pieces)

    def _pieces(self, text: str, start: int, end: int, level: int) -> list[Span]:
        """Split [start, end) into pieces of at most ``size`` characters."""
        if end - start <= self.size:
            return [(start, end)]
        if level >= len(_RECURSIVE_SEPARATORS) - 1:
            return [(i, min(i + self.size, end)) for i in range(start, end, self.size)]
        sep = re.compile(_RECURSIVE_SEPARATORS[level])
        cuts = [start]
        for m in sep.finditer(text, start, end):
            if m.end() > cuts[-1] and m.end() < end:
                cuts.append(m.end())
        cuts.append(end)
        if len(cuts) == 2:
            return self._pieces(text, start, end, level + 1)
        out: list[Span] = []
        for a, b in zip(cuts, cuts[1:]):
            if b - a > self.size:
                out.extend(self._pieces(text, a, b, level + 1))
            elif b > a:
                out.append((a, b))
        return out

    def _pack(self, text: str, pieces: Sequence[Span]) -> list[Span]:
        chunks: list[Span] = []
        cur_start: int | None = None
        cur_end = 0
        for idx, (a, b) in enumerate(pieces):
            if cur_start is None:
                cur_start, cur_end = a, b
            elif b - cur_start <= self.size:
                cur_end = b
            else:
                chunks.append((cur_start, cur_end))
                # Carry over the tail of the previous chunk: the last pieces
                # that fit in ``overlap`` characters (whole pieces only, so
                # the overlap starts at a separator, not mid-word).
                new_start = a
                for pa, pb in reversed(pieces[max(0, idx - 64):idx]):
                    if pb <= cur_start or cur_end - pa > self.overlap or b - pa > self.size:
                        break
                    new_start = pa
                cur_start, cur_end = new_start, b
        if cur_start is not None:
            chunks.append((cur_start, cur_end))
        out: list[Span] = []
        for a, b in chunks:
            s = _strip(text, a, b)
            if s and (not out or s != out[-1]):
                out.append(s)
        return out


def _check_size_overlap(name: str, size: int, overlap: int) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise InvalidInput(f"chunker {name}: size must be a positive integer, got {size!r}")
    if not isinstance(overlap, int) or isinstance(overlap, bool) or overlap < 0:
        raise InvalidInput(f"chunker {name}: overlap must be a non-negative integer, got {overlap!r}")
    if overlap >= size:
        raise InvalidInput(f"chunker {name}: overlap ({overlap}) must be smaller than size ({size})")


DEFAULT_CHUNKER = "recursive:size=800,overlap=100"


def split_checked(chunker: Chunker, text: str, label: str) -> list[Span]:
    """``chunker.split(text)``, held to the contract when the chunker is not one of ragdb's
    own: a list of ``(start, end)`` integer pairs with ``0 <= start < end <= len(text)``,
    starts in order (overlap allowed). A plugin's chunker returning anything else (a span
    past the text, negative or reversed, numpy integers, strings) or raising is an
    :class:`InvalidInput` naming it, before anything is written: unchecked, a negative start
    stored a chunk of no text (the document was never found), numpy integers were stored
    as bytes (``ragdb check`` then reported the chunk damaged), and the rest raised
    TypeError, ValueError or OverflowError out of ``add``."""
    if type(chunker) in _OWN:
        return chunker.split(text)
    try:
        name = chunker.spec()
    except Exception:
        name = getattr(chunker, "name", type(chunker).__name__)
    try:
        got = chunker.split(text)
        iterable = hasattr(got, "__iter__") and not isinstance(got, (str, bytes, dict))
        spans = list(got) if iterable else None
    except RagdbError:
        raise
    except Exception as e:
        raise InvalidInput(f"{label}: chunker {name!r} failed: {type(e).__name__}: {_said(e)}") from e
    if spans is None:
        raise InvalidInput(f"{label}: chunker {name!r} returned a {type(got).__name__}, not a list of "
                           f"(start, end) spans")
    out: list[Span] = []
    last = 0
    for i, span in enumerate(spans):
        pair = tuple(span) if hasattr(span, "__iter__") and not isinstance(span, (str, bytes, dict)) else None
        if pair is None or len(pair) != 2 or not all(_is_int(x) for x in pair):
            raise InvalidInput(f"{label}: chunker {name!r} returned {span!r} as span {i}, not a pair of "
                               f"integers (start, end)")
        start, end = int(pair[0]), int(pair[1])
        if not 0 <= start < end <= len(text):
            raise InvalidInput(f"{label}: chunker {name!r} returned span {i} ({start}, {end}), outside a "
                               f"text of {len(text)} characters or empty (0 <= start < end <= length)")
        if start < last:
            raise InvalidInput(f"{label}: chunker {name!r} returned span {i} ({start}, {end}) starting "
                               f"before the span before it (spans go in order of their starts)")
        last = start
        out.append((start, end))
    return out


def _is_int(x: object) -> bool:
    import numbers

    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _said(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # (an exception whose message cannot be made)
        return "?"


def get_chunker(spec: "str | Chunker | None") -> Chunker:
    """Build a chunker from a spec string (``"window:size=200,overlap=50"``) or return it.

    A spec goes through :func:`ragdb.plugins.build`: ragdb's own chunkers (registered by
    :func:`register_builtins`) and those of installed plugins."""
    if spec is None:
        spec = DEFAULT_CHUNKER
    if isinstance(spec, str):
        return _parse_chunker(spec)
    if hasattr(spec, "split") and hasattr(spec, "spec"):
        return spec
    raise InvalidInput(f"chunker {spec!r}: expected a name like 'window' or a Chunker")


#: ragdb's own chunkers by spec: they are immutable, so a parsed spec is shared.
_SHARED: dict[str, Chunker] = {}
_WHAT = "a chunker (name, spec(), split(text))"


def _parse_chunker(spec: str) -> Chunker:
    shared = _SHARED.get(spec)
    if shared is not None:
        return shared
    from ragdb import plugins

    found = plugins.find("chunker", spec)
    if found is None:
        made: Chunker = plugins.build("chunker", spec)  # raises: unknown, with the choices
        return made
    made = found.build(Chunker, _WHAT)
    if found.provided.builtin and len(_SHARED) < 64:
        _SHARED[spec] = made
    return made


def _params(name: str, arg: str | None, *, sized: bool) -> dict[str, Any]:
    """The ``size=N,overlap=N`` parameters of the spec ``name:arg``."""
    kwargs: dict[str, Any] = {}
    if arg is None or not arg.strip():
        return kwargs
    spec = f"{name}:{arg}"
    for part in arg.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in ("size", "overlap") or not sized:
            raise InvalidInput(f"chunker {spec!r}: unknown parameter {part.strip()!r}")
        try:
            kwargs[key] = int(value)
        except ValueError:
            raise InvalidInput(f"chunker {spec!r}: {key} must be an integer, got {value.strip()!r}") from None
    return kwargs


def _recursive(arg: str | None = None) -> RecursiveChunker:
    return RecursiveChunker(**_params("recursive", arg, sized=True))


def _window(arg: str | None = None) -> WindowChunker:
    return WindowChunker(**_params("window", arg, sized=True))


def _paragraph(arg: str | None = None) -> ParagraphChunker:
    _params("paragraph", arg, sized=False)
    return ParagraphChunker()


def _none(arg: str | None = None) -> NoneChunker:
    _params("none", arg, sized=False)
    return NoneChunker()


def register_builtins(register: Callable[..., None]) -> None:
    """Register ragdb's own chunkers with the ``register`` callback of the ``register_chunkers``
    hook (called by the default plugin :mod:`ragdb.text.builtins`)."""
    register("recursive", _recursive, usage="recursive[:size=N,overlap=N]")
    register("window", _window, usage="window[:size=N,overlap=N]")
    register("paragraph", _paragraph)
    register("none", _none)


#: ragdb's own chunkers: their spans are not checked again (a bulk load makes millions).
_OWN: frozenset[type] = frozenset({NoneChunker, WindowChunker, ParagraphChunker, RecursiveChunker})
