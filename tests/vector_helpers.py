"""What the vector and hybrid tests share (tests/index/test_vectors.py, tests/index/hybrid/):
a small corpus, searches by scorer, the cosine of two texts."""

from __future__ import annotations

import numpy as np

DOCS = [
    ("a.md", "The cat sat on the mat near the door.", {"lang": "en", "team": "x"}),
    ("b.md", "Dogs chase cats around the park every morning.", {"lang": "en", "team": "y"}),
    ("c.md", "Quantum physics describes black holes and particles.", {"lang": "en", "team": "x"}),
    ("d.md", "Die Katze schläft auf der Matte.", {"lang": "de", "team": "y"}),
    ("e.md", "A mat is a flat piece of fabric on the floor.", {"lang": "en", "team": "y"}),
]


def vector_search(db, query, k=10, embedder=None, **kw):
    """``Database.search`` with the vector scorer (the embedder positional, as the tests read best)."""
    return db.search(query, k, scorer="vector", embedder=embedder, **kw)


def hybrid_search(db, query, k=10, embedder=None, **kw):
    return db.search(query, k, scorer="hybrid", embedder=embedder, **kw)


def fill(db, docs=DOCS):
    for source, text, meta in docs:
        db.add(text, source=source, metadata=meta, chunker="none")


def cosine(emb, a, b):
    return float(np.dot(emb.embed([a])[0].astype(np.float64), emb.embed([b])[0].astype(np.float64)))
