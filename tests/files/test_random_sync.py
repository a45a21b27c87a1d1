"""Random histories of a folder on disk, kept in step with ``sync``: everything a reader can
observe equals a fresh database synced once from the documents the sync must have stored.

Each example makes a folder ``kb/`` (files in it and in ``sub/`` and ``sub/deep/``:
Markdown with front matter -- ``title``, ``labels``/``acl``, ``version``, metadata --, text,
HTML, reStructuredText, JSON Lines) and a database (``keep_versions`` on or off, one ``acl=``
for every sync or none), and applies a random list of steps: files created, edited, deleted,
touched without an edit (a new modification time), renamed or moved between folders, copied
(the same content under two names), swapped for a link to another file of the folder or to a
file outside it (whose text must never come in: ``link outside``), front matter changed, an
empty file, binary content, text that is not UTF-8, bad front matter or JSON Lines, a file whose
name is not UTF-8; syncs of ``kb`` or ``kb/sub`` (through ``sync_folder``, ``plan_sync`` +
``apply_sync``, ``ragdb sync --json`` in process or in a subprocess; with or without a
source prefix, ``include``/``exclude`` patterns, ``recursive=False``, dry runs); and close +
reopen. Every file gets a modification time of its own (a clock), so a change is never hidden
by an equal size and time (which the docs say a sync does not read).

:class:`Model` follows what each sync must do and store: per source prefix, per file source,
the bytes and modification time of the version stored (a touched file keeps its stored
version and time; a file that fails to load or turns binary keeps its stored version), and
per document source the number of stored versions. After each sync its report (added,
changed, deleted, unchanged, failed, the links and binary files skipped, documents written,
documents removed) equals the model's, ``check()`` finds nothing, the versions stored are the
model's, no text from outside the folder is found, and :func:`observe` (of
``test_random_operations``: searches of every form and principals, counts, facets,
``documents()``, ``get(source=)``) equals that of a fresh database synced once from a folder
holding exactly the stored files (same paths, bytes, times). When nothing stored differs from
the folder, a fresh sync of the folder itself gives the same too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from click.testing import CliRunner
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import ragdb
from ragdb.cli import cli
from ragdb.files import sync
from tests.engine.test_random_operations import DAYS, QUERIES, TITLES, WORDS, assert_same, observe

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "15"))
ROOT = str(Path(ragdb.__file__).resolve().parent.parent)

#: the files of the folder, by kind: a file moves, is copied or linked only within its kind
SLOTS: dict[str, list[str]] = {
    "md": ["a.md", "b.md", "sub/a.md", "sub/deep/c.md", "sub/we[ir]d *?.md"],  # (glob characters: a literal name)
    "txt": ["t.txt", "sub/t.txt"],
    "html": ["h.html", "sub/deep/h.html"],
    "rst": ["r.rst", "sub/r.rst"],
    "jsonl": ["j.jsonl", "sub/j.jsonl"],
}
KINDS = list(SLOTS)
ALL_SLOTS = [s for names in SLOTS.values() for s in names]
BAD_NAME = os.fsdecode(b"caf\xe9.txt")  # not UTF-8: a file every sync reports failed
SECRET = "zyzzyva"  # the words of the file outside the folder
PREFIXES = ["", "p/"]
ROOTS = ["kb", "kb/sub"]
INCLUDES = [None, ["*.md"], ["*.txt", "*.jsonl"]]
EXCLUDES = [None, ["deep/"], ["*.html"]]
ACLS = [None, ["team"], [ragdb.PUBLIC]]
LABELS = ["a", "b", "c", ragdb.PUBLIC]
BASE_TIME = 1_700_000_000


# -- contents --------------------------------------------------------------------------------------

words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=10).map(" ".join)
front = st.fixed_dictionaries({}, optional={
    "title": st.sampled_from([t for t in TITLES if t]), "labels": st.lists(st.sampled_from(LABELS), max_size=2),
    "acl": st.sampled_from(LABELS), "version": st.sampled_from(["1", "2", "v3"]),
    "lang": st.sampled_from(["en", "zh"]), "n": st.integers(0, 4),
    "tags": st.lists(st.sampled_from(["x", "y", "z"]), max_size=2, unique=True), "timestamp": st.sampled_from(DAYS)})
record = st.fixed_dictionaries({"text": words}, optional={
    "acl": st.lists(st.sampled_from(LABELS), min_size=1, max_size=2), "lang": st.sampled_from(["en", "zh"]),
    "n": st.integers(0, 4), "timestamp": st.sampled_from(DAYS)})
records = st.lists(st.tuples(st.sampled_from(["r1", "r2", "r3", None]), record), min_size=1, max_size=3,
                   unique_by=lambda r: r[0] or object())
#: what a file holds: a document of its kind, or something that does not load
content = st.one_of(
    st.tuples(st.just("doc"), front, st.sampled_from([t for t in TITLES if t]), words, records),
    st.tuples(st.just("doc"), front, st.sampled_from([t for t in TITLES if t]), words, records),
    st.tuples(st.just("doc"), front, st.sampled_from([t for t in TITLES if t]), words, records),
    st.sampled_from([("empty",), ("blank",), ("binary",), ("latin1",), ("bad",)]),
)


def render(kind: str, spec: tuple) -> tuple[bytes, str, list[str]]:
    """(bytes, outcome, record keys) of ``spec`` in a file of ``kind``: outcome ``ok`` (loads),
    ``fail`` (reported failed) or ``binary`` (skipped); the record keys of a JSON Lines file
    (``#id`` or ``#line``), else ``[""]``."""
    what = spec[0]
    if what == "empty":
        return b"", "fail", []
    if what == "blank":
        return b"  \n\n\t\n", "fail", []
    if what == "binary":
        return b"\x00\x01\x02\x03 apple \x00 note \xff\xfe" * 4, "binary", []
    if what == "latin1" and kind in ("txt", "md"):
        return "café apple note retrieval évidence\n".encode("latin-1"), "ok", [""]
    if what == "bad" and kind == "md":
        return b"---\ntitle: [\n---\n# Apple\n\napple note\n", "fail", []
    if what == "bad" and kind == "jsonl":
        return b'{"id": "r1", "text": "apple note"}\n{"id": "r2", "text": 5}\n', "fail", []
    if what != "doc":  # a kind without that content: its plain document
        spec = ("doc", {}, "Install guide", "apple evidence guide", [("r1", {"text": "apple evidence"})])
    _, fm, title, body, recs = spec
    if kind == "md":
        head = ""
        if fm:
            lines = [f"{k}: {orjson.dumps(v).decode()}" for k, v in fm.items()]
            head = "---\n" + "\n".join(lines) + "\n---\n"
        return f"{head}# {title}\n\n{body}\n".encode(), "ok", [""]
    if kind == "txt":
        return f"{body}\n".encode(), "ok", [""]
    if kind == "html":
        return (f"<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{body}</p></body></html>\n"
                .encode()), "ok", [""]
    if kind == "rst":
        return f"{title}\n{'=' * (2 * len(title))}\n\n{body}\n".encode(), "ok", [""]
    lines, keys = [], []
    for line, (rid, rec) in enumerate(recs, 1):
        lines.append(orjson.dumps({**({"id": rid} if rid else {}), **rec}).decode())
        keys.append(f"#{rid}" if rid else f"#{line}")
    return ("\n".join(lines) + "\n").encode(), "ok", keys


def file_labels(kind: str, spec: tuple, keys: list[str]) -> list[tuple[str, ...] | None]:
    """The access labels the file gives each of its documents (None: none given, so a new
    version keeps the labels of the one it replaces, as docs/filters-and-access.md says)."""
    if spec[0] != "doc":
        spec = ("doc", {}, "", "", [("r1", {})])
    if kind == "md":
        fm = spec[1]
        if "acl" not in fm and "labels" not in fm:
            return [None for _ in keys]
        given = [fm["acl"]] if "acl" in fm else []
        return [tuple(sorted({*given, *fm.get("labels", [])}))]
    if kind == "jsonl":
        return [tuple(sorted(set(rec["acl"]))) if "acl" in rec else None for _, rec in spec[4]][:len(keys)]
    return [None for _ in keys]


def kind_of(rel: str) -> str:
    return rel.rsplit(".", 1)[1]


# -- the history -------------------------------------------------------------------------------------

slot = st.sampled_from(ALL_SLOTS)
pair = st.sampled_from(KINDS).flatmap(lambda k: st.tuples(st.sampled_from(SLOTS[k]), st.sampled_from(SLOTS[k])))
change = st.one_of(
    st.tuples(st.just("write"), slot, content),
    st.tuples(st.just("write"), slot, content),
    st.tuples(st.just("write"), slot, content),
    st.tuples(st.just("touch"), slot),
    st.tuples(st.just("delete"), slot),
    st.tuples(st.just("rename"), pair),
    st.tuples(st.just("copy"), pair),
    st.tuples(st.just("link_in"), pair),
    st.tuples(st.just("link_out"), slot),
    st.tuples(st.just("front"), st.sampled_from(SLOTS["md"]), front),
    st.tuples(st.just("bad_name"), st.booleans()),
    st.tuples(st.just("drop_record"), st.sampled_from(SLOTS["jsonl"])),
)
a_sync = st.tuples(st.just("sync"),
                   st.sampled_from(["library", "library", "library", "plan", "runner", "process"]),
                   st.sampled_from(ROOTS), st.sampled_from(range(len(PREFIXES))),
                   st.sampled_from(range(len(INCLUDES))), st.sampled_from(range(len(EXCLUDES))),
                   st.booleans(), st.booleans())  # recursive, dry run
#: rounds of a few changes of the folder, each followed by a sync (or a reopening, then a sync)
then = st.one_of(a_sync, a_sync, a_sync, st.tuples(st.just("full_sync"), st.sampled_from(range(len(PREFIXES)))),
                 st.tuples(st.just("reopen")))
rounds = st.tuples(st.lists(change, max_size=5), then)
histories = st.lists(rounds, min_size=2, max_size=12).map(lambda rs: [op for ops, last in rs for op in (*ops, last)])


# -- the model ---------------------------------------------------------------------------------------

@dataclass
class Stored:
    """A file's stored version: its bytes, modification time (ns), and per document source
    (the file's, or its records') the number of stored versions."""

    data: bytes
    mtime_ns: int
    versions: dict[str, int] = field(default_factory=dict)
    acl: dict[str, tuple[str, ...]] = field(default_factory=dict)  # document source -> its labels


@dataclass
class Want:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: set[tuple[str, str]] = field(default_factory=set)
    documents: int = 0
    removed: int = 0


class Run:
    def __init__(self, base: Path, keep_versions: bool, acl: list[str] | None) -> None:
        self.base, self.kb, self.keep, self.acl = base, base / "kb", keep_versions, acl
        self.kb.mkdir()
        self.outside = base / "kb-outside"  # (its path starts with the folder's)
        self.outside.mkdir()
        self.path = str(base / "kb.db")
        self.db = ragdb.open(self.path, keep_versions=keep_versions)
        self.clock = 0
        self.outcomes: dict[tuple[str, bytes], tuple[str, list[str]]] = {}
        self.labels: dict[tuple[str, bytes], list[tuple[str, ...] | None]] = {}
        self.specs: dict[bytes, tuple] = {}  # Markdown bytes -> the spec that made them
        self.stored: dict[str, dict[str, Stored]] = {p: {} for p in PREFIXES}  # prefix -> file source -> version

    # the folder ---------------------------------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1
        return (BASE_TIME + self.clock) * 1_000_000_000 + self.clock * 7_000  # whole microseconds

    def file(self, rel: str) -> Path:
        return self.kb / rel

    def put(self, rel: str, data: bytes) -> None:
        p = self.file(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            p.unlink()
        p.write_bytes(data)
        t = self.tick()
        os.utime(p, ns=(t, t))

    def regular(self, rel: str) -> bool:
        p = self.file(rel)
        return p.is_file() and not p.is_symlink()

    def change(self, op: tuple) -> None:
        kind = op[0]
        if kind == "write":
            rel, spec = op[1], op[2]
            data, outcome, keys = render(kind_of(rel), spec)
            self.outcomes[(kind_of(rel), data)] = (outcome, keys)
            self.labels[(kind_of(rel), data)] = file_labels(kind_of(rel), spec, keys)
            if kind_of(rel) == "md" and spec[0] == "doc":
                self.specs[data] = spec
            self.put(rel, data)
        elif kind == "touch":
            p = self.file(op[1])
            if p.exists():  # (through a link: its target)
                t = self.tick()
                os.utime(p, ns=(t, t))
        elif kind == "delete":
            p = self.file(op[1])
            if p.is_symlink() or p.exists():
                p.unlink()
        elif kind in ("rename", "copy", "link_in"):
            src, dst = op[1]
            if src == dst or not self.regular(src):
                return
            s, d = self.file(src), self.file(dst)
            d.parent.mkdir(parents=True, exist_ok=True)
            if d.is_symlink() or d.exists():
                d.unlink()
            if kind == "rename":
                os.rename(s, d)  # (keeps its time)
            elif kind == "copy":
                shutil.copyfile(s, d)
                t = self.tick()
                os.utime(d, ns=(t, t))
            else:
                os.symlink(os.path.relpath(s, d.parent), d)
        elif kind == "link_out":
            p = self.file(op[1])
            p.parent.mkdir(parents=True, exist_ok=True)
            target = self.outside / ("secret." + kind_of(op[1]))
            data, _, _ = render(kind_of(op[1]), ("doc", {}, "Install guide", f"{SECRET} apple note",
                                                 [("r1", {"text": f"{SECRET} apple"})]))
            target.write_bytes(data)
            if p.is_symlink() or p.exists():
                p.unlink()
            os.symlink(target, p)
        elif kind == "front":
            p = self.file(op[1])
            if not p.exists():
                return
            spec = self.specs.get(p.read_bytes())
            if spec is None:
                return
            self.change(("write", op[1], (spec[0], op[2], *spec[2:])))
        elif kind == "drop_record":  # a JSON Lines file loses its last record (the others stay as they are)
            p = self.file(op[1])
            if not self.regular(op[1]):
                return
            data = p.read_bytes()
            outcome, keys = self.outcomes[("jsonl", data)]
            if outcome != "ok" or len(keys) < 2:
                return
            shorter = b"".join(data.splitlines(keepends=True)[:-1])
            self.outcomes[("jsonl", shorter)] = ("ok", keys[:-1])
            self.labels[("jsonl", shorter)] = self.labels[("jsonl", data)][:-1]
            self.put(op[1], shorter)
        elif kind == "bad_name":
            p = os.path.join(os.fsencode(self.kb), os.fsencode(BAD_NAME))
            if op[1]:
                try:
                    with open(p, "wb") as f:
                        f.write(b"coffee apple note\n")
                except OSError:  # pragma: no cover - a file system that refuses such names
                    return
            elif os.path.exists(p):
                os.unlink(p)
        else:  # pragma: no cover
            raise AssertionError(op)

    # what a sync must do --------------------------------------------------------------------------
    def expect(self, root: str, prefix: str, include, exclude, recursive: bool) -> tuple[Want, dict]:
        """What a sync of ``root`` must report, and the model's stored files after it."""
        scope = prefix + root + "/"
        under = root[len("kb/"):] + "/" if root != "kb" else ""
        root_real = os.path.realpath(self.base / root)

        def included(rel: str) -> bool:
            if include and not any(rel.endswith(p[1:]) for p in include):
                return False
            return not excluded(rel)

        def excluded(rel: str) -> bool:
            if exclude == ["deep/"]:
                return "/deep/" in "/" + rel
            return bool(exclude) and rel.endswith(".html")

        def visited(rel: str) -> bool:  # reached by the walk (a folder excluded is not entered)
            if not recursive and "/" in rel:
                return False
            return not (exclude == ["deep/"] and "/" in rel and "/deep/" in "/" + rel.rsplit("/", 1)[0] + "/")

        want = Want()
        stored = {s: Stored(v.data, v.mtime_ns, dict(v.versions), dict(v.acl)) for s, v in self.stored[prefix].items()}
        files: set[str] = set()
        for name in [*ALL_SLOTS, BAD_NAME]:
            if not name.startswith(under):
                continue
            rel = name[len(under):]
            p = self.file(name)
            if not (p.is_symlink() or p.exists()) or not visited(rel):
                continue
            shown = f"{root}/{rel}"
            if p.is_symlink():
                if not p.exists():
                    want.skipped.add((shown, "not a file"))
                    continue
                real = os.path.realpath(p)
                if not real.startswith(root_real + os.sep):
                    want.skipped.add((shown, "link outside"))
                    continue
            if not included(rel):
                continue
            source = scope + rel
            files.add(source)
            if name == BAD_NAME:
                want.failed.append(source)
                continue
            data, mtime = p.read_bytes(), os.stat(p).st_mtime_ns
            outcome, keys = self.outcomes[(kind_of(name), data)]
            old = stored.get(source)
            if old is not None and ((len(data) == len(old.data) and abs(mtime - old.mtime_ns) <= 2000)
                                    or hashlib.sha256(data).digest() == hashlib.sha256(old.data).digest()):
                want.unchanged.append(source)
                continue
            if outcome == "fail":
                want.failed.append(source)
                continue
            if outcome == "binary":
                want.skipped.add((shown, "binary"))
                continue
            (want.changed if old is not None else want.added).append(source)
            versions, acl = {}, {}
            given = self.labels[(kind_of(name), data)]
            for key, labels in zip(keys, given):
                before = old.versions.get(source + key, 0) if old is not None else 0
                versions[source + key] = before + 1 if self.keep else 1
                if self.acl is not None:
                    labels = tuple(sorted(set(self.acl)))
                if labels is None:  # the labels of the version it replaces
                    labels = old.acl.get(source + key, ()) if old is not None else ()
                acl[source + key] = labels
            if old is not None:
                want.removed += sum(n for s, n in old.versions.items() if s not in versions)
            want.documents += len(keys)
            stored[source] = Stored(data, mtime, versions, acl)
        for source in sorted(self.stored[prefix]):
            rel = source[len(scope):] if source.startswith(scope) else None
            if rel is None or source in files or (not recursive and "/" in rel) or not included(rel):
                continue
            want.deleted.append(source)
            want.removed += sum(stored.pop(source).versions.values())
        return want, stored

    # syncs ----------------------------------------------------------------------------------------
    def do_sync(self, how: str, root: str, prefix: str, include, exclude, recursive: bool, dry: bool) -> None:
        want, after = self.expect(root, prefix, include, exclude, recursive)
        kw = {"source_prefix": prefix, "include": include, "exclude": exclude, "recursive": recursive, "acl": self.acl}
        if how == "library":
            report = sync.sync_folder(self.db, root, dry_run=dry, **kw)
            got = self.from_report(report)
        elif how == "plan":
            plan = sync.plan_sync(self.db, root, probe=dry, **kw)
            report = plan.dry_run() if dry else sync.apply_sync(self.db, plan)
            got = self.from_report(report)
        else:
            args = ["sync", "-d", self.path, root, "--json", "--source-prefix", prefix,
                    "--recursive" if recursive else "--no-recursive"]
            args += [a for p in include or () for a in ("--include", p)]
            args += [a for p in exclude or () for a in ("--exclude", p)]
            args += [a for label in self.acl or () for a in ("--acl", label)]
            if dry:
                args.append("--dry-run")
            if how == "runner":
                result = CliRunner().invoke(cli, args, catch_exceptions=False)
                assert result.exit_code == 0, result.output
                out = orjson.loads(result.stdout)
            else:
                done = subprocess.run([sys.executable, "-m", "ragdb.cli", *args], capture_output=True, timeout=120,
                                      cwd=self.base, env={**os.environ, "PYTHONPATH": ROOT})
                assert done.returncode == 0, done.stderr.decode()
                out = orjson.loads(done.stdout)
            got = self.from_json(out)
            want.unchanged = len(want.unchanged)  # type: ignore[assignment]  # (the JSON gives a count)
        if dry:
            want.documents = want.removed = 0
        elif how in ("library", "plan"):
            assert report.dry_run is False
        assert_same(got, self.as_dict(want, json=how in ("runner", "process")), f"the report of a {how} sync")
        if not dry:
            self.stored[prefix] = after
        self.compare()

    @staticmethod
    def as_dict(w: Want, json: bool) -> dict:
        def shown(s: str) -> str:
            return s.encode("utf-8", "backslashreplace").decode() if json else s

        return {"added": sorted(w.added), "changed": sorted(w.changed), "deleted": sorted(w.deleted),
                "unchanged": w.unchanged if isinstance(w.unchanged, int) else sorted(w.unchanged),
                "failed": sorted(shown(s) for s in w.failed),
                "skipped": sorted([shown(p), r] for p, r in w.skipped), "documents": w.documents,
                "removed": w.removed}

    @staticmethod
    def kept_skips(pairs) -> list:
        return sorted([p, r] for p, r in pairs if r in ("link outside", "not a file", "binary"))

    def from_report(self, r) -> dict:
        return {"added": list(r.added), "changed": list(r.changed), "deleted": list(r.deleted),
                "unchanged": list(r.unchanged), "failed": sorted(f.source for f in r.failed),
                "skipped": self.kept_skips((s.path, s.reason) for s in r.skipped), "documents": r.documents,
                "removed": r.removed}

    def from_json(self, out: dict) -> dict:
        return {"added": out["added"], "changed": out["changed"], "deleted": out["deleted"],
                "unchanged": out["unchanged"], "failed": sorted(f["source"] for f in out["failed"]),
                "skipped": self.kept_skips((s["path"], s["reason"]) for s in out["skipped"]),
                "documents": out["documents"], "removed": out["removed"]}

    # comparisons ----------------------------------------------------------------------------------
    def sources(self) -> list[str]:
        out = {p + "kb/" + s for p in PREFIXES for s in ALL_SLOTS}
        for files in self.stored.values():
            for f in files.values():
                out.update(f.versions)
        return sorted(out)

    def versions(self) -> dict[str, int]:
        return {s: n for files in self.stored.values() for f in files.values() for s, n in f.versions.items()}

    def fresh_from_stored(self) -> ragdb.Database:
        """A fresh database synced once, per prefix, from a folder at ``kb`` holding exactly the
        stored files (the folder itself moved aside meanwhile)."""
        fresh = ragdb.open(":memory:", keep_versions=self.keep)
        aside = self.base / "kb.aside"
        os.rename(self.kb, aside)
        try:
            for prefix, files in self.stored.items():
                if not files:
                    continue
                for source, f in files.items():
                    p = self.base / source[len(prefix):]
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(f.data)
                    os.utime(p, ns=(f.mtime_ns, f.mtime_ns))
                report = sync.sync_folder(fresh, "kb", source_prefix=prefix, acl=self.acl)
                assert sorted(report.added) == sorted(files) and not report.failed, report
                for f in files.values():  # labels a file no longer gives, kept from an older version
                    for source, labels in f.acl.items():
                        doc = fresh.get(source=source, principals=ragdb.ALL)
                        if doc.acl != labels:
                            fresh.update(doc.id, acl=list(labels))
                shutil.rmtree(self.kb)
        finally:
            if self.kb.exists():
                shutil.rmtree(self.kb)
            os.rename(aside, self.kb)
        return fresh

    def compare(self) -> None:
        assert self.db.check() == []
        counts: dict[str, int] = {}
        for d in self.db.documents(versions="all", principals=ragdb.ALL):
            counts[d.source] = counts.get(d.source, 0) + 1
            assert SECRET not in (d.text or ""), d.source
        assert counts == self.versions()
        assert self.db.search(SECRET, principals=ragdb.ALL) == []
        sources = self.sources()
        with self.fresh_from_stored() as fresh:
            want = orjson.loads(orjson.dumps(observe(fresh, sources, QUERIES)))
        assert_same(orjson.loads(orjson.dumps(observe(self.db, sources, QUERIES))), want, "the synced database")
        if self.pure():  # the folder is what is stored: a fresh sync of it is the same
            prefix = next(p for p, files in self.stored.items() if files)
            with ragdb.open(":memory:", keep_versions=self.keep) as fresh:
                sync.sync_folder(fresh, "kb", source_prefix=prefix, acl=self.acl)
                assert_same(orjson.loads(orjson.dumps(observe(fresh, sources, QUERIES))), want, "a fresh sync")

    def pure(self) -> bool:
        used = [p for p, files in self.stored.items() if files]
        if len(used) != 1:
            return False
        want, after = self.expect("kb", used[0], None, None, True)
        if want.added or want.changed or want.deleted or want.failed or want.skipped:
            return False
        for source, f in after.items():
            if f.mtime_ns != os.stat(self.base / source[len(used[0]):]).st_mtime_ns:
                return False
            given = self.labels[(kind_of(source), f.data)] if self.acl is None else [tuple(sorted(set(self.acl)))]
            if [g or () for g in given] != [f.acl[s] for s in f.versions]:
                return False  # (labels kept from an older version)
        return True

    def run(self, ops) -> None:
        try:
            for op in ops:
                kind = op[0]
                if kind == "sync":
                    _, how, root, prefix, inc, exc, recursive, dry = op
                    if not (self.base / root).is_dir():
                        continue
                    self.do_sync(how, root, PREFIXES[prefix], INCLUDES[inc], EXCLUDES[exc], recursive, dry)
                elif kind == "full_sync":
                    self.do_sync("library", "kb", PREFIXES[op[1]], None, None, True, False)
                elif kind == "reopen":
                    self.db.close()
                    self.db = ragdb.open(self.path)
                else:
                    self.change(op)
            for prefix in PREFIXES:
                if any(self.stored[prefix].values()) or prefix == "":
                    self.do_sync("library", "kb", prefix, None, None, True, False)
        finally:
            self.db.close()


@contextlib.contextmanager
def working_folder(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(ops=histories, keep_versions=st.booleans(), acl=st.sampled_from(ACLS))
def test_random_folder_histories_sync_to_a_fresh_build(tmp_path_factory, ops, keep_versions, acl):
    """After any history of file changes and syncs, each sync reports what changed and the
    database observes what a fresh sync of the stored files does; check() finds nothing."""
    note(f"keep_versions={keep_versions}, acl={acl!r}\nops={ops!r}")
    base = tmp_path_factory.mktemp("sync")
    with working_folder(base):
        Run(base, keep_versions, acl).run(ops)
