"""A database calibrates its refusal floor on itself (issue 30, item 5): questions made from
its own chunks against bundled off-topic questions, stored in its settings, made again as it
grows; a small base answers the question its one document answers; a floor the user set wins."""

from __future__ import annotations

import pytest

import ragdb
from ragdb.answers import evaluation
from ragdb.answers.evaluation import (SELF_CALIBRATION, SelfCalibration, bundled_off_topic, needs_recalibration,
                                      pseudo_questions, self_calibrate)
from ragdb.index.confidence import DEFAULT_MIN_CONFIDENCE

REFUND = "Refunds are accepted within 30 days of purchase."

# A small manual: each passage answers one of ON_TOPIC; general questions share some of its words.
MANUAL = [
    "The capital account records investment flows into and out of a company; a capital "
    "increase needs the approval of the shareholders' meeting.",
    "The world map widget draws every region of the sales world on one page; the largest region "
    "is shown first.",
    "Population statistics of the customer base are refreshed every night; a population below "
    "ten customers is hidden for privacy.",
    "Invoices are numbered per year; a cancelled invoice keeps its number and is marked void.",
    "The export button writes the ledger as CSV, with one line per booking and a header line.",
    "Payment reminders are sent seven days after the due date, and again after fourteen days.",
    "A supplier is blocked when its bank details fail validation; unblock it after correcting them.",
    "Cost centres group expenses by department; each booking line names exactly one cost centre.",
]
ON_TOPIC = ["When are payment reminders sent?", "How are cancelled invoices numbered?",
            "What does the export button write?", "Why is a supplier blocked?",
            "What do cost centres group?"]


def test_bundled_questions_are_split_and_bilingual():
    for lang in ("en", "zh"):
        cal, held, every = (bundled_off_topic(lang, part) for part in ("calibration", "held_out", "all"))
        assert len(every) == 200 and len(cal) == 150 and len(held) == 50
        assert not set(cal) & set(held) and sorted(cal + held) == sorted(every)
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in q) for q in bundled_off_topic("zh"))
    with pytest.raises(ragdb.errors.InvalidInput, match="not bundled"):
        bundled_off_topic("fr")


def test_pseudo_questions_are_windows_of_sentences():
    texts = ["One two three four five six seven eight nine ten eleven. Short.",
             "检索增强生成是一种把检索和生成结合起来的方法，它让回答有据可查。", "tiny"]
    qs = pseudo_questions(texts)
    assert qs == pseudo_questions(texts)  # deterministic
    assert len(qs) == 2
    assert len(qs[0].split()) == evaluation.PSEUDO_WORDS and qs[0] in texts[0].replace(".", "")
    assert len(qs[1]) == 2 * evaluation.PSEUDO_WORDS and qs[1] in texts[1]


def test_floor_refuses_off_topic_but_never_more_than_it_answers():
    texts = ["alpha beta gamma delta epsilon zeta eta theta iota kappa."] * 20
    off = {q: 0.2 if i % 2 else 0.1 for i, q in enumerate(bundled_off_topic("en"))}
    # off-topic questions reach 0.2, own questions 0.9: the floor sits half again above 0.2
    cal = self_calibrate(lambda q: off.get(q, 0.9), texts, 20)
    assert cal.languages == ("en",)
    assert cal.floor == pytest.approx(evaluation.OFF_TOPIC_FACTOR * 0.2 + evaluation.MARGIN)
    assert cal.off_topic_refused == 1.0 and cal.pseudo_answered == 1.0
    # own questions as weak as 0.4: answering wins, the floor drops to their discounted 5th percentile
    cal = self_calibrate(lambda q: off.get(q, 0.4), texts, 20)
    assert cal.floor == pytest.approx(evaluation.PSEUDO_DISCOUNT * 0.4)
    assert cal.pseudo_answered == 1.0 and cal.off_topic_refused == 0.5
    assert SelfCalibration.from_setting(cal.to_setting()) == cal
    assert SelfCalibration.from_setting({"floor": "x"}) is None


def test_recalibration_follows_growth():
    cal = SelfCalibration(0.1, 100, ("en",), 0.0, 1.0, 0.5, 1.0)
    assert not needs_recalibration(cal, 115) and not needs_recalibration(cal, 85)
    assert needs_recalibration(cal, 121) and needs_recalibration(cal, 79) and needs_recalibration(None, 5)


def test_the_refund_example_is_answered_on_a_one_document_base(tmp_path):
    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add(REFUND, source="policy/refunds.md")
        p = db.build_prompt("How long is the refund window for a purchase?")
        assert not p.refused and p.sources[0].source == "policy/refunds.md"
        assert p.min_confidence < p.confidence
        assert db.build_prompt("What is the capital of Mongolia?").refused
        assert db.build_prompt("蒙古的首都是哪里？").refused


def test_a_manual_answers_its_questions_and_refuses_others(tmp_path):
    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add_many({"text": t, "source": f"manual/{i}.md"} for i, t in enumerate(MANUAL))
        for q in ON_TOPIC:
            assert not db.build_prompt(q).refused, q
        for q in ("Who painted the Mona Lisa?", "How do I bake sourdough bread?", "珠穆朗玛峰有多高？"):
            assert db.build_prompt(q).refused, q
        cal = db.self_calibration()
        assert cal is not None and cal.languages == ("en",) and cal.chunks == len(MANUAL)
        assert cal.floor <= evaluation.PSEUDO_DISCOUNT * cal.pseudo_p5 + 1e-9


def test_calibration_is_stored_reused_and_redone_as_the_base_grows(tmp_path):
    path = str(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        db.add_many({"text": t, "source": f"manual/{i}.md"} for i, t in enumerate(MANUAL))
        assert SELF_CALIBRATION not in db.settings
        floor = db.min_confidence
        stored = SelfCalibration.from_setting(db.settings[SELF_CALIBRATION])
        assert stored is not None and stored.floor == floor and stored.chunks == len(MANUAL)
    with ragdb.open(path) as db:
        assert db.self_calibration() == stored  # read back, not made again
        db.add(REFUND, source="policy/refunds.md")  # 8 -> 9 chunks: within a fifth
        assert db.self_calibration() == stored
        db.add_many({"text": f"Note {i}: the archive keeps closed years for ten years.", "source": f"n/{i}"}
                    for i in range(3))
        again = db.self_calibration()
        assert again is not None and again.chunks == len(MANUAL) + 4
        assert SelfCalibration.from_setting(db.settings[SELF_CALIBRATION]) == again


def test_a_floor_set_by_hand_wins_and_default_returns_to_the_measured_one(tmp_path):
    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add(REFUND, source="policy/refunds.md")
        measured = db.min_confidence
        db.set_min_confidence(0.5)
        assert db.min_confidence == 0.5
        assert db.build_prompt("How long is the refund window for a purchase?").refused
        db.set_min_confidence(None)
        assert db.min_confidence == measured


def test_empty_and_read_only_bases(tmp_path):
    path = str(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        assert db.self_calibration() is None and db.min_confidence == DEFAULT_MIN_CONFIDENCE
        db.add(REFUND, source="policy/refunds.md")
    with ragdb.open(path, readonly=True) as db:
        assert not db.build_prompt("How long is the refund window for a purchase?").refused
        assert SELF_CALIBRATION not in db.settings  # measured, kept in memory only
    with ragdb.open(path) as db, db.transaction():
        assert db.self_calibration() is not None  # inside a transaction: not stored, no error


def test_postgres_calibrates_like_sqlite(tmp_path, pg_url):
    floors = []
    for path in (str(tmp_path / "kb.db"), pg_url):
        with ragdb.open(path) as db:
            db.add_many({"text": t, "source": f"manual/{i}.md"} for i, t in enumerate(MANUAL))
            floors.append(db.self_calibration())
            assert not db.build_prompt("When are payment reminders sent?").refused
        with ragdb.open(path) as db:
            assert SelfCalibration.from_setting(db.settings[SELF_CALIBRATION]) == floors[-1]
    assert floors[0] == floors[1]


def test_a_prompt_does_not_wait_for_or_fail_on_another_writer(tmp_path):
    """build_prompt, a read, stores the calibration it measured. It took the write lock for that,
    so while another process was writing (a long add or sync) a prompt waited the whole busy
    timeout and then raised DatabaseBusy, where searches went on: a read must neither wait for a
    writer nor fail because of one. Now the calibration is stored only when the lock is free at
    once, and kept in memory otherwise (stored by a later prompt)."""
    import sqlite3

    path = str(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        db.add_many({"text": t, "source": f"manual/{i}.md"} for i, t in enumerate(MANUAL))
    reader = ragdb.open(path, busy_timeout=5)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process in the middle of a write, for longer than any timeout
    try:
        assert not reader.build_prompt(ON_TOPIC[0]).refused  # (before the fix: 5 s, then DatabaseBusy)
        measured = reader.self_calibration()
        assert measured is not None and SELF_CALIBRATION not in reader.settings
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert reader.build_prompt(ON_TOPIC[0]).sources  # the lock is free now: stored
    assert SelfCalibration.from_setting(reader.settings[SELF_CALIBRATION]) == measured
    # the handle's busy timeout is its own again (5 s), not the 0 the store's attempt used
    assert reader._engine.store.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    reader.add(REFUND, source="policy/refunds.md")
    reader.close()


def test_a_prompt_beside_another_writer_keeps_the_in_memory_view(tmp_path):
    """Storing the calibration found the write lock taken (DatabaseBusy at BEGIN IMMEDIATE): no
    write began, nothing in memory changed. Engine.writing dropped the whole view all the same
    (the index and the vectors, reloaded from the file by the next search), at every prompt for
    as long as another process wrote."""
    import sqlite3

    path = str(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        db.add_many({"text": t, "source": f"manual/{i}.md"} for i, t in enumerate(MANUAL))
    reader = ragdb.open(path, busy_timeout=5)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        reader.build_prompt(ON_TOPIC[0])  # measures the calibration; cannot store it
        eng = reader._engine
        index, vectors = eng.index, eng.vectors
        reader.build_prompt(ON_TOPIC[0])  # tries to store it again, and cannot
        assert eng.index is index and eng.vectors is vectors
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        reader.close()
