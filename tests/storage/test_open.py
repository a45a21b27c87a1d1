"""Opening a database: damaged settings, empty files and ``create=``, and access
settings that change only through an explicit call (issue 13, items 6 and 9)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

import ragdb
from ragdb.errors import InvalidInput, NotADatabase, RagdbError, StorageError

from cli_helpers import out_json, run

PUBLIC_QUERY = "alpha"


def empty_file(path):
    """A zero-byte file last modified an hour ago (not one being created right now)."""
    path.write_bytes(b"")
    old = time.time() - 3600
    os.utime(path, (old, old))
    return path


def make_db(path, **kwargs):
    """A database with one unlabeled and one labeled document."""
    with ragdb.open(path, **kwargs) as db:
        db.add("alpha open text", source="open")
        db.add("alpha closed text", source="closed", acl=["staff"])
    return path


def visible(db, principals=("outsider",)):
    return sorted(h.source for h in db.search(PUBLIC_QUERY, principals=list(principals)))


def sql(path, statement, params=()):
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(statement, params)
    finally:
        conn.close()


def stored_settings(path):
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT key, value FROM settings"))
    finally:
        conn.close()


# ----------------------------------------------------------------------------- 6: damaged settings


@pytest.mark.parametrize("value", ["{not json", "", "[1, 2", "nan", "\x00"])
def test_a_setting_that_is_not_json_is_a_storage_error_naming_file_and_key(tmp_path, value):
    path = make_db(tmp_path / "kb.db")
    sql(path, "UPDATE settings SET value = ? WHERE key = 'chunker'", [value])
    with pytest.raises(StorageError) as e:
        ragdb.open(path)
    assert str(path) in str(e.value) and "'chunker'" in str(e.value) and "not valid JSON" in str(e.value)
    with pytest.raises(StorageError):
        ragdb.open(path, readonly=True)


@pytest.mark.parametrize("value", ['"false"', "0", "null", "[]"])
def test_an_access_flag_that_is_not_true_or_false_is_refused_not_guessed(tmp_path, value):
    path = make_db(tmp_path / "kb.db")
    sql(path, "UPDATE settings SET value = ? WHERE key = 'public_unlabeled'", [value])
    with pytest.raises(StorageError, match="'public_unlabeled'"):
        ragdb.open(path)


def test_the_cli_reports_a_damaged_setting_in_one_line(tmp_path, runner):
    path = make_db(tmp_path / "kb.db")
    sql(path, "UPDATE settings SET value = '{oops' WHERE key = 'keep_versions'")
    result = run(runner, "-d", path, "stats", ok=False)
    assert result.exit_code == 1
    assert "keep_versions" in result.output and "Traceback" not in result.output
    assert "internal error" not in result.output


# ----------------------------------------------------------------------------- 6: empty files and create=


@pytest.mark.parametrize("kwargs", [{}, {"create": None}, {"create": False}, {"readonly": True},
                                    {"readonly": True, "create": True}])
def test_an_empty_file_is_not_a_database_unless_created_explicitly(tmp_path, kwargs):
    path = empty_file(tmp_path / "empty.db")
    with pytest.raises(NotADatabase, match=r"not a ragdb database \(empty file\)") as e:
        ragdb.open(path, **kwargs)
    assert str(path) in str(e.value)
    assert path.stat().st_size == 0 and not (tmp_path / "empty.db-wal").exists()  # nothing written


def test_create_true_makes_an_empty_file_a_new_database(tmp_path):
    path = empty_file(tmp_path / "empty.db")
    with ragdb.open(path, create=True, keep_versions=True) as db:
        db.add("alpha", source="a")
        assert db.check() == []
    with ragdb.open(path) as db:  # now a database: the default opens it
        assert db.settings["keep_versions"] is True and db.stats().documents == 1


def test_create_on_a_missing_file(tmp_path):
    with pytest.raises(NotADatabase, match="no such database file"):
        ragdb.open(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    for create in (None, True):
        path = tmp_path / f"new-{create}.db"
        with ragdb.open(path, create=create) as db:
            assert db.check() == [] and "analyzer" in db.settings


def test_create_false_opens_an_existing_database(tmp_path):
    path = make_db(tmp_path / "kb.db")
    with ragdb.open(path, create=False) as db:
        assert db.stats().documents == 2


@pytest.mark.parametrize("create", [1, 0, "yes", "false", [], 1.0])
def test_create_must_be_none_or_a_bool(tmp_path, create):
    with pytest.raises(InvalidInput, match="create"):
        ragdb.open(tmp_path / "x.db", create=create)
    assert not (tmp_path / "x.db").exists()


def test_an_empty_file_being_created_by_someone_else_is_waited_for(tmp_path):
    """SQLite creates the file empty and writes its first page a moment later: a process
    opening it in between (create=None) must not take it for a stale empty file."""
    path = tmp_path / "racing.db"
    path.write_bytes(b"")  # fresh: just created

    def creator():
        time.sleep(0.1)
        ragdb.open(path, create=True).close()

    t = threading.Thread(target=creator)
    t.start()
    try:
        with ragdb.open(path) as db:
            assert "analyzer" in db.settings
    finally:
        t.join()


def test_many_openers_of_a_new_file_all_succeed(tmp_path):
    """Six threads open one new file at once, twenty times over: the switch to WAL mode,
    which SQLite refuses at once (no busy handler) while another connection looks at
    the file, is retried; it failed about one round in eight before."""
    for round_ in range(20):
        path = tmp_path / f"new{round_}.db"
        barrier = threading.Barrier(6)
        errors: list[BaseException] = []

        def opener(path=path, barrier=barrier, errors=errors):
            barrier.wait()
            try:
                ragdb.open(path).close()
            except BaseException as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

        threads = [threading.Thread(target=opener) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], f"round {round_}"
        with ragdb.open(path) as db:
            assert db.check() == []
        conn = sqlite3.connect(path)  # WAL mode is a property of the file
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()


def test_arguments_are_checked_before_the_file_is_made(tmp_path):
    for kwargs in ({"chunker": "zigzag"}, {"analyzer": "bogus"}, {"busy_timeout": -1},
                   {"public_unlabeled": "yes"}, {"keep_versions": 1}, {"embedder": 5}):
        with pytest.raises(RagdbError):
            ragdb.open(tmp_path / "never.db", **kwargs)
        assert not (tmp_path / "never.db").exists(), kwargs


@pytest.mark.parametrize("value", [-1, -0.5, float("nan"), float("inf"), 1e300, 10**12, None, "30", True])
def test_busy_timeout_is_a_number_in_range(tmp_path, value):
    with pytest.raises(InvalidInput, match="busy_timeout"):
        ragdb.open(tmp_path / "kb.db", busy_timeout=value)


@pytest.mark.parametrize("path", [b"kb.db", 5, None, "", "a\x00b.db", "\udcff.db", ["kb.db"]])
def test_path_must_be_text_sqlite_can_open(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput, match="path"):
        ragdb.open(path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("path", ["file:kb.db", "file::memory:?cache=shared", "file:kb.db?mode=ro"])
def test_an_sqlite_uri_is_refused_at_once(tmp_path, monkeypatch, path):
    """SQLite reads a name starting with 'file:' as a URI even without uri=True: 'file:kb.db'
    opened kb.db while ragdb had checked another path, and a shared in-memory URI waited the
    busy timeout (30 s) before failing to switch to WAL. './file:kb.db' is a file of that name."""
    monkeypatch.chdir(tmp_path)
    for readonly in (False, True):
        with pytest.raises(InvalidInput, match="SQLite URI"):
            ragdb.open(path, readonly=readonly, busy_timeout=1)
    assert os.listdir(tmp_path) == []
    with ragdb.open("./file:kb.db") as db:
        db.add("pump seal", source="a")
    assert sorted(os.listdir(tmp_path))[0] == "file:kb.db"
    with ragdb.open(tmp_path / "file:kb.db", readonly=True) as db:
        assert [h.source for h in db.search("pump")] == ["a"]


def test_a_path_the_system_refuses_to_probe_is_a_storage_error_naming_it(tmp_path):
    """A name too long for the file system (or a folder not to be entered) made Path.exists()
    raise Python's OSError out of ragdb.open."""
    for path in (tmp_path / ("x" * 300 + ".db"), tmp_path / ("x" * 300) / "kb.db"):
        with pytest.raises(StorageError, match="cannot open the database") as e:
            ragdb.open(path)
        assert str(path) in str(e.value)


def test_closing_inside_a_transaction_is_refused_and_the_block_rolls_back(tmp_path):
    """db.close() inside db.transaction() left the block's COMMIT on a closed connection
    (sqlite3.ProgrammingError); it is refused, the block's writes roll back, the handle stays open."""
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add("kept", source="k.md")
        with pytest.raises(InvalidInput, match="inside a write transaction"), db.transaction():
            db.add("gone", source="g.md")
            db.close()
        assert [d.source for d in db.documents()] == ["k.md"] and db.check() == []
        db.add("after", source="a.md")
    with ragdb.open(tmp_path / "kb.db") as db:
        assert sorted(d.source for d in db.documents()) == ["a.md", "k.md"]


def test_closing_inside_a_read_ends_it_and_the_read_says_the_handle_is_closed(tmp_path):
    """Closing in a loop over records() is allowed (the read is rolled back), as a with block
    ending in an exception does; the loop's next step said it failed unexpectedly, a bug in
    ragdb (SQLite's error on a closed connection, raised again by the read's rollback)."""
    db = ragdb.open(tmp_path / "kb.db")
    for i in range(3):
        db.add(f"doc {i}", source=f"s{i}")
    with pytest.raises(StorageError, match="this database handle is closed"):
        for _record in db.records(principals=ragdb.ALL):
            db.close()
    with ragdb.open(tmp_path / "kb.db") as again:
        assert again.count() == 3 and again.check() == []


@pytest.mark.parametrize("scorer", ["bm25", "tfidf", "vector", "hybrid"])
def test_a_search_of_a_closed_handle_says_it_is_closed_for_every_scorer(tmp_path, scorer):
    """A vector or hybrid search checks its restrictions before embedding the query, outside
    a read: on a closed handle (labels read anew, as after a write) it said the search failed
    unexpectedly, a bug in ragdb (InternalError of SQLite's ProgrammingError), where the
    lexical scorers say the handle is closed."""
    from ragdb.models.embeddings import HashEmbedder

    embedder = HashEmbedder(16)
    db = ragdb.open(tmp_path / "kb.db")
    db.add("apple pie", source="a")
    db.embed(embedder)
    db.close()
    with pytest.raises(StorageError, match="this database handle is closed"):
        db.search("apple", scorer=scorer, **({"embedder": embedder} if scorer in ("vector", "hybrid") else {}))


def test_cli_commands_refuse_an_empty_file_and_init_takes_it(tmp_path, runner):
    path = empty_file(tmp_path / "kb.db")
    doc = tmp_path / "doc.txt"
    doc.write_text("alpha beta gamma", encoding="utf-8")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "alpha", "source": "s"}\n', encoding="utf-8")
    for args in (["add", doc], ["import", jsonl], ["sync", tmp_path / "nothing-here"], ["search", "alpha"],
                 ["stats"], ["migrate"], ["config"]):
        if args[0] == "sync":
            (tmp_path / "nothing-here").mkdir(exist_ok=True)
        result = run(runner, "-d", path, *args, ok=False)
        assert result.exit_code == 1, (args, result.output)
        assert "empty file" in result.output and "Traceback" not in result.output, (args, result.output)
        assert path.stat().st_size == 0, args
    data = out_json(run(runner, "-d", path, "init", "--json"))
    assert data["created"] is True
    run(runner, "-d", path, "add", doc)
    assert out_json(run(runner, "-d", path, "stats", "--json"))["documents"] == 1


# ----------------------------------------------------------------------------- 9: public_unlabeled on open


def test_public_unlabeled_is_stored_at_creation(tmp_path):
    path = make_db(tmp_path / "kb.db", public_unlabeled=True)
    with ragdb.open(path) as db:
        assert db.settings["public_unlabeled"] is True and visible(db) == ["open"]
    with ragdb.open(path, public_unlabeled=True) as db:  # the stored value: fine
        assert visible(db) == ["open"]
    closed = make_db(tmp_path / "closed.db", public_unlabeled=False)
    with ragdb.open(closed) as db:
        assert db.settings["public_unlabeled"] is False and visible(db) == []
    with ragdb.open(closed, public_unlabeled=False) as db:  # the stored value: fine
        assert visible(db) == []
    default = make_db(tmp_path / "default.db")  # a new database: on
    with ragdb.open(default) as db:
        assert db.settings["public_unlabeled"] is True and visible(db) == ["open"]
    assert stored_settings(default)["public_unlabeled"] == "true"


@pytest.mark.parametrize("readonly", [False, True])
def test_opening_with_another_public_unlabeled_is_refused_and_changes_nothing(tmp_path, readonly):
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    before = stored_settings(path)
    with pytest.raises(InvalidInput) as e:
        ragdb.open(path, public_unlabeled=True, readonly=readonly)
    message = str(e.value)
    assert str(path) in message and "public_unlabeled" in message
    assert "set_public_unlabeled(True)" in message and "ragdb config public_unlabeled true" in message
    assert stored_settings(path) == before
    with ragdb.open(path) as db:
        assert db.settings["public_unlabeled"] is False and visible(db) == []


def test_another_process_opening_with_public_unlabeled_does_not_change_what_searches_see(tmp_path):
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    with ragdb.open(path) as db:
        assert visible(db) == []
        code = ("import sys, ragdb\n"
                "try:\n"
                "    ragdb.open(sys.argv[1], public_unlabeled=True).close()\n"
                "except ragdb.errors.InvalidInput as e:\n"
                "    print('refused:', e)\n"
                "    sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "refused:" in proc.stdout and "set_public_unlabeled" in proc.stdout
        assert visible(db) == []  # this connection
    with ragdb.open(path) as db:  # and every later open
        assert db.settings["public_unlabeled"] is False and visible(db) == []


def test_set_public_unlabeled_changes_the_file_and_this_connection_at_once(tmp_path):
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    with ragdb.open(path) as db:
        db.set_public_unlabeled(True)
        assert db.settings["public_unlabeled"] is True and visible(db) == ["open"]
        assert visible(db, ["staff"]) == ["closed", "open"]
        assert db.check() == []
    assert stored_settings(path)["public_unlabeled"] == "true"
    with ragdb.open(path) as db:
        assert visible(db) == ["open"]
        db.set_public_unlabeled(False)
        assert visible(db) == []
    with ragdb.open(path, public_unlabeled=False) as db:
        assert visible(db) == []


def test_other_open_connections_see_a_change_at_their_next_search(tmp_path):
    """A settings change advances the generation: every open connection, in this
    process or another, reads the settings again before its next search."""
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    with ragdb.open(path) as other, ragdb.open(path) as db:
        assert visible(other) == []  # searched once: its view is current
        db.set_public_unlabeled(True)
        assert visible(db) == ["open"]
        assert visible(other) == ["open"]
        other.set_public_unlabeled(False)
        assert visible(db) == [] and visible(other) == []
    code = "import sys, ragdb\nragdb.open(sys.argv[1]).set_public_unlabeled(True)\n"
    with ragdb.open(path) as db:
        assert visible(db) == []
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=120)
        assert visible(db) == ["open"]  # revoked or granted for open connections too
        code = code.replace("True", "False")
        subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=120)
        assert visible(db) == []


def test_keep_versions_set_elsewhere_applies_to_the_next_write(tmp_path):
    path = make_db(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        db.add("first text", source="v.md")
        with ragdb.open(path, keep_versions=True):
            pass
        db.add("second text", source="v.md")
        assert len(db.documents(source="v.md", versions="all")) == 2


@pytest.mark.parametrize("value", [1, 0, "true", None, [], 1.0])
def test_set_public_unlabeled_takes_a_bool(tmp_path, value):
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    with ragdb.open(path) as db:
        with pytest.raises(InvalidInput, match="public_unlabeled"):
            db.set_public_unlabeled(value)
        assert visible(db) == []
    assert stored_settings(path)["public_unlabeled"] == "false"


def test_set_public_unlabeled_is_refused_inside_a_transaction(tmp_path):
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    with ragdb.open(path) as db:
        with pytest.raises(InvalidInput, match="transaction"), db.transaction():
            db.add("alpha inside", source="inside")
            db.set_public_unlabeled(True)
        assert visible(db) == [] and db.settings["public_unlabeled"] is False
        assert db.stats().documents == 2  # the transaction rolled back
    assert stored_settings(path)["public_unlabeled"] == "false"


def test_set_public_unlabeled_on_a_read_only_database(tmp_path):
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    with ragdb.open(path, readonly=True) as db:
        with pytest.raises(RagdbError):
            db.set_public_unlabeled(True)
        assert visible(db) == []
    assert stored_settings(path)["public_unlabeled"] == "false"


def test_a_database_without_the_setting_reads_it_as_off(tmp_path):
    path = make_db(tmp_path / "kb.db")
    sql(path, "DELETE FROM settings WHERE key = 'public_unlabeled'")
    with ragdb.open(path, public_unlabeled=False) as db:
        assert visible(db) == []
    with pytest.raises(InvalidInput):
        ragdb.open(path, public_unlabeled=True)
    assert "public_unlabeled" not in stored_settings(path)  # opening wrote nothing


def test_keep_versions_and_chunker_given_on_open_still_update_the_stored_settings(tmp_path):
    path = make_db(tmp_path / "kb.db")
    with ragdb.open(path, keep_versions=True, chunker="window:size=50,overlap=10") as db:
        assert db.settings["keep_versions"] is True
    with ragdb.open(path) as db:
        assert db.settings["keep_versions"] is True and db.settings["chunker"] == "window:size=50,overlap=10"
    before = stored_settings(path)
    with ragdb.open(path, readonly=True, keep_versions=True, chunker="window:size=50,overlap=10"):
        pass  # the stored values: nothing to write, so read-only is fine
    with pytest.raises(InvalidInput, match="read-only"):
        ragdb.open(path, readonly=True, keep_versions=False)
    assert stored_settings(path) == before


# ----------------------------------------------------------------------------- 9: the CLI


def test_config_lists_the_settings(tmp_path, runner):
    path = make_db(tmp_path / "kb.db")  # the defaults of a new database: public_unlabeled on
    data = out_json(run(runner, "-d", path, "config", "--json"))
    assert data["public_unlabeled"] is True and data["keep_versions"] is False
    assert data["chunker"].startswith("recursive") and data["analyzer"]["name"] == "ragdb"
    text = run(runner, "-d", path, "config").output
    assert "public_unlabeled" in text and "true" in text and "false" in text and "chunker" in text
    assert run(runner, "-d", path, "config", "public_unlabeled").output.strip() == "true"
    assert run(runner, "-d", path, "config", "keep_versions").output.strip() == "false"
    assert out_json(run(runner, "-d", path, "config", "chunker", "--json"))["value"].startswith("recursive")


def test_config_public_unlabeled(tmp_path, runner):
    path = make_db(tmp_path / "kb.db", public_unlabeled=False)
    search = ["search", PUBLIC_QUERY, "--principal", "outsider", "--json"]
    assert out_json(run(runner, "-d", path, *search)) == []
    data = out_json(run(runner, "-d", path, "config", "public_unlabeled", "true", "--json"))
    assert data == {"setting": "public_unlabeled", "old": False, "value": True, "changed": True}
    assert [h["source"] for h in out_json(run(runner, "-d", path, *search))] == ["open"]
    result = run(runner, "-d", path, "config", "public_unlabeled", "TRUE")
    assert "unchanged" in result.output
    run(runner, "-d", path, "config", "public_unlabeled", "off")
    assert out_json(run(runner, "-d", path, *search)) == []
    assert stored_settings(path)["public_unlabeled"] == "false"


def test_config_keep_versions_and_chunker(tmp_path, runner):
    path = make_db(tmp_path / "kb.db")
    run(runner, "-d", path, "config", "keep_versions", "yes")
    result = run(runner, "-d", path, "config", "chunker", "window:size=50,overlap=10")
    assert "-> window:size=50,overlap=10" in result.output
    with ragdb.open(path) as db:
        assert db.settings["keep_versions"] is True and db.settings["chunker"] == "window:size=50,overlap=10"


@pytest.mark.parametrize("args, code, words", [
    (["public_unlabeled", "maybe"], 2, ["true or false", "maybe"]),
    (["keep_versions", ""], 2, ["true or false"]),
    (["analyzer", "simple"], 2, ["'ragdb reindex' changes it", "settable: chunker, fields, keep_versions, min_confidence, public_unlabeled"]),
    (["colour", "red"], 2, ["'colour'", "settable"]),
    (["chunker", "zigzag"], 1, ["zigzag"]),
    (["chunker", "window:size=-1"], 1, ["window"]),
])
def test_config_refuses_unknown_keys_and_bad_values(tmp_path, runner, args, code, words):
    path = make_db(tmp_path / "kb.db")
    before = stored_settings(path)
    result = run(runner, "-d", path, "config", *args, ok=False)
    assert result.exit_code == code, result.output
    for word in words:
        assert word in result.output, result.output
    assert "Traceback" not in result.output
    assert stored_settings(path) == before


def test_config_needs_an_existing_database(tmp_path, runner):
    result = run(runner, "-d", tmp_path / "none.db", "config", "public_unlabeled", "true", ok=False)
    assert result.exit_code == 1 and "no such database" in result.output
    assert not (tmp_path / "none.db").exists()


def test_init_public_unlabeled(tmp_path, runner):
    path = tmp_path / "kb.db"
    data = out_json(run(runner, "-d", path, "init", "--public-unlabeled", "--json"))
    assert data["created"] is True and data["public_unlabeled"] is True
    assert out_json(run(runner, "-d", path, "init", "--json"))["public_unlabeled"] is True  # no flag: kept
    run(runner, "-d", path, "init", "--public-unlabeled")  # the stored value: fine
    bad = run(runner, "-d", path, "init", "--no-public-unlabeled", ok=False)
    assert bad.exit_code == 1 and "ragdb config public_unlabeled false" in bad.output
    assert "Traceback" not in bad.output
    with ragdb.open(path) as db:
        assert db.settings["public_unlabeled"] is True
    assert "public unlabeled" in run(runner, "-d", path, "init").output
    # no flag on a new database: on, the default; --no-public-unlabeled turns it off at creation
    fresh = out_json(run(runner, "-d", tmp_path / "fresh.db", "init", "--json"))
    assert fresh["created"] is True and fresh["public_unlabeled"] is True
    closed = out_json(run(runner, "-d", tmp_path / "closed.db", "init", "--no-public-unlabeled", "--json"))
    assert closed["created"] is True and closed["public_unlabeled"] is False
    assert stored_settings(tmp_path / "closed.db")["public_unlabeled"] == "false"
