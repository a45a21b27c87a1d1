"""What the tests of sealed bulk loads share (tests/engine/test_bulk_seal.py, and PostgreSQL's in
tests/storage/test_postgres.py): records of English and Chinese text, and the hits of a few
queries with their scores."""

from __future__ import annotations

EN = ["retrieval of deleted documents", "ranking passages by BM25", "incremental index updates",
      "the inverted index holds postings"]
ZH = ["检索增强生成的知识库", "倒排索引与文档频率", "增量更新后的结果"]
QUERIES = ["retrieval documents index", "postings ranking", "检索 索引", "word7 word23 第9段"]


def seal_records(n: int) -> list[dict]:
    """``n`` add_many records, sources s0, s1, ..."""
    return [{"text": f"{EN[i % 4]} {ZH[i % 3]} word{i} 第{i}段 {'extra ' * (i % 5)}", "source": f"s{i}"}
            for i in range(n)]


def seal_hits(db) -> list:
    """(source, score) of the first 50 hits of each of :data:`QUERIES`."""
    return [[(h.source, round(h.score, 9)) for h in db.search(q, k=50)] for q in QUERIES]
