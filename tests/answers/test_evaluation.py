"""Tests of ragdb.answers.evaluation: hand-computed metric values and the BEIR loader."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from ragdb.errors import InvalidInput
from ragdb.answers.evaluation import (
    best_confidences,
    calibrate_questions,
    calibrate_refusal,
    evaluate,
    evaluate_database,
    load_beir,
    load_questions,
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
)

LOG3 = math.log2(3)


# ---------------------------------------------------------------- metrics


def test_binary_case_by_hand():
    # relevant: d2 (rank 2) and d4 (not retrieved)
    ranked = ["d1", "d2", "d3"]
    qrels = {"d2": 1, "d4": 1}
    # DCG = 1/log2(3); IDCG = 1 + 1/log2(3)
    assert ndcg_at_k(ranked, qrels, 3) == pytest.approx((1 / LOG3) / (1 + 1 / LOG3))
    assert ndcg_at_k(ranked, qrels, 3) == pytest.approx(0.3868528)
    assert recall_at_k(ranked, qrels, 3) == 0.5
    assert mrr_at_k(ranked, qrels, 3) == 0.5
    # cut at 1: nothing relevant in the top 1
    assert ndcg_at_k(ranked, qrels, 1) == 0.0
    assert recall_at_k(ranked, qrels, 1) == 0.0
    assert mrr_at_k(ranked, qrels, 1) == 0.0


def test_perfect_and_empty_rankings():
    qrels = {"a": 1, "b": 1}
    assert ndcg_at_k(["a", "b", "x"], qrels, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["b", "a"], qrels, 10) == pytest.approx(1.0)
    assert recall_at_k(["b", "a"], qrels, 10) == 1.0
    assert mrr_at_k(["b", "a"], qrels, 10) == 1.0
    assert ndcg_at_k([], qrels, 10) == 0.0
    assert recall_at_k([], qrels, 10) == 0.0
    assert mrr_at_k([], qrels, 10) == 0.0
    # no relevant document at all
    assert ndcg_at_k(["a"], {"a": 0}, 10) == 0.0
    assert recall_at_k(["a"], {}, 10) == 0.0


def test_ideal_dcg_is_cut_at_k():
    # three relevant docs, k=2: IDCG = 1 + 1/log2(3); ranking finds one at rank 1
    qrels = {"a": 1, "b": 1, "c": 1}
    assert ndcg_at_k(["a", "x"], qrels, 2) == pytest.approx(1 / (1 + 1 / LOG3))
    assert recall_at_k(["a", "x"], qrels, 2) == pytest.approx(1 / 3)


def test_graded_gains_by_hand():
    ranked = ["a", "b", "c"]
    qrels = {"a": 1, "c": 2}
    # linear: DCG = 1/1 + 2/log2(4) = 2; IDCG = 2/1 + 1/log2(3)
    assert ndcg_at_k(ranked, qrels, 3) == pytest.approx(2 / (2 + 1 / LOG3))
    assert ndcg_at_k(ranked, qrels, 3) == pytest.approx(0.7601875)
    # exponential: DCG = 1 + 3/2 = 2.5; IDCG = 3 + 1/log2(3)
    assert ndcg_at_k(ranked, qrels, 3, gain="exponential") == pytest.approx(2.5 / (3 + 1 / LOG3))
    # binary judgements: both gains agree
    binary = {"a": 1, "c": 1}
    assert ndcg_at_k(ranked, binary, 3) == pytest.approx(ndcg_at_k(ranked, binary, 3, gain="exponential"))
    with pytest.raises(InvalidInput):
        ndcg_at_k(ranked, qrels, 3, gain="cubic")


def test_repeated_ids_count_once():
    # "x" twice must not push "a" out of the top 2
    assert mrr_at_k(["x", "x", "a"], {"a": 1}, 2) == 0.5
    assert recall_at_k(["a", "a"], {"a": 1, "b": 1}, 10) == 0.5


def test_bad_k():
    with pytest.raises(InvalidInput):
        ndcg_at_k(["a"], {"a": 1}, 0)
    with pytest.raises(InvalidInput):
        evaluate({}, {}, k_values=(0,))


def test_evaluate_means_and_skips_unjudged():
    qrels = {
        "q1": {"d2": 1, "d4": 1},  # ndcg@3 = 0.38685, recall 0.5, mrr 0.5
        "q2": {"a": 1},  # found at rank 1: all 1.0
        "q3": {"z": 0},  # no relevant judgement: skipped
        "q4": {"b": 1},  # absent from the run: scores 0
    }
    run = {"q1": ["d1", "d2", "d3"], "q2": ["a"], "q3": ["z"], "q5": ["whatever"]}
    result = evaluate(run, qrels, k_values=(3,))
    assert result["queries"] == 3
    assert result["missing"] == 1
    assert result["ndcg@3"] == pytest.approx((0.3868528 + 1.0 + 0.0) / 3)
    assert result["recall@3"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert result["mrr@3"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    default = evaluate(run, qrels)
    assert set(default) >= {"ndcg@10", "recall@100", "mrr@10", "ndcg@100", "recall@10", "mrr@100"}
    assert evaluate({}, {})["ndcg@10"] == 0.0


# ---------------------------------------------------------------- loader


def _write_beir(folder, *, queries_name="queries.jsonl", qrels_name="qrels.tsv"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "Cats", "text": "Cats purr."}\n'
        "\n"
        '{"_id": 2, "text": "Dogs bark."}\n'
        '{"_id": "d3", "title": "鸟", "text": "鸟会飞。"}\n',
        encoding="utf-8",
    )
    (folder / queries_name).write_text(
        '{"_id": "q1", "text": "purring cats"}\n{"_id": "q2", "text": "barking", "answers": ["x"]}\n',
        encoding="utf-8",
    )
    (folder / qrels_name).write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\t2\t1\nq2\td3\t0\n", encoding="utf-8"
    )
    return folder


def test_load_beir_folder(tmp_path):
    corpus, queries, qrels = load_beir(_write_beir(tmp_path / "beir"))
    assert corpus == [("d1", "Cats", "Cats purr."), ("2", "", "Dogs bark."), ("d3", "鸟", "鸟会飞。")]
    assert queries == {"q1": "purring cats", "q2": "barking"}
    assert qrels == {"q1": {"d1": 1}, "q2": {"2": 1, "d3": 0}}


def test_files_saved_with_a_byte_order_mark_read_as_without(tmp_path):
    """Windows editors start a UTF-8 file with a BOM: a corpus or queries file was refused as
    invalid JSON, a qrels file without a header line gave its first query the id '\ufeffq1'
    (never matched), and a question file's first question began with it."""
    from ragdb.answers.evaluation import load_questions

    folder = _write_beir(tmp_path / "beir")
    want = load_beir(folder)
    qrels = folder / "qrels.tsv"
    qrels.write_text("q1\td1\t1\nq2\t2\t1\nq2\td3\t0\n", encoding="utf-8")  # no header line
    for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv"):
        path = folder / name
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load_beir(folder) == want
    (tmp_path / "q.txt").write_bytes("\ufeffwhy do cats purr\n# a comment\n".encode())
    assert load_questions(tmp_path / "q.txt") == ["why do cats purr"]
    assert load_questions(folder / "queries.jsonl") == ["purring cats", "barking"]


def test_an_integer_id_past_64_bits_is_that_id(tmp_path):
    """orjson read it as a float: the corpus was refused ("'_id' must be a string, got float")."""
    folder = _write_beir(tmp_path / "beir")
    big = 2 ** 70 + 1
    (folder / "corpus.jsonl").write_text(f'{{"_id": {big}, "text": "Cats purr."}}\n', encoding="utf-8")
    (folder / "queries.jsonl").write_text(f'{{"_id": {big}, "text": "purring"}}\n', encoding="utf-8")
    (folder / "qrels.tsv").write_text(f"{big}\t{big}\t1\n", encoding="utf-8")
    assert load_beir(folder) == ([(str(big), "", "Cats purr.")], {str(big): "purring"}, {str(big): {str(big): 1}})


def test_load_beir_explicit_paths(tmp_path):
    folder = _write_beir(tmp_path / "beir")
    paths = (folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels.tsv")
    assert load_beir(paths) == load_beir(folder)
    mapping = {"corpus": str(paths[0]), "queries": str(paths[1]), "qrels": str(paths[2])}
    assert load_beir(mapping) == load_beir(folder)


def test_load_beir_split_choice(tmp_path):
    folder = _write_beir(tmp_path / "beir", queries_name="queries-train.jsonl", qrels_name="qrels-train.tsv")
    (folder / "queries-test.jsonl").write_text('{"_id": "t1", "text": "birds"}\n', encoding="utf-8")
    (folder / "qrels-test.tsv").write_text("t1\td3\t1\n", encoding="utf-8")  # no header
    with pytest.raises(InvalidInput, match="split"):
        load_beir(folder)
    _, queries, qrels = load_beir(folder, split="test")
    assert queries == {"t1": "birds"} and qrels == {"t1": {"d3": 1}}
    _, queries, _ = load_beir(folder, split="train")
    assert set(queries) == {"q1", "q2"}


def test_load_beir_qrels_subfolder(tmp_path):
    folder = _write_beir(tmp_path / "beir")
    (folder / "qrels.tsv").unlink()
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\n", encoding="utf-8")
    _, _, qrels = load_beir(folder, split="test")
    assert qrels == {"q1": {"d1": 2}}


def test_load_beir_errors_name_file_and_line(tmp_path):
    folder = _write_beir(tmp_path / "beir")
    corpus = folder / "corpus.jsonl"
    corpus.write_text('{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": \n', encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"corpus\.jsonl:2: invalid JSON"):
        load_beir(folder)
    corpus.write_text('{"_id": "d1", "text": "ok"}\n{"text": "no id"}\n', encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"corpus\.jsonl:2: missing '_id'"):
        load_beir(folder)
    corpus.write_text('{"_id": "d1"}\n{"_id": "d1"}\n', encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"corpus\.jsonl:2: duplicate _id"):
        load_beir(folder)
    corpus.write_text('["not", "an", "object"]\n', encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"corpus\.jsonl:1: expected a JSON object"):
        load_beir(folder)
    _write_beir(folder)
    (folder / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"qrels\.tsv:2: expected 3 tab-separated columns"):
        load_beir(folder)
    (folder / "qrels.tsv").write_text("q1\td1\t1\nq1\td2\thigh\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"qrels\.tsv:2: score 'high'"):
        load_beir(folder)
    with pytest.raises(InvalidInput, match="not a folder"):
        load_beir(tmp_path / "nowhere")
    with pytest.raises(InvalidInput, match="no such file"):
        load_beir((corpus, folder / "missing.jsonl", folder / "qrels.tsv"))
    (folder / "corpus.jsonl").unlink()
    with pytest.raises(InvalidInput, match="corpus.jsonl"):
        load_beir(folder)


# ---------------------------------------------------------------- evaluate_database


@dataclass
class _Hit:
    source: str
    score: float


class _FakeDb:
    """Stands in for ragdb.Database: returns canned hits, records the calls."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def search(self, query, k=10, scorer="bm25", **kwargs):
        self.calls.append((query, k, scorer, kwargs))
        return [_Hit(s, 1.0) for s in self.answers.get(query, [])][:k]


def test_evaluate_database_maps_sources_and_dedupes():
    queries = {"q1": "cats", "q2": "dogs", "q3": "unjudged"}
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    # q1: two chunks of d9 then d1 -> d1 is the 2nd distinct source
    db = _FakeDb({"cats": ["d9", "d9", "d1"], "dogs": ["d2"]})
    result = evaluate_database(db, queries, qrels, k=10, scorer="tfidf", where={"lang": "en"})
    assert result["queries"] == 2
    assert result["mrr@10"] == pytest.approx((0.5 + 1.0) / 2)
    assert result["recall@10"] == 1.0
    # only judged queries are searched, with the scorer and extra arguments passed on
    assert sorted(c[0] for c in db.calls) == ["cats", "dogs"]
    assert all(c[1:] == (10, "tfidf", {"where": {"lang": "en"}}) for c in db.calls)


def test_evaluate_database_counts_the_copies_a_hit_stands_for():
    """A search keeps one hit per passage; a judged document repeating another's text came back
    only as that hit's duplicate, and the run left it out (recall 0.5 of two identical relevant
    documents, where an exhaustive ranking finds both)."""
    import ragdb

    db = ragdb.open(":memory:", chunker="none")
    text = "Refunds are accepted within 30 days of purchase."
    db.add_many([{"text": text, "source": "d1"}, {"text": "Shipping takes five business days.", "source": "d2"},
                 {"text": text, "source": "d5"}])
    qrels = {"q1": {"d1": 1, "d5": 1}}
    result = evaluate_database(db, {"q1": "refund within 30 days"}, qrels, k=10)
    assert result["recall@10"] == 1.0 and result["ndcg@10"] == pytest.approx(1.0)
    assert result == evaluate_database(db, {"q1": "refund within 30 days"}, qrels, k=10, collapse=False)


def test_bad_arguments_are_invalid_input_not_python_errors():
    """A k that is not an integer, questions that are not strings (or one string, which was read as a
    list of its characters) and paths that are not paths raised TypeError, ValueError or AttributeError
    (or ran on the characters); evaluate's k_values=[1.5] was silently k=1."""
    import numpy as np

    import ragdb

    db = ragdb.open(":memory:")
    db.add("Cats sit on mats.", source="d1")
    bad = [
        lambda: evaluate_database(db, {"q": "cats"}, {"q": {"d1": 1}}, k="10"),
        lambda: evaluate({"q": ["d1"]}, {"q": {"d1": 1}}, k_values=[1.5]),
        lambda: evaluate({}, {}, k_values=["a"]),
        lambda: evaluate({"q": ["d1"]}, {"q": {"d1": 1}}, k_values=10),  # (TypeError: not iterable)
        lambda: evaluate({"q": ["d1"]}, {"q": {"d1": 1}}, k_values=None),
        lambda: ndcg_at_k(["d1"], {"d1": 1}, "3"),
        lambda: ndcg_at_k(["d1"], {"d1": 1}, None),
        lambda: recall_at_k(["d1"], {"d1": 1}, 2.0),
        lambda: mrr_at_k(["d1"], {"d1": 1}, True),
        lambda: best_confidences(db, [None]),
        lambda: best_confidences(db, "cats"),
        lambda: calibrate_questions(db, ["cats", None], []),
        lambda: calibrate_refusal(db, {"q": "cats"}, {"q": {"d1": 1}}, off_topic="what"),
        lambda: load_beir(None),
        lambda: load_beir([1, 2, 3]),
        lambda: load_questions(5),
    ]
    for call in bad:
        with pytest.raises(InvalidInput):
            call()
    with pytest.raises(InvalidInput, match="k_values must be a list of integers, got str"):
        evaluate({"q": ["d1"]}, {"q": {"d1": 1}}, k_values="10")  # (was read as its characters: 'got '1'')
    assert evaluate({"q": ["d1"]}, {"q": {"d1": 1}}, k_values=[np.int64(1)])["ndcg@1"] == 1.0
