"""Library-level tests of ragdb.files.sync (folder mirroring, add_paths) and ragdb.files.transfer (export/import)."""

from __future__ import annotations

import io
import os
import re
import sys
import time

import orjson
import pytest

import ragdb
from ragdb.files import loaders
from ragdb.files import sync
from ragdb.files import transfer
from ragdb.errors import InvalidInput, LoaderError

BINARY = bytes(range(256)) * 8 + b"\x00\x01\x02\xff" * 64


def write(path, text, *, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder of three files, and the working folder (sources are named relative to it, see
    sync.source_name: syncing the working folder itself names files by their path in it)."""
    root = tmp_path / "kb"
    write(root / "alpha.md", "# Alpha\n\nAlpha particles are helium nuclei emitted in radioactive decay.\n")
    write(root / "beta.txt", "Beta decay turns a neutron into a proton, an electron and an antineutrino.\n")
    write(root / "sub" / "gamma.txt", "Gamma rays are high-energy photons from excited nuclei.\n")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def db():
    with ragdb.open(":memory:") as d:
        yield d


def sources(db, pattern=None):
    return sorted(d.source for d in db.documents(pattern))


class Counter:
    """Counts calls of a wrapped function."""

    def __init__(self, fn, keyword=None):
        self.fn = fn
        self.keyword = keyword
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs[self.keyword] if self.keyword else args[0] if args else None)
        return self.fn(*args, **kwargs)


def counted(monkeypatch):
    load = Counter(loaders.load_read, "where")  # what load_file does once the file is read
    monkeypatch.setattr(loaders, "load_read", load)
    digest = Counter(sync.file_sha256)
    monkeypatch.setattr(sync, "file_sha256", digest)
    return load, digest


# ----------------------------------------------------------------------------- planning and applying


def test_first_sync_adds_everything(db, folder):
    plan = sync.plan_sync(db, folder)
    assert plan.added == ("alpha.md", "beta.txt", "sub/gamma.txt")
    assert plan.changed == plan.deleted == plan.unchanged == ()
    report = sync.apply_sync(db, plan)
    assert report.added == plan.added and report.documents == 3 and not report.failed
    assert sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]
    doc = db.documents("beta.txt")[0]
    assert doc.metadata["content_hash"] == sync.file_sha256(folder / "beta.txt")
    assert db.check() == []
    assert [h.source for h in db.search("neutron proton")][:1] == ["beta.txt"]


def test_unchanged_files_are_not_read(db, folder, monkeypatch):
    sync.sync_folder(db, folder)
    load, digest = counted(monkeypatch)
    report = sync.sync_folder(db, folder)
    assert report.unchanged == ("alpha.md", "beta.txt", "sub/gamma.txt")
    assert report.added == report.changed == report.deleted == ()
    assert load.calls == [] and digest.calls == []


def test_detects_new_changed_deleted_and_touched(db, folder, monkeypatch):
    sync.sync_folder(db, folder)
    before = {d.source: d.id for d in db.documents()}
    write(folder / "beta.txt", "Beta decay was rewritten: positrons appear in beta plus decay.\n")
    (folder / "sub" / "gamma.txt").unlink()
    write(folder / "delta.md", "Delta is the fourth letter; deltas form at river mouths.\n")
    # touched, not edited: other mtime, same bytes
    st = (folder / "alpha.md").stat()
    os.utime(folder / "alpha.md", (st.st_atime, st.st_mtime + 100))
    load, digest = counted(monkeypatch)
    plan = sync.plan_sync(db, folder)
    assert plan.added == ("delta.md",)
    assert plan.changed == ("beta.txt",)
    assert plan.deleted == ("sub/gamma.txt",)
    assert plan.unchanged == ("alpha.md",)
    assert load.calls == []  # planning reads no file through the loaders
    assert sorted(os.path.basename(str(p)) for p in digest.calls) == ["alpha.md", "beta.txt"]
    report = sync.apply_sync(db, plan)
    assert sorted(os.path.basename(str(p)) for p in load.calls) == ["beta.txt", "delta.md"]
    assert report.removed == 1
    assert sources(db) == ["alpha.md", "beta.txt", "delta.md"]
    after = {d.source: d.id for d in db.documents()}
    assert after["alpha.md"] == before["alpha.md"]  # untouched
    assert after["beta.txt"] != before["beta.txt"]  # replaced
    assert [h.source for h in db.search("positrons")] == ["beta.txt"]
    assert db.search("antineutrino") == []  # the old text is gone
    assert db.search("photons") == []  # the deleted file's document is gone
    assert db.check() == []


def test_dry_run_writes_nothing(db, folder):
    sync.sync_folder(db, folder)
    write(folder / "beta.txt", "Changed beta text about positrons.\n")
    (folder / "alpha.md").unlink()
    write(folder / "new.txt", "A brand new file about muons.\n")
    stats = db.stats()
    docs = [(d.id, d.source) for d in db.documents()]
    report = sync.sync_folder(db, folder, dry_run=True)
    assert report.dry_run
    assert (report.added, report.changed, report.deleted) == (("new.txt",), ("beta.txt",), ("alpha.md",))
    assert db.stats() == stats
    assert [(d.id, d.source) for d in db.documents()] == docs


def test_change_of_one_file_in_many_touches_only_that_file(db, tmp_path, monkeypatch):
    root = tmp_path / "many"
    for i in range(1000):
        write(root / f"d{i // 100}" / f"f{i}.txt", f"document number {i} about topic{i % 37} and word{i}\n")
    monkeypatch.chdir(root)
    first = sync.sync_folder(db, root)
    assert len(first.added) == 1000
    path = root / "d4" / "f417.txt"
    write(path, "document number 417 now talks about quasars\n")
    load, digest = counted(monkeypatch)
    report = sync.sync_folder(db, root)
    assert report.changed == ("d4/f417.txt",) and report.added == report.deleted == ()
    assert len(report.unchanged) == 999
    assert [os.fspath(p) for p in load.calls] == [os.fspath(path)]
    assert [os.fspath(p) for p in digest.calls] == [os.fspath(path)]
    assert [h.source for h in db.search("quasars")] == ["d4/f417.txt"]


# ----------------------------------------------------------------------------- scope: prefix and glob


def test_prefix_scopes_sources_and_deletions(db, folder):
    db.add("A note added by hand, not from the folder.", source="notes/manual.txt")
    report = sync.sync_folder(db, folder, source_prefix="kb/")
    assert report.added == ("kb/alpha.md", "kb/beta.txt", "kb/sub/gamma.txt")
    (folder / "beta.txt").unlink()
    report = sync.sync_folder(db, folder, source_prefix="kb/")
    assert report.deleted == ("kb/beta.txt",)
    assert sources(db) == ["kb/alpha.md", "kb/sub/gamma.txt", "notes/manual.txt"]


def test_prefix_with_glob_characters_is_literal(db, folder):
    db.add("Outside the prefix, but its source would match an unescaped glob.", source="kbX1]/other.txt")
    db.add("Also outside.", source="kb1/other.txt")
    sync.sync_folder(db, folder, source_prefix="kb[1]/")
    assert "kb[1]/alpha.md" in sources(db)
    report = sync.sync_folder(db, folder, source_prefix="kb[1]/")
    assert report.unchanged == ("kb[1]/alpha.md", "kb[1]/beta.txt", "kb[1]/sub/gamma.txt")
    assert report.deleted == ()
    assert "kb1/other.txt" in sources(db) and "kbX1]/other.txt" in sources(db)


def test_without_prefix_the_database_mirrors_the_folder(db, folder):
    db.add("Not in the folder.", source="elsewhere.txt")
    report = sync.sync_folder(db, folder)
    assert report.deleted == ("elsewhere.txt",)
    assert sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]


def test_glob_limits_files_and_deletions(db, folder):
    sync.sync_folder(db, folder)
    report = sync.sync_folder(db, folder, glob="*.md")
    assert report.deleted == ()  # the .txt documents are out of scope, not vanished
    assert report.unchanged == ("alpha.md",)


def test_no_recursion(db, folder):
    report = sync.sync_folder(db, folder, recursive=False)
    assert report.added == ("alpha.md", "beta.txt")


def test_not_a_folder(db, tmp_path):
    with pytest.raises(InvalidInput, match="not a folder"):
        sync.plan_sync(db, tmp_path / "missing")


# ----------------------------------------------------------------------------- failures and atomicity


def test_unreadable_file_is_reported_and_skipped(db, folder):
    # Changed by issue 14: binary files are skipped with a reason (by type or by content), not failures.
    (folder / "blob.bin").write_bytes(BINARY)
    (folder / "blob.txt").write_bytes(BINARY)
    (folder / "empty.txt").write_bytes(b"")
    (folder / "invisible.txt").write_bytes("\ufeff\u200b\u200b\n".encode())  # BOM and zero-width spaces only
    report = sync.sync_folder(db, folder)
    assert {f.source for f in report.failed} == {"empty.txt", "invisible.txt"}
    assert all(f.error for f in report.failed)
    assert {(os.path.basename(s.path), s.reason) for s in report.skipped} == {("blob.bin", "binary"),
                                                                               ("blob.txt", "binary")}
    assert report.skip_counts == {"binary": 2}
    assert report.added == ("alpha.md", "beta.txt", "sub/gamma.txt")
    assert sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]
    # still failing, still skipped; nothing else changes
    again = sync.sync_folder(db, folder)
    assert {f.source for f in again.failed} == {"empty.txt", "invisible.txt"} and again.added == ()
    assert len(again.skipped) == 2


@pytest.mark.parametrize("front", ['acl: "\\ud800"', 'labels: ["ok", "\\udc00x"]'])
def test_front_matter_no_store_can_hold_fails_its_file_not_the_batch(db, folder, front):
    """Front matter whose access labels hold a lone surrogate (a YAML escape) passed the
    loader's checks and was refused by add_many: the whole add or sync ended with nothing
    written. The file fails on its own now, and the others land."""
    (folder / "bad.md").write_text(f"---\n{front}\n---\nBad words.\n")
    report = sync.sync_folder(db, folder)
    assert [f.source for f in report.failed] == ["bad.md"] and "not valid Unicode" in report.failed[0].error
    assert sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]
    added = sync.add_paths(db, ["bad.md", "alpha.md"])
    assert [f.source for f in added.failed] == ["bad.md"] and added.unchanged == ("alpha.md",)


def test_dry_run_lists_failures(db, folder):
    (folder / "empty.txt").write_bytes(b"")
    (folder / "blob.txt").write_bytes(BINARY)
    report = sync.sync_folder(db, folder, dry_run=True)
    assert [f.source for f in report.failed] == ["empty.txt"]
    assert [(os.path.basename(s.path), s.reason) for s in report.skipped] == [("blob.txt", "binary")]
    assert "empty.txt" not in report.added and "blob.txt" not in report.added
    assert db.stats().documents == 0


def test_strict_writes_nothing_and_leaves_a_consistent_database(db, folder):
    db.add("Existing document about neutrons.", source="alpha.md")
    (folder / "zz.txt").write_bytes(b"   \n")  # loaded last, after the others were written; empty
    plan = sync.plan_sync(db, folder)
    before = [(d.id, d.source, d.content_hash) for d in db.documents()]
    with pytest.raises(LoaderError, match="zz.txt"):
        sync.apply_sync(db, plan, strict=True, batch_size=1)
    assert [(d.id, d.source, d.content_hash) for d in db.documents()] == before
    assert db.check() == []
    assert [h.source for h in db.search("neutrons")] == ["alpha.md"]
    assert db.search("photons") == []
    # the in-memory index was rebuilt: later writes and searches are exact
    (folder / "zz.txt").unlink()
    report = sync.sync_folder(db, folder)
    assert report.changed == ("alpha.md",) and len(report.added) == 2
    assert db.check() == []
    assert [h.source for h in db.search("photons")] == ["sub/gamma.txt"]


def test_failed_changed_file_keeps_the_stored_version(db, folder):
    sync.sync_folder(db, folder)
    (folder / "beta.txt").write_bytes(b"\n\n")
    report = sync.sync_folder(db, folder)
    assert [f.source for f in report.failed] == ["beta.txt"]
    assert report.changed == ()
    assert [h.source for h in db.search("antineutrino")] == ["beta.txt"]
    # content that became binary is a skip (issue 14), and the stored version stays too
    (folder / "beta.txt").write_bytes(BINARY)
    report = sync.sync_folder(db, folder)
    assert report.failed == () and report.changed == () and report.deleted == ()
    assert [(os.path.basename(s.path), s.reason) for s in report.skipped] == [("beta.txt", "binary")]
    assert [h.source for h in db.search("antineutrino")] == ["beta.txt"]


def test_interrupted_sync_rolls_back(db, folder, monkeypatch):
    plan = sync.plan_sync(db, folder)
    real = loaders.load_read
    calls = []

    def boom(*a, **kw):
        calls.append(kw["where"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(loaders, "load_read", boom)
    with pytest.raises(KeyboardInterrupt):
        sync.apply_sync(db, plan, batch_size=1)
    assert db.documents() == [] and db.check() == []


def test_keep_versions_database_keeps_the_replaced_version(folder):
    with ragdb.open(":memory:", keep_versions=True) as db:
        sync.sync_folder(db, folder)
        write(folder / "beta.txt", "Beta, second edition, mentions positrons.\n")
        sync.sync_folder(db, folder)
        versions = db.documents("beta.txt", versions="all")
        assert len(versions) == 2 and sum(d.latest for d in versions) == 1
        (folder / "beta.txt").unlink()
        report = sync.sync_folder(db, folder)
        assert report.deleted == ("beta.txt",) and report.removed == 2
        assert db.documents("beta.txt", versions="all") == []
        assert db.check() == []


def test_escape_glob():
    assert sync.escape_glob("a*b?c[d]") == "a[*]b[?]c[[]d]"


# ----------------------------------------------------------------------------- add_paths


def test_add_paths_files_folders_and_stdin(db, folder, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    report = sync.add_paths(db, ["kb/alpha.md", "./kb/sub", "-"], stdin=b"Text piped in about leptons.\n",
                            version="3", metadata={"team": "physics"}, source_prefix="p/")
    piped = sync.stdin_source(b"Text piped in about leptons.\n", "p/")
    assert piped.startswith("p/stdin-") and len(piped) == len("p/stdin-") + 12
    assert sorted(report.added) == ["p/kb/alpha.md", "p/kb/sub/gamma.txt", piped]
    doc = db.documents("p/kb/alpha.md")[0]
    assert doc.version == "3" and doc.metadata["team"] == "physics"
    again = sync.add_paths(db, ["kb/alpha.md"], version="3", metadata={"team": "physics"}, source_prefix="p/")
    assert again.added == () and again.unchanged == ("p/kb/alpha.md",)


def test_add_paths_source_for_one_input(db, folder):
    report = sync.add_paths(db, [str(folder / "beta.txt")], source="physics/beta")
    assert report.added == ("physics/beta",)
    with pytest.raises(InvalidInput, match="one document"):
        sync.add_paths(db, [str(folder)], source="x")


def test_add_paths_missing_path(db, tmp_path):
    with pytest.raises(InvalidInput, match="no such file"):
        sync.add_paths(db, [str(tmp_path / "nope.txt")])
    assert db.documents() == []


def test_add_paths_failures_and_strict(db, folder):
    bad = folder / "empty.md"
    bad.write_bytes(b"---\ntitle: only front matter\n---\n")
    (folder / "blob.bin").write_bytes(BINARY)  # skipped in a folder (issue 14), not a failure
    with pytest.raises(LoaderError, match="empty.md"):
        sync.add_paths(db, [str(folder)], strict=True, batch_size=1)
    assert db.documents() == [] and db.check() == []
    report = sync.add_paths(db, [str(folder)])
    assert [f.path for f in report.failed] == [str(bad)]
    assert [(os.path.basename(s.path), s.reason) for s in report.skipped] == [("blob.bin", "binary")]
    assert len(report.added) == 3
    # named explicitly, a binary file is loaded and fails (no default rule skips it)
    named = sync.add_paths(db, [str(folder / "blob.bin")])
    assert [f.path for f in named.failed] == [str(folder / "blob.bin")] and "binary" in named.failed[0].error


# ----------------------------------------------------------------------------- export / import


def fingerprint(hits):
    return [(h.source, h.start, h.end, h.text, round(h.score, 9), dict(h.metadata)) for h in hits]


MD = """---
title: Decay modes
tags: [physics, nuclear]
---
# Alpha decay

Alpha decay emits a helium nucleus. """ + "The nucleus loses two protons and two neutrons. " * 30 + """

# Beta decay

Beta decay emits an electron or a positron. """ + "A neutron turns into a proton inside the nucleus. " * 30 + "\n"


def _populate(db, folder):
    write(folder / "decay.md", MD)
    sync.sync_folder(db, folder)
    db.add("Labelled note about protons.", source="acl/note", acl=["team-a"], timestamp="2024-05-01T00:00:00Z",
           version="7", metadata={"year": 2024}, chunker="none")


QUERIES = ["proton neutron", "helium nucleus", "positron electron", "photons", "protons", "decay"]


def test_export_import_roundtrip_gives_identical_search(tmp_path, folder):
    out = tmp_path / "kb.jsonl"
    with ragdb.open(tmp_path / "a.db", chunker="window:size=40,overlap=10") as a:
        _populate(a, folder)
        report = transfer.export_jsonl(a, out, principals=ragdb.ALL)  # a full backup
        assert report.documents == 5 and report.latest == 5 and report.hidden == 0
        anonymous = transfer.export_jsonl(a, io.BytesIO())  # an anonymous export leaves the labelled note out
        assert (anonymous.documents, anonymous.hidden) == (4, 1)
        expected = {q: fingerprint(a.search(q, k=20, principals=ragdb.ALL)) for q in QUERIES}
        expected_p = fingerprint(a.search("protons", principals=["team-a"]))
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert set(lines[0]) >= {"source", "version", "timestamp", "title", "text", "metadata", "acl", "chunker",
                             "latest"}
    assert [r["source"] for r in lines if "spans" in r] == ["alpha.md", "decay.md"]  # markdown sections survive
    with ragdb.open(tmp_path / "b.db") as b:
        rep = transfer.import_jsonl(b, out)
        assert rep.documents == 5 and rep.unchanged == 0
        assert {q: fingerprint(b.search(q, k=20, principals=ragdb.ALL)) for q in QUERIES} == expected
        assert fingerprint(b.search("protons", principals=["team-a"])) == expected_p
        assert b.check() == []
        again = transfer.import_jsonl(b, out)
        assert again.documents == 0 and again.unchanged == 5


def test_export_keeps_versions_and_import_skips_them_without_keep_versions(tmp_path):
    out = io.BytesIO()
    with ragdb.open(":memory:", keep_versions=True) as a:
        a.add("first edition about kaons", source="s", version="1", timestamp="2024-01-01T00:00:00Z")
        a.add("second edition about pions", source="s", version="2", timestamp="2024-06-01T00:00:00Z")
        transfer.export_jsonl(a, out, principals=ragdb.ALL)
        old = fingerprint(a.search("kaons", versions="all"))
    data = out.getvalue()
    with ragdb.open(":memory:", keep_versions=True) as b:
        rep = transfer.import_jsonl(b, io.BytesIO(data))
        assert rep.documents == 2 and rep.skipped_versions == 0
        assert fingerprint(b.search("kaons", versions="all")) == old
        assert [d.version for d in b.documents("s")] == ["2"]
    with ragdb.open(":memory:") as c:
        rep = transfer.import_jsonl(c, io.BytesIO(data))
        assert rep.documents == 1 and rep.skipped_versions == 1
        assert [d.version for d in c.documents("s", versions="all")] == ["2"]


def test_import_bad_line_imports_nothing(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"source": "a", "text": "fine text"}\n{"source": "b", "text": 5}\n')
    with ragdb.open(":memory:") as db:
        with pytest.raises(InvalidInput, match=r"bad.jsonl:2"):
            transfer.import_jsonl(db, path)
        assert db.documents() == [] and db.check() == []
        path.write_bytes(b'{"source": "a", "text": "fine text"}\nnot json\n')
        with pytest.raises(InvalidInput, match=r"bad.jsonl:2: invalid JSON"):
            transfer.import_jsonl(db, path, batch_size=1)
        assert db.documents() == [] and db.check() == []
        path.write_bytes(b'{"source": "a", "text": "x", "colour": "red"}\n')
        with pytest.raises(InvalidInput, match="unknown keys"):
            transfer.import_jsonl(db, path)
        with pytest.raises(InvalidInput, match="cannot read"):
            transfer.import_jsonl(db, tmp_path / "missing.jsonl")


def test_import_skips_a_byte_order_mark_at_the_start_as_the_loader_does(tmp_path):
    """A JSONL saved by a Windows editor starts with a UTF-8 BOM: ``ragdb add`` loaded it, and
    ``ragdb import`` refused it as invalid JSON. Elsewhere a BOM is still not JSON."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"source": "a", "text": "fine text"}\n{"source": "b", "text": "more"}\n')
    with ragdb.open(":memory:") as db:
        assert transfer.import_jsonl(db, path).documents == 2
        assert [d.source for d in db.documents()] == ["a", "b"]
        path.write_bytes(b'{"source": "c", "text": "fine text"}\n\xef\xbb\xbf{"source": "d", "text": "x"}\n')
        with pytest.raises(InvalidInput, match=r"bom.jsonl:2: invalid JSON"):
            transfer.import_jsonl(db, path)
        assert [d.source for d in db.documents()] == ["a", "b"] and db.check() == []


@pytest.mark.parametrize("field,value,message", [
    ("timestamp", "soon", "timestamp 'soon' is not ISO-8601"), ("metadata", 5, "metadata must be a mapping"),
    ("acl", "x", "acl must be a list"), ("chunker", "bogus", "unknown chunker 'bogus'"),
    ("version", ["1"], "version must be a string"), ("title", 3, "title must be a string"),
    ("latest", "no", "'latest' must be true or false, got 'no'"), ("latest", 0, "'latest' must be true or false")])
def test_import_names_the_line_of_a_bad_value(tmp_path, field, value, message):
    """A bad timestamp, metadata, label list, chunker, version or title was named by the
    record's source alone (and a chunker by nothing): add_many reads the records in batches.
    A 'latest' other than true or false ("no", 0) was read as a latest version."""
    path = tmp_path / "bad.jsonl"
    good = {"source": "a", "text": "fine text"}
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (good, good, {**good, "source": "b", field: value})))
    with ragdb.open(":memory:") as db:
        with pytest.raises(InvalidInput, match=rf"bad.jsonl:3: {re.escape(message)}"):
            transfer.import_jsonl(db, path, batch_size=2)
        assert db.documents() == [] and db.check() == []


def test_export_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    out = tmp_path / "x.jsonl"
    with ragdb.open(":memory:") as db:
        db.add("one", source="a")
        db.add("two", source="b")

        real = type(db).records

        def broken(self, **k):  # fails after the first record is written
            it = real(self, **k)
            yield next(it)
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(type(db), "records", broken)
        with pytest.raises(RuntimeError):
            transfer.export_jsonl(db, out)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_export_to_a_path_it_cannot_write_names_the_path(tmp_path, monkeypatch):
    from ragdb.errors import StorageError

    out = tmp_path / "missing" / "x.jsonl"
    with ragdb.open(":memory:") as db:
        db.add("one", source="a")
        with pytest.raises(InvalidInput, match="cannot write") as err:
            transfer.export_jsonl(db, out)
        assert str(err.value).startswith(f"{out}: ") and ".tmp" not in str(err.value)

        def refused(src, dst):
            raise OSError(28, "No space left on device")

        (tmp_path / "folder.jsonl").mkdir()
        with pytest.raises(InvalidInput, match="is a folder"):  # found before the export is written
            transfer.export_jsonl(db, tmp_path / "folder.jsonl")
        (tmp_path / "folder.jsonl").rmdir()
        monkeypatch.setattr(transfer.os, "replace", refused)
        with pytest.raises(StorageError, match="No space left on device"):
            transfer.export_jsonl(db, tmp_path / "y.jsonl")
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


def test_mtime_comparison_tolerates_iso_and_numbers(tmp_path):
    p = write(tmp_path / "f.txt", "x", mtime=1_700_000_000.25)
    st = p.stat()
    assert sync._same_stat({"size": 1, "mtime": 1_700_000_000.25}, st)
    assert sync._same_stat({"size": 1, "mtime": "2023-11-14T22:13:20.250000+00:00"}, st)
    assert not sync._same_stat({"size": 2, "mtime": 1_700_000_000.25}, st)
    assert not sync._same_stat({"size": 1}, st)
    assert not sync._same_stat({"size": 1, "mtime": time.time() + 10}, st)


def test_jsonl_file_documents_follow_their_file(db, folder):
    path = folder / "records.jsonl"
    path.write_bytes(b'{"id": "r1", "text": "first record about kaons"}\n'
                     b'{"id": "r2", "text": "second record about pions"}\n')
    sync.sync_folder(db, folder)
    assert [s for s in sources(db) if s.startswith("records")] == ["records.jsonl#r1", "records.jsonl#r2"]
    report = sync.sync_folder(db, folder)
    assert "records.jsonl" in report.unchanged and report.added == report.deleted == ()
    path.write_bytes(b'{"id": "r1", "text": "first record now about muons"}\n'
                     b'{"id": "r3", "text": "third record about taus"}\n')
    report = sync.sync_folder(db, folder)
    assert report.changed == ("records.jsonl",)
    assert [s for s in sources(db) if s.startswith("records")] == ["records.jsonl#r1", "records.jsonl#r3"]
    assert db.search("pions") == [] and db.search("kaons") == []
    path.unlink()
    report = sync.sync_folder(db, folder)
    assert report.deleted == ("records.jsonl",) and report.removed == 2
    assert sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]
    assert db.check() == []


def test_glob_with_a_folder_does_not_reach_other_folders(db, tmp_path, monkeypatch):
    root = tmp_path / "r"
    write(root / "docs" / "a.md", "alpha in docs")
    write(root / "sub" / "docs" / "b.md", "beta in sub docs")
    monkeypatch.chdir(root)
    sync.sync_folder(db, root)
    report = sync.sync_folder(db, root, glob="docs/*.md")
    assert report.unchanged == ("docs/a.md",) and report.deleted == ()
    (root / "docs" / "a.md").unlink()
    report = sync.sync_folder(db, root, glob="docs/*.md")
    assert report.deleted == ("docs/a.md",)
    assert sources(db) == ["sub/docs/b.md"]


def test_stdin_without_a_source_never_replaces_other_stdin(db):
    """Issue 30, item 9: two texts piped in without a source are two documents; the same text
    again is unchanged; a source given replaces, and the report says so."""
    first = sync.add_paths(db, ["-"], stdin=b"first text about muons")
    second = sync.add_paths(db, ["-"], stdin=b"second text about taus")
    assert len(db.documents()) == 2 and first.added != second.added
    assert second.replaced == ()
    assert sync.add_paths(db, ["-"], stdin=b"first text about muons").unchanged == first.added
    sync.add_paths(db, ["-"], stdin=b"a", source="named")
    again = sync.add_paths(db, ["-"], stdin=b"b", source="named")
    assert again.added == ("named",) and again.replaced == ("named",)


# ----------------------------------------------------------------------------- files swapped after the walk


def _swap(path, kind, outside):
    """Replace ``path`` by a link to ``outside``, a FIFO, another file, or nothing."""
    if kind == "other":  # written beside it, then renamed over it: another inode
        (path.parent / "new.tmp").write_text("Another file under the same name.\n")
        os.replace(path.parent / "new.tmp", path)
        return
    os.unlink(path)
    if kind == "link":
        os.symlink(outside, path)
    elif kind == "fifo":
        os.mkfifo(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX links and FIFOs")
@pytest.mark.parametrize("kind, reason", [("link", "changed"), ("fifo", "changed"), ("other", "changed"),
                                          ("gone", "vanished")])
def test_a_file_swapped_after_the_walk_is_skipped(db, folder, tmp_path, kind, reason):
    """Issue 32, item 8: sync read a file swapped for a link to a file outside the folder
    through the link (the outside text under the inside source), and a FIFO swapped in
    blocked open() forever inside the write transaction. A file is now read from one
    descriptor opened without following a link or blocking, held to the walk's inode."""
    outside = tmp_path / "outside-secret.txt"
    outside.write_text("Outside words: zanzibar quokka.\n")
    plan = sync.plan_sync(db, folder)
    _swap(folder / "beta.txt", kind, outside)
    report = sync.apply_sync(db, plan)  # returns: no blocked open, no OSError
    assert [(os.path.basename(s.path), s.reason) for s in report.skipped] == [("beta.txt", reason)]
    assert "beta.txt" not in report.added and not report.failed
    assert db.search("zanzibar quokka") == [] and db.search("another file") == []
    # add_paths of the folder holds its files to the walk the same way
    sel = sync.select_paths([folder])
    _swap(folder / "alpha.md", "link", outside)
    added = sync.add_paths(db, sel)
    assert ("alpha.md", "changed") in {(os.path.basename(s.path), s.reason) for s in added.skipped}
    assert db.search("zanzibar quokka") == []


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="POSIX links")
@pytest.mark.parametrize("how", ["sync", "add"])
def test_a_folder_swapped_for_a_link_during_the_walk_brings_nothing_from_outside(tmp_path, monkeypatch, how):
    """A sub-folder listed by the walk, then swapped for a link to a folder outside before its
    files were looked at: each file's identity was taken through the link, and the outside
    file was read under the inside source (a real race reproduced it 5 times in 5 with
    ``ragdb add``). A file is now read only where it lies inside the folder walked."""
    from ragdb.files import walk

    folder = tmp_path / "kb"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "x.md").write_text("Inside words: alpha.\n")
    (folder / "top.md").write_text("Top words: beta.\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.md").write_text("Outside words: zanzibar quokka.\n")
    original = walk._folder_rules

    def swapping(path, base, display):
        if os.path.basename(path) == "sub" and not os.path.islink(folder / "sub"):
            os.rename(folder / "sub", folder / "sub.real")
            os.symlink(outside, folder / "sub")
        return original(path, base, display)

    monkeypatch.setattr(walk, "_folder_rules", swapping)
    with ragdb.open(tmp_path / "kb.db") as db:
        if how == "sync":
            report = sync.apply_sync(db, sync.plan_sync(db, folder))
        else:
            report = sync.add_paths(db, sync.select_paths([folder]))
        assert db.search("zanzibar quokka") == [] and [h.source for h in db.search("beta")]
        assert ("x.md", "changed") in {(os.path.basename(s.path), s.reason) for s in report.skipped}


def test_a_sync_file_key_in_front_matter_does_not_regroup_documents(tmp_path):
    """``sync_file`` is how sync groups a JSON Lines file's records; a Markdown file's front
    matter setting it put its document in another file's group: a sync deleted it when that
    file changed (and ``sync_file: elsewhere`` took it out of the sync's scope for good)."""
    folder = tmp_path / "f3"
    folder.mkdir()
    (folder / "a.md").write_text("---\nsync_file: f3/b.md\n---\nalpha text of file a\n")
    (folder / "b.md").write_text("beta b\n")
    (folder / "c.md").write_text("---\nsync_file: elsewhere\n---\ngamma text of file c\n")
    with ragdb.open(tmp_path / "kb.db") as db:
        sync.apply_sync(db, sync.plan_sync(db, folder, relative_to=tmp_path))
        assert "sync_file" not in db.get(source="f3/a.md").metadata
        (folder / "b.md").write_text("beta changed, and longer\n")
        (folder / "c.md").unlink()
        plan = sync.plan_sync(db, folder, relative_to=tmp_path)
        assert (plan.changed, plan.deleted) == (("f3/b.md",), ("f3/c.md",))
        sync.apply_sync(db, plan)
        assert sorted(d.source for d in db.documents()) == ["f3/a.md", "f3/b.md"] and db.check() == []


@pytest.mark.parametrize("which", ["sub", "root"])
def test_a_folder_that_cannot_be_listed_keeps_its_documents(tmp_path, monkeypatch, which):
    """A folder the walk cannot list (no permission, a path too long) was taken for an empty
    one: sync deleted every document under it, silently. It is skipped as unreadable, and
    what it holds is kept (the tests run as root, whom permissions do not stop: scandir refuses
    here instead)."""
    folder = tmp_path / "kb"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.md").write_text("Alpha words in the sub-folder.\n")
    (folder / "b.md").write_text("Beta words at the top.\n")
    with ragdb.open(tmp_path / "kb.db") as db:
        sync.apply_sync(db, sync.plan_sync(db, folder))
        before = sorted(d.source for d in db.documents())
        blocked = os.path.realpath(folder / "sub" if which == "sub" else folder)
        real_scandir = os.scandir

        def scandir(path="."):
            if os.path.realpath(os.fspath(path)) == blocked:
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real_scandir(path)

        monkeypatch.setattr(os, "scandir", scandir)
        plan = sync.plan_sync(db, folder)
        assert plan.deleted == ()
        assert [s.reason for s in plan.skipped] == ["unreadable"]
        sync.apply_sync(db, plan)
        assert sorted(d.source for d in db.documents()) == before and db.check() == []


def test_a_file_growing_past_the_limit_while_read_is_too_large(tmp_path, monkeypatch):
    """read_file checked the size fstat gave, then read to the end of the file: one that grew
    after the fstat (a log being written) was read whole, past MAX_FILE_BYTES, however large."""
    from ragdb.files import walk

    folder = tmp_path / "kb"
    grows = write(folder / "grows.txt", "small at first\n")
    write(folder / "ok.txt", "Other words.\n")
    monkeypatch.setattr(walk, "MAX_FILE_BYTES", 1000)
    real_fstat = os.fstat

    def fstat(fd):
        st = real_fstat(fd)
        if os.path.samestat(st, os.stat(grows)):
            with open(grows, "a") as fh:  # grows after its size was taken
                fh.write("more words\n" * 200)
        return st

    monkeypatch.setattr(os, "fstat", fstat)
    with pytest.raises(walk.FileTooLarge):
        walk.read_file(grows)
    grows.write_text("small at first\n")
    assert walk.read_file(folder / "ok.txt")[0] == b"Other words.\n"
    with ragdb.open(":memory:") as db:
        report = sync.sync_folder(db, folder)
        assert [os.path.basename(s) for s in report.added] == ["ok.txt"]
        assert [(os.path.basename(s.path), s.reason) for s in report.skipped] == [("grows.txt", "too large")]


def test_an_ignore_file_too_large_for_one_re2_set_is_obeyed(tmp_path):
    """google-re2 compiles all the lines of an ignore file into one automaton with a memory
    budget: 3,000 lines such as ``name*.md`` (36 KB) exceeded it, and re2's error ended the
    whole walk (add and sync of the folder failed). The lines are compiled in parts now, and
    obeyed in order as one file's: a later negation still re-includes."""
    folder = tmp_path / "kb"
    lines = [f"generated{i}*.md" for i in range(3000)]
    write(folder / ".gitignore", "\n".join(["keep*.md", *lines, "secret.md", "!keep-this.md", ""]))
    for name in ("a.md", "secret.md", "generated7x.md", "keep-this.md", "keep-not.md"):
        write(folder / name, f"Words of {name}.\n")
    with ragdb.open(":memory:") as db:
        report = sync.sync_folder(db, folder)
        assert sorted(os.path.basename(s) for s in report.added) == ["a.md", "keep-this.md"]
        assert sorted(os.path.basename(s.path) for s in report.skipped if s.reason == "ignored") == [
            "generated7x.md", "keep-not.md", "secret.md"]


class _NoStat:
    """A directory entry whose status cannot be read (what a folder with read but not search
    permission lists: names, but every stat fails with EACCES)."""

    def __init__(self, entry):
        self._entry, self.name, self.path = entry, entry.name, entry.path

    def _refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", self.path)

    is_dir = is_file = stat = _refuse

    def is_symlink(self):
        return self._entry.is_symlink()


def _refuse_stats_in(monkeypatch, folder, wrap):
    """``os.scandir`` of ``folder`` lists its entries wrapped by ``wrap`` (a :class:`_NoStat`):
    what a folder with read but not search permission gives."""
    blocked = os.path.realpath(folder)
    real_scandir = os.scandir

    class Listing:
        def __init__(self, path):
            self._it = real_scandir(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._it.close()

        def __iter__(self):
            return (wrap(entry) for entry in self._it)

    def scandir(path="."):
        return Listing(path) if os.path.realpath(os.fspath(path)) == blocked else real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize("how", ["lstat", "is_dir"])
def test_files_listed_but_not_statable_keep_their_documents(tmp_path, monkeypatch, how):
    """A folder with read but not search permission (``chmod a-x``) lists its names but every
    stat of them fails: its files were skipped as ``vanished`` and sync deleted their documents
    (JSON Lines records too). They are ``unreadable`` now, and kept. (The tests run as root,
    whom permissions do not stop: the entries refuse here instead.)"""
    folder = tmp_path / "kb"
    write(folder / "sub" / "a.md", "Alpha words in the sub-folder.\n")
    write(folder / "sub" / "r.jsonl", '{"id": "1", "text": "record one"}\n{"id": "2", "text": "record two"}\n')
    write(folder / "b.md", "Beta words at the top.\n")
    with ragdb.open(tmp_path / "kb.db") as db:
        sync.apply_sync(db, sync.plan_sync(db, folder))
        before = sorted(d.source for d in db.documents())
        assert len(before) == 4
        def refused(entry):
            if how == "is_dir":  # a file system without d_type: is_dir() itself stats
                return _NoStat(entry)
            entry_stat = _NoStat(entry)  # d_type known: only the status read for the file's identity fails
            entry_stat.is_dir, entry_stat.is_file = entry.is_dir, entry.is_file
            return entry_stat

        _refuse_stats_in(monkeypatch, folder / "sub", refused)
        plan = sync.plan_sync(db, folder)
        assert plan.deleted == ()
        assert sorted((os.path.basename(s.path), s.reason) for s in plan.skipped) == [
            ("a.md", "unreadable"), ("r.jsonl", "unreadable")]
        sync.apply_sync(db, plan)
        assert sorted(d.source for d in db.documents()) == before and db.check() == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX links and FIFOs")
def test_read_file_holds_a_file_to_its_identity(tmp_path):
    from ragdb.files import walk

    f = tmp_path / "f.txt"
    f.write_text("inside")
    st = f.stat()
    identity = walk.FileIdentity(st.st_dev, st.st_ino, os.path.realpath(tmp_path))
    assert walk.read_file(f, identity)[0] == b"inside"
    link = tmp_path / "link.txt"
    link.symlink_to(f)
    assert walk.read_file(link, identity)[0] == b"inside"  # a link inside the folder: its walked target
    other = tmp_path / "other.txt"
    other.write_text("other")
    with pytest.raises(walk.FileChanged) as e:
        walk.read_file(other, identity)
    assert e.value.reason == "changed"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(walk.FileChanged):
        walk.read_file(fifo, identity)  # does not block
    with pytest.raises(LoaderError, match="not a regular file"):
        walk.read_file(fifo)  # named explicitly: not a file either, and no block
    with pytest.raises(walk.FileChanged) as e:
        walk.read_file(tmp_path / "gone.txt", identity)
    assert e.value.reason == "vanished"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX links and FIFOs")
def test_syncs_while_a_file_is_swapped_in_a_loop(tmp_path, monkeypatch):
    """A thread swaps a file between a regular file, a link to a file outside the folder and
    a FIFO as fast as it can while syncs run (a bounded number): nothing from outside is
    indexed, no sync hangs or raises (bare OSError included)."""
    import threading

    root = tmp_path / "shared"
    for i in range(20):
        write(root / f"f{i}.md", f"Inside document number {i} about sailing boats.\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("Outside words: zanzibar quokka.\n")
    monkeypatch.chdir(tmp_path)
    stop = threading.Event()
    target = root / "f15.md"

    def swapper():
        n = 0
        while not stop.is_set():
            kind = ("link", "fifo", "file")[n % 3]
            n += 1
            tmp = root / f".swap{n % 2}"
            try:
                if kind == "link":
                    os.symlink(outside, tmp)
                elif kind == "fifo":
                    os.mkfifo(tmp)
                else:
                    tmp.write_text(f"Inside document 15, version {n}.\n")
                os.replace(tmp, target)
            except OSError:
                pass

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    errors = []
    try:
        with ragdb.open(tmp_path / "kb.db") as db:
            deadline = time.monotonic() + 5
            runs = 0
            while runs < 5 or (time.monotonic() < deadline and runs < 200):
                runs += 1
                try:
                    sync.sync_folder(db, "shared")
                except ragdb.RagdbError as e:  # a clear error is allowed; a bare OSError is not
                    errors.append(e)
                assert db.search("zanzibar quokka") == [], f"outside text indexed after {runs} syncs"
    finally:
        stop.set()
        thread.join()
    assert errors == []


def test_a_file_add_many_would_refuse_fails_alone(tmp_path):
    """A bad timestamp or version in one file's front matter (or a JSON Lines record) ended
    the whole add or sync of the folder at the write; that file is a failed file now, and
    the rest is written."""
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "x.md").write_text("---\ntimestamp: not-a-date\n---\nalpha\n")
    (folder / "v.md").write_text("---\nversion: [1, 2]\n---\ngamma\n")
    (folder / "r.jsonl").write_text('{"text": "a record", "timestamp": "bad"}\n')
    (folder / "good.md").write_text("beta good\n")
    with ragdb.open(tmp_path / "kb.db") as db:
        report = sync.add_paths(db, sync.select_paths([folder]))
        assert sorted(os.path.basename(f.path) for f in report.failed) == ["r.jsonl", "v.md", "x.md"]
        assert [d.source for d in db.documents()] == [str(folder / "good.md")]
    with ragdb.open(tmp_path / "kb2.db") as db:
        result = sync.apply_sync(db, sync.plan_sync(db, folder))
        assert len(result.failed) == 3 and len(db.documents()) == 1 and db.check() == []


def test_text_that_mentions_the_pdf_header_is_text(tmp_path):
    """A script or README naming "%PDF-" in its first KiB was read as a PDF and failed."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "pdfcheck.py").write_text('def is_pdf(d):\n    return d.startswith(b"%PDF-")\n')
    (folder / "README").write_text("README\nValidates files with the %PDF-1.7 header.\n")
    with ragdb.open(tmp_path / "kb.db") as db:
        report = sync.add_paths(db, sync.select_paths([folder]))
        assert not report.failed and len(db.documents()) == 2
        assert [h.source for h in db.search("validates header")] == [str(folder / "README")]


def test_a_file_over_the_size_limit_is_skipped_before_it_is_read(tmp_path, monkeypatch):
    """A 4 GiB sparse file was read whole to find it binary (20 s, 4.2 GB), or ended the add
    with a MemoryError; a large binary file is now found from its head, and a file over
    MAX_FILE_BYTES is skipped as too large, walked or named on its own."""
    from ragdb.files import walk

    monkeypatch.setattr(walk, "MAX_FILE_BYTES", 1000)
    folder = tmp_path / "f7"
    folder.mkdir()
    (folder / "a.md").write_text("fine words\n")
    (folder / "big.txt").write_text("zanzibar quokka " * 200)
    with ragdb.open(tmp_path / "kb.db") as db:
        report = sync.add_paths(db, sync.select_paths([folder]))
        assert [(os.path.basename(s.path), s.reason) for s in report.skipped] == [("big.txt", "too large")]
        alone = sync.add_paths(db, sync.select_paths([folder / "big.txt"]))
        assert [(os.path.basename(s.path), s.reason) for s in alone.skipped] == [("big.txt", "too large")]
        assert db.search("zanzibar") == [] and len(db.documents()) == 1
    with ragdb.open(tmp_path / "kb2.db") as db:
        applied = sync.apply_sync(db, sync.plan_sync(db, folder))
        assert [(os.path.basename(s.path), s.reason) for s in applied.skipped] == [("big.txt", "too large")]
        assert applied.failed == () and len(db.documents()) == 1 and db.search("zanzibar") == []


def test_a_large_binary_file_is_found_binary_from_its_head(tmp_path, monkeypatch):
    """The binary check of a walked file reads its first 64 KiB, not the whole file."""
    from ragdb.files import walk

    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "a.md").write_text("fine words\n")
    (folder / "blob.txt").write_bytes(b"\x00\x01\x02\xff" * (1 << 18))  # 1 MiB of binary
    reads = []
    real = walk.read_file

    def recording(path, identity=None, *, limit=None):
        reads.append((os.path.basename(os.fspath(path)), limit))
        return real(path, identity, limit=limit)

    monkeypatch.setattr(walk, "read_file", recording)
    with ragdb.open(tmp_path / "kb.db") as db:
        report = sync.add_paths(db, sync.select_paths([folder]))
    assert [(os.path.basename(s.path), s.reason) for s in report.skipped] == [("blob.txt", "binary")]
    assert [limit for name, limit in reads if name == "blob.txt"] == [1 << 16]


def test_a_file_name_that_is_not_utf8_fails_alone_saying_so(db, folder):
    name = os.fsencode(folder) + b"/caf\xe9.txt"  # Latin-1 bytes: no UTF-8 text form
    try:
        with open(name, "wb") as f:
            f.write(b"Coffee beans are roasted seeds.\n")
    except OSError:  # pragma: no cover - a file system that refuses such names
        pytest.skip("this file system refuses names that are not UTF-8")
    report = sync.sync_folder(db, folder)
    assert sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]
    [failed] = report.failed
    assert "the file name is not valid UTF-8" in failed.error and "rename the file" in failed.error
    with pytest.raises(LoaderError, match="the file name is not valid UTF-8"):
        loaders.load_file(os.fsdecode(name))
    again = sync.sync_folder(db, folder)  # the documents of the other files stay as they are
    assert len(again.failed) == 1 and sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]


@pytest.mark.parametrize("how", ["ignore file", "include", "exclude", "ignore file in a folder so named"])
def test_a_file_name_that_is_not_utf8_fails_alone_with_patterns_too(db, folder, how):
    """With google-re2 (pathspec's backend) the pattern match of such a name raised
    UnicodeEncodeError: every sync of a folder with an ignore file, include or exclude ended."""
    where = os.fsencode(folder) + (b"/d\xe9" if how.endswith("so named") else b"")
    try:
        os.makedirs(where, exist_ok=True)
        with open(where + b"/caf\xe9.txt", "wb") as f:
            f.write(b"Coffee beans are roasted seeds.\n")
    except OSError:  # pragma: no cover - a file system that refuses such names
        pytest.skip("this file system refuses names that are not UTF-8")
    if how.startswith("ignore file"):
        with open(where + b"/.gitignore", "wb") as f:
            f.write(b"*.log\n")
    options = {"include": {"include": ["*.txt", "*.md"]}, "exclude": {"exclude": ["*.html"]}}.get(how, {})
    report = sync.sync_folder(db, folder, **options)
    assert sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]
    [failed] = report.failed
    assert "the file name is not valid UTF-8" in failed.error
    excluded = sync.sync_folder(db, folder, exclude=["caf?.txt", "d?/"])  # a wildcard matches the byte
    assert not excluded.failed and sources(db) == ["alpha.md", "beta.txt", "sub/gamma.txt"]


def test_adding_a_touched_file_again_is_unchanged_as_a_sync_finds_it(tmp_path, monkeypatch):
    """The loaded file's mtime (in its metadata, and its timestamp) made a touched but unedited
    file a new version on 'ragdb add' (a second identical version with keep_versions)."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path / "a.md", "# Title\n\nThe refund window is 30 days.\n", mtime=1_700_000_000)
    with ragdb.open(tmp_path / "kb.db", keep_versions=True) as db:
        sync.add_paths(db, ["a.md"])
        before = db.get(source="a.md")
        os.utime(path, (1_700_000_600, 1_700_000_600))  # touched, the same bytes
        report = sync.add_paths(db, ["a.md"])
        assert report.unchanged == ("a.md",) and report.added == report.replaced == ()
        assert len(db.documents(versions="all")) == 1 and db.get(source="a.md") == before
        with ragdb.open(tmp_path / "kb.db") as again:  # a new handle reads the same file
            assert again.documents(versions="all") == db.documents(versions="all") and again.check() == []
        path.write_text("# Title\n\nThe refund window is 14 days.\n")  # edited: a new version, its own time
        os.utime(path, (1_700_001_200, 1_700_001_200))
        assert sync.add_paths(db, ["a.md"]).replaced
        assert db.get(source="a.md").timestamp.startswith("2023-11-14T22:33:20")



@pytest.mark.parametrize("how", ["too large", "unreadable"])
def test_a_folder_whose_ignore_file_cannot_be_read_is_skipped_and_kept(tmp_path, monkeypatch, how):
    """An ignore file over a megabyte, or one that cannot be read (no permission, an I/O error),
    was passed over: every file it ignores (secrets, say) was indexed. Which files it ignores is
    unknown, so its folder is skipped as unreadable: nothing of it is added, and a sync keeps
    the documents it has of it. The other folders sync as before."""
    from ragdb.files import walk

    folder = tmp_path / "kb"
    write(folder / "a.md", "Words of a.\n")
    write(folder / "sub" / "kept.md", "Words of kept.\n")
    with ragdb.open(":memory:") as db:
        sync.sync_folder(db, folder)
        ignore = folder / "sub" / ".gitignore"
        write(ignore, "secret.md\n")
        write(folder / "sub" / "secret.md", "The password is hunter2.\n")
        write(folder / "b.md", "Words of b.\n")
        if how == "too large":
            write(ignore, "secret.md\n" + "# padding\n" * (walk.MAX_IGNORE_BYTES // 10))
        else:
            real_open = os.open

            def refuse(path, *args, **kwargs):
                if os.path.basename(os.fspath(path)) == ".gitignore" and os.path.lexists(path):
                    raise PermissionError(13, "Permission denied", os.fspath(path))
                return real_open(path, *args, **kwargs)

            read_bytes = type(ignore).read_bytes

            def refuse_read(path):
                if path.name == ".gitignore":
                    raise PermissionError(13, "Permission denied", str(path))
                return read_bytes(path)

            monkeypatch.setattr(os, "open", refuse)  # (however the walk reads it)
            monkeypatch.setattr(type(ignore), "read_bytes", refuse_read)
        report = sync.sync_folder(db, folder)
        assert [os.path.basename(s) for s in report.added] == ["b.md"]
        assert not report.deleted
        assert [(os.path.basename(s.path.rstrip("/")), s.detail) for s in report.skipped
                if s.reason == "unreadable"] == [("sub", "an ignore file cannot be read")]
        assert not db.search("password hunter2")
        assert sorted(os.path.basename(d.source) for d in db.documents()) == ["a.md", "b.md", "kept.md"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS as Linux counts it")
def test_reading_a_small_file_takes_no_more_memory_than_it_needs(tmp_path):
    """read_file asked fh.read(MAX_FILE_BYTES + 1) of every file, which allocates that much
    first: 256 MiB of address space for a file of a few bytes (MemoryError under ulimit -v)."""
    import subprocess

    small = write(tmp_path / "small.txt", "a few words\n")
    code = (
        "import resource, sys\n"
        "from ragdb.files import walk\n"
        "with open('/proc/self/statm') as fh: size = int(fh.read().split()[0]) * resource.getpagesize()\n"
        "limit = size + (96 << 20)  # far less than MAX_FILE_BYTES\n"
        "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
        "print(walk.read_file(sys.argv[1])[0].decode(), end='')\n"
    )
    got = subprocess.run([sys.executable, "-c", code, str(small)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=60)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout == "a few words\n"


def test_what_has_an_ignore_files_name_but_is_no_file_is_no_ignore_file(tmp_path):
    """A folder named .gitignore (or a FIFO named .ragdbignore) holds no rules: the walk read it as an
    ignore file that cannot be read and skipped the whole folder as unreadable (nothing of it
    added); a FIFO blocked the walk until a writer came."""
    import threading

    from ragdb.files import walk

    folder = tmp_path / "kb"
    write(folder / "a.md", "Words of a.\n")
    write(folder / "sub" / "b.md", "Words of b.\n")
    (folder / ".gitignore").mkdir()
    if hasattr(os, "mkfifo"):
        os.mkfifo(folder / "sub" / ".ragdbignore")
    found: list = []
    worker = threading.Thread(target=lambda: found.append(walk.walk(folder)), daemon=True)
    worker.start()
    worker.join(60)
    assert found, "the walk blocked on a FIFO named .ragdbignore"
    assert sorted(rel for _path, rel in found[0].files) == ["a.md", "sub/b.md"]
    assert found[0].unreadable == ()


def test_a_folder_listed_but_not_statable_keeps_its_documents(tmp_path, monkeypatch):
    """An entry whose is_dir() fails (a file system without d_type, in a folder with read but not
    search permission) may be a folder: it was kept as a file source only ('sub/deep'), and a
    sync deleted the documents of the files under it ('sub/deep/c.md')."""
    folder = tmp_path / "kb"
    write(folder / "sub" / "deep" / "c.md", "Gamma words deeper down.\n")
    write(folder / "b.md", "Beta words at the top.\n")
    with ragdb.open(tmp_path / "kb.db") as db:
        sync.apply_sync(db, sync.plan_sync(db, folder))
        assert len(list(db.documents())) == 2
        _refuse_stats_in(monkeypatch, folder / "sub", _NoStat)
        plan = sync.plan_sync(db, folder)
        assert plan.deleted == ()
