"""The query language: one parser for the library, the CLI and the integrations.

A query is words, as before, plus operators in their syntactic form only::

    deleted documents            words: a chunk matching any of them is a hit, ranked by BM25
    "deleted documents"          a phrase: the words adjacent and in order (after analysis);
                                 a CJK phrase ("检索增强") is the contiguous characters;
                                 only the ASCII quote (or its full-width form) quotes
    +index  -draft  NOT draft    require / exclude a word, phrase or group
    a AND b   a OR b   (a b)     AND binds tighter than OR; both tighter than plain spacing
    delet*                       a prefix, expanded over the vocabulary (at most
                                 MAX_EXPANSIONS index terms, the most frequent)
    docment~                     a fuzzy word: index terms within one edit (insert, delete,
                                 substitute, swap two neighbours)
    title:rag  section:"quick start"  lang:en  source:docs/*
                                 a field: the title or heading path of a chunk, or a stored
                                 metadata key or source (those filter, they do not score)
    index^2  "exact phrase"^1.5  (a b)^3
                                 a boost: the clause's terms weigh that much more

Operators are recognised only in their syntactic form: ``AND``/``OR``/``NOT`` in
capitals between words, ``+``/``-`` glued to the start of a word (``C++``, ``e-mail``,
``--force`` and the numbers ``-2``, ``+1`` are words), ``*``/``~``/``^N`` glued to the end, ``field:`` only for a
known field. ``-`` excludes only a word of two or more letters none upper case, a
phrase, a group or a field: command-line flags (``-g``, ``-fPIC``, ``-Wall``, ``-O2``,
``-DCMAKE_BUILD_TYPE=Release``) are words (see :func:`_excludes`). The metadata keys
the file loaders add (:data:`AUTOMATIC_KEYS`) are never fields. A question
(``build_prompt``, ``ask``, the retrievers) is not parsed at all unless its caller asks
(``syntax="query"``; :meth:`ragdb.options.SearchOptions.as_question`). A natural-language question has none of them and passes through
unchanged: it is searched exactly as with ``syntax="plain"``. A query that cannot be
parsed (an unbalanced quote or parenthesis, a lone ``-``) never raises: it is searched
as plain words, and :attr:`ParsedQuery.error` (``--explain``) says why.

Structure (``Group`` of ``Clause``s, each ``must``/``should``/``must_not``) follows
Lucene's boolean query: in a group with a ``must`` clause the ``should`` clauses only
add to the score; otherwise at least one ``should`` clause must match. A bare phrase
and the operands of ``AND`` are ``must``; words and groups are ``should``.

Why a hand-written parser rather than a parser library (lark, pyparsing): the grammar
is a dozen lines, the rule that matters most (fall back to plain words, never raise,
on any input) is error recovery a generated parser would need custom code for
anyway, and it keeps the core free of another dependency.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ragdb.patterns import LazyPattern
from ragdb.errors import InvalidInput
from ragdb.options import SYNTAXES
MUST, SHOULD, MUST_NOT = "must", "should", "must_not"
MAX_EXPANSIONS = 64       #: index terms a prefix or fuzzy word expands to, at most (the most frequent)
#: index terms all the prefix and fuzzy words of one query expand to together, at most: past
#: it a word is searched as written, and the plan's ``dropped`` says so (issue 32, item 3:
#: 1,000 two-letter prefixes were 64,000 terms, 3.1 s)
MAX_QUERY_EXPANSIONS = 1024
#: spellings one edit away that all the fuzzy words of one query look up together, at most:
#: past it a fuzzy word is searched as written (a word of 64 letters has ~4,700 of them, and
#: a query of long fuzzy words took 17 ms each, 33 s for a word of 64,000 letters)
MAX_FUZZY_CANDIDATES = 50_000
MIN_PREFIX_CHARS = 2      #: a shorter prefix (``a*``) is a plain word
MAX_BOOST = 1000.0
MAX_DEPTH = 32            #: parentheses (and NOT/-) nested deeper: the query is searched as plain words
#: fields every database has; stored metadata keys are fields too
BUILTIN_FIELDS = ("title", "section", "source")
TEXT_FIELDS = ("title", "section")  #: fields whose words are searched (the others filter)
#: metadata keys the file loaders add to every file (ragdb.files.loaders): never a field in a
#: query, since ``encoding:utf8`` or ``path:src`` in a question is text, not a filter that
#: silently keeps or drops every file (a filter= mapping or --filter still filters on them)
AUTOMATIC_KEYS = frozenset({"path", "content_hash", "size", "mtime", "loader", "encoding", "pages", "line"})

# Only the ASCII quote (and its full-width form, which NFKC maps to it) quotes a phrase.
# Typographic quotes (“ ” 「 」) are punctuation: Chinese and Japanese questions use them
# for names and terms as a matter of course (25 of CMRC 2018's 1,002 trial questions do),
# and reading them as phrases would change how natural questions are searched.
_OPEN_QUOTES = {'"': '"'}
_FIELD_RE = LazyPattern(r"([A-Za-z_][\w.\-]*):(?=\S)")
_SUFFIX_RE = LazyPattern(r"^(?P<body>.*?)(?P<star>\*)?(?P<fuzzy>~(?P<dist>\d+)?)?(?:\^(?P<boost>\d+(?:\.\d+)?|\.\d+))?$",
                        re.S)
_BOOST_RE = LazyPattern(r"\^(\d+(?:\.\d+)?|\.\d+)")
_OPERATORS = ("AND", "OR", "NOT")
# Every character or word the tokenizer gives a meaning beyond "a word": a quote,
# parentheses, a field's colon, the suffixes *, ~ and ^, a sign at a word's start, an
# operator. A query with none of them is plain words, and parse() builds that directly:
# parsing was a quarter of a SciFact question's search time (0.1 of 0.35 ms).
_SYNTAX_RE = LazyPattern(r'["()*~^:]|(?:^|\s)[+-]|\b(?:AND|OR|NOT)\b')


@dataclass(frozen=True)
class Word:
    """A word as typed; analyzed into index terms when searched. ``prefix``: ``word*``;
    ``fuzzy``: ``word~`` (edit distance); ``field``: ``field:word``."""

    text: str
    field: str | None = None
    boost: float = 1.0
    prefix: bool = False
    fuzzy: int = 0


@dataclass(frozen=True)
class Phrase:
    """``"words in order"``: every index term of the text, adjacent and in order."""

    text: str
    field: str | None = None
    boost: float = 1.0


@dataclass(frozen=True)
class Group:
    """Clauses combined as a boolean query (see the module docstring); a parenthesised
    group may carry a ``field`` (``title:(a b)``: its words in that field)."""

    clauses: tuple[Clause, ...]
    boost: float = 1.0
    field: str | None = None
    #: ``a OR b``: the clauses are alternatives (a metadata field among them is one, not a
    #: filter every match must pass; see ragdb.index.matching.compile_query)
    alternatives: bool = False


Node = Word | Phrase | Group


@dataclass(frozen=True)
class Clause:
    occur: str  # MUST, SHOULD or MUST_NOT
    node: Node


@dataclass(frozen=True)
class ParsedQuery:
    """A parsed query: ``root`` (a :class:`Group`), the ``syntax`` it was parsed with,
    and ``error``: why the query language was not applied (the query was then searched
    as plain words), else None."""

    text: str
    root: Group
    syntax: str = "query"
    error: str | None = None

    @property
    def plain(self) -> bool:
        """Whether the query is plain words: no operator, phrase, field, boost, prefix or
        fuzzy word anywhere (then it is searched exactly as its whole text)."""
        return _plain(self.root)

    def words(self, *, negated: bool = False) -> Iterator[tuple[Word | Phrase, str | None, float]]:
        """Every word and phrase with its field and its boost (times those of its groups):
        the ones that score (``negated=False``) or the excluded ones."""
        yield from _walk(self.root, None, 1.0, False, negated)


def _plain(group: Group) -> bool:
    if group.boost != 1.0 or group.field is not None:
        return False
    for c in group.clauses:
        if c.occur != SHOULD:
            return False
        n = c.node
        if isinstance(n, Group):
            if not _plain(n):
                return False
        elif not isinstance(n, Word) or n.field is not None or n.boost != 1.0 or n.prefix or n.fuzzy:
            return False
    return True


def _walk(group: Group, field: str | None, boost: float, under_not: bool, negated: bool
          ) -> Iterator[tuple[Word | Phrase, str | None, float]]:
    field = group.field or field
    boost *= group.boost
    for c in group.clauses:
        excluded = under_not ^ (c.occur == MUST_NOT)
        n = c.node
        if isinstance(n, Group):
            yield from _walk(n, field, boost, excluded, negated)
        elif excluded == negated:
            yield n, n.field or field, boost * n.boost


def plain(text: str) -> ParsedQuery:
    """``text`` as plain words (``syntax="plain"``)."""
    return ParsedQuery(text, Group(tuple(Clause(SHOULD, Word(w)) for w in text.split())), "plain")


def plain_words(text: str) -> bool:
    """Whether ``text`` holds no operator, phrase, field, boost, prefix or fuzzy word in
    the query language's syntax: then :func:`parse` makes plain words of it."""
    return not _SYNTAX_RE.search(unicodedata.normalize("NFKC", text) if not text.isascii() else text)


# The same without parentheses: they only group words, and a group of plain words is
# plain (unbalanced or too deep ones make the query plain words too). 118 of SciFact's
# 809 questions hold one, e.g. "(H2A)".
_SEARCH_SYNTAX_RE = LazyPattern(r'["*~^:]|(?:^|[\s(])[+-]|\b(?:AND|OR|NOT)\b')


def searched_as_plain(text: str) -> bool:
    """Whether :func:`parse` of ``text`` is :attr:`~ParsedQuery.plain` for certain (so a
    search can take its words as they are without parsing): :func:`plain_words`, or
    parentheses around plain words."""
    return not _SEARCH_SYNTAX_RE.search(unicodedata.normalize("NFKC", text) if not text.isascii() else text)


def parse(text: str, *, syntax: str = "query", is_field: Callable[[str], bool] | None = None) -> ParsedQuery:
    """Parse ``text``; never raises on the query's content (see the module docstring).
    ``is_field(name)``: whether ``name:`` is a field (default: the built-in fields only)."""
    if syntax not in SYNTAXES:
        raise InvalidInput(f"syntax must be one of {', '.join(map(repr, SYNTAXES))}, got {syntax!r}")
    if syntax == "plain":
        return plain(text)
    normal = unicodedata.normalize("NFKC", text) if not text.isascii() else text
    if not _SYNTAX_RE.search(normal):  # what the parser makes of words alone (a test checks both agree)
        return ParsedQuery(text, Group(tuple(Clause(SHOULD, Word(w)) for w in normal.split())), "query")
    return _parse(text, normal, is_field)


def _parse(text: str, normal: str, is_field: Callable[[str], bool] | None) -> ParsedQuery:
    """:func:`parse` by the tokenizer and the parser (``normal``: ``text`` after NFKC)."""
    known = is_field or (lambda name: name in BUILTIN_FIELDS)
    try:
        tokens = _tokenize(normal, known)
        parser = _Parser(tokens)
        root = parser.sequence(top=True)
    except _SyntaxError as e:
        return ParsedQuery(text, plain(text).root, "query", str(e))
    return ParsedQuery(text, root, "query")


# -- tokens ------------------------------------------------------------------------------

class _SyntaxError(Exception):
    pass


class _Tok(NamedTuple):  # (not a frozen dataclass: ~1 ms less at import, the CLI's start)
    kind: str  # word, phrase, open, close, op, sign
    text: str
    field: str | None = None
    boost: float = 1.0


def _boost(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_BOOST:
        raise _SyntaxError(f"boost ^{text} is outside (0, {MAX_BOOST:g}]")
    return value


def _tokenize(text: str, is_field: Callable[[str], bool]) -> list[_Tok]:
    out: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        start = i
        # a sign glued to what follows: +word, -word, -"phrase", +(group); "--x" is a word, and
        # so are numbers: -2, +1 (SciFact's "E2f-1, -2, -3" and "+1 nucleosomes")
        # (only at the start of a token: after "(H2A)" a "-" is part of the text)
        at_start = i == 0 or text[i - 1].isspace() or text[i - 1] == "("
        if at_start and ch in "+-" and i + 1 < n and not text[i + 1].isspace() and text[i + 1] not in "+-)" \
                and not text[i + 1].isdigit() and (ch == "+" or _excludes(text, i + 1, is_field)):
            out.append(_Tok("sign", ch))
            i += 1
            continue
        if at_start and ch in "+-" and (i + 1 == n or text[i + 1].isspace()):
            raise _SyntaxError(f"a lone {ch!r} at offset {start}")
        field = None
        m = _FIELD_RE.match(text, i)
        if m and is_field(m.group(1)):
            field = m.group(1)
            i = m.end()
            ch = text[i]
        if ch == "(":
            out.append(_Tok("open", "(", field))
            i += 1
            continue
        if ch == ")":
            if field is not None:
                raise _SyntaxError(f"{field}: is followed by nothing")
            i += 1
            boost = 1.0
            m = _BOOST_RE.match(text, i)
            if m:
                boost = _boost(m.group(1))
                i = m.end()
            out.append(_Tok("close", ")", boost=boost))
            continue
        if ch in _OPEN_QUOTES:
            close = _OPEN_QUOTES[ch]
            end = text.find(close, i + 1)
            if end < 0:
                raise _SyntaxError(f"the quote at offset {start} is never closed")
            phrase = text[i + 1:end]
            i = end + 1
            boost = 1.0
            m = _BOOST_RE.match(text, i)
            if m:
                boost = _boost(m.group(1))
                i = m.end()
            out.append(_Tok("phrase", phrase, field, boost))
            continue
        # a word: up to whitespace, a closing parenthesis or a quote
        j = i
        while j < n and not text[j].isspace() and text[j] not in ')"':
            if text[j] == "(" and j > i:  # f(x): the word ends; the parenthesis opens a group
                break
            j += 1
        word = text[i:j]
        i = j
        if field is None and word in _OPERATORS:
            out.append(_Tok("op", word))
            continue
        out.append(_Tok("word", word, field))
    return out


# What may follow "-" for an exclusion (see _excludes): lower-case letters, then the
# suffix operators of a word (prefix*, word~, word^2).
_EXCLUDED_WORD_RE = LazyPattern(r"(?:[^\W\d_]{2,})(?:\*|~\d*)?(?:\^(?:\d+(?:\.\d+)?|\.\d+))?")


def _excludes(text: str, i: int, is_field: Callable[[str], bool]) -> bool:
    """Whether the ``-`` before ``text[i]`` excludes what follows: a phrase (``-"a b"``), a
    group (``-(a b)``), a known field (``-lang:en``) or a word of two or more letters none
    of which is upper case (``-draft``, ``-草稿``, ``-draft*``). Anything else is a word as
    typed, sign included: command-line flags (``-g``, ``-r``, ``-fPIC``, ``-Wall``, ``-O2``,
    ``-DCMAKE_BUILD_TYPE=Release``, ``-std=c++17``) are what technical questions search for."""
    ch = text[i]
    if ch in _OPEN_QUOTES or ch == "(":
        return True
    m = _FIELD_RE.match(text, i)
    if m and is_field(m.group(1)):
        return True
    j = i
    while j < len(text) and not text[j].isspace() and text[j] not in ')"':
        if text[j] == "(" and j > i:
            break
        j += 1
    word = text[i:j]
    return _EXCLUDED_WORD_RE.fullmatch(word) is not None and not any(c.isupper() for c in word)


class _Parser:
    """sequence := orx+ ; orx := andx (OR andx)* ; andx := unary (AND unary)* ;
    unary := (NOT | - ) unary | + primary | primary ; primary := word | phrase | ( sequence )"""

    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0
        self.field: str | None = None  # the field of the innermost group with one (``lang:(...)``)

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _SyntaxError(f"nested deeper than {MAX_DEPTH} levels")

    def peek(self) -> _Tok | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> _Tok:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def sequence(self, top: bool = False) -> Group:
        clauses: list[Clause] = []
        while (tok := self.peek()) is not None:
            if tok.kind == "close":
                if top:
                    raise _SyntaxError("a closing parenthesis without an opening one")
                break
            clauses.append(self.orx())
        if top and not clauses:
            return Group(())
        if not clauses:
            raise _SyntaxError("empty parentheses")
        return Group(tuple(clauses))

    def orx(self) -> Clause:
        first = self.andx()
        items = [first]
        while (tok := self.peek()) is not None and tok.kind == "op" and tok.text == "OR":
            self.take()
            items.append(self.andx())
        if len(items) == 1:
            return first
        return Clause(SHOULD, Group(tuple(Clause(SHOULD if c.occur == MUST else c.occur, c.node) for c in items),
                                    alternatives=True))

    def andx(self) -> Clause:
        first = self.unary()
        items = [first]
        while (tok := self.peek()) is not None and tok.kind == "op" and tok.text == "AND":
            self.take()
            items.append(self.unary())
        if len(items) == 1:
            return first
        return Clause(MUST, Group(tuple(c if c.occur == MUST_NOT else Clause(MUST, c.node) for c in items)))

    def unary(self) -> Clause:
        tok = self.peek()
        if tok is None:
            raise _SyntaxError("an operator at the end of the query")
        if (tok.kind == "op" and tok.text == "NOT") or (tok.kind == "sign" and tok.text == "-"):
            self.take()
            self.deeper()
            inner = self.unary()
            self.depth -= 1
            if inner.occur == MUST_NOT:  # NOT NOT x, --x never reach here as words: keep it simple
                raise _SyntaxError("a double negation")
            return Clause(MUST_NOT, inner.node)
        if tok.kind == "sign" and tok.text == "+":
            self.take()
            return Clause(MUST, self.primary())
        node = self.primary()
        return Clause(MUST if isinstance(node, Phrase) else SHOULD, node)

    def primary(self) -> Node:
        tok = self.peek()
        if tok is None:
            raise _SyntaxError("an operator at the end of the query")
        if tok.kind == "op":
            raise _SyntaxError(f"{tok.text} where a word was expected")
        if tok.kind == "sign":
            raise _SyntaxError(f"{tok.text!r} where a word was expected")
        self.take()
        if tok.kind == "open":
            self.deeper()
            outer, self.field = self.field, tok.field or self.field
            try:
                group = self.sequence()
            finally:
                self.field = outer
            self.depth -= 1
            close = self.peek()
            if close is None or close.kind != "close":
                raise _SyntaxError("a parenthesis is never closed")
            self.take()
            return Group(group.clauses, close.boost, tok.field)
        if tok.kind == "close":
            raise _SyntaxError("a closing parenthesis without an opening one")
        if tok.kind == "phrase":
            if not tok.text.strip():
                raise _SyntaxError("an empty phrase")
            return Phrase(tok.text, tok.field, tok.boost)
        return _word(tok, tok.field or self.field)


def _word(tok: _Tok, field: str | None) -> Word:
    """The word ``tok``; ``field``: its own field, else its group's (``lang:(en~1)``)."""
    m = _SUFFIX_RE.match(tok.text)
    assert m is not None  # the pattern matches any text
    if field is not None and field not in TEXT_FIELDS:
        # a filter (source or a metadata key, its own or its group's): its value as typed, ``*``
        # and ``~`` included (``source:docs/*`` is a glob, ``source:notes.md~`` an editor's
        # backup, ``lang:(en~1 OR zh)`` the value ``en~1``); a boost means nothing to a filter
        boost = m.group("boost")
        return Word(tok.text[:m.start("boost") - 1] if boost else tok.text, tok.field,
                    _boost(boost) if boost else 1.0)
    body = m.group("body")
    if not body or not any(c.isalnum() for c in body):  # "*", "~", "^2", "...": a plain word
        return Word(tok.text, tok.field)
    prefix = bool(m.group("star"))
    fuzzy = 0
    if m.group("fuzzy"):
        fuzzy = int(m.group("dist") or 1)
        if fuzzy != 1:
            raise _SyntaxError(f"{tok.text!r}: fuzzy words match within one edit (word~ or word~1)")
        if prefix:
            raise _SyntaxError(f"{tok.text!r}: a word is a prefix or fuzzy, not both")
    if prefix and sum(c.isalnum() for c in body) < MIN_PREFIX_CHARS:
        # a plain word, the rest of the query still the query language (``"deleted documents"
        # -draft C*`` keeps its phrase and exclusion)
        return Word(body + "*", tok.field, _boost(m.group("boost")) if m.group("boost") else 1.0)
    boost = _boost(m.group("boost")) if m.group("boost") else 1.0
    return Word(body, tok.field, boost, prefix, fuzzy)
