"""Retrieval evaluation: BEIR-layout loaders and ranking metrics.

The metrics are pure functions of a ranked list of document ids and the
relevance judgements ("qrels") of one query:

* :func:`ndcg_at_k` -- normalised discounted cumulative gain, log2 discount,
  ideal DCG computed from the judgements;
* :func:`recall_at_k` -- share of the relevant documents found in the top k;
* :func:`mrr_at_k` -- reciprocal rank of the first relevant document.

:func:`evaluate` averages them over a whole run and :func:`evaluate_database`
runs a query set against a ragdb database first.  :func:`calibrate_refusal`
chooses a database's refusal floor (``min_confidence``) from judged queries
and off-topic questions; :func:`calibrate_questions` from questions alone (no
judgements), and :func:`self_calibrate` from the database's own text against a
bundled set of off-topic questions, with no input at all.  Nothing here prints.

A BEIR folder (Thakur et al., 2021) holds ``corpus.jsonl`` (``{"_id", "title",
"text"}`` a line), ``queries*.jsonl`` (``{"_id", "text"}``) and ``qrels*.tsv``
(``query-id<TAB>corpus-id<TAB>score`` with an optional header line), the qrels
possibly in a ``qrels/`` sub-folder as ``qrels/<split>.tsv``.
"""

from __future__ import annotations

import codecs
import math
import numbers
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import orjson

from ragdb.errors import InvalidInput
from ragdb.storage.codec import loads_exact

if TYPE_CHECKING:
    from ragdb.answers.prompt import ThresholdReport

__all__ = [
    "load_beir",
    "load_questions",
    "best_confidences",
    "calibrate_refusal",
    "calibrate_questions",
    "bundled_off_topic",
    "pseudo_questions",
    "SelfCalibration",
    "self_calibrate",
    "needs_recalibration",
    "ndcg_at_k",
    "recall_at_k",
    "mrr_at_k",
    "evaluate",
    "evaluate_database",
]

Corpus = list[tuple[str, str, str]]
Queries = dict[str, str]
Qrels = dict[str, dict[str, int]]


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    try:
        # Opened apart from the ``with`` below so that only a failed open is reported as "cannot read".
        handle = open(path, "rb")  # noqa: SIM115 - closed by ``with handle:`` below
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror or exc}") from exc
    with handle:
        for lineno, line in enumerate(handle, 1):
            if lineno == 1:
                line = line.removeprefix(codecs.BOM_UTF8)  # a UTF-8 byte order mark, as Windows editors write
            if not line.strip():
                continue
            try:
                obj = loads_exact(line)  # (an integer id past 64 bits stays that id)
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"{path}:{lineno}: invalid JSON: {exc}") from exc
            if not isinstance(obj, dict):
                raise InvalidInput(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def _field(obj: Mapping[str, Any], key: str, path: Path, lineno: int, *, required: bool) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise InvalidInput(f"{path}:{lineno}: missing {key!r}")
        return ""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    raise InvalidInput(f"{path}:{lineno}: {key!r} must be a string, got {type(value).__name__}")


def _load_corpus(path: Path) -> Corpus:
    corpus: Corpus = []
    seen: set[str] = set()
    for lineno, obj in _read_jsonl(path):
        doc_id = _field(obj, "_id", path, lineno, required=True)
        if doc_id in seen:
            raise InvalidInput(f"{path}:{lineno}: duplicate _id {doc_id!r}")
        seen.add(doc_id)
        corpus.append(
            (
                doc_id,
                _field(obj, "title", path, lineno, required=False),
                _field(obj, "text", path, lineno, required=False),
            )
        )
    return corpus


def _load_queries(path: Path) -> Queries:
    queries: Queries = {}
    for lineno, obj in _read_jsonl(path):
        qid = _field(obj, "_id", path, lineno, required=True)
        queries[qid] = _field(obj, "text", path, lineno, required=True)
    return queries


def _load_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    try:
        # Opened apart from the ``with`` below so that only a failed open is reported as "cannot read".
        handle = open(path, encoding="utf-8-sig")  # noqa: SIM115 - closed by ``with handle:`` below (-sig: a BOM is skipped)
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # pragma: no cover - open() does not decode
        raise InvalidInput(f"{path}: not UTF-8 text") from exc
    with handle:
        try:
            for lineno, line in enumerate(handle, 1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                cols = line.split("\t")
                if len(cols) != 3:
                    raise InvalidInput(
                        f"{path}:{lineno}: expected 3 tab-separated columns "
                        f"(query-id, corpus-id, score), got {len(cols)}"
                    )
                qid, did, raw = (c.strip() for c in cols)
                try:
                    score = float(raw)
                except ValueError:
                    if lineno == 1:  # header line: query-id corpus-id score
                        continue
                    raise InvalidInput(f"{path}:{lineno}: score {raw!r} is not a number") from None
                if not math.isfinite(score) or score != int(score):
                    raise InvalidInput(f"{path}:{lineno}: score {raw!r} is not an integer")
                if not qid or not did:
                    raise InvalidInput(f"{path}:{lineno}: empty query-id or corpus-id")
                qrels.setdefault(qid, {})[did] = int(score)
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{path}: not UTF-8 text ({exc.reason})") from exc
    return qrels


def _pick(folder: Path, candidates: list[Path], what: str, split: str | None) -> Path:
    if split is not None:
        wanted = [p for p in candidates if p.stem in (f"{what}-{split}", f"{what}_{split}", split)]
        if len(wanted) == 1:
            return wanted[0]
        if not wanted and len(candidates) == 1 and candidates[0].stem == what:
            return candidates[0]
        names = ", ".join(str(p.relative_to(folder)) for p in candidates) or "none"
        raise InvalidInput(f"{folder}: no single {what} file for split {split!r} (found: {names})")
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise InvalidInput(f"{folder}: no {what} file found")
    names = ", ".join(str(p.relative_to(folder)) for p in candidates)
    raise InvalidInput(f"{folder}: several {what} files ({names}); pass split= to choose one")


def _path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidInput(f"load_beir: a path must be a string or os.PathLike, got {type(path).__name__}")
    return Path(path)


def load_beir(
    folder_or_paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mapping[str, str | os.PathLike[str]],
    *,
    split: str | None = None,
) -> tuple[Corpus, Queries, Qrels]:
    """Load a retrieval collection in the BEIR layout.

    ``folder_or_paths`` is either a folder, searched for ``corpus.jsonl``, one
    ``queries*.jsonl`` and one ``qrels*.tsv`` (or ``qrels/*.tsv``), or the
    three files given explicitly: a ``(corpus, queries, qrels)`` sequence or a
    mapping with those keys.  When a folder holds several query or qrels
    files (``queries-train.jsonl``, ``queries-test.jsonl``...), ``split``
    chooses one (``"train"`` picks ``queries-train.jsonl`` and
    ``qrels-train.tsv`` or ``qrels/train.tsv``).

    Returns ``(corpus, queries, qrels)``: ``corpus`` is a list of
    ``(id, title, text)`` in file order (a missing title is ``""``),
    ``queries`` maps query id to text, and ``qrels`` maps query id to
    ``{doc id: relevance}``.  Ids are always strings.

    Raises :class:`~ragdb.errors.InvalidInput` naming the file (and line) when
    a file is missing, unreadable or malformed.
    """
    if isinstance(folder_or_paths, Mapping):
        try:
            paths = [_path(folder_or_paths[key]) for key in ("corpus", "queries", "qrels")]
        except KeyError as exc:
            raise InvalidInput(f"load_beir: mapping lacks the {exc.args[0]!r} path") from None
    elif isinstance(folder_or_paths, (str, os.PathLike)):
        folder = Path(folder_or_paths)
        if not folder.is_dir():
            raise InvalidInput(f"{folder}: not a folder")
        corpus_path = folder / "corpus.jsonl"
        if not corpus_path.is_file():
            raise InvalidInput(f"{folder}: no corpus.jsonl")
        query_files = sorted(folder.glob("queries*.jsonl"))
        qrels_files = sorted(folder.glob("qrels*.tsv"))
        if (folder / "qrels").is_dir():
            qrels_files += sorted((folder / "qrels").glob("*.tsv"))
        paths = [
            corpus_path,
            _pick(folder, query_files, "queries", split),
            _pick(folder, qrels_files, "qrels", split),
        ]
    else:
        if isinstance(folder_or_paths, bytes) or not hasattr(folder_or_paths, "__iter__"):
            raise InvalidInput(f"load_beir: expected a folder or 3 paths (corpus, queries, qrels), "
                               f"got {type(folder_or_paths).__name__}")
        items = list(folder_or_paths)
        if len(items) != 3:
            raise InvalidInput(
                f"load_beir: expected a folder or 3 paths (corpus, queries, qrels), got {len(items)}"
            )
        paths = [_path(p) for p in items]
    for path in paths:
        if not path.is_file():
            raise InvalidInput(f"{path}: no such file")
    return _load_corpus(paths[0]), _load_queries(paths[1]), _load_qrels(paths[2])


def load_questions(path: str | os.PathLike[str]) -> list[str]:
    """Questions from a file: a ``.jsonl`` file of ``{"text": ...}`` objects (a BEIR
    ``queries.jsonl``; other keys are ignored), else plain text with one question
    a line (blank lines and lines starting with ``#`` skipped)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidInput(f"load_questions: path must be a file path, got {type(path).__name__}", param="path")
    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        return [_field(obj, "text", path, lineno, required=True) for lineno, obj in _read_jsonl(path)]
    try:
        text = path.read_text(encoding="utf-8-sig")  # (a byte order mark, as Windows editors write, is skipped)
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: not UTF-8 text ({exc.reason})") from exc
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):  # (numpy's integers too)
        raise InvalidInput(f"k must be an integer, got {k!r:.40}", param="k")
    if k < 1:
        raise InvalidInput(f"k must be at least 1, got {k}", param="k")
    return int(k)


def _check_questions(questions: Any, what: str) -> list[str]:
    """A list of question strings (a string alone is not a list of its characters)."""
    if questions is None or isinstance(questions, (str, bytes, Mapping)) or not hasattr(questions, "__iter__"):
        raise InvalidInput(f"{what} must be a list of question strings, got {type(questions).__name__}", param=what)
    out = list(questions)
    for i, q in enumerate(out):
        if not isinstance(q, str):
            raise InvalidInput(f"{what}[{i}] must be a string, got {type(q).__name__}", param=what)
    return out


def _top_k(ranked_ids: Iterable[str], k: int) -> list[str]:
    """First ``k`` distinct ids (a repeated id counts once, at its first rank)."""
    _check_k(k)
    out: list[str] = []
    seen: set[str] = set()
    for doc_id in ranked_ids:
        if doc_id in seen:
            continue
        seen.add(doc_id)
        out.append(doc_id)
        if len(out) == k:
            break
    return out


def ndcg_at_k(
    ranked_ids: Sequence[str],
    qrels_for_query: Mapping[str, int],
    k: int,
    *,
    gain: str = "linear",
) -> float:
    """Normalised discounted cumulative gain of the top ``k`` of a ranking.

    ``DCG@k = sum(g(rel_i) / log2(i + 1))`` over ranks ``i = 1..k``, where
    ``rel_i`` is the judged relevance of the document at rank ``i`` (0 when
    unjudged or negative).  The gain ``g`` is ``rel`` for ``gain="linear"``
    (as trec_eval/pytrec_eval and the BEIR tooling compute it) or
    ``2**rel - 1`` for ``gain="exponential"``; the two agree for binary
    judgements.  The ideal DCG is the DCG of the judged documents sorted by
    relevance, cut at ``k``.  Returns a value in ``[0, 1]``, ``0.0`` when the
    query has no relevant document.  A document id repeated in
    ``ranked_ids`` counts once, at its first rank.
    """
    g: Callable[[int], float]
    if gain == "linear":
        g = float
    elif gain == "exponential":
        g = lambda rel: 2.0**rel - 1.0  # noqa: E731
    else:
        raise InvalidInput(f"gain must be 'linear' or 'exponential', got {gain!r}")
    _check_k(k)
    ideal = sorted((r for r in qrels_for_query.values() if r > 0), reverse=True)[:k]
    idcg = sum(g(rel) / math.log2(i + 2) for i, rel in enumerate(ideal))
    if idcg <= 0:
        _top_k((), k)  # still validate k
        return 0.0
    dcg = 0.0
    for i, doc_id in enumerate(_top_k(ranked_ids, k)):
        rel = qrels_for_query.get(doc_id, 0)
        if rel > 0:
            dcg += g(rel) / math.log2(i + 2)
    return dcg / idcg


def recall_at_k(ranked_ids: Sequence[str], qrels_for_query: Mapping[str, int], k: int) -> float:
    """Share of the relevant documents (relevance > 0) found in the top ``k``.

    Returns ``0.0`` when the query has no relevant document.  A repeated id
    counts once.
    """
    top = _top_k(ranked_ids, k)
    relevant = {d for d, r in qrels_for_query.items() if r > 0}
    if not relevant:
        return 0.0
    return sum(1 for d in top if d in relevant) / len(relevant)


def mrr_at_k(ranked_ids: Sequence[str], qrels_for_query: Mapping[str, int], k: int) -> float:
    """Reciprocal rank of the first relevant document in the top ``k``.

    ``1/rank`` (rank starting at 1) of the first document with relevance > 0,
    ``0.0`` when none is in the top ``k``.  A repeated id counts once.
    """
    for i, doc_id in enumerate(_top_k(ranked_ids, k)):
        if qrels_for_query.get(doc_id, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def evaluate(
    run: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    k_values: Sequence[int] = (10, 100),
) -> dict[str, float]:
    """Mean nDCG, Recall and MRR of a run over the judged queries.

    ``run`` maps query id to its ranked document ids (best first); ``qrels``
    maps query id to ``{doc id: relevance}``.  Queries are the keys of
    ``qrels`` that have at least one relevant (> 0) judgement: queries
    without judgements are skipped (they cannot score), and a judged query
    absent from ``run`` counts as an empty ranking (it scores 0).

    Returns ``{"ndcg@k", "recall@k", "mrr@k"}`` for each ``k`` in
    ``k_values`` (the report's headline figures are ``ndcg@10``,
    ``recall@100`` and ``mrr@10``), plus ``"queries"`` (judged queries
    averaged over) and ``"missing"`` (judged queries absent from ``run``).
    Every mean is ``0.0`` when no query is judged.
    """
    if isinstance(k_values, (str, bytes, Mapping)) or not hasattr(k_values, "__iter__"):
        # (an int is not iterable; a string would be read as its characters)
        raise InvalidInput(f"k_values must be a list of integers, got {type(k_values).__name__}", param="k_values")
    ks = sorted({_check_k(k) for k in k_values})
    if not ks:
        raise InvalidInput("k_values is empty")
    sums: dict[str, float] = {}
    for k in ks:
        for name in ("ndcg", "recall", "mrr"):
            sums[f"{name}@{k}"] = 0.0
    judged = 0
    missing = 0
    for qid, judgements in qrels.items():
        if not any(r > 0 for r in judgements.values()):
            continue
        judged += 1
        ranked = run.get(qid)
        if ranked is None:
            missing += 1
            continue
        ranked = _top_k(ranked, ks[-1])
        for k in ks:
            sums[f"ndcg@{k}"] += ndcg_at_k(ranked, judgements, k)
            sums[f"recall@{k}"] += recall_at_k(ranked, judgements, k)
            sums[f"mrr@{k}"] += mrr_at_k(ranked, judgements, k)
    result: dict[str, float] = {
        key: (total / judged if judged else 0.0) for key, total in sums.items()
    }
    result["queries"] = judged
    result["missing"] = missing
    return result


def evaluate_database(
    db: Any,
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    k: int = 100,
    scorer: str | None = None,
    *,
    options: Any = None,
    **search_kwargs: Any,
) -> dict[str, float]:
    """Search ``db`` with every judged query and :func:`evaluate` the run.

    Each query text is passed to ``db.search(text, k=k, scorer=scorer,
    options=options, **search_kwargs)`` (``scorer`` default: the options',
    else bm25); every hit is mapped to a collection document id
    through ``hit.source`` (so the documents must have been added with
    ``source=<corpus id>``), each followed by the sources of the copies it
    stands for (``hit.duplicates``: one hit per passage, so a document that
    repeats another's text comes back as its copy), keeping the first
    occurrence of each source, since several chunks of one document may be
    hit.  Only queries that
    have a relevant judgement are searched (the others would be skipped by
    :func:`evaluate`); a judged query missing from ``queries`` counts as an
    empty ranking.  Metrics are computed at 10 and at ``k``.
    """
    _check_k(k)
    if scorer is not None:
        search_kwargs["scorer"] = scorer
    if options is not None:
        search_kwargs["options"] = options
    run: dict[str, list[str]] = {}
    for qid, judgements in qrels.items():
        if qid not in queries or not any(r > 0 for r in judgements.values()):
            continue
        hits = db.search(queries[qid], k=k, **search_kwargs)
        run[qid] = _top_k(_ranked_sources(hits), k)
    return evaluate(run, qrels, k_values=(10, k))


def _ranked_sources(hits: Iterable[Any]) -> Iterator[str]:
    """Each hit's source, then the sources of the copies it stands for (``Hit.duplicates``, best
    first): a search keeps one hit per passage, and a judged document whose text is a copy of
    another's was found all the same (two identical relevant documents are both retrieved)."""
    for hit in hits:
        yield hit.source
        for copy in getattr(hit, "duplicates", ()):
            yield copy.source


# --------------------------------------------------------------------------
# Refusal
# --------------------------------------------------------------------------


def best_confidences(db: Any, questions: Iterable[str], k: int = 10, **search_kwargs: Any) -> list[float]:
    """The best :attr:`~ragdb.types.Hit.confidence` of each question's top ``k`` hits
    (``db.search(text, k=k, **search_kwargs)``), 0.0 for a question with no hit:
    the number a prompt's confidence floor is compared with."""
    from ragdb.index.confidence import best_confidence

    _check_k(k)
    out = []
    for text in _check_questions(questions, "questions"):
        best = best_confidence(db.search(text, k=k, **search_kwargs)) if text.strip() else None
        out.append(best if best is not None else 0.0)
    return out


def calibrate_refusal(
    db: Any,
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    off_topic: Sequence[str] = (),
    k: int = 10,
    **search_kwargs: Any,
) -> ThresholdReport:
    """Choose a refusal floor (``min_confidence``) for ``db`` with
    :func:`ragdb.answers.prompt.choose_threshold`.

    Each judged query (one with a relevant judgement, as :func:`evaluate`
    counts them) should be answered, each ``off_topic`` question (one the
    knowledge base cannot answer) refused; a question's score is its
    :func:`best_confidences` value. The returned report's ``threshold`` is the
    floor with the best F1 of answer decisions; ``false_negatives`` are the
    judged queries it refuses, ``true_negatives`` the off-topic questions it
    refuses. Store it with ``db.set_min_confidence(report.threshold)``
    (``ragdb eval --calibrate`` does). Without ``off_topic`` the floor is the
    lowest best confidence of the judged queries: it refuses none of them.
    """
    from ragdb.answers.prompt import choose_threshold

    off_topic = _check_questions(off_topic, "off_topic")
    judged = [queries[qid] for qid, judgements in qrels.items()
              if qid in queries and any(r > 0 for r in judgements.values())]
    if not judged:
        raise InvalidInput("calibrate_refusal: no judged query (a query with a relevant judgement) to answer")
    positives = best_confidences(db, judged, k, **search_kwargs)
    negatives = best_confidences(db, list(off_topic), k, **search_kwargs)
    return choose_threshold([(c, True) for c in positives] + [(c, False) for c in negatives])


def calibrate_questions(db: Any, answerable: Sequence[str], off_topic: Sequence[str], k: int = 10,
                        **search_kwargs: Any) -> ThresholdReport:
    """Choose a refusal floor for ``db`` from questions alone, no judgements: each of
    ``answerable`` should be answered, each of ``off_topic`` refused
    (:func:`ragdb.answers.prompt.choose_threshold` on their :func:`best_confidences`;
    ``ragdb calibrate --answerable FILE --off-topic FILE``)."""
    from ragdb.answers.prompt import choose_threshold

    answerable = [q for q in _check_questions(answerable, "answerable") if q.strip()]
    off_topic = _check_questions(off_topic, "off_topic")
    if not answerable:
        raise InvalidInput("calibrate: no answerable question (give some with --answerable)")
    positives = best_confidences(db, answerable, k, **search_kwargs)
    negatives = best_confidences(db, [q for q in off_topic if q.strip()], k, **search_kwargs)
    return choose_threshold([(c, True) for c in positives] + [(c, False) for c in negatives])


# --------------------------------------------------------------------------
# Self-calibration: a database's own text against questions it cannot answer
# --------------------------------------------------------------------------
#
# A fixed floor cannot serve every knowledge base: confidences move with the size of the
# collection (a term it lacks weighs the most, and a small one lacks most words) and with
# its subject (a general-knowledge question shares more words with an encyclopedia than
# with a compiler's manual). So a database measures itself. It scores two sets of
# questions against its own chunks:
#
# * off-topic: the bundled general-knowledge questions (offtopic-en.txt, offtopic-zh.txt in
#   this package: 200 each, spread over some twenty subjects; every HELD_OUT_EVERY-th is
#   held out of calibration, for measuring it), in the languages the base is written in;
# * on-topic: pseudo-questions, a window of a sentence of chunks sampled evenly from the
#   base (PSEUDO_WORDS words, or twice as many CJK characters).
#
# A pseudo-question is a verbatim piece of a chunk, so it scores higher than a real
# question, which words the same need differently: measured on SciFact (train claims) and
# CMRC 2018 (trial questions), the 5th percentile of real questions' best confidence was
# PSEUDO_DISCOUNT times that of pseudo-questions, or more (docs/grounded-answers.md). The
# floor is then the lower of two bounds: half again above the 95th percentile of the
# off-topic questions of the base's languages (OFF_TOPIC_FACTOR), and the discounted 5th
# percentile of the pseudo-questions (answer about 95% of real ones). Where the two cross,
# answering wins: refusing a question the knowledge base answers costs more than passing
# an off-topic one to a model told to answer only from its sources.
#
# A small base (a few documents) lacks most words of any off-topic question, which then
# scores 0: its floor is low, and a question sharing any real word with it is answered.

#: The database setting holding its :class:`SelfCalibration`.
SELF_CALIBRATION = "min_confidence_self"
#: The bundled off-topic questions, per language (files of this package).
OFF_TOPIC_FILES = {"en": "offtopic-en.txt", "zh": "offtopic-zh.txt"}
#: Every this-many-th bundled question (the 4th, 8th, ...) is held out of calibration.
HELD_OUT_EVERY = 4
#: Pseudo-questions made from the base's chunks.
PSEUDO_QUESTIONS = 120
#: Words of a pseudo-question (CJK characters: twice as many).
PSEUDO_WORDS = 8
#: The share of the off-topic questions a floor should refuse, and of the pseudo-questions
#: (discounted) it should answer.
OFF_TOPIC_REFUSED = 0.95
ON_TOPIC_ANSWERED = 0.95
#: Real questions' 5th percentile over pseudo-questions' (measured; see above).
PSEUDO_DISCOUNT = 0.45
#: The floor is this many times the off-topic questions' 95th percentile (plus MARGIN): 150
#: questions show the bulk of off-topic scores, not their tail (on the 12 CMake and npm notes
#: of tests/answers/test_refusal.py, "What is the capital of Mongolia?" scores 0.154 against a
#: 95th percentile of 0.114 for the bundled questions, and every real question above 0.5).
OFF_TOPIC_FACTOR = 1.5
#: A floor this much above the off-topic bound refuses the questions at it.
MARGIN = 0.005
#: A base whose chunk count moved by more than this share since its calibration is calibrated again.
STALE_FRACTION = 0.2
#: The hits per question (as ``ragdb prompt``).
PROMPT_K = 8

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+")
_SENTENCE = re.compile(r"(?<=[.!?;:\u3002\uff01\uff1f\uff1b])\s*|\n+")


def bundled_off_topic(language: str, part: str = "calibration") -> list[str]:
    """The bundled off-topic questions of ``language`` (``"en"``, ``"zh"``): ``part``
    ``"calibration"`` (what :func:`self_calibrate` uses), ``"held_out"`` (every
    :data:`HELD_OUT_EVERY`-th, for measuring) or ``"all"``."""
    if language not in OFF_TOPIC_FILES:
        raise InvalidInput(f"off-topic questions: language {language!r} is not bundled; "
                           f"choose one of {', '.join(OFF_TOPIC_FILES)}")
    if part not in ("calibration", "held_out", "all"):
        raise InvalidInput(f"off-topic questions: part must be 'calibration', 'held_out' or 'all', got {part!r}")
    questions = load_questions(Path(__file__).with_name(OFF_TOPIC_FILES[language]))
    if part == "all":
        return questions
    held = part == "held_out"
    return [q for i, q in enumerate(questions, 1) if (i % HELD_OUT_EVERY == 0) == held]


def _is_cjk(token: str) -> bool:
    return len(token) == 1 and re.match(f"[{_CJK}]", token) is not None


def pseudo_questions(texts: Sequence[str], seed: int = 0) -> list[str]:
    """One question-like piece of each text: a window of :data:`PSEUDO_WORDS` words (twice as
    many CJK characters) of one of its sentences, chosen with ``random.Random(seed)``; texts
    without a sentence of four words give none."""
    rng = random.Random(seed)
    out = []
    for text in texts:
        sentences = [toks for part in _SENTENCE.split(text) if len(toks := _TOKEN.findall(part)) >= 4]
        if not sentences:
            continue
        tokens = rng.choice(sentences)
        cjk = sum(map(_is_cjk, tokens)) * 2 > len(tokens)
        n = PSEUDO_WORDS * (2 if cjk else 1)
        i = rng.randrange(max(1, len(tokens) - n + 1))
        out.append(("" if cjk else " ").join(tokens[i:i + n]))
    return out


def _languages(texts: Sequence[str]) -> tuple[str, ...]:
    """The bundled languages a base's sampled texts are written in (one in ten texts at least)."""
    if not texts:
        return tuple(OFF_TOPIC_FILES)
    zh = sum(1 for t in texts if re.search(f"[{_CJK}]", t)) * 10 >= len(texts)
    en = sum(1 for t in texts if len(re.findall(r"[A-Za-z]{2,}", t)) >= 3) * 10 >= len(texts)
    return tuple(lang for lang, ok in (("en", en), ("zh", zh)) if ok) or tuple(OFF_TOPIC_FILES)


def _quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile: the smallest value with at least ``q`` of them at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class SelfCalibration:
    """What :func:`self_calibrate` measured on a base of ``chunks`` chunks: the ``floor``
    (a ``min_confidence``), the ``languages`` of the off-topic questions asked, their 95th
    percentile confidence and the share the floor refuses, and the pseudo-questions' 5th
    percentile and the share it answers. Stored in the database's settings
    (:meth:`to_setting`) and made again when the base grew or shrank by
    :data:`STALE_FRACTION`."""

    floor: float
    chunks: int
    languages: tuple[str, ...]
    off_topic_p95: float
    off_topic_refused: float
    pseudo_p5: float
    pseudo_answered: float

    def to_setting(self) -> dict[str, Any]:
        return {"floor": self.floor, "chunks": self.chunks, "languages": list(self.languages),
                "off_topic_p95": self.off_topic_p95, "off_topic_refused": self.off_topic_refused,
                "pseudo_p5": self.pseudo_p5, "pseudo_answered": self.pseudo_answered}

    @staticmethod
    def from_setting(value: Any) -> SelfCalibration | None:
        """The stored calibration, or None when ``value`` is not one (never stored, or damaged:
        then it is made again)."""
        if not isinstance(value, dict):
            return None
        try:
            cal = SelfCalibration(float(value["floor"]), int(value["chunks"]), tuple(map(str, value["languages"])),
                                  float(value["off_topic_p95"]), float(value["off_topic_refused"]),
                                  float(value["pseudo_p5"]), float(value["pseudo_answered"]))
        except (KeyError, TypeError, ValueError):
            return None
        return cal if 0.0 <= cal.floor <= 1.0 and cal.chunks >= 0 else None


def needs_recalibration(calibration: SelfCalibration | None, chunks: int) -> bool:
    """Whether a base of ``chunks`` chunks should calibrate itself again."""
    if calibration is None:
        return True
    return abs(chunks - calibration.chunks) > STALE_FRACTION * calibration.chunks


def self_calibrate(best: Callable[[str], float], texts: Sequence[str], chunks: int) -> SelfCalibration:
    """The refusal floor of a base of ``chunks`` chunks, from ``texts`` (chunks sampled
    evenly from it) and ``best`` (a question -> the best confidence of its hits in the base,
    0 without hits); see the comment above this function for the rule."""
    languages = _languages(texts)
    off = {lang: [best(q) for q in bundled_off_topic(lang)] for lang in languages}
    off_p95 = max(_quantile(v, OFF_TOPIC_REFUSED) for v in off.values())
    pseudo = [best(q) for q in pseudo_questions(texts)]
    pseudo_p5 = _quantile(pseudo, 1.0 - ON_TOPIC_ANSWERED) if pseudo else 0.0
    floor = OFF_TOPIC_FACTOR * off_p95 + MARGIN
    if pseudo:
        floor = min(floor, PSEUDO_DISCOUNT * pseudo_p5)
    floor = round(min(1.0, max(0.0, floor)), 4)
    every_off = [c for v in off.values() for c in v]
    return SelfCalibration(
        floor=floor, chunks=chunks, languages=languages, off_topic_p95=off_p95,
        off_topic_refused=sum(1 for c in every_off if c < floor) / len(every_off),
        pseudo_p5=pseudo_p5,
        pseudo_answered=sum(1 for c in pseudo if c >= floor) / len(pseudo) if pseudo else 0.0)
