"""Quick timing script for highlighted searches (issue 28); not a test, not part of run.py.

    PYTHONPATH=. .venv/bin/python benchmarks/highlights.py [--chunks 5000] [--queries 200] [--rounds 3]

A generated corpus (``--chunks`` one-paragraph documents of ~120 words drawn from a
Zipf-distributed vocabulary of 5,000 words, some of them stemmed forms of others) is
searched with ``--queries`` queries (two or three words; every fourth a phrase), k=10,
each query without and then with highlights; a second pass repeats the queries (as a
user paging or refining does). Prints the best of ``--rounds`` CPU seconds of each and
of the highlight step alone, that step's share of a highlighted search, and a digest
of every hit's highlights and snippet (equal digests: the same highlights).

Only API that existed before the change is used, so running it with an older
checkout on PYTHONPATH gives the "before" numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import ragdb
from ragdb.engine.search import Searcher

SUFFIXES = ("", "", "", "s", "ing", "ed", "er")


def corpus(n_chunks: int, seed: int = 7) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnoprstuvw"
    stems = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(1200)})
    vocab = [stem + rng.choice(SUFFIXES) for stem in stems for _ in range(4)][:5000]
    weights = [1 / (i + 1) ** 0.9 for i in range(len(vocab))]
    texts = []
    for _ in range(n_chunks):
        words = rng.choices(vocab, weights, k=rng.randint(90, 150))
        sentences, i = [], 0
        while i < len(words):
            n = rng.randint(8, 18)
            sentences.append(" ".join(words[i:i + n]).capitalize() + ".")
            i += n
        texts.append(" ".join(sentences))
    return texts, vocab


def queries(texts: list[str], n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = rng.choice(texts).rstrip(".").replace(".", "").lower().split()
        j = rng.randrange(0, max(1, len(words) - 3))
        span = words[j:j + rng.randint(2, 3)]
        out.append(f'"{" ".join(span)}"' if i % 4 == 0 else " ".join(span))
    return out


HIGHLIGHTING = [0.0]  # CPU seconds spent in the search's highlight step


def _timed_highlight() -> None:
    """Time the highlight step of a search: the one private name this script reads (it
    exists before and after the change)."""
    real = Searcher._highlight

    def timed(self: Searcher, *args: Any) -> None:
        t0 = time.process_time()
        try:
            real(self, *args)
        finally:
            HIGHLIGHTING[0] += time.process_time() - t0

    Searcher._highlight = timed  # type: ignore[method-assign]


def run_pass(db: ragdb.Database, qs: list[str]) -> tuple[float, float, float, str]:
    """(CPU seconds of the plain searches, of the highlighted ones, of their highlight step,
    digest of the highlights): each query searched plain and then highlighted, one after
    the other, so that a change of the machine's load falls on both alike."""
    digest = hashlib.sha256()
    plain = highlighted = 0.0
    HIGHLIGHTING[0] = 0.0
    for q in qs:
        t0 = time.process_time()
        db.search(q, k=10)
        t1 = time.process_time()
        hits = db.search(q, k=10, highlight=True)
        t2 = time.process_time()
        plain += t1 - t0
        highlighted += t2 - t1
        for h in hits:
            digest.update(repr((h.chunk_id, h.highlights, h.snippet)).encode())
    return plain, highlighted, HIGHLIGHTING[0], digest.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    _timed_highlight()
    texts, _vocab = corpus(args.chunks)
    qs = queries(texts, args.queries)
    with tempfile.TemporaryDirectory() as tmp:
        best: dict[str, float] = {}
        digests = set()
        for _ in range(args.rounds):
            db = ragdb.open(str(Path(tmp) / f"h{_}.db"))
            db.add_many({"text": t, "source": f"doc{i}"} for i, t in enumerate(texts))
            db.search("warm up", k=10)
            for name in ("first pass", "repeated"):
                plain, highlighted, step, digest = run_pass(db, qs)
                digests.add(digest)
                for part, secs in (("plain", plain), ("highlighted", highlighted), ("highlight step", step)):
                    key = f"{name}: {part}"
                    best[key] = min(best.get(key, secs), secs)
            db.close()
    n = len(qs)
    for name, secs in best.items():
        print(f"{name:32} {secs:7.3f} s CPU  {secs / n * 1000:7.2f} ms/query")
    for name in ("first pass", "repeated"):
        share = best[f"{name}: highlight step"] / best[f"{name}: highlighted"]
        print(f"highlights' share of a highlighted search ({name}): {share:.0%}")
    print("digest of highlights and snippets:", ", ".join(sorted(digests)))


if __name__ == "__main__":
    main()
