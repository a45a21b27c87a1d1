"""Section ``refusal`` (issue 14): how the default confidence floor of prompt/ask treats real and
off-topic questions; worker stage ``refusal_confidences``.

Real questions are each corpus's judged queries (they should be answered); off-topic ones are the
questions of ``benchmarks/data/offtopic-{en,zh}.jsonl``, written for this benchmark: general
knowledge and other-domain questions neither corpus can answer (they should be refused). Each is
searched in a ragdb database of the corpus (one chunk per document, default analyzer, k=8 as
``ragdb prompt``/``ask``), and its score is the best ``Hit.confidence`` of its hits (0 without
hits): a prompt refuses when that is below the floor. Runnable alone::

    .venv/bin/python benchmarks/run.py --sections refusal --merge
"""

from __future__ import annotations

import importlib
import random
import time
from pathlib import Path
from typing import Any

import orjson

from ..common import REPO, log, percentile, read_pairs
from ..harness import Context, section, worker_stage
from ..report import bar, cell, fmt

OFF_TOPIC = {"en": REPO / "benchmarks" / "data" / "offtopic-en.jsonl",
             "zh": REPO / "benchmarks" / "data" / "offtopic-zh.jsonl"}
PROMPT_K = 8  # the hits `ragdb prompt` / `ask` retrieve by default
SUBSETS = {"scifact": (200, 1000), "cmrc": (60,)}  # smaller knowledge bases cut from each corpus
SUBSET_REPEATS = 3
SEED = 14
BAR_OFF_TOPIC_REFUSED = 0.40  # at least this share of off-topic questions refused, each corpus
BAR_JUDGED_REFUSED = 0.05     # at most this share of judged queries refused, each corpus


@worker_stage("refusal_confidences")
def _stage_refusal(spec: dict) -> dict:
    """Best hit confidence of every judged query and off-topic question, on the whole corpus
    (BM25 and TF-IDF) and on smaller databases cut from it (BM25)."""
    import ragdb
    from ragdb.index.confidence import DEFAULT_MIN_CONFIDENCE, best_confidence
    from ragdb.answers.evaluation import load_questions

    docs = dict(read_pairs(Path(spec["docs"])))
    judged = read_pairs(Path(spec["queries"]))
    relevant: dict[str, list[str]] = orjson.loads(Path(spec["relevant"]).read_bytes())
    off = {lang: load_questions(path) for lang, path in spec["off_topic"].items()}
    k = spec["prompt_k"]

    def best(db: Any, texts: list[str], scorer: str = "bm25") -> list[float]:
        return [best_confidence(db.search(t, k=k, scorer=scorer)) or 0.0 for t in texts]

    out: dict[str, Any] = {"default": DEFAULT_MIN_CONFIDENCE, "chunks": len(docs)}
    with ragdb.open(":memory:") as db:
        db.add_many(({"text": t, "source": d} for d, t in docs.items()), chunker="none")
        for scorer in ("bm25", "tfidf"):
            t0 = time.perf_counter()
            out[scorer] = {"judged": best(db, [t for _q, t in judged], scorer),
                           **{f"off_{lang}": best(db, qs, scorer) for lang, qs in off.items()}}
            out[scorer]["seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cal = db.self_calibration()  # the floor prompt/ask apply by default (issue 30)
        out["self"] = cal.to_setting() if cal is not None else None
        out["self_seconds"] = time.perf_counter() - t0
    rng = random.Random(SEED)
    ids = sorted(docs)
    subsets = []
    for size in spec["subsets"]:
        pos: list[float] = []
        neg: list[float] = []
        pos_self = neg_self = 0  # refused at each database's own measured floor
        floors = []
        for _ in range(SUBSET_REPEATS):
            # judged queries whose relevant documents fit, padded with random other documents
            chosen: set[str] = set()
            asked = []
            for qid, text in rng.sample(judged, min(len(judged), max(5, size // 4))):
                rel = set(relevant.get(qid, ())) & docs.keys()
                if rel and len(chosen | rel) <= size:
                    chosen |= rel
                    asked.append(text)
            chosen |= set(rng.sample([d for d in ids if d not in chosen], size - len(chosen)))
            with ragdb.open(":memory:") as db:
                db.add_many(({"text": docs[d], "source": d} for d in sorted(chosen)), chunker="none", workers=0)
                p, n = best(db, asked), best(db, off[spec["lang"]])
                floor = db.min_confidence
                floors.append(floor)
                pos_self += sum(1 for c in p if c < floor)
                neg_self += sum(1 for c in n if c < floor)
                pos += p
                neg += n
        subsets.append({"size": size, "judged": pos, "off": neg, "floors": floors,
                        "judged_refused_self": pos_self, "off_refused_self": neg_self})
    out["subsets"] = subsets
    return out


def _questions(path: Path) -> list[str]:
    return [orjson.loads(line)["text"] for line in path.read_bytes().splitlines() if line.strip()]


def _share_below(values: list[float], floor: float) -> float | None:
    return sum(1 for v in values if v < floor) / len(values) if values else None


def _auc(pos: list[float], neg: list[float]) -> float | None:
    """ROC AUC: the chance that a real question outscores an off-topic one (ties count half)."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _pct(x: float | None) -> str:
    return f"{100 * x:.1f}%" if x is not None else "–"


@section("refusal")
def section_refusal(ctx: Context) -> str:
    head = ["## Refusal by default: the confidence floor of prompt and ask (issue 14)", ""]
    names = ["the database's own floor refuses ≥ 40% of off-topic questions (each corpus)",
             "the database's own floor refuses ≤ 5% of judged queries (each corpus)"]
    if not ctx.ragdb_ok:
        for name in names:
            bar(ctx, name, None, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    prompt = importlib.import_module("ragdb.answers.prompt")  # from the run's snapshot (load_evaluation put it first)
    measured: dict[str, dict] = {}
    for key in ("scifact", "cmrc"):
        corpus = ctx.corpora[key]
        relevant = {q: [d for d, r in rels.items() if r > 0] for q, rels in corpus.qrels.items()}
        rel_path = ctx.workdir / "data" / key / "relevant.json"
        rel_path.write_bytes(orjson.dumps(relevant))
        log(f"== refusal: {corpus.title}")
        measured[key] = ctx.run_worker("refusal_confidences", "ragdb", corpus, relevant=str(rel_path),
                                       off_topic={k: str(v) for k, v in OFF_TOPIC.items()}, prompt_k=PROMPT_K,
                                       subsets=list(SUBSETS[key] if not ctx.args.quick else SUBSETS[key][:1]))
    ctx.results["refusal"] = {k: {n: v for n, v in r.items() if n in ("default", "chunks", "error")}
                              for k, r in measured.items()}
    bad = [f"{k}: {cell(r['error'])}" for k, r in measured.items() if "error" in r]
    if bad:
        for name in names:
            bar(ctx, name, None, "worker failed")
        return "\n".join(head + [f"worker failed: {'; '.join(bad)}", ""])
    own = {"scifact": "en", "cmrc": "zh"}
    other = {"scifact": "zh", "cmrc": "en"}
    floor = measured["scifact"]["default"]
    # What the default was chosen with: choose_threshold over both corpora pooled (BM25).
    pairs = [(c, True) for k in measured for c in measured[k]["bm25"]["judged"]] + \
            [(c, False) for k in measured for c in measured[k]["bm25"][f"off_{own[k]}"]]
    chosen = prompt.choose_threshold(pairs)
    # ... and held out: 2-fold (alternate questions), choose on one half, count on the other.
    held: dict[str, dict[str, list[float]]] = {k: {"fr": [], "rr": []} for k in measured}
    for fold in (0, 1):
        train = [(c, True) for k in measured for i, c in enumerate(measured[k]["bm25"]["judged"]) if i % 2 == fold] + \
                [(c, False) for k in measured for i, c in enumerate(measured[k]["bm25"][f"off_{own[k]}"])
                 if i % 2 == fold]
        t = prompt.choose_threshold(train).threshold
        for k in measured:
            test_pos = [c for i, c in enumerate(measured[k]["bm25"]["judged"]) if i % 2 != fold]
            test_neg = [c for i, c in enumerate(measured[k]["bm25"][f"off_{own[k]}"]) if i % 2 != fold]
            held[k]["fr"].append(_share_below(test_pos, t) or 0.0)
            held[k]["rr"].append(_share_below(test_neg, t) or 0.0)
    lines = head + [
        "`prompt` and `ask` drop evidence whose `Hit.confidence` is below a floor and refuse without calling "
        "the model when none is left. The confidence is the hit's BM25 score over the highest score any chunk "
        "could reach for the query (every distinct query term fully matched; terms the collection lacks at "
        "df 0), the same measure for every scorer (`ragdb/index/confidence.py`). The default floor, "
        f"`ragdb.index.confidence.DEFAULT_MIN_CONFIDENCE` = **{floor}**, was chosen with "
        "`ragdb.answers.prompt.choose_threshold` (best F1 of answer decisions) on the questions below; "
        "`ragdb eval --calibrate` does the same on a user's own judged queries. Real questions: each corpus's "
        "judged queries (should be answered). Off-topic questions: `benchmarks/data/offtopic-en.jsonl` and "
        "`offtopic-zh.jsonl` (60 each, written for this benchmark: general knowledge and other domains; "
        "should be refused), asked of the corpus of their language and, as a sanity row, of the other one. "
        f"A question's score is the best confidence among its top {PROMPT_K} hits (0 without hits; k={PROMPT_K} "
        "as `ragdb prompt`); one chunk per document, default analyzer.",
        "",
        f"| corpus | scorer | judged queries | refused at {floor} (false refusals) | off-topic, own language "
        f"| refused at {floor} | off-topic, other language | refused at {floor} | judged confidence p5 / p50 "
        "| off-topic confidence p50 / p95 | ROC AUC (judged vs off-topic, own language) |",
        "|" + "---|" * 11,
    ]
    rates: dict[str, tuple[float | None, float | None]] = {}
    self_rows = []
    for k, r in measured.items():
        cal = r.get("self")
        if cal is None:
            continue
        s = r["bm25"]
        own_floor = cal["floor"]
        pos, neg, negx = s["judged"], s[f"off_{own[k]}"], s[f"off_{other[k]}"]
        fr, rr = _share_below(pos, own_floor), _share_below(neg, own_floor)
        rates[k] = (fr, rr)
        self_rows.append(
            f"| {ctx.corpora[k].title} | {fmt(own_floor)} | {_pct(_share_below(pos, floor))} → {_pct(fr)} "
            f"| {_pct(_share_below(neg, floor))} → {_pct(rr)} | {_pct(_share_below(negx, floor))} → "
            f"{_pct(_share_below(negx, own_floor))} | {', '.join(cal['languages'])} "
            f"| {fmt(cal['off_topic_p95'])} / {fmt(cal['pseudo_p5'])} | {r.get('self_seconds', 0.0):.1f} s |")
    for k, r in measured.items():
        corpus = ctx.corpora[k]
        for scorer in ("bm25", "tfidf"):
            s = r[scorer]
            pos, neg, negx = s["judged"], s[f"off_{own[k]}"], s[f"off_{other[k]}"]
            fr, rr, rrx = _share_below(pos, floor), _share_below(neg, floor), _share_below(negx, floor)
            lines.append(
                f"| {corpus.title}, {r['chunks']:,} chunks | {scorer} | {len(pos)} | {_pct(fr)} "
                f"({sum(1 for v in pos if v < floor)}) | {len(neg)} | {_pct(rr)} | {len(negx)} | {_pct(rrx)} "
                f"| {fmt(percentile(pos, 5))} / {fmt(percentile(pos, 50))} "
                f"| {fmt(percentile(neg, 50))} / {fmt(percentile(neg, 95))} | {fmt(_auc(pos, neg))} |")
    lines += [
        "",
        f"- How the default was chosen: `choose_threshold` over both corpora pooled (BM25; {len(pairs)} questions) "
        f"picks **{chosen.threshold:.3f}** (F1 {chosen.f1:.3f}, precision {chosen.precision:.3f}, recall "
        f"{chosen.recall:.3f}); "
        + (f"the default is that value rounded to {floor}. " if round(chosen.threshold, 1) == floor else
           f"the default in the code is {floor}: the choice moved since it was set (rerun and update it). ")
        + "Held out (2-fold: the threshold chosen on "
        "alternate questions, counted on the others, mean of both folds): "
        + "; ".join(f"{ctx.corpora[k].title} {_pct(sum(h['fr']) / 2)} of judged queries refused, "
                    f"{_pct(sum(h['rr']) / 2)} of off-topic refused" for k, h in held.items()) + ".",
        "- Off-topic questions still answered match real words of the corpus, which lexical evidence cannot "
        "tell from an answer (the model's own rule, answer only from the sources or say the refusal "
        "sentence, is the second line). The highest-scoring ones: "
        + "; ".join(f"{ctx.corpora[k].title}: " + ", ".join(
            f"\"{q}\" ({c:.2f})" for c, q in sorted(zip(measured[k]["bm25"][f"off_{own[k]}"],
                                                        _questions(OFF_TOPIC[own[k]])), reverse=True)[:3])
            for k in measured) + ".",
    ]
    lines += [
        "",
        "The floor prompt/ask apply by default since issue 30 is the one each database measures on itself "
        "(`Database.self_calibration`, docs/grounded-answers.md): questions made from its own chunks (answer) "
        "against ragdb's bundled off-topic questions (`ragdb/answers/offtopic-*.txt`, refuse; the off-topic "
        "questions counted here are the benchmark's own, written apart). Fixed 0.2 → measured, BM25, the "
        "bars are on the measured floor:",
        "",
        "| corpus | measured floor | judged refused | off-topic refused, own language | off-topic refused, other "
        "language | languages | bundled off-topic p95 / pseudo-question p5 | measuring took |",
        "|---|---|---|---|---|---|---|---|",
        *self_rows,
    ]
    sub_rows = []
    for k, r in measured.items():
        for sub in r["subsets"]:
            n_pos, n_neg = len(sub["judged"]), len(sub["off"])
            own_pos = _pct(sub.get("judged_refused_self", 0) / n_pos) if n_pos else "–"
            own_neg = _pct(sub.get("off_refused_self", 0) / n_neg) if n_neg else "–"
            sub_rows.append(f"| {ctx.corpora[k].title} | {sub['size']:,} of {r['chunks']:,} | {n_pos} "
                            f"| {_pct(_share_below(sub['judged'], floor))} → {own_pos} | {n_neg} "
                            f"| {_pct(_share_below(sub['off'], floor))} → {own_neg} "
                            f"| {', '.join(fmt(f) for f in sub.get('floors', []))} |")
    if sub_rows:
        lines += [
            "",
            f"Smaller knowledge bases (BM25): {SUBSET_REPEATS} databases of each size cut from the corpus (seed "
            f"{SEED}), each holding the relevant documents of some judged queries (asked) plus random other "
            "documents; every off-topic question of the corpus's language asked of each. IDFs of a small "
            "collection are coarser (a term absent from it weighs the most), so confidences move with its size; "
            "each database measures its own floor (fixed 0.2 → measured).",
            "",
            "| corpus | documents | judged queries | refused | off-topic questions | refused | measured floors |",
            "|---|---|---|---|---|---|---|",
            *sub_rows,
        ]
    for name, ok_fn in ((names[0], lambda fr, rr: rr is not None and rr >= BAR_OFF_TOPIC_REFUSED),
                        (names[1], lambda fr, rr: fr is not None and fr <= BAR_JUDGED_REFUSED)):
        ok = all(ok_fn(*v) for v in rates.values())
        detail = "; ".join(f"{k}: {_pct(rr if name == names[0] else fr)}" for k, (fr, rr) in rates.items())
        bar(ctx, name, ok, detail)
    secs = sum(r[s]["seconds"] for r in measured.values() for s in ("bm25", "tfidf"))
    lines += ["", f"- Searches of this section took {secs:.1f} s in all (both scorers, both corpora)."]
    return "\n".join(lines + [""])
