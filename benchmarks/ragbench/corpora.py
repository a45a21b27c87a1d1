"""The benchmark corpora: reading BEIR data, replicating SciFact, choosing the documents to delete.

A corpus is prepared once in the parent as two files under the run's work
folder (``docs.jsonl``: one ``[doc_id, text]`` pair a line, each document one
chunk ``title + "\\n\\n" + text``; ``queries.jsonl``: the judged queries), which
every worker streams.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from .common import UPDATE_OPS, read_pairs

if TYPE_CHECKING:
    from .harness import Context

# A benchmark corpus: folder under the data directory, BEIR split, language.
CORPORA = {
    "scifact": {"folder": "scifact", "split": "train", "lang": "en", "title": "SciFact (train queries)"},
    "cmrc": {"folder": "cmrc2018-trial", "split": None, "lang": "zh", "title": "CMRC 2018 trial"},
}


@dataclass
class Corpus:
    key: str
    title: str
    lang: str
    docs_path: Path
    queries_path: Path
    n_docs: int
    n_queries: int
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    victims: list[tuple[str, int]] = field(default_factory=list)


def prepare_corpus(ctx: Context, key: str, max_queries: int | None) -> Corpus:
    spec = CORPORA[key]
    corpus, queries, qrels = ctx.evaluation.load_beir(ctx.args.data / spec["folder"], split=spec["split"])
    judged = [(qid, text) for qid, text in queries.items() if any(r > 0 for r in qrels.get(qid, {}).values())]
    if max_queries:
        judged = judged[:max_queries]
    folder = ctx.workdir / "data" / key
    folder.mkdir(parents=True, exist_ok=True)
    docs_path, queries_path = folder / "docs.jsonl", folder / "queries.jsonl"
    with open(docs_path, "wb") as fh:
        for doc_id, title, text in corpus:  # one chunk a document: title + blank line + text
            fh.write(orjson.dumps([doc_id, f"{title}\n\n{text}" if title else text]) + b"\n")
    with open(queries_path, "wb") as fh:
        for pair in judged:
            fh.write(orjson.dumps(list(pair)) + b"\n")
    kept = {qid for qid, _ in judged}
    c = Corpus(key, spec["title"], spec["lang"], docs_path, queries_path, len(corpus), len(judged),
               {q: r for q, r in qrels.items() if q in kept})
    c.victims = pick_victims(docs_path, len(corpus), ctx.args.rounds + 1)  # + the slice of the split pass
    return c


def pick_victims(docs_path: Path, n: int, rounds: int = 1) -> list[tuple[str, int]]:
    """``rounds`` x UPDATE_OPS distinct existing documents spread over the corpus, to delete
    (round r deletes the r-th slice of UPDATE_OPS)."""
    total = min(n, UPDATE_OPS * rounds)
    step = max(1, n // total)
    wanted = {min(n - 1, step // 2 + i * step) for i in range(total)}
    last = max(wanted)
    out = []
    with open(docs_path, "rb") as fh:  # only the wanted lines are parsed (a 1M corpus is 1.5 GB)
        for i, line in enumerate(fh):
            if i in wanted:
                out.append((orjson.loads(line)[0], i))
            if i >= last:
                break
    return out


def replicate_corpus(ctx: Context, base: Corpus, n: int, key: str, max_queries: int) -> Corpus:
    """``base`` repeated until ``n`` documents; replica r > 0 gets ids ``<id>@r<r>``."""
    folder = ctx.workdir / "data" / key
    folder.mkdir(parents=True, exist_ok=True)
    docs_path = folder / "docs.jsonl"
    base_docs = read_pairs(base.docs_path)
    written = 0
    with open(docs_path, "wb") as fh:
        r = 0
        while written < n:
            for doc_id, text in base_docs:
                if written >= n:
                    break
                fh.write(orjson.dumps([doc_id if r == 0 else f"{doc_id}@r{r}", text]) + b"\n")
                written += 1
            r += 1
    queries_path = folder / "queries.jsonl"
    with open(base.queries_path, "rb") as src, open(queries_path, "wb") as dst:
        for i, line in enumerate(src):
            if i >= max_queries:
                break
            dst.write(line)
    c = Corpus(key, f"SciFact x{n / len(base_docs):.1f}", base.lang, docs_path, queries_path, n,
               min(max_queries, base.n_queries))
    c.victims = pick_victims(docs_path, n, ctx.args.rounds)
    return c


def drop_indexes(ctx: Context, corpus: Corpus) -> None:
    shutil.rmtree(ctx.workdir / "index" / corpus.key, ignore_errors=True)
