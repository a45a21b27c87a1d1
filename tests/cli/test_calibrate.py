"""``ragdb calibrate`` (issue 30, item 5) and ``ragdb search --all-copies`` (item 7)."""

from __future__ import annotations

import ragdb
from tests.cli_helpers import out_json, run

MANUAL = ["Payment reminders are sent seven days after the due date, and again after fourteen days.",
          "Invoices are numbered per year; a cancelled invoice keeps its number and is marked void.",
          "The export button writes the ledger as CSV, with one line per booking and a header line."]


def test_calibrate_without_files_shows_the_measured_floor(tmp_path, runner):
    db = tmp_path / "kb.db"
    with ragdb.open(str(db)) as d:
        d.add_many({"text": t, "source": f"m/{i}.md"} for i, t in enumerate(MANUAL))
    data = out_json(run(runner, "-d", db, "calibrate", "--json"))
    assert data["self_calibration"]["chunks"] == 3 and data["stored_min_confidence"] is None
    assert data["min_confidence"] == data["self_calibration"]["floor"]
    table = run(runner, "-d", db, "calibrate").stdout
    assert "self-calibrated floor" in table and "off-topic refused" in table


def test_calibrate_with_question_files_stores_a_floor(tmp_path, runner):
    db = tmp_path / "kb.db"
    with ragdb.open(str(db)) as d:
        d.add_many({"text": t, "source": f"m/{i}.md"} for i, t in enumerate(MANUAL))
    answerable = tmp_path / "answerable.txt"
    answerable.write_text("# mine\nWhen are payment reminders sent?\nHow are cancelled invoices numbered?\n",
                          encoding="utf-8")
    off = tmp_path / "off.jsonl"
    off.write_text('{"text": "Who painted the Mona Lisa?"}\n', encoding="utf-8")
    dry = out_json(run(runner, "-d", db, "calibrate", "--answerable", answerable, "--off-topic", off,
                       "--dry-run", "--json"))
    assert dry["stored"] is False and dry["answerable"] == 2 and dry["off_topic"] == 1 + 300
    with ragdb.open(str(db)) as d:
        assert d.settings.get("min_confidence") is None
    data = out_json(run(runner, "-d", db, "calibrate", "--answerable", answerable, "--off-topic", off,
                        "--no-bundled", "--json"))
    assert data["stored"] is True and data["off_topic"] == 1 and data["answerable_refused"] == 0
    with ragdb.open(str(db)) as d:
        assert d.min_confidence == data["min_confidence"] > 0
    bad = run(runner, "-d", db, "calibrate", "--off-topic", off, ok=False)
    assert bad.exit_code == 2 and "--answerable" in bad.output


def test_search_names_copies_and_all_copies_lists_them(tmp_path, runner):
    db = tmp_path / "kb.db"
    text = MANUAL[0]
    with ragdb.open(str(db)) as d:
        d.add_many([{"text": text, "source": "a.md"}, {"text": "<p>" + text + "</p>", "source": "a.html"}])
    hits = out_json(run(runner, "-d", db, "search", "payment reminders", "--json"))
    assert len(hits) == 1 and [c["source"] for c in hits[0]["duplicates"]] == ["a.html"]
    assert "also in: a.html" in run(runner, "-d", db, "search", "payment reminders").stdout
    every = out_json(run(runner, "-d", db, "search", "payment reminders", "--all-copies", "--json"))
    assert len(every) == 2 and all("duplicates" not in h for h in every)
