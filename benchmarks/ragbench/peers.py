"""The benchmarked systems: ragdb (BM25 and TF-IDF on one index) and its peers
SQLite FTS5, tantivy, bm25s and rank_bm25 (BM25Okapi).

Each adapter is a class registered with ``@system("name")``:
``build(docs, folder, lang) -> build info``; ``open(folder, lang) -> handle``;
``search(handle, text, k) -> [doc ids]``; ``add(handle, doc_id, ordinal, text)``;
``delete(handle, doc_id, ordinal)``; ``close(handle)``; ``size(folder) -> bytes``.
``persistent=False`` means build and query happen in one process;
``incremental=False`` means updates need a rebuild (no add/delete);
``index_of`` lets a row reuse another system's index; ``needs_list`` makes the
build get the whole corpus as a list instead of a stream.

Which sections measure a system is the lists at the end of this module
(:data:`QUALITY_SYSTEMS`, :data:`PEERS`, :data:`SCALE_SYSTEMS`,
:data:`UPDATE_SCALE_SYSTEMS`); :data:`PEER_PACKAGES` are the distributions
whose versions the report lists. Imports of the systems' libraries stay inside
the methods, so a worker loads only its own system's.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

import orjson

from .common import path_size
from .harness import system

# CJK tokens for the peers on CMRC: character unigrams + bigrams of CJK runs,
# lowercased words otherwise (the same idea as ragdb's default analyzer).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_CJK_TOKEN_RE = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_CHAR_RE = re.compile(rf"[{_CJK}]")


_CJK_RUN_RE = re.compile(rf"[{_CJK}]+")
# bm25s on mixed text: its default words of two or more characters, and single CJK characters
_MIXED_TOKEN_PATTERN = rf"(?u)\b\w\w+\b|[{_CJK}]"


def expand_cjk(text: str) -> str:
    """``text`` with each CJK run replaced by its character unigrams and bigrams, space
    separated (text without CJK comes back as it is): how the peers index the mixed
    English + Chinese corpus of the scale section with one word tokenizer (``lang="mixed"``),
    as ragdb's analyzer treats CJK runs internally."""
    if not _CJK_RUN_RE.search(text):
        return text

    def grams(m: re.Match[str]) -> str:
        run = m.group()
        return " " + " ".join([*run, *(run[i : i + 2] for i in range(len(run) - 1))]) + " "

    return _CJK_RUN_RE.sub(grams, text)


def cjk_tokens(text: str) -> list[str]:
    out: list[str] = []
    for m in _CJK_TOKEN_RE.finditer(text.lower()):
        run = m.group()
        if _CJK_CHAR_RE.match(run):
            out.extend(run)
            out.extend(run[i : i + 2] for i in range(len(run) - 1))
        else:
            out.append(run)
    return out


class Adapter:
    """Defaults of an adapter (the protocol is in the module docstring)."""

    name = "?"
    label = "?"
    persistent = True
    incremental = True
    index_of: str | None = None  # reuse another system's index (query only)
    needs_list = False  # build needs the whole corpus in memory

    @staticmethod
    def size(folder: Path) -> int:
        return path_size(folder)


@system("ragdb")
class RagdbAdapter(Adapter):
    label = "ragdb (bm25)"
    scorer = "bm25"

    @staticmethod
    def _path(folder: Path) -> Path:
        return folder / "ragdb.db"

    @classmethod
    def build(cls, docs, folder: Path, lang: str) -> dict:
        import ragdb

        with ragdb.open(str(cls._path(folder))) as db:
            db.add_many(({"text": text, "source": doc_id} for doc_id, text in docs), chunker="none")
        return {}

    @classmethod
    def open(cls, folder: Path, lang: str):
        import ragdb

        return ragdb.open(str(cls._path(folder)))

    @classmethod
    def search(cls, db, text: str, k: int) -> list[str]:
        seen: dict[str, None] = {}
        for hit in db.search(text, k=k, scorer=cls.scorer):
            seen.setdefault(hit.source, None)
        return list(seen)

    @staticmethod
    def add(db, doc_id: str, ordinal: int, text: str) -> None:
        db.add(text, source=doc_id, chunker="none")

    @staticmethod
    def delete(db, doc_id: str, ordinal: int) -> None:
        db.delete(source=doc_id)

    @staticmethod
    def close(db) -> None:
        db.close()

    @classmethod
    def size(cls, folder: Path) -> int:
        p = cls._path(folder)
        return sum(path_size(x) for x in (p, Path(f"{p}-wal")) if x.exists())


@system("ragdb-tfidf")
class RagdbTfidfAdapter(RagdbAdapter):
    label = "ragdb (tfidf)"
    scorer = "tfidf"
    index_of = "ragdb"


@system("ragdb-numpy")
class RagdbNumpyAdapter(RagdbAdapter):
    """ragdb's BM25 on ragdb's index, scored by the numpy fallback kernel (what ragdb does
    without its compiled kernel, or with RAGDB_KERNEL=numpy): the same hits, slower."""

    label = "ragdb (bm25, numpy kernel)"
    index_of = "ragdb"

    @classmethod
    def open(cls, folder: Path, lang: str):
        try:
            from ragdb.index import kernel
        except ImportError:  # a ragdb from before the compiled kernel: numpy is all it has
            pass
        else:
            kernel.use("numpy")
        return super().open(folder, lang)


@system("fts5")
class Fts5Adapter(Adapter):
    label = "SQLite FTS5"

    @staticmethod
    def _connect(folder: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(str(folder / "fts5.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @classmethod
    def build(cls, docs, folder: Path, lang: str) -> dict:
        tokenizer = "trigram" if lang == "zh" else "porter unicode61"
        conn = cls._connect(folder)
        conn.execute(f"CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, body, tokenize='{tokenizer}')")
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO docs(rowid, doc_id, body) VALUES (?, ?, ?)",
            ((i + 1, doc_id, expand_cjk(text) if lang == "mixed" else text) for i, (doc_id, text) in enumerate(docs)),
        )
        conn.execute("COMMIT")
        conn.close()
        return {"tokenizer": tokenizer}

    @classmethod
    def open(cls, folder: Path, lang: str):
        return {"conn": cls._connect(folder), "lang": lang}

    @staticmethod
    def match_expression(text: str, lang: str) -> str:
        """OR of quoted tokens: words for porter/unicode61, 3-grams for trigram (and on
        mixed text, the words of its CJK-expanded form)."""
        if lang == "mixed":
            tokens = re.findall(r"\w+", expand_cjk(text))
        elif lang == "en":
            tokens = re.findall(r"\w+", text)
        else:
            tokens = [text[i : i + 3] for i in range(len(text) - 2)]
        return " OR ".join('"' + t.replace('"', '""') + '"' for t in tokens)

    @classmethod
    def search(cls, h, text: str, k: int) -> list[str]:
        expr = cls.match_expression(text, h["lang"])
        if not expr:
            return []
        rows = h["conn"].execute(
            "SELECT doc_id FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?", (expr, k)
        ).fetchall()
        return [r[0] for r in rows]

    @staticmethod
    def add(h, doc_id: str, ordinal: int, text: str) -> None:
        conn = h["conn"]
        conn.execute("BEGIN")
        body = expand_cjk(text) if h["lang"] == "mixed" else text
        conn.execute("INSERT INTO docs(rowid, doc_id, body) VALUES (?, ?, ?)", (ordinal + 1, doc_id, body))
        conn.execute("COMMIT")

    @staticmethod
    def delete(h, doc_id: str, ordinal: int) -> None:
        conn = h["conn"]
        conn.execute("BEGIN")
        conn.execute("DELETE FROM docs WHERE rowid = ?", (ordinal + 1,))
        conn.execute("COMMIT")

    @staticmethod
    def close(h) -> None:
        h["conn"].close()

    @staticmethod
    def size(folder: Path) -> int:
        p = folder / "fts5.db"
        return sum(path_size(x) for x in (p, Path(f"{p}-wal")) if x.exists())


@system("tantivy")
class TantivyAdapter(Adapter):
    label = "tantivy"
    NGRAM = "ngram12"

    @classmethod
    def _analyzer(cls, lang: str):
        import tantivy as tv

        if lang in ("en", "mixed"):  # the same chain as tantivy's built-in "en_stem"
            b = tv.TextAnalyzerBuilder(tv.Tokenizer.simple())
            b = b.filter(tv.Filter.remove_long(40)).filter(tv.Filter.lowercase())
            return b.filter(tv.Filter.stemmer("english")).build()
        return tv.TextAnalyzerBuilder(tv.Tokenizer.ngram(1, 2)).filter(tv.Filter.lowercase()).build()

    @classmethod
    def _schema(cls, lang: str):
        import tantivy as tv

        sb = tv.SchemaBuilder()
        sb.add_integer_field("row", stored=True, indexed=True, fast=True)
        if lang == "mixed":  # the CJK-expanded text indexed, the text itself stored (UTF-8, not indexed)
            sb.add_text_field("body", stored=False, tokenizer_name="en_stem")
            sb.add_bytes_field("text", stored=True, indexed=False)
        else:
            sb.add_text_field("body", stored=True, tokenizer_name="en_stem" if lang == "en" else cls.NGRAM)
        return sb.build()

    @staticmethod
    def _document(tv, row: int, text: str, lang: str):
        if lang == "mixed":
            return tv.Document(row=row, body=expand_cjk(text), text=text.encode())
        return tv.Document(row=row, body=text)

    @classmethod
    def build(cls, docs, folder: Path, lang: str) -> dict:
        import tantivy as tv

        (folder / "index").mkdir(parents=True, exist_ok=True)
        index = tv.Index(cls._schema(lang), path=str(folder / "index"))
        if lang == "zh":
            index.register_tokenizer(cls.NGRAM, cls._analyzer(lang))
        writer = index.writer()
        ids = []
        for i, (doc_id, text) in enumerate(docs):
            writer.add_document(cls._document(tv, i, text, lang))
            ids.append(doc_id)
        writer.commit()
        writer.wait_merging_threads()
        (folder / "ids.json").write_bytes(orjson.dumps(ids))
        return {"tokenizer": "ngram(1,2)+lowercase" if lang == "zh" else "en_stem"}

    @classmethod
    def open(cls, folder: Path, lang: str):
        import tantivy as tv

        index = tv.Index.open(str(folder / "index"))
        if lang == "zh":
            index.register_tokenizer(cls.NGRAM, cls._analyzer(lang))
        index.reload()
        return {
            "tv": tv,
            "index": index,
            "schema": index.schema,
            "searcher": index.searcher(),
            "analyzer": cls._analyzer(lang),
            "ids": orjson.loads((folder / "ids.json").read_bytes()),
            "writer": None,
            "lang": lang,
        }

    @staticmethod
    def _hits(h, text: str, k: int) -> list:
        """(score, doc address) of the top ``k``: a boolean OR of term queries over the analyzed
        tokens (no query syntax to escape, no phrase queries from the ngram tokenizer)."""
        tv = h["tv"]
        tokens = h["analyzer"].analyze(expand_cjk(text) if h["lang"] == "mixed" else text)
        if not tokens:
            return []
        query = tv.Query.boolean_query(
            [(tv.Occur.Should, tv.Query.term_query(h["schema"], "body", t)) for t in tokens]
        )
        return h["searcher"].search(query, k, count=False).hits

    @classmethod
    def search(cls, h, text: str, k: int) -> list[str]:
        hits = cls._hits(h, text, k)
        if not hits:
            return []
        searcher = h["searcher"]
        rows = searcher.fast_field_values("row", [addr for _score, addr in hits])
        ids = h["ids"]
        return [ids[r] for r in rows]

    @staticmethod
    def _writer(h):
        if h["writer"] is None:
            h["writer"] = h["index"].writer()
        return h["writer"]

    @classmethod
    def add(cls, h, doc_id: str, ordinal: int, text: str) -> None:
        w = cls._writer(h)
        w.add_document(cls._document(h["tv"], ordinal, text, h["lang"]))
        w.commit()

    @classmethod
    def delete(cls, h, doc_id: str, ordinal: int) -> None:
        w = cls._writer(h)
        w.delete_documents_by_term("row", ordinal)
        w.commit()

    @staticmethod
    def close(h) -> None:
        if h["writer"] is not None:
            h["writer"].wait_merging_threads()


@system("tantivy-text")
class TantivyTextAdapter(TantivyAdapter):
    """tantivy's index and query, each hit's stored text read as well (``Searcher.doc``), as a
    RAG application does to build its prompt: ragdb's hits carry their text, tantivy's
    ids-only search does not read it. A context row beside the bars, which stay on tantivy's
    ids-only search."""

    label = "tantivy (+ stored text)"
    index_of = "tantivy"

    @classmethod
    def search(cls, h, text: str, k: int) -> list[str]:
        hits = cls._hits(h, text, k)
        searcher = h["searcher"]
        field = "text" if h["lang"] == "mixed" else "body"
        ids = h["ids"]
        out = []
        for _score, addr in hits:
            doc = searcher.doc(addr)
            if not doc[field]:  # (every document stores its text)
                raise RuntimeError("a tantivy hit without its stored text")
            out.append(ids[doc["row"][0]])
        return out


def _bm25s_tokens(texts: list[str], lang: str, *, ids: bool):
    """bm25s tokenization: PyStemmer English + English stopwords, or CJK uni+bigrams; on
    mixed text, the English tokenization of its CJK-expanded form keeping one-character CJK
    tokens."""
    if lang in ("en", "mixed"):
        import bm25s
        import Stemmer

        extra = {}
        if lang == "mixed":
            texts = [expand_cjk(t) for t in texts]
            extra["token_pattern"] = _MIXED_TOKEN_PATTERN
        return bm25s.tokenize(
            texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), return_ids=ids, show_progress=False, **extra
        )
    return [cjk_tokens(t) for t in texts]


@system("bm25s")
class Bm25sAdapter(Adapter):
    label = "bm25s"
    incremental = False
    needs_list = True

    @staticmethod
    def build(docs, folder: Path, lang: str) -> dict:
        import bm25s

        pairs = list(docs)
        t0 = time.perf_counter()
        retriever = bm25s.BM25()
        retriever.index(_bm25s_tokens([t for _, t in pairs], lang, ids=True), show_progress=False)
        t1 = time.perf_counter()
        retriever.save(str(folder / "index"), show_progress=False)
        (folder / "ids.json").write_bytes(orjson.dumps([d for d, _ in pairs]))
        return {"index_s": t1 - t0, "save_s": time.perf_counter() - t1}

    @staticmethod
    def open(folder: Path, lang: str):
        import bm25s

        return {
            "retriever": bm25s.BM25.load(str(folder / "index")),
            "ids": orjson.loads((folder / "ids.json").read_bytes()),
            "lang": lang,
        }

    @staticmethod
    def search(h, text: str, k: int) -> list[str]:
        tokens = _bm25s_tokens([text], h["lang"], ids=False)
        ids = h["ids"]
        docs, scores = h["retriever"].retrieve(tokens, k=min(k, len(ids)), show_progress=False)
        # bm25s pads with zero-score documents: those did not match
        return [ids[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0]

    @staticmethod
    def close(h) -> None:
        pass


@system("rank_bm25")
class RankBm25Adapter(Adapter):
    label = "rank_bm25 (BM25Okapi)"
    persistent = False
    incremental = False
    needs_list = True

    @staticmethod
    def build(docs, folder: Path, lang: str):
        from rank_bm25 import BM25Okapi

        pairs = list(docs)
        tokens = _bm25s_tokens([t for _, t in pairs], lang, ids=False)
        return {"bm25": BM25Okapi(tokens), "ids": [d for d, _ in pairs], "lang": lang}

    @staticmethod
    def search(h, text: str, k: int) -> list[str]:
        import numpy as np

        scores = h["bm25"].get_scores(_bm25s_tokens([text], h["lang"], ids=False)[0])
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [h["ids"][i] for i in top if scores[i] > 0]

    @staticmethod
    def close(h) -> None:
        pass


def pg_url(folder: Path) -> str:
    """The PostgreSQL database of a ``ragdb-pg`` index folder: a schema of its own, named
    after the folder, on the server of $RAGDB_BENCH_PG (the postgres section starts one)."""
    import hashlib
    import os
    from urllib.parse import quote

    base = os.environ.get("RAGDB_BENCH_PG")
    if not base:
        raise RuntimeError("RAGDB_BENCH_PG names no PostgreSQL server (the postgres section sets it)")
    schema = "bench_" + hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    return base + ("&" if "?" in base else "?") + "options=" + quote(f"-csearch_path={schema}", safe="")


def pg_schema(url: str) -> str:
    from urllib.parse import parse_qs, unquote, urlsplit

    return unquote(parse_qs(urlsplit(url).query)["options"][-1]).split("=", 1)[1]


def pg_admin(sql: str) -> None:
    """One statement on the bench server (schema creation and removal: generated names only)."""
    import os

    import psycopg

    with psycopg.connect(os.environ["RAGDB_BENCH_PG"], autocommit=True) as conn:
        conn.execute(sql)


@system("ragdb-pg")
class RagdbPgAdapter(RagdbAdapter):
    """ragdb on PostgreSQL (the postgres section): the same calls as ``ragdb``, on a schema of
    its own of the bench server; the index size is the schema's tables with indexes and TOAST."""

    label = "ragdb on PostgreSQL"
    storage: str | None = None  # how the postings' blobs are stored (ALTER COLUMN ...); None: as the schema has it

    @classmethod
    def build(cls, docs, folder: Path, lang: str) -> dict:
        import ragdb

        url = pg_url(folder)
        schema = pg_schema(url)
        pg_admin(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        pg_admin(f"CREATE SCHEMA {schema}")
        folder.mkdir(parents=True, exist_ok=True)
        with ragdb.open(url) as db:
            if cls.storage:
                pg_admin(f"ALTER TABLE {schema}.postings ALTER COLUMN chunk_ids {cls.storage}, "
                         f"ALTER COLUMN tfs {cls.storage}")
            db.add_many(({"text": text, "source": doc_id} for doc_id, text in docs), chunker="none")
        return {}

    @classmethod
    def open(cls, folder: Path, lang: str):
        import ragdb

        return ragdb.open(pg_url(folder))

    @classmethod
    def size(cls, folder: Path) -> int:
        import ragdb

        with ragdb.open(pg_url(folder), readonly=True) as db:
            return db.stats().file_size

    @staticmethod
    def drop(folder: Path) -> None:
        pg_admin(f"DROP SCHEMA IF EXISTS {pg_schema(pg_url(folder))} CASCADE")


@system("ragdb-pg-external")
class RagdbPgExternalAdapter(RagdbPgAdapter):
    """ragdb on PostgreSQL with the postings' blobs stored uncompressed (EXTERNAL), to
    measure the schema's choice of PostgreSQL's default (EXTENDED, pglz)."""

    label = "ragdb on PostgreSQL, postings EXTERNAL (uncompressed)"
    storage = "SET STORAGE EXTERNAL"


@system("ragdb-pg-lz4")
class RagdbPgLz4Adapter(RagdbPgAdapter):
    """ragdb on PostgreSQL with the postings' blobs compressed with lz4 (PostgreSQL 14+
    built with lz4) instead of pglz."""

    label = "ragdb on PostgreSQL, postings lz4"
    storage = "SET COMPRESSION lz4"


# ==========================================================================
# Which sections measure which systems (in this order: the tables' rows and the rounds' turns)
# ==========================================================================

QUALITY_SYSTEMS = ["ragdb", "ragdb-tfidf", "bm25s", "tantivy", "fts5", "rank_bm25"]
PEERS = ["bm25s", "tantivy", "fts5", "rank_bm25"]  # "best peer" in the quality bars and ratios
SCALE_SYSTEMS = ["ragdb", "tantivy", "fts5", "bm25s"]
UPDATE_SCALE_SYSTEMS = ["ragdb", "fts5", "tantivy"]  # add/delete at 10k and at the scale size
PEER_PACKAGES = ("bm25s", "tantivy", "rank-bm25")  # versions in the report's header
