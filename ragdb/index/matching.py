"""A parsed query (:mod:`ragdb.query.language`) on the index: the units it scores and the chunks it matches.

:func:`compile_query` turns the parse tree into

* scoring **units**: each distinct term of the words and phrases that are not
  excluded, with its boost (the largest, when a term comes twice), and for a prefix
  or fuzzy word one unit for all the index terms it expands to, scored as one term
  (term frequencies summed per chunk, document frequency the number of chunks
  holding any of them: Lucene's ``SynonymQuery``);
* a **match tree** of the boolean structure: words, phrases, metadata fields and
  groups with ``must``/``should``/``must_not`` clauses.

Scores do not depend on the operators: a hit's score is the BM25 (or TF-IDF) sum of
the query's units it holds; the operators decide which chunks may be hits. So the
ranking order is known before any phrase is checked, and :class:`Matcher` checks
phrases lazily, best-scored candidate first, until ``k`` hits are certain: bounds
(:meth:`Matcher.bounds`) say which chunks certainly match (every phrase of theirs
proven by its terms alone, or not needed) and which may (their phrases' terms are all
there); only the second kind is verified, on the chunk's text with the analyzer's
token positions (:meth:`ragdb.text.analysis.Analyzer.tokens`).

Rules for a word (it may analyze to several index terms: ``node.js``, ``检索增强``):
a ``should`` word matches a chunk holding any of its terms; a ``must`` or
``must_not`` word one holding all of them; a prefix or fuzzy word any of its
expansions. A term is held in the text or in a field of positive weight (the fields
where it also scores, :mod:`ragdb.text.fields`). A word the analyzer drops entirely (a stopword) is ignored wherever it
stands; a ``must`` word with a term the vocabulary lacks matches nothing. A bare
metadata field (``lang:en``, ``source:docs/*``) is a ``must`` filter: it restricts,
never scores.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ragdb.text import fields
from ragdb.query import language as q

if TYPE_CHECKING:
    from ragdb.text.analysis import Analyzer
    from ragdb.index.inverted import Index

ANY, ALL = "any", "all"


class Unit(NamedTuple):
    """One scoring unit: ``key`` (how explain names it), the index ``ids`` scored as one
    term, its live document frequency ``df``, ``weight`` (the boost, times a field's weight)
    and ``field`` (None: the text). A named tuple, not a frozen dataclass: every search
    makes one per query term, and a frozen dataclass's ``__init__`` costs 4x as much."""

    key: str
    ids: tuple[int, ...]
    df: int
    weight: float = 1.0
    field: str | None = None  #: a field's unit (:mod:`ragdb.text.fields`): BM25 without length normalisation
    #: how often the query's scored words hold the term (TF-IDF weighs the query's vector by it,
    #: as a plain search's; BM25 scores each term once)
    tf: int = 1


# The nodes of a compiled query are named tuples as well: a frozen dataclass took ~1 ms to
# create at import, which every ``ragdb search`` pays (five of them ~5 ms of its ~230 ms start),
# a named tuple ~0.2 ms; and a search makes several.


class Terms(NamedTuple):
    """A word: ``groups`` of index term ids, one a term (its alternatives: the term in the
    text and in each weighted field; a prefix or fuzzy word's expansions); chunks holding
    any of them (``mode`` ANY) or, for every group, one of its ids (ALL). ``missing``: a
    term of a ``must`` word is nowhere in the vocabulary, so nothing matches."""

    groups: tuple[tuple[int, ...], ...]
    mode: str
    missing: bool = False
    text_only: bool = True  #: every id a term of the text (none of a field)


class PhraseNode(NamedTuple):
    """A phrase: ``seq`` its (term, position relative to its first) pairs, ``ids`` the
    ids of its distinct terms (None when one is not in the vocabulary: nothing matches)."""

    text: str
    seq: tuple[tuple[str, int], ...]
    ids: tuple[int, ...] | None
    field: str | None = None  #: the phrase is searched in this field's text (title, section)

    @property
    def single(self) -> bool:
        """One position only: holding the terms is holding the phrase."""
        return len({p for _, p in self.seq}) <= 1


class MaskNode(NamedTuple):
    """A metadata/source field: chunks of the documents matching ``filter``."""

    filter: Mapping[str, Any]


class GroupNode(NamedTuple):
    clauses: tuple[tuple[str, MatchNode], ...]


MatchNode = Terms | PhraseNode | MaskNode | GroupNode


class Compiled(NamedTuple):
    """A query ready to run: its scoring units, its match tree (None: any chunk a unit
    scores matches), and what the plan reports (see :class:`ragdb.types.QueryPlan`)."""

    units: tuple[Unit, ...]
    tree: MatchNode | None
    phrases: bool
    expansions: Mapping[str, tuple[str, ...]]
    dropped: tuple[tuple[str, str], ...] = ()
    unknown: tuple[str, ...] = ()
    #: how many distinct terms of the words that score (not excluded ones) no chunk the search
    #: may see holds in the text (a word only a title holds among them, as a plain search
    #: counts it): what a confidence's maximum counts for them (an excluded word changes no hit)
    unknown_scored: int = 0
    #: (term, relative position) sequences of the phrases that are not excluded (highlighting)
    phrase_seqs: tuple[tuple[tuple[str, int], ...], ...] = ()


class Lookup:
    """What compiling needs from the database (inside a read transaction): term ids and
    live dfs, the prefix and fuzzy expansions, whether a term shows in chunks the search
    may see.

    A term no chunk the search may see holds is not there for it: :meth:`terms` leaves it
    out, as a term of no chunk, so what a caller is told (``unknown``, the field units, a
    confidence's maximum, a TF-IDF query's norm) is what a database of the chunks it may
    see would say: else they would tell whether hidden documents hold a word."""

    def __init__(self, terms: Callable[[Sequence[str]], dict[str, tuple[int, int]]],
                 expand: Callable[[str | None, Mapping[str, tuple[int, int]], int], list[tuple[str, int, int]]],
                 visible: Callable[[int], bool], union_df: Callable[[Sequence[int]], int],
                 stored: Callable[[Sequence[int]], set[int]] | None = None,
                 restricted: bool = False) -> None:
        self._terms = terms
        self.expand = expand
        """``expand(prefix, found, n)``: the ``n`` most frequent (term, id, live df) among the
        terms ``found`` (already :meth:`terms`' answer) and, with a ``prefix``, every term starting
        with it that chunks the search may see hold; frequent as counted in those chunks, ties by
        term. Exact whatever was flushed (see :meth:`ragdb.engine.search.Searcher._expansions`)."""
        self.visible = visible
        self.union_df = union_df
        self._stored = stored
        self._restricted = restricted

    def terms(self, terms: Sequence[str]) -> dict[str, tuple[int, int]]:
        """term -> (id, live df) of the terms a search can match: in latest chunks (df > 0),
        or, for a search of history (``stored`` given), in any stored chunk; and, when the
        search may not see every such chunk, in one it may see."""
        found = self._terms(terms)
        if self._stored is None:
            found = {t: v for t, v in found.items() if v[1] > 0}
        else:
            rare = [v[0] for v in found.values() if v[1] == 0]
            kept = self._stored(rare) if rare else set()
            found = {t: v for t, v in found.items() if v[1] > 0 or v[0] in kept}
        if self._restricted:
            found = {t: v for t, v in found.items() if self.visible(v[0])}
        return found


def compile_query(parsed: q.ParsedQuery, analyzer: Analyzer, lookup: Lookup, *, fuzzy: int = 0,
                  field_weights: Mapping[str, float] | None = None) -> Compiled:
    """Compile ``parsed`` (see the module docstring). ``fuzzy=1`` makes every word fuzzy.
    ``field_weights``: the database's (:mod:`ragdb.text.fields`); a word searched in the text also
    scores in each field of positive weight, and ``title:word`` in that field alone."""
    weights = {f: w for f, w in (field_weights or {}).items() if w > 0}
    units: dict[tuple[int, ...], Unit] = {}
    text_tf: Counter[tuple[int, ...]] = Counter()  # a text term's count in the scored words (Unit.tf)
    expansions: dict[str, tuple[str, ...]] = {}
    dropped: list[tuple[str, str]] = []
    unknown: list[str] = []
    scored_unknown: set[str] = set()  # (see Compiled.unknown_scored)
    phrases = False
    seqs: list[tuple[tuple[str, int], ...]] = []
    budget = q.MAX_QUERY_EXPANSIONS  # expansion terms left to the query's prefix and fuzzy words
    spellings = [q.MAX_FUZZY_CANDIDATES]  # edits left to the query's fuzzy words to look up
    expanded_before: dict[tuple[str, bool, int], tuple[str, list[tuple[str, int, int]]] | str | None] = {}
    units_before: dict[tuple[str, bool, int], tuple[tuple[int, ...], tuple[str, ...], int, Terms]] = {}

    def add_unit(key: str, ids: tuple[int, ...], df: int, weight: float, fld: str | None = None) -> None:
        old = units.get(ids)
        if old is None or old.weight < weight:
            units[ids] = Unit(old.key if old else key, ids, df, weight, fld)

    def field_alternatives(terms: Sequence[str], boost: float, scored: bool) -> dict[str, list[int]]:
        """term -> its ids in the weighted fields: a text word is found, and scores, in those
        fields too (a unit each, weighted by the field's weight)."""
        if not weights:
            return {}
        names = [fields.PREFIX[f] + t for f in weights for t in terms]
        found = lookup.terms(names)
        out: dict[str, list[int]] = {}
        for f, w in weights.items():
            for t in terms:
                hit = found.get(fields.PREFIX[f] + t)
                if hit is not None:
                    out.setdefault(t, []).append(hit[0])
                    if scored:
                        add_unit(f"{f}:{t}", (hit[0],), hit[1], boost * w, f)
        return out

    def field_word(word: q.Word, fld: str, occur: str, boost: float, scored: bool) -> MatchNode | None:
        """``title:word``: the word's terms in that field alone."""
        terms = list(dict.fromkeys(analyzer.terms(word.text)))
        if not terms:
            dropped.extend(analyzer.dropped(word.text) or [(word.text, "no index terms")])
            return None
        names = [fields.PREFIX[fld] + t for t in terms]
        known = lookup.terms(names)
        missing = [f"{fld}:{t}" for t, n in zip(terms, names) if n not in known]
        unknown.extend(missing)
        if scored:
            scored_unknown.update(missing)
            for t, n in zip(terms, names):
                if n in known:
                    add_unit(f"{fld}:{t}", (known[n][0],), known[n][1], boost, fld)
        groups = tuple((known[n][0],) for n in names if n in known)
        if occur == q.SHOULD:
            return Terms(groups, ANY, missing=not groups, text_only=False)
        return Terms(groups, ALL, missing=len(groups) < len(names), text_only=False)

    def expand(word: q.Word, distance: int) -> tuple[str, list[tuple[str, int, int]]] | str | None:
        """A prefix or fuzzy word's (key, expansions), cut to the query's budget; ``AS_WRITTEN``
        past a budget (the plan's ``dropped`` says which); None when it has nothing to expand."""
        nonlocal budget
        if budget <= 0:
            dropped.append((f"{word.text}{'*' if word.prefix else '~'}",
                            f"not expanded: the query's prefix and fuzzy words already took "
                            f"{q.MAX_QUERY_EXPANSIONS} index terms; searched as written"))
            return AS_WRITTEN
        expanded = _expand(word, analyzer, lookup, distance, dropped, spellings)
        if not isinstance(expanded, tuple):
            return expanded
        key, found = expanded
        if len(found) > budget:
            dropped.append((key, f"expanded to {budget} of its {len(found)} index terms: the query's "
                                 f"prefix and fuzzy words take {q.MAX_QUERY_EXPANSIONS} in all"))
            found = found[:budget]
        budget -= max(1, len(found))
        return key, found

    def word_terms(word: q.Word, occur: str, boost: float, scored: bool) -> MatchNode | None:
        if word.prefix or word.fuzzy or fuzzy:
            memo = (word.text, word.prefix, fuzzy or word.fuzzy)
            if memo not in expanded_before:  # a word written twice expands once (its unit is one)
                expanded_before[memo] = expand(word, fuzzy or word.fuzzy)
            expanded = expanded_before[memo]
            if expanded is None:
                return None
            if isinstance(expanded, tuple):
                key, found = expanded
                if not found:
                    unknown.append(key)
                    if scored:
                        scored_unknown.add(key)
                    expansions[key] = ()
                    return Terms((), ANY, missing=True)
                unit = units_before.get(memo)
                if unit is None:
                    ids = tuple(i for _, i, _ in found)
                    unit = units_before[memo] = (ids, tuple(t for t, _, _ in found),
                                                 lookup.union_df(ids) if len(ids) > 1 else found[0][2],
                                                 Terms((ids,), ANY))
                expansions[key] = unit[1]
                if scored:
                    add_unit(key, unit[0], unit[2], boost)
                return unit[3]
        terms = list(dict.fromkeys(analyzer.terms(word.text)))
        if not terms:
            dropped.extend(analyzer.dropped(word.text) or [(word.text, "no index terms")])
            return None
        known = lookup.terms(terms)
        if scored:
            written = Counter(analyzer.terms(word.text))  # (a plain search counts every term written)
            for t in terms:
                if t in known:
                    add_unit(t, (known[t][0],), known[t][1], boost)
                    text_tf[(known[t][0],)] += written[t]
        in_fields = field_alternatives(terms, boost, scored)
        groups = []
        missing = []
        for t in terms:
            alternatives = ((known[t][0],) if t in known else ()) + tuple(in_fields.get(t, ()))
            if alternatives:
                groups.append(alternatives)
            else:
                missing.append(t)
        unknown.extend(missing)
        if scored:  # a term no text holds counts as a plain search counts it, held by a field or not
            scored_unknown.update(t for t in terms if t not in known)
        only_text = not in_fields
        if occur == q.SHOULD:
            return Terms(tuple(groups), ANY, missing=not groups, text_only=only_text)
        return Terms(tuple(groups), ALL, missing=bool(missing), text_only=only_text)

    def phrase_node(phrase: q.Phrase, boost: float, scored: bool, fld: str | None = None) -> MatchNode | None:
        nonlocal phrases
        tokens = analyzer.tokens(phrase.text)
        if not tokens:
            dropped.extend(analyzer.dropped(phrase.text) or [(phrase.text, "no index terms")])
            return None
        base = min(t.position for t in tokens)
        seq = tuple(dict.fromkeys((t.term, t.position - base) for t in tokens))
        terms = list(dict.fromkeys(t for t, _ in seq))
        names = [fields.PREFIX[fld] + t for t in terms] if fld else terms
        known = lookup.terms(names)
        missing = [t for t, n in zip(terms, names) if n not in known]
        unknown.extend(f"{fld}:{t}" if fld else t for t in missing)
        if scored:
            scored_unknown.update(f"{fld}:{t}" if fld else t for t in missing)
        if scored:
            for t, n in zip(terms, names):
                if n in known:
                    add_unit(f"{fld}:{t}" if fld else t, (known[n][0],), known[n][1], boost, fld)
            if not fld:
                field_alternatives(terms, boost, scored)
        node = PhraseNode(phrase.text, seq, None if missing else tuple(known[n][0] for n in names), fld)
        phrases = phrases or not node.single
        if scored and not fld:
            seqs.append(seq)
        return node

    def compile_group(group: q.Group, fld: str | None, boost: float, under_not: bool
                      ) -> tuple[MatchNode | None, bool]:
        """The group's match node, and whether it is a filter only (metadata fields and groups
        of them: it restricts, never scores)."""
        fld = group.field or fld
        boost *= group.boost
        clauses: list[tuple[str, MatchNode, bool]] = []
        for clause in group.clauses:
            node = clause.node
            occur = clause.occur
            excluded = under_not ^ (occur == q.MUST_NOT)
            node_field = node.field if not isinstance(node, q.Group) else None
            compiled: MatchNode | None
            only_filter = False
            if isinstance(node, q.Group):
                compiled, only_filter = compile_group(node, fld, boost, excluded)
            elif (node_field or fld) not in (None, *fields.FIELDS):
                # a metadata key or source: a filter on documents; its value as typed (the parser
                # keeps ``source:docs/*`` whole; a word in a field's group, ``lang:(en*)``, is read
                # as a word: its suffix is written back); a boost means nothing to a filter
                text = node.text + ("*" if isinstance(node, q.Word) and node.prefix else "") + \
                    ("~" if isinstance(node, q.Word) and node.fuzzy else "")
                compiled, only_filter = MaskNode(_field_filter(node_field or fld or "", text)), True
            elif isinstance(node, q.Phrase):
                compiled = phrase_node(node, boost * node.boost, not excluded, node_field or fld)
            elif node_field or fld:  # title:word, section:word
                compiled = field_word(node, node_field or fld or "", occur, boost * node.boost, not excluded)
            else:
                compiled = word_terms(node, occur, boost * node.boost, not excluded)
            if compiled is not None:
                clauses.append((occur, compiled, only_filter))
        if not clauses:
            return None, False
        if group.alternatives:
            clauses = _merged_filters(clauses)
        only = all(f for _o, _c, f in clauses)
        # A filter restricts whatever stands beside it (``pump lang:en``, ``lang:en lang:zh``,
        # ``pump (lang:en OR lang:zh)``): required where it would be optional. Among
        # alternatives it stays one (``lang:en OR lang:zh`` is either); a group of filters
        # alone is, as a whole, the filter its parent requires.
        if not group.alternatives:
            words = [(o, c, f) for o, c, f in clauses if o == q.SHOULD and not f]
            if (words and not only and any(f for _o, _c, f in clauses)
                    and not any(o == q.MUST and not f for o, _c, f in clauses)):
                # the words beside a filter still need one of them to match (``(pump lang:en) OR
                # (valve lang:zh)``: the English chunks with 'pump'), as they do where the hits'
                # scores ask for it: a group of them, required with the filter
                clauses = [(o, c, f) for o, c, f in clauses if not (o == q.SHOULD and not f)] + \
                    [(q.MUST, GroupNode(tuple((o, c) for o, c, _f in words)), False)]
            clauses = [(q.MUST if o == q.SHOULD and f else o, c, f) for o, c, f in clauses]
        # a clause twice is the clause once (a AND a, a OR a): a word repeated 100,000 times
        # made as many masks to combine (its unit was one already)
        distinct: dict[Any, tuple[str, MatchNode]] = {}
        for n, (o, c, _f) in enumerate(clauses):
            try:
                distinct.setdefault((o, c), (o, c))
            except TypeError:  # a node holding a filter mapping: kept as it is
                distinct[n] = (o, c)
        return GroupNode(tuple(distinct.values())), only

    tree = compile_group(parsed.root, None, 1.0, False)[0]
    scored = tuple(Unit(u.key, ids, u.df, u.weight, u.field, text_tf[ids]) if u.field is None and text_tf[ids] > 1
                   else u for ids, u in units.items())
    return Compiled(scored, tree, phrases, expansions, tuple(dropped), tuple(dict.fromkeys(unknown)),
                    len(scored_unknown), tuple(seqs))


def _merged_filters(clauses: list[tuple[str, MatchNode, bool]]) -> list[tuple[str, MatchNode, bool]]:
    """Alternatives' filters on one key as one filter of every value (``n:1 OR n:2 OR ...``,
    ``lang:(en OR zh)``): each was a mask of its own, read apart (2,000 of them took 0.4 s;
    ``filter={'n': {'$in': [...]}}`` takes 0.03)."""
    by_key: dict[str, tuple[list[Any], set[tuple[type, Any]]]] = {}  # key -> (its values, as seen)
    out: list[tuple[str, MatchNode, bool]] = []
    for occur, node, only in clauses:
        if occur == q.SHOULD and isinstance(node, MaskNode) and len(node.filter) == 1:
            (key, values), = node.filter.items()
            if isinstance(values, list):
                if key not in by_key:
                    by_key[key] = ([], set())
                    out.append((occur, MaskNode({key: by_key[key][0]}), only))
                merged, seen = by_key[key]
                for v in values:  # (1 and True are one in a set: typed apart)
                    if (type(v), v) not in seen:
                        seen.add((type(v), v))
                        merged.append(v)
                continue
        out.append((occur, node, only))
    return out


def _field_filter(key: str, text: str) -> dict[str, Any]:
    """The filter of ``key:text``: the text, and the number it spells when it spells one (an
    integer past 64 bits is the text alone, as ``ragdb --filter`` takes it: no metadata holds
    such an integer, and its float would be another number)."""
    values: list[Any] = [text]
    if "_" in text or not text.isascii():  # (int() reads 1_000 and ١٠٠٠ as 1000: not numbers as typed)
        return {key: values}
    for convert in (int, float):
        try:
            number = convert(text)
        except ValueError:
            continue
        if convert is int and not -2 ** 63 <= number < 2 ** 63:
            break
        if math.isfinite(number) and number not in values:  # ('inf', 'nan', '1e999': text alone)
            values.append(number)
    if text in ("true", "false"):
        values.append(text == "true")
    return {key: values}


# -- prefix and fuzzy expansion ------------------------------------------------------------

def _normalized(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


AS_WRITTEN = "as written"  #: what :func:`_expand` answers for a word past a budget: search it as written


def _expand(word: q.Word, analyzer: Analyzer, lookup: Lookup, fuzzy: int, dropped: list[tuple[str, str]],
            spellings: list[int]) -> tuple[str, list[tuple[str, int, int]]] | str | None:
    """(explain key, [(term, id, live df)]) of a prefix or fuzzy word: at most
    ``MAX_EXPANSIONS`` index terms that chunks the search may see hold, the most
    frequent first. None when the word has nothing to expand (a stopword)."""
    if word.prefix:
        own = lookup.terms(list(dict.fromkeys(analyzer.terms(word.text))))  # the word itself counts (deleted* finds delet)
        return f"{word.text}*", lookup.expand(_normalized(word.text), own, q.MAX_EXPANSIONS)
    terms = list(dict.fromkeys(analyzer.terms(word.text)))
    if not terms:
        dropped.extend(analyzer.dropped(word.text) or [(word.text, "no index terms")])
        return None
    candidates: list[str] = []
    for term in terms:  # (``spellings``: what the query's fuzzy words may still look up)
        if len(candidates) >= spellings[0]:  # spent: not even one more spelling made
            candidates.append(term)
        else:
            candidates.extend(edits1(term) if fuzzy else [term])
        if len(candidates) > spellings[0]:  # made a term at a time: a long word stops early
            dropped.append((f"{word.text}~", f"not expanded: the query's fuzzy words look up "
                                             f"{q.MAX_FUZZY_CANDIDATES:,} spellings one edit away at most; "
                                             f"searched as written"))
            return AS_WRITTEN
    spellings[0] -= len(candidates)
    return f"{word.text}~", lookup.expand(None, lookup.terms(list(dict.fromkeys(candidates))), q.MAX_EXPANSIONS)


_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def edits1(term: str) -> list[str]:
    """Every string one edit from ``term`` (Damerau-Levenshtein: delete, insert,
    substitute a character, swap two neighbours), ``term`` itself first. Insertions and
    substitutions use ASCII letters and digits plus the term's own characters. A term
    with a CJK character (single characters and bigrams of the index) gets none:
    an edit of one would be another word, not a typo. (Norvig, "How to Write a
    Spelling Corrector", 2007.)"""
    from ragdb.text.analysis import is_cjk

    if is_cjk(term):
        return [term]
    letters = "".join(dict.fromkeys(_ALPHABET + term))
    splits = [(term[:i], term[i:]) for i in range(len(term) + 1)]
    out = [term]
    out += [a + b[1:] for a, b in splits if b]
    out += [a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1]
    out += [a + c + b[1:] for a, b in splits if b for c in letters if c != b[0]]
    out += [a + c + b for a, b in splits for c in letters]
    return [t for t in dict.fromkeys(out) if t]


# -- matching ------------------------------------------------------------------------------------

class Matcher:
    """Evaluates a match tree on one index snapshot: :meth:`bounds` for every chunk at once,
    :meth:`matches` for one chunk exactly (phrases checked on its text)."""

    def __init__(self, index: Index, analyzer: Analyzer, mask_of: Callable[[Mapping[str, Any]], np.ndarray],
                 text_of: Callable[[int, str | None], str]) -> None:
        self.index = index
        self.analyzer = analyzer
        self.mask_of = mask_of
        self.text_of = text_of
        self.size = len(index.lengths)
        self.phrase_terms: set[str] = set()  # the terms of the tree's phrases (see bounds)
        self._dense: np.ndarray | None = None  # a scratch mask, all False between uses
        self._node_masks: dict[int, np.ndarray] = {}  # id(MaskNode) -> its mask (the tree outlives the matcher)
        self._positions: dict[tuple[int, str | None], dict[str, list[int]]] = {}
        self._by_text: dict[str, dict[str, list[int]]] = {}
        self._bounds: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(node) -> bounds (the tree outlives this)
        self._verdicts: dict[str, bool] = {}
        #: reads the texts of candidate chunks a batch at a time (see ragdb.engine.search)
        self.prefetch: Callable[[list[int]], object] = lambda _ids: None
        #: called by :meth:`release` (the searcher's texts read so far: see ragdb.engine.search)
        self.on_release: Callable[[], object] = lambda: None
        self._text_only: bool | None = None

    # Masks are kept packed, 8 chunks a byte (numpy's packbits, bit ``i & 7`` of byte ``i >> 3``):
    # a query's words and phrases each have their bounds, and dense masks of every node (and before,
    # of every term: a Chinese question's unigrams and bigrams) held ~7 MiB at 100k chunks while a
    # phrase was checked, ~70 MiB at 1M. Only :meth:`bounds` unpacks, for its caller.

    def _any_mask(self, term_ids: Sequence[int]) -> np.ndarray:
        """The chunks holding any of ``term_ids``, packed."""
        if self._dense is None:
            self._dense = np.zeros(self.size, bool)
        dense = self._dense
        postings = self.index.term_postings(list(term_ids))
        for t in term_ids:
            p = postings.get(t)
            if p is not None:
                dense[p[0]] = True
        out = np.packbits(dense, bitorder="little")
        dense.fill(False)
        return out

    def _terms_mask(self, node: Terms) -> np.ndarray:
        if node.missing or not node.groups:
            return self._none()
        if node.mode == ANY:
            return self._any_mask([t for group in node.groups for t in group])
        out = self._any_mask(node.groups[0])
        for group in node.groups[1:]:
            out &= self._any_mask(group)
        return out

    def _none(self) -> np.ndarray:
        return np.zeros((self.size + 7) // 8, np.uint8)

    def _all(self) -> np.ndarray:
        return np.full((self.size + 7) // 8, 255, np.uint8)

    def bounds(self, node: MatchNode) -> tuple[np.ndarray, np.ndarray]:
        """(certainly matching, possibly matching) masks over chunk ids (worked out once a node)."""
        lo, hi = self._packed_bounds(node)
        return (np.unpackbits(lo, count=self.size, bitorder="little").view(bool),
                np.unpackbits(hi, count=self.size, bitorder="little").view(bool))

    def _packed_bounds(self, node: MatchNode) -> tuple[np.ndarray, np.ndarray]:
        found = self._bounds.get(id(node))
        if found is None:
            found = self._bounds[id(node)] = self._bounds_of(node)
        return found

    def _bounds_of(self, node: MatchNode) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(node, Terms):
            m = self._terms_mask(node)
            return m, m
        if isinstance(node, MaskNode):
            cached = self._node_masks.get(id(node))
            if cached is None:
                dense = self.mask_of(node.filter)[:self.size]
                if len(dense) < self.size:
                    dense = np.concatenate([dense, np.zeros(self.size - len(dense), bool)])
                cached = self._node_masks[id(node)] = np.packbits(dense, bitorder="little")
            return cached, cached
        if isinstance(node, PhraseNode):
            self.phrase_terms.update(t for t, _p in node.seq)
            if node.ids is None:
                none = self._none()
                return none, none
            hi = self._terms_mask(Terms(tuple((i,) for i in node.ids), ALL))
            return (hi if node.single else self._none()), hi
        return self._combine([(occur, self._packed_bounds(child)) for occur, child in node.clauses])

    def _combine(self, parts: Sequence[tuple[str, tuple[np.ndarray, np.ndarray]]]) -> tuple[np.ndarray, np.ndarray]:
        must = [b for o, b in parts if o == q.MUST]
        should = [b for o, b in parts if o == q.SHOULD]
        nots = [b for o, b in parts if o == q.MUST_NOT]
        lo = self._all()
        hi = self._all()
        for m_lo, m_hi in must:
            lo &= m_lo
            hi &= m_hi
        if should and not must:
            s_lo = self._none()
            s_hi = self._none()
            for m_lo, m_hi in should:
                s_lo |= m_lo
                s_hi |= m_hi
            lo &= s_lo
            hi &= s_hi
        for n_lo, n_hi in nots:
            lo &= ~n_hi
            hi &= ~n_lo
        return lo, hi

    def matches(self, node: MatchNode, cid: int) -> bool:
        """Whether chunk ``cid`` matches ``node`` exactly."""
        if isinstance(node, (Terms, MaskNode)):
            return _bit(self._packed_bounds(node)[0], cid)
        if isinstance(node, PhraseNode):
            return node.ids is not None and _bit(self._packed_bounds(node)[1], cid) and self.phrase_at(node, cid)
        lo, hi = self._packed_bounds(node)
        if _bit(lo, cid) or not _bit(hi, cid):  # settled without reading a text
            return _bit(lo, cid)
        must = [self.matches(c, cid) for o, c in node.clauses if o == q.MUST]
        if not all(must):
            return False
        if any(self.matches(c, cid) for o, c in node.clauses if o == q.MUST_NOT):
            return False
        should = [c for o, c in node.clauses if o == q.SHOULD]
        return bool(must) or not should or any(self.matches(c, cid) for c in should)

    def verdict(self, tree: MatchNode, cid: int) -> bool:
        """:meth:`matches` of the whole tree, remembered by text when the tree depends on the
        text alone (words and phrases of the text, no field or metadata): chunks with the
        same text (copies, unchanged boilerplate) are decided once."""
        if self._text_only is None:
            self._text_only = _text_only(tree)
        if not self._text_only:
            return self.matches(tree, cid)
        text = self.text_of(cid, None)
        found = self._verdicts.get(text)
        if found is None:
            found = self._verdicts[text] = self.matches(tree, cid)
        return found

    def release(self) -> None:
        """Let go of the texts read so far and of what was worked out from them (token
        positions, verdicts by text): a phrase check is done with the candidates it decided
        (see ragdb.engine.search); a text asked about again is read again."""
        self._positions.clear()
        self._by_text.clear()
        self._verdicts.clear()
        self.on_release()

    def positions(self, cid: int, field: str | None = None) -> dict[str, list[int]]:
        """term -> sorted token positions in chunk ``cid``'s text (or the text of its ``field``), for
        the terms of the query's phrases."""
        found = self._positions.get((cid, field))
        if found is None:
            # by text too: chunks with the same text (copies, unchanged boilerplate) are read once
            text = self.text_of(cid, field)
            found = self._by_text.get(text)
            if found is None:
                found = self._by_text[text] = self.analyzer.positions_of(text, self.phrase_terms)
            self._positions[(cid, field)] = found
        return found

    def phrase_at(self, node: PhraseNode, cid: int) -> bool:
        return phrase_in(node.seq, self.positions(cid, node.field))


def _bit(packed: np.ndarray, cid: int) -> bool:
    """Whether chunk ``cid`` is in the packed mask ``packed`` (see ``Matcher._any_mask``)."""
    return bool(int(packed[cid >> 3]) >> (cid & 7) & 1)


def _text_only(node: MatchNode) -> bool:
    """Whether a chunk matches ``node`` follows from its text alone."""
    if isinstance(node, GroupNode):
        return all(_text_only(c) for _o, c in node.clauses)
    if isinstance(node, PhraseNode):
        return node.field is None
    if isinstance(node, Terms):  # the text's own terms only (no field alternatives)
        return node.text_only
    return False


def phrase_in(seq: Sequence[tuple[str, int]], positions: Mapping[str, Sequence[int]]) -> bool:
    """Whether ``positions`` (term -> its positions in a text) hold every (term, offset) of
    ``seq`` at one common start."""
    if not seq:
        return False
    sets = []
    for term, _ in seq:
        found = positions.get(term)
        if not found:
            return False
        sets.append(set(found))
    first, off0 = seq[0]
    for p in positions[first]:
        start = p - off0
        if all(start + off in s for (_t, off), s in zip(seq, sets)):
            return True
    return False
