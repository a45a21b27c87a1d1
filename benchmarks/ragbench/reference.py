"""The exhaustive BM25 reference and the corpus statistics (worker stage ``bm25_reference``).

To check that ragdb's ranking is exact (issue 17: a pruning top-k must return what
scoring every document would), this stage scores every document of a corpus for
every plain query, the slow way: ragdb's own analyzer (the default of a new
database, :meth:`ragdb.Database.analyzer`) and its BM25 functions
(:mod:`ragdb.index.scoring`), applied as ragdb's exhaustive path applies them -- every
distinct query term in the order of its first appearance, each term's
contributions added into one float64 array, a chunk's length its terms' count less
the compound whole forms (``TermCounts.overlaps``) -- and the ``k`` best, equal
scores ordered by document id (ragdb's hit order). Its scores are bit-identical to
an exhaustive ragdb's, so its top ``k`` is too. Queries written in the query language
(phrases, ``-``/``+`` operators: 29 of SciFact's and CMRC's) are left out; the
section says how many.

The same pass over the corpus measures its term statistics (per language, English
or Chinese by the share of CJK characters): documents, terms, vocabulary, share
of terms in one document, term frequency per posting, lengths, the vocabulary at
prefixes of the corpus (Heaps' law), and the document frequencies of the queries'
terms. Documents are analyzed in two processes (this stage is not timed).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from .common import percentile, read_pairs
from .harness import worker_stage

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_CJK_CHAR_RE = re.compile(rf"[{_CJK}]")
# prefixes of the corpus (shares of its documents) where the vocabulary is recorded
HEAPS_POINTS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)


def is_zh(text: str) -> bool:
    """A document counts as Chinese when CJK characters are a third of its characters or more."""
    return not text.isascii() and 3 * len(_CJK_CHAR_RE.findall(text)) >= len(text)


def _analyze_range(args: tuple[str, dict, list[str], int, int, list[int]]) -> dict[str, Any]:
    """Analyze documents ``[lo, hi)`` of a docs file: ids, lengths, language, the postings
    of the query terms, per-language document frequencies and the vocabulary at ``marks``."""
    docs_path, config, qterms, lo, hi, marks = args
    from ragdb.text.analysis import Analyzer

    analyzer = Analyzer.from_config(config)
    qset = frozenset(qterms)
    post: dict[str, array] = {t: array("I") for t in qterms}
    tfs: dict[str, array] = {t: array("I") for t in qterms}
    ids: list[str] = []
    lengths = array("q")
    zh = bytearray()
    df = {"en": Counter(), "zh": Counter()}
    cf = {"en": 0, "zh": 0}
    tokens = {"en": 0, "zh": 0}
    heaps: list[dict[str, int]] = []
    mark_set = set(marks)
    with open(docs_path, "rb") as fh:
        for i, line in enumerate(fh):
            if i < lo:
                continue
            if i >= hi:
                break
            doc_id, text = orjson.loads(line)
            counts = analyzer.term_counts(text)
            length = sum(counts.values()) - getattr(counts, "overlaps", 0)
            lang = "zh" if is_zh(text) else "en"
            ids.append(doc_id)
            lengths.append(length)
            zh.append(lang == "zh")
            df[lang].update(counts.keys())
            cf[lang] += sum(counts.values())
            tokens[lang] += length
            for t in qset.intersection(counts):
                post[t].append(i)
                tfs[t].append(counts[t])
            if i + 1 in mark_set:
                heaps.append({"docs": i + 1, "T_en": tokens["en"], "T_zh": tokens["zh"],
                              "V_en": len(df["en"]), "V_zh": len(df["zh"]),
                              "V": len(df["en"].keys() | df["zh"].keys())})
    return {"ids": ids, "lengths": lengths.tobytes(), "zh": bytes(zh), "post": {t: a.tobytes() for t, a in post.items()},
            "tfs": {t: a.tobytes() for t, a in tfs.items()}, "df": df, "cf": cf, "tokens": tokens, "heaps": heaps}


def _plain(text: str) -> bool:
    """Whether ragdb reads ``text`` as plain words (no phrases or operators)."""
    try:
        from ragdb.query import language as qlang

        return bool(qlang.parse(text).plain)
    except Exception:  # noqa: BLE001 - a ragdb without the query language: every query is plain
        return True


@worker_stage("bm25_reference")
def stage_reference(spec: dict) -> dict:
    import numpy as np

    import ragdb
    from ragdb.index import scoring
    from ragdb.text.analysis import Analyzer

    t0 = time.perf_counter()
    with ragdb.open(":memory:") as db:  # a new database's analyzer and settings
        config = db.analyzer.config()
        settings = db.settings
    analyzer = Analyzer.from_config(config)
    k1 = float(settings.get("bm25_k1", scoring.BM25_K1))
    b = float(settings.get("bm25_b", scoring.BM25_B))
    queries = read_pairs(Path(spec["queries"]))
    plain = [(qid, text) for qid, text in queries if _plain(text)]
    q_terms = {qid: list(dict.fromkeys(analyzer.terms(text))) for qid, text in plain}
    all_terms = sorted({t for ts in q_terms.values() for t in ts})
    n = spec["n_docs"]
    workers = max(1, min(int(spec.get("workers", 2)), n // 5000 or 1))
    cuts = [n * w // workers for w in range(workers + 1)]
    marks = [max(1, int(n * f)) for f in HEAPS_POINTS]
    jobs = [(spec["docs"], config, all_terms, cuts[w], cuts[w + 1], marks if w == 0 else []) for w in range(workers)]
    if workers > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            parts = pool.map(_analyze_range, jobs)
    else:
        parts = [_analyze_range(jobs[0])]
    t1 = time.perf_counter()

    ids = [d for p in parts for d in p["ids"]]
    if len(ids) != n:
        raise RuntimeError(f"read {len(ids)} documents, expected {n}")
    lengths = np.concatenate([np.frombuffer(p["lengths"], np.int64) for p in parts]).astype(np.float64)
    zh = np.concatenate([np.frombuffer(p["zh"], np.uint8) for p in parts]).astype(bool)
    post = {t: np.concatenate([np.frombuffer(p["post"][t], np.uint32) for p in parts]).astype(np.intp)
            for t in all_terms}
    tfs = {t: np.concatenate([np.frombuffer(p["tfs"][t], np.uint32) for p in parts]) for t in all_terms}
    df: dict[str, Counter] = {"en": Counter(), "zh": Counter()}
    for p in parts:
        for lang in df:
            df[lang].update(p["df"][lang])

    # -- exhaustive BM25, as ragdb's exhaustive path computes it ---------------------
    total_length = int(lengths.sum())
    avgdl = total_length / n
    norm = scoring.bm25_length_norm(lengths, avgdl, k1, b)
    order = np.array(ids, dtype=object)
    k = int(spec.get("k", 100))
    run: dict[str, list[str]] = {}
    run_scores: dict[str, list[float]] = {}
    scores = np.zeros(n, np.float64)
    postings_touched: dict[str, int] = {}
    for qid, terms in q_terms.items():
        scores.fill(0.0)
        touched = 0
        for t in terms:
            d = post[t]
            if len(d) == 0:
                continue
            touched += len(d)
            idf = scoring.bm25_idf(n, len(d))
            scores[d] += scoring.bm25_term_scores(tfs[t], norm[d], idf)
        postings_touched[qid] = touched
        cand = np.flatnonzero(scores > 0)
        if len(cand) > k:
            top = np.argpartition(-scores[cand], k - 1)[:k]
            kth = scores[cand[top]].min()
            cand = cand[scores[cand] >= kth]  # ties at the cut, then ordered by document id
        ranked = sorted(zip((-scores[cand]).tolist(), order[cand].tolist()))[:k]
        run[qid] = [doc_id for _s, doc_id in ranked]
        run_scores[qid] = [-s for s, _d in ranked]
    t2 = time.perf_counter()

    # -- statistics ------------------------------------------------------------------
    stats: dict[str, Any] = {"docs": n, "heaps": parts[0]["heaps"]}
    for lang in ("en", "zh"):
        sel = zh if lang == "zh" else ~zh
        v = np.fromiter(df[lang].values(), np.int64, len(df[lang]))
        lens = lengths[sel]
        cf = sum(p["cf"][lang] for p in parts)
        stats[lang] = {
            "docs": int(sel.sum()), "terms": int(lens.sum()), "vocabulary": len(v),
            "hapax_share": float((v == 1).mean()) if len(v) else None,
            "df_le_10_share": float((v <= 10).mean()) if len(v) else None,
            "df_over_1pct": int((v > 0.01 * max(1, int(sel.sum()))).sum()),
            "tf_per_posting": cf / int(v.sum()) if len(v) else None,
            "length_mean": float(lens.mean()) if len(lens) else None,
            "length_p5_p50_p95": [float(x) for x in np.percentile(lens, [5, 50, 95])] if len(lens) else None,
        }
    stats["vocabulary"] = len(df["en"].keys() | df["zh"].keys())
    stats["terms"] = total_length
    # document frequencies of the queries' terms, and the postings an exhaustive scorer reads per query
    q_lang = {qid: "zh" if is_zh(text) else "en" for qid, text in plain}
    for lang in ("en", "zh"):
        terms = {t for qid, ts in q_terms.items() if q_lang[qid] == lang for t in ts}
        dfs = [len(post[t]) for t in terms]
        touched = [postings_touched[qid] for qid in q_terms if q_lang[qid] == lang]
        stats[lang]["query_terms"] = len(terms)
        stats[lang]["query_term_df_p50_p90"] = [percentile(dfs, 50), percentile(dfs, 90)] if dfs else None
        stats[lang]["query_postings_p50_p95"] = [percentile(touched, 50), percentile(touched, 95)] if touched else None
    return {"run": run, "scores": run_scores, "plain": len(plain), "queries": len(queries), "stats": stats,
            "analyze_s": t1 - t0, "score_s": t2 - t1, "k1": k1, "b": b}


def cache_key(docs_fingerprint: str, queries_path: Path, src: Path, k: int) -> str:
    """What a cached reference depends on: the corpus, the queries, this module, ragdb's
    analysis and scoring sources (the snapshot's) and ``k``."""
    h = hashlib.sha256(docs_fingerprint.encode())
    h.update(Path(__file__).read_bytes())  # this module's own code
    h.update(queries_path.read_bytes())
    analysis = src / "ragdb" / "analysis.py"
    h.update(analysis.read_bytes() if analysis.exists() else b"")
    h.update(_scoring_source(src / "ragdb" / "scoring.py").encode())
    h.update(str(k).encode())
    return h.hexdigest()[:16]


#: What the reference uses of ragdb.index.scoring: a change elsewhere in that module (a pruning
#: scorer's bounds, say) leaves a cached reference valid.
SCORING_NAMES = ("BM25_K1", "BM25_B", "bm25_idf", "bm25_length_norm", "bm25_term_scores")


def _scoring_source(path: Path) -> str:
    """The source of :data:`SCORING_NAMES` in ragdb's scoring module (the whole file when
    it does not parse)."""
    import ast

    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    parts = []
    for node in tree.body:
        names = ([node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 else [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)])
        if any(n in SCORING_NAMES for n in names):
            parts.append(ast.get_source_segment(text, node) or "")
    return "\n".join(parts)


def compare(run: dict[str, list[str]], ref: dict[str, list[str]], ref_scores: dict[str, list[float]] | None = None,
            depth: int = 10, rel_tol: float = 1e-9) -> dict[str, Any]:
    """How ragdb's run agrees with the reference on the queries the reference scored:
    identical top ``depth``; identical up to near-ties (each position's document has the
    reference's score at that position, within ``rel_tol``: a scorer summing the same terms
    in another order may swap documents whose scores differ only by rounding); identical top k."""
    same_top = same_ties = same_all = 0
    differ = []
    for q, ids in ref.items():
        got = run.get(q, [])
        if got[:depth] == ids[:depth]:
            same_top += 1
            same_ties += 1
        elif ref_scores is not None and len(got[:depth]) == len(ids[:depth]):
            score_of = dict(zip(ids, ref_scores[q]))
            want = ref_scores[q][:depth]
            if all(d in score_of and abs(score_of[d] - w) <= rel_tol * max(abs(w), 1e-300)
                   for d, w in zip(got[:depth], want)):
                same_ties += 1
            else:
                differ.append(q)
        else:
            differ.append(q)
        same_all += got == ids
    return {"queries": len(ref), f"same_top{depth}": same_top, f"same_top{depth}_ties": same_ties,
            "same_all": same_all, "differ": differ[:10], "n_differ": len(differ)}


def heaps_beta(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log V over log T (Heaps' exponent) through ``(T, V)`` points."""
    pts = [(math.log(t), math.log(v)) for t, v in points if t > 0 and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx
