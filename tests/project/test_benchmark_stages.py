"""Benchmark stages that drive ragdb's internals directly run at a small size here, so a change
of those internals that breaks the benchmark fails the suite, not the next benchmark run (the
ANN stage's stand-in store lacked ``Store.in_write`` for a day). The measurements themselves are
the benchmark's (``benchmarks/run.py``); nothing here times anything.

Each stage is called in this process as its worker would call it, with a spec like the one its
section builds, on a synthetic corpus written to ``tmp_path`` in the benchmark's files (one JSON
``[id, text]`` pair a line): made-up words drawn with a skewed frequency, and queries cut from the
documents (so they match, and two adjacent words of a query stand adjacent in some document, as
the operators stage wants). The assertions are on behaviour: the bars' counts (violations, files
loaded, rankings alike), keys and sizes, never on a time."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch):
    """The benchmark's ``ragbench`` package, importable, with its systems and stages registered."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from ragbench import harness

    harness.load_plugins()
    return harness


@pytest.fixture
def kernel():
    """ragdb's kernel switch; the kernel this process ran before the test is restored after it
    (the kernel stages and the numpy system switch it for the whole process, as in a worker)."""
    from ragdb.index import kernel

    before = kernel.name()
    yield kernel
    kernel.use(before)


# --------------------------------------------------------------------------- a synthetic corpus

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words: dict[str, None] = {}
    while len(words) < size:
        words.setdefault("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 5))), None)
    return list(words)


def write_corpus(folder: Path, n_docs: int, n_queries: int, *, seed: int = 7, copies: int = 1,
                 words: int = 40) -> dict[str, Path]:
    """``docs.jsonl`` (``n_docs`` documents "title\\n\\nbody"; with ``copies`` > 1 the first
    ``n_docs // copies`` repeated under new ids ``<id>@r<r>``, as ``corpora.replicate_corpus``
    writes them, and ``base.jsonl`` the first copy), ``queries.jsonl`` (runs of 3 to 8 words cut
    from the documents) and ``relevant.json`` (each query's document, as the refusal section
    writes it); returns their paths."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng, 600)
    weights = [1.0 / (r + 1) for r in range(len(vocab))]
    unique = n_docs // copies
    texts = []
    for _ in range(unique):
        body = rng.choices(vocab, weights, k=words)
        title = " ".join(rng.choices(vocab, weights, k=4)).capitalize()
        texts.append(f"{title}\n\n{' '.join(body).capitalize()}.")
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"docs": folder / "docs.jsonl", "base": folder / "base.jsonl", "queries": folder / "queries.jsonl"}
    with open(paths["docs"], "wb") as fh:
        for i in range(n_docs):
            r, j = divmod(i, unique)
            fh.write(orjson.dumps([f"d{j:05d}" if r == 0 else f"d{j:05d}@r{r}", texts[j]]) + b"\n")
    paths["base"].write_bytes(b"".join(orjson.dumps([f"d{j:05d}", t]) + b"\n" for j, t in enumerate(texts)))
    relevant = {}
    with open(paths["queries"], "wb") as fh:
        for q in range(n_queries):
            j = rng.randrange(unique)
            body = texts[j].split("\n\n", 1)[1].rstrip(".").lower().split()
            start = rng.randrange(len(body) - 8)
            fh.write(orjson.dumps([f"q{q}", " ".join(body[start:start + rng.randint(3, 8)])]) + b"\n")
            relevant[f"q{q}"] = [f"d{j:05d}"]
    paths["relevant"] = folder / "relevant.json"
    paths["relevant"].write_bytes(orjson.dumps(relevant))
    return paths


def build(bench, paths: dict[str, Path], index: Path, system: str = "ragdb") -> None:
    """The harness's ``build`` stage of ``system`` (a ragdb database of the docs, one chunk each)."""
    out = bench.worker({"stage": "build", "system": system, "lang": "en", "docs": str(paths["docs"]),
                        "index_dir": str(index)})
    assert "error" not in out


# --------------------------------------------------------------------------- the stages


def test_the_ann_stage_runs_on_a_small_collection(tmp_path, monkeypatch):
    pytest.importorskip("usearch.index", reason="usearch is in the test extra (ragdb[ann])")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from ragbench.sections import ann as stage

    out = stage._stage_ann({"n": 3_000, "queries": 30, "index_dir": str(tmp_path / "ann")})
    assert out["loaded_from_file"] is True  # the graph was saved, then loaded and checked
    assert out["violations"] == 0 and out["shortfalls"] == 0
    assert set(out["exact_by_size"]) == {"3000"}
    assert all(out[f"ann_{label}"]["recall"] > 0.5 for label in ("none", "1%", "10%", "50%"))


def test_the_kernel_stages_run_and_both_kernels_rank_alike(tmp_path, bench, kernel, monkeypatch):
    """Section ``kernel``: the probe, the paired stage, the threads stage (its windows cut to a
    fraction of a second), and the harness's query stage of ``ragdb`` and ``ragdb-numpy`` (the
    numpy system switches the kernel through ``ragdb.index.kernel.use``) on one index: the
    section's bar wants every query ranked alike by both."""
    from ragbench.sections import kernel as stage

    paths = write_corpus(tmp_path / "data", 1_500, 40)
    index = tmp_path / "index"
    build(bench, paths, index)
    spec = {"index_dir": str(index), "queries": str(paths["queries"]), "k": 100}

    probe = stage._stage_probe({})
    assert probe["kernel"] == kernel.name() and set(probe["available"]) == set(kernel.available())
    assert "numpy" in probe["available"]

    paired = stage._stage_paired(spec)
    if "compiled" in kernel.available():
        assert paired["queries"] == 40 and paired["ratio"] > 0
        assert paired["p50_compiled_ms"] > 0 and paired["p50_numpy_ms"] > 0
    else:
        assert paired == {"error": "the compiled kernel is not installed"}

    monkeypatch.setattr(stage, "THREAD_SECONDS", 0.2)
    monkeypatch.setattr(stage, "THREAD_REPEATS", 2)
    for name in kernel.available():
        threads = stage._stage_threads({**spec, "kernel": name})
        assert threads["kernel"] == name and threads["windows"] == 2
        assert threads["qps_1"] > 0 and threads["qps_2"] > 0 and threads["speedup"] > 0

    runs = {}
    for system, ran in (("ragdb", "compiled" if "compiled" in kernel.available() else "numpy"),
                        ("ragdb-numpy", "numpy")):
        kernel.use(ran)  # a fresh worker's kernel (ragdb's default: the compiled one where installed)
        out = bench.worker({"stage": "query", "system": system, "lang": "en", "index_dir": str(index),
                            "queries": spec["queries"], "k": 100})
        assert kernel.name() == ran
        assert out["queries"] == 40 and all(out["run"].values())
        runs[system] = out["run"]
    assert stage._same_rankings(runs["ragdb"], runs["ragdb-numpy"]) == (40, 40)


def test_the_filters_stages_keep_every_restriction(tmp_path, bench):
    """Section ``filters``: the build (metadata, access labels, timestamps) and the query stage
    under every restriction: no hit outside its restriction, no short result while more chunks
    match (the section's bars), each row with its share of the documents."""
    from ragbench.sections import filters as stage

    n, nq = 1_000, 25
    paths = write_corpus(tmp_path / "data", n, nq, copies=4)  # replicas, as the section's corpus
    index = tmp_path / "index"
    built = stage._stage_filter_build({"index_dir": str(index), "docs": str(paths["docs"])})
    assert built["chunks"] == n and built["size_bytes"] > 0

    out = stage._stage_filter_query({"n_docs": n, "queries": str(paths["queries"]), "index_dir": str(index)})
    rows = {r["label"]: r for r in out["configs"]}
    assert list(rows) == [label for label, _pred, _kw in stage._filter_configs(n)]
    assert out["queries"] == nq
    assert rows["unfiltered"]["kept"] == n
    assert rows["`filter={\"bucket\": 0}`"]["kept"] == n // 100
    assert rows["`principals=[\"group0\"]`"]["kept"] == n // 10
    for label, row in rows.items():
        for k in (10, 100):
            c = row[f"k{k}"]
            assert c["n"] == nq, (label, k)
            assert c["violations"] == 0 and c["outside"] == 0, (label, k, c)
            assert c["hits"] > 0, (label, k)
        if label != "unfiltered":
            assert row["first_ms"] is not None
    assert rows["unfiltered"]["k10"]["short"] == 0 and rows["unfiltered"]["k10"]["hits"] == 10 * nq
    # 1% of 1,000 chunks is 10: k=100 under it is always short, so each query's truth was searched
    assert rows["`filter={\"bucket\": 0}`"]["k100"]["short"] == nq and out["truth_searches"] == nq


def test_the_sync_stage_loads_only_the_changed_file(tmp_path, bench):
    """Section ``sync``: it counts the files sync loads and hashes by wrapping
    ``ragdb.files.loaders.load_read`` and ``ragdb.files.sync.file_sha256``; the section's bars
    (one edit loads and hashes one file, no change reads none, a delete loads none and removes
    one document) hold on 40 files, and the wrappers are gone afterwards."""
    from ragbench.sections import sync as stage
    from ragdb.files import loaders, sync

    real = (loaders.load_read, sync.file_sha256)
    paths = write_corpus(tmp_path / "data", 50, 1)
    n = 40
    out = stage._stage_sync({"index_dir": str(tmp_path / "sync"), "docs": str(paths["docs"]), "n_files": n})
    assert (loaders.load_read, sync.file_sha256) == real
    assert out["files"] == n and out["edit_found"] is True and out["delete_gone"] is True
    assert out["documents_after"] == n  # SYNC_REPEATS files deleted, as many added
    steps = {s["label"]: s for s in out["steps"]}
    assert list(steps) == ["initial sync into an empty database", "no change", "one file edited",
                           "one file deleted", "one file added", "one file touched (mtime changed, same bytes)"]
    initial = steps["initial sync into an empty database"]
    assert (initial["loaded"], initial["added"], initial["failed"]) == (n, n, 0)
    assert {k: steps["no change"][k] for k in ("loaded", "hashed", "changed", "unchanged")} == \
        {"loaded": 0, "hashed": 0, "changed": 0, "unchanged": n}
    edit = steps["one file edited"]
    assert {k: edit[k] for k in ("loaded", "hashed", "changed", "added", "deleted", "documents", "unchanged")} == \
        {"loaded": 1, "hashed": 1, "changed": 1, "added": 0, "deleted": 0, "documents": 1, "unchanged": n - 1}
    delete = steps["one file deleted"]
    assert (delete["loaded"], delete["deleted"], delete["removed"]) == (0, 1, 1)
    added = steps["one file added"]
    assert (added["loaded"], added["added"]) == (1, 1)
    touched = steps["one file touched (mtime changed, same bytes)"]
    assert (touched["loaded"], touched["hashed"], touched["changed"]) == (0, 1, 0)


def test_the_operators_stages_find_cases_and_hits(tmp_path, bench):
    """Section ``operators``: the build and the query stage (the analyzer's ``dropped`` and
    ``terms``, ``Database.query_plan``'s suggestions, highlighting) on a corpus replicated three
    times: every case has a phrase, an exclusion, a prefix, a misspelling; each variant finds hits."""
    from ragbench.sections import operators as stage

    paths = write_corpus(tmp_path / "data", 900, 30, copies=3)
    index = tmp_path / "index"
    built = stage._stage_build({"index_dir": str(index), "docs": str(paths["docs"])})
    assert built["chunks"] == 900

    out = stage._stage_query({"index_dir": str(index), "docs": str(paths["docs"]), "base_docs": str(paths["base"]),
                              "queries": str(paths["queries"])})
    assert out["base_docs"] == 300 and out["cases"] >= 10
    assert 0 < out["excluded_df"] < 300
    assert set(out["variants"]) == set(stage.VARIANTS)
    for name, v in out["variants"].items():
        assert v["n"] == out["cases"], name
        assert v["hits"] > 0, name  # (for did_you_mean: the misspelled word's suggestions)
    assert out["suggested"] == out["variants"]["did_you_mean"]["hits"]
    ex = out["example"]
    assert ex["phrase"] == f'"{ex["words"]}"' and "*" in ex["prefix"] and "~" in ex["fuzzy"]


def test_the_tfidf_stage_reaches_the_private_index(tmp_path, bench):
    """Section ``tfidf``: the norm recomputation is timed through ``Database._store.read()``,
    ``Database._index.sync()`` and ``Database._index.norms()``; the stage reports a failure of
    those as ``norms_error`` instead of raising, so that is what is checked here."""
    from ragbench.sections import tfidf as stage

    paths = write_corpus(tmp_path / "data", 500, 30)
    out = stage._stage_tfidf_norms({"index_dir": str(tmp_path / "tfidf"), "docs": str(paths["docs"]),
                                    "queries": str(paths["queries"]), "rounds": 3})
    assert "norms_error" not in out, out["norms_error"]
    assert out["chunks"] == 500 and out["rounds"] == 3 and out["build_s"] > 0
    for key in ("add", "tfidf_first", "tfidf_warm", "delete", "bm25_first", "bm25_warm", "norms"):
        assert out[key] is not None and out[key] >= 0, key


def test_the_update_split_stage_wraps_the_store_connection(tmp_path, bench, monkeypatch):
    """Section ``quality``'s ``update_split``: it wraps ``Database._store.conn`` and the analyzer's
    ``term_counts`` / ``term_counts_many`` to split an add's and a delete's time; both parts must
    be seen (a wrapper that ragdb no longer calls would report 0 ms of SQL or of analysis)."""
    from ragbench.common import UPDATE_OPS
    from ragbench.corpora import pick_victims
    from ragbench.sections import quality as stage
    from ragdb.text import analysis

    for name in ("term_counts", "term_counts_many"):  # the stage wraps them for good (a worker ends after it)
        monkeypatch.setattr(analysis.Analyzer, name, getattr(analysis.Analyzer, name))
    n = 300
    paths = write_corpus(tmp_path / "data", n, 1)
    index = tmp_path / "index"
    build(bench, paths, index)
    victims = pick_victims(paths["docs"], n)
    assert len(victims) == UPDATE_OPS
    out = stage._stage_update_split({"index_dir": str(index), "docs": str(paths["docs"]), "lang": "en",
                                     "n_docs": n, "round": 0, "victims": victims})
    assert out["add"]["sql_ms"] > 0 and out["add"]["analysis_ms"] > 0
    assert out["delete"]["sql_ms"] > 0
    for op in ("add", "delete"):
        assert out[op]["total_ms"] >= out[op]["sql_ms"], op
    import ragdb

    with ragdb.open(str(index / "ragdb.db")) as db:  # the adds and deletes happened
        assert db.stats().chunks == n + UPDATE_OPS - len(victims)
        assert not list(db.documents(victims[0][0]))


def test_the_bm25_reference_ranks_as_ragdb(tmp_path, bench):
    """Section ``scale``'s exhaustive reference (``bm25_reference``): it scores every document
    with ragdb's analyzer config and ``ragdb.index.scoring``'s functions as ragdb's exhaustive
    path does, so its top 100 is ragdb's (the section compares them with ``reference.compare``)."""
    from ragbench import reference

    n, nq = 1_000, 30
    paths = write_corpus(tmp_path / "data", n, nq)
    index = tmp_path / "index"
    build(bench, paths, index)
    spec = {"docs": str(paths["docs"]), "queries": str(paths["queries"]), "n_docs": n, "k": 100, "workers": 1}
    ref = reference.stage_reference(spec)
    assert (ref["plain"], ref["queries"], ref["stats"]["docs"]) == (nq, nq, n)
    assert ref["stats"]["en"]["docs"] == n and ref["stats"]["vocabulary"] > 100
    run = bench.worker({"stage": "query", "system": "ragdb", "lang": "en", "index_dir": str(index),
                        "queries": str(paths["queries"]), "k": 100})["run"]
    agree = reference.compare(run, ref["run"], ref["scores"])
    assert agree["queries"] == nq and agree["n_differ"] == 0, agree
    assert agree["same_all"] == nq, agree


def test_the_refusal_stage_scores_judged_and_off_topic_questions(tmp_path, bench):
    """Section ``refusal``: best hit confidences (``ragdb.index.confidence.best_confidence``) of
    judged queries and of the repository's off-topic questions, the database's own calibration,
    and smaller databases cut from the corpus with their floors (``Database.min_confidence``)."""
    from ragbench.sections import refusal as stage

    nq = 20
    paths = write_corpus(tmp_path / "data", 400, nq)
    out = stage._stage_refusal({"docs": str(paths["docs"]), "queries": str(paths["queries"]),
                                "relevant": str(paths["relevant"]), "lang": "en", "prompt_k": stage.PROMPT_K,
                                "off_topic": {k: str(v) for k, v in stage.OFF_TOPIC.items()}, "subsets": [60]})
    assert out["chunks"] == 400 and 0 < out["default"] < 1
    off = {lang: len(stage._questions(path)) for lang, path in stage.OFF_TOPIC.items()}
    for scorer in ("bm25", "tfidf"):
        r = out[scorer]
        assert len(r["judged"]) == nq and all(c > 0 for c in r["judged"]), scorer  # cut from a document
        assert {lang: len(r[f"off_{lang}"]) for lang in off} == off
        zero = sum(c == 0.0 for lang in off for c in r[f"off_{lang}"])  # made-up words: theirs are not here
        assert zero >= 0.9 * sum(off.values()), (scorer, zero)
    [sub] = out["subsets"]
    assert sub["size"] == 60 and len(sub["floors"]) == stage.SUBSET_REPEATS
    assert sub["judged"] and len(sub["off"]) == off["en"] * stage.SUBSET_REPEATS
    assert sub["off_refused_self"] >= 0.9 * len(sub["off"])  # under each database's own floor
