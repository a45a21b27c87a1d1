"""Fields: a chunk's title and heading path, indexed beside its text and weighted in scoring.

Every chunk carries two short fields besides its text:

* ``title``: its document's title (a loader's: Markdown front matter or first ``#``
  heading, RST's first title, HTML's ``<title>``, a PDF's metadata title), else the
  file name of a source that looks like a path (``docs/install-guide.md`` gives
  ``install-guide``);
* ``section``: its heading path (``Install > From source``), the ``section`` metadata
  that Markdown, RST and HTML headings (and a PDF's outline) give a chunk.

They are analyzed like the text and stored in the chunk's forward index as terms of
their own (the field's mark, ``\\x1f`` and a letter, before the index term:
``\\x1ftretriev``), so every part of the index, incremental updates included, treats
them like any term and each field has exact document frequencies of its own; a
chunk's length (for BM25) is its text's alone.

Scoring (**per-field BM25 summed**): a query term adds, to its BM25 on the text, its
BM25 in each field times the field's weight, each field with its own IDF and without
length normalisation (``b = 0``: titles and heading paths are short and of like
length)::

    score(q, c) = sum_t  BM25(t, text_c)  +  sum_f  w_f * idf_f(t) * tf_f(t, c) / (tf_f(t, c) + k1)

(Robertson, Zaragoza & Taylor, "Simple BM25 extension to multiple weighted fields",
CIKM 2004, discuss this linear combination and BM25F; Robertson & Zaragoza 2009, §3.4.)
``title:word`` and ``section:word`` search one field alone. The weights are the
database's ``fields`` setting, chosen at creation (:data:`DEFAULT_WEIGHTS`, measured on
SciFact, CMRC 2018 and npm's documentation: BENCHMARKS.md, fields section); a database
made before fields has no ``fields`` setting and no field terms until ``ragdb reindex``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ragdb.patterns import LazyPattern

if TYPE_CHECKING:
    from ragdb.text.analysis import Analyzer

FIELDS = ("title", "section")
MARK = "\x1f"  # never in an analyzed term (NFKC text, word and CJK characters)
PREFIX = {"title": MARK + "t", "section": MARK + "s"}
#: Weights of new databases (the ``fields`` setting); see the module docstring.
DEFAULT_WEIGHTS: dict[str, float] = {"title": 0.25, "section": 0.25}
MAX_WEIGHT = 100.0

_PATHLIKE = LazyPattern(r"(?:^|[/\\])([^/\\]+)\.[A-Za-z0-9]{1,8}$")


def effective_title(title: str | None, source: str) -> str | None:
    """A document's title field: its title, else the file name (without extension) of a
    source that ends in one (``docs/install-guide.md``), else None."""
    if title is not None and title.strip():
        return title
    m = _PATHLIKE.search(source)
    return m.group(1) if m else None


def field_counts(analyzer: Analyzer, field: str, text: str | None) -> dict[str, int]:
    """The index terms of ``text`` as terms of ``field``, with their frequencies."""
    if not text:
        return {}
    prefix = PREFIX[field]
    return {prefix + t: c for t, c in analyzer.term_counts(text).items()}


def chunk_field_counts(analyzer: Analyzer, title_counts: Mapping[str, int], chunk_metadata: Mapping[str, Any]
                       ) -> dict[str, int]:
    """The field terms of one chunk: its document's title terms and its heading path's."""
    section = chunk_metadata.get("section")
    if not isinstance(section, str) or not section:
        return dict(title_counts)
    out = dict(title_counts)
    out.update(field_counts(analyzer, "section", section))
    return out


def is_field_term(term: str) -> bool:
    return term.startswith(MARK)


def check_weights(value: Any, what: str = "fields") -> dict[str, float]:
    """A ``fields`` setting: a mapping of field name to a weight in [0, MAX_WEIGHT]."""
    from ragdb.errors import InvalidInput
    from ragdb.options import check_number

    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a mapping of field to weight, e.g. {DEFAULT_WEIGHTS}, got {value!r}")
    unknown = set(value) - set(FIELDS)
    if unknown:
        raise InvalidInput(f"{what}: unknown field {sorted(map(str, unknown))[0]!r}; fields are "
                           f"{', '.join(FIELDS)}")
    return {f: check_number(value.get(f, 0.0), f"{what}: weight of {f!r}", low=0.0, high=MAX_WEIGHT)
            for f in FIELDS}
