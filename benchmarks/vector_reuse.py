"""Quick timing script for vector reuse on replace (issue 14); not a test, not part of run.py.

    PYTHONPATH=. .venv/bin/python benchmarks/vector_reuse.py [--rounds 5]

1. Embedder work: a database of 2,000 chunks (200 documents of 10 paragraphs,
   ~500 characters each, default chunker: one chunk a paragraph) embedded with a
   counting hash embedder; then 100 documents are replaced, each with one line
   of one paragraph edited. Prints the embedder calls and texts the replace cost.
2. The add path: seconds per chunk to add 2,000 chunks (a) into a database
   without vectors (no hashing happens) and (b) into one holding vectors, with
   no embedder (each chunk hashed and looked up, nothing found or copied), and
   the cost of the hash itself on these chunk texts. Best of ``--rounds``.

Only API that existed before the change is used, so running it with an older
checkout on PYTHONPATH gives the "before" numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

import ragdb
from ragdb.models.embeddings import HashEmbedder

N_DOCS, N_PARAS, N_EDITED = 200, 10, 100


class CountingEmbedder:
    def __init__(self, dimensions: int = 64) -> None:
        self.inner = HashEmbedder(dimensions)
        self.name, self.dimensions = self.inner.name, dimensions
        self.calls = self.texts = 0

    def embed(self, texts):
        self.calls += 1
        self.texts += len(texts)
        return self.inner.embed(texts)

    def embed_query(self, text):
        return self.inner.embed_query(text)


def paragraphs(doc: int, tag: str = "") -> list[str]:
    return [f"Document {doc} paragraph {p}{tag} " + " ".join(f"w{doc}x{p}x{j}" for j in range(50))
            for p in range(N_PARAS)]


def records(tag: str = "", start: int = 0, n: int = N_DOCS) -> list[dict[str, str]]:
    return [{"text": "\n\n".join(paragraphs(d, tag)), "source": f"doc{d}.md"} for d in range(start, start + n)]


def edited(doc: int) -> dict[str, str]:
    paras = paragraphs(doc)
    paras[doc % N_PARAS] = paras[doc % N_PARAS].replace(" ", " edited ", 1)  # one line changed
    return {"text": "\n\n".join(paras), "source": f"doc{doc}.md"}


def embedder_work(tmp: Path) -> None:
    emb = CountingEmbedder()
    with ragdb.open(tmp / "work.db", embedder=emb) as db:
        db.add_many(records())
        chunks = db.stats().stored_chunks
        print(f"build: {chunks} chunks, {emb.calls} embedder calls, {emb.texts} texts")
        calls, texts = emb.calls, emb.texts
        t = time.perf_counter()
        db.add_many([edited(d) for d in range(N_EDITED)])
        dt = time.perf_counter() - t
        print(f"replace {N_EDITED} documents (one line each): {emb.calls - calls} embedder calls, "
              f"{emb.texts - texts} texts embedded, {dt:.3f} s; vectors {db.vector_info().vectors}, "
              f"pending {db.vector_info().pending}")


def add_seconds(path: Path, recs: list[dict[str, str]]) -> float:
    with ragdb.open(path) as db:
        t = time.perf_counter()
        db.add_many(recs)
        return time.perf_counter() - t


def add_path(tmp: Path, rounds: int) -> None:
    recs = records("-new", start=N_DOCS, n=N_DOCS)  # 2,000 chunks no database holds yet
    n = N_DOCS * N_PARAS
    plain, vec = [], []
    for r in range(rounds):
        for kind, times in (("plain", plain), ("vec", vec)):
            path = tmp / f"{kind}{r}.db"
            with ragdb.open(path) as db:
                db.add_many(records())
                if kind == "vec":
                    db.embed(HashEmbedder(64))
            times.append(add_seconds(path, recs))
    texts = [p for rec in recs for p in rec["text"].split("\n\n")]
    t = time.perf_counter()
    for _ in range(5):
        hashes = [hashlib.sha256(text.encode("utf-8")).digest() for text in texts]
    hash_us = (time.perf_counter() - t) / (5 * len(texts)) * 1e6
    print(f"add {n} new chunks, best of {rounds}: no vectors {min(plain) / n * 1e6:.1f} us/chunk "
          f"(median {sorted(plain)[rounds // 2] / n * 1e6:.1f}); with vectors stored, no embedder "
          f"{min(vec) / n * 1e6:.1f} us/chunk (median {sorted(vec)[rounds // 2] / n * 1e6:.1f}); "
          f"SHA-256 of a chunk text ({sum(map(len, texts)) // len(texts)} chars) {hash_us:.2f} us")
    with ragdb.open(tmp / "vec0.db") as db:
        store = db._store  # the benchmark's instrument, not API
        if hasattr(store, "vectors_by_hash"):  # after the change: the lookup each new chunk costs
            best = float("inf")
            for _ in range(rounds):
                with store.read():
                    t = time.perf_counter()
                    store.vectors_by_hash(hashes)
                    best = min(best, time.perf_counter() - t)
            print(f"looking {len(hashes)} new texts up among {store.vector_count()} vectors: "
                  f"{best / len(hashes) * 1e6:.2f} us/chunk")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"ragdb from {Path(ragdb.__file__).parent}")
    with tempfile.TemporaryDirectory() as tmp:
        embedder_work(Path(tmp))
        add_path(Path(tmp), args.rounds)


if __name__ == "__main__":
    main()
