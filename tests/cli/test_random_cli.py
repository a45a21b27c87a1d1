"""Random histories through the ``ragdb`` commands that write (``import``, ``add -`` with
labels, metadata and versions, ``delete`` by id, source pattern, ``--filter`` and ``--where``,
``collections create``/``drop``, ``optimize``) and bad input, mostly through click's runner in
this process and now and then as a fresh ``python -m ragdb.cli`` process: what the reading
commands print (``search --json`` as three callers with both lexical scorers, ``list
--json``, ``show --json``, ``facets --json``, ``stats --json``) equals what the library returns
on the same file (ids included) and on a fresh build of the same documents (ids left out);
``ragdb check`` finds nothing; an export with ``--all-principals`` imported into a new file
reads the same.

Bad input (a malformed import line, a record the library refuses, metadata it refuses, an
empty text, filters that do not parse or that it refuses, a missing id, document or
collection, option conflicts) exits non-zero with a one-line message, the library's where the
library refused it, never a traceback, and changes nothing stored.

:class:`Model` is tests/engine/test_random_operations.py's with versions; the strategies are
its texts, metadata values, sources, globs and filters.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st

import ragdb
import ragdb.files.transfer
from cli_helpers import ROOT
from engine.test_random_operations import (DAYS, FILTERS, GLOBS, SOURCES, TITLES, assert_same, small_segments,
                                           texts)
from ragdb.cli import cli
from ragdb.cli.main import one_line
from ragdb.errors import RagdbError
from ragdb.serve.shapes import document_json, facets_json, hit_json

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "12"))

ALL = ragdb.ALL
CALLERS: dict[str, tuple[list[str], Any]] = {"anonymous": ([], None), "a": (["--principal", "a"], ["a"]),
                                             "ALL": (["--all-principals"], ALL)}
QUERIES = ["apple retrieval", "检索增强生成", '"apple note"', "search -model", "note OR 向量"]
SNIPPET_CHARS = 160  # (search's default --snippet-chars)
SIDE = "side"


class Model:
    """Per source its stored versions (text, title, metadata, version, acl, timestamp), oldest
    first; the sources in the order of their latest add; the side collection's sources."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.stored: dict[str, list[dict]] = {}
        self.side: set[str] | None = None
        self.seen: set[str] = set(SOURCES)

    def add(self, source: str, record: dict) -> str:
        self.seen.add(source)
        versions = self.stored.get(source)
        latest = versions[-1] if versions else None
        acl = tuple(sorted(set(record["acl"]))) if record.get("acl") is not None else (latest["acl"] if latest else ())
        new = {"text": record["text"], "title": record.get("title"), "metadata": copy.deepcopy(record["metadata"]),
               "version": record.get("version"), "acl": acl, "timestamp": record.get("timestamp")}
        if latest is not None and all(new[k] == latest[k] for k in ("text", "title", "metadata", "version", "acl")):
            return "unchanged"
        older = self.stored.pop(source, [])
        self.stored[source] = [*older, new] if self.keep else [new]
        return "replaced" if latest is not None else "added"

    def delete_where(self, doomed) -> int:
        n = 0
        for source in list(self.stored):
            kept = [v for v in self.stored[source] if not doomed(source, v)]
            n += len(self.stored[source]) - len(kept)
            if kept:
                self.stored[source] = kept
            else:
                del self.stored[source]
        return n

    def records(self) -> list[dict]:
        return [{"text": v["text"], "source": s, "title": v["title"], "metadata": v["metadata"],
                 "version": v["version"], "acl": list(v["acl"]), "timestamp": v["timestamp"]}
                for s, versions in sorted(self.stored.items()) for v in versions[-1:]]


# -- running the command ---------------------------------------------------------------------------

class Outcome:
    def __init__(self, code: int, stdout: str, output: str) -> None:
        self.code, self.stdout, self.output = code, stdout, output

    def json(self) -> Any:
        assert self.code == 0, self.output
        return orjson.loads(self.stdout)


def ragdb_cli(path: str, *args: str, stdin: bytes | None = None, process: bool = False) -> Outcome:
    """``ragdb -d PATH ARGS`` in process (click's runner), or as a fresh process."""
    argv = ["-d", path, *args]
    if process:
        done = subprocess.run([sys.executable, "-m", "ragdb.cli", *argv], input=stdin, capture_output=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        out, err = done.stdout.decode(), done.stderr.decode()
        result = Outcome(done.returncode, out, out + err)
    else:
        r = CliRunner().invoke(cli, argv, input=stdin, catch_exceptions=True)
        assert r.exception is None or isinstance(r.exception, SystemExit), (argv, r.output, r.exc_info)
        result = Outcome(r.exit_code, r.stdout, r.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, (argv, result.output)
    return result


# -- what the reading commands print ---------------------------------------------------------------

def read_calls(model: Model, ids: list[int]) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []
    for flags, _ in CALLERS.values():
        for q in QUERIES:
            for scorer in ("bm25", "tfidf"):
                calls.append(("search", q, "-k", "40", "--scorer", scorer, "--json", *flags))
        calls.append(("search", "apple note", "-k", "40", "--where", '{"n": {"$gte": 2}}', "--json", *flags))
        calls.append(("list", "--json", *flags))
        calls.append(("facets", "lang", "--json", *flags))
        calls.append(("facets", "tags", "apple OR 检索", "--by", "documents", "--json", *flags))
    calls.append(("list", "--all-versions", "--json", "--all-principals"))
    calls.append(("list", "--source", "a/*", "--filter", "lang=en", "--json", "--all-principals"))
    calls.append(("list", "--limit", "2", "--offset", "1", "--json", "--principal", "a"))
    calls.append(("search", "apple 检索 note", "-k", "3", "--offset", "2", "--json", "--all-principals"))
    calls += [("show", s, "--json", "--all-principals") for s in sorted(model.seen)]
    calls += [("show", s, "--json") for s in sorted(model.seen)[:3]]
    calls += [("show", str(i), "--json", "--all-principals") for i in ids]
    calls.append(("stats", "--json"))
    return calls


def library_reads(db: ragdb.Database, call: tuple[str, ...]) -> Any:
    """What ``ragdb CALL`` prints, as the library computes it (``["error", message]`` for a
    RagdbError: exit status 1 and the message)."""
    try:
        return _library_reads(db, call)
    except RagdbError as e:
        return ["error", one_line(e)]


def _library_reads(db: ragdb.Database, call: tuple[str, ...]) -> Any:
    who = ALL if "--all-principals" in call else (["a"] if "--principal" in call else None)
    if call[0] == "search":
        kw: dict[str, Any] = {}
        if "--where" in call:
            kw["filter"] = orjson.loads(call[call.index("--where") + 1])
        k = int(call[call.index("-k") + 1])
        offset = int(call[call.index("--offset") + 1]) if "--offset" in call else 0
        hits = db.search(call[1], k, offset=offset, scorer=call[call.index("--scorer") + 1] if "--scorer" in call else "bm25",
                         highlight=True, snippet_chars=SNIPPET_CHARS, principals=who, **kw)
        return [hit_json(h, i) for i, h in enumerate(hits, offset + 1)]
    if call[0] == "list":
        source = call[call.index("--source") + 1] if "--source" in call else None
        flt = {"lang": "en"} if "--filter" in call else None
        limit = int(call[call.index("--limit") + 1]) if "--limit" in call else None
        offset = int(call[call.index("--offset") + 1]) if "--offset" in call else 0
        return [document_json(d) for d in db.documents(source, versions="all" if "--all-versions" in call else "latest",
                                                       limit=limit, offset=offset, filter=flt, principals=who)]
    if call[0] == "facets":
        query = call[2] if call[2] != "--json" else None
        return facets_json(db.facets(call[1], query, by="documents" if "--by" in call else "chunks", principals=who))
    if call[0] == "show":
        d = db.get(int(call[1]), principals=who) if call[1].isdigit() else db.get(source=call[1], principals=who)
        return document_json(d)
    if call[0] == "stats":
        s = db.stats()
        return {"documents": s.documents, "chunks": s.chunks, "vocabulary": s.vocabulary, "postings": s.postings,
                "avg_chunk_length": s.avg_chunk_length}
    raise AssertionError(call)


def cli_reads(outcome: Outcome, call: tuple[str, ...]) -> Any:
    if outcome.code != 0:
        assert outcome.code == 1, outcome.output
        lines = [line for line in outcome.output.splitlines() if line.startswith("Error: ")]
        assert len(lines) == 1, outcome.output
        return ["error", lines[0][len("Error: "):]]
    got = outcome.json()
    if call[0] == "stats":
        return {k: got[k] for k in ("documents", "chunks", "vocabulary", "postings", "avg_chunk_length")}
    return got


def without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in ("id", "doc_id", "chunk_id")}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def snapshot(path: str) -> Any:
    with ragdb.open(path) as db:
        names = [c.name for c in db.collections()]
        docs = [[d.id, d.source, d.version, d.timestamp, d.content_hash, dict(d.metadata), list(d.acl), d.latest]
                for d in db.documents(versions="all", principals=ALL)]
        side = [d.source for d in db.collection(SIDE, create=False).documents(principals=ALL)] \
            if SIDE in names else None
        return [docs, names, side, dict(db.settings)]


# -- the operations --------------------------------------------------------------------------------

#: --metadata values as the command types them: numbers and booleans typed, a repeated key a list
cli_metadata = st.fixed_dictionaries({}, optional={
    "lang": st.sampled_from(["en", "zh"]), "n": st.integers(0, 4), "flag": st.booleans(),
    "tags": st.sampled_from([["x", "y"], ["y", "z"], "x", "z"])})
import_metadata = st.fixed_dictionaries({}, optional={
    "lang": st.sampled_from(["en", "zh"]), "n": st.integers(0, 4), "w": st.sampled_from([0.5, 2.25, -1.0]),
    "flag": st.booleans(), "tags": st.lists(st.sampled_from(["x", "y", "z"]), max_size=2, unique=True)})
labels = st.lists(st.sampled_from(["a", "b", ragdb.PUBLIC]), max_size=2, unique=True)
import_records = st.fixed_dictionaries({
    "text": texts, "title": st.sampled_from(TITLES), "metadata": import_metadata,
    "version": st.sampled_from([None, "v1", "v2"]), "timestamp": st.sampled_from(DAYS),
    "acl": st.one_of(st.none(), labels)})
sources = st.sampled_from(SOURCES)
existing = st.integers(0, 50)

writes = st.one_of(
    st.tuples(st.just("import"), st.lists(st.tuples(sources, import_records), min_size=1, max_size=5)),
    st.tuples(st.just("add"), sources, texts, cli_metadata, st.one_of(st.none(), labels, st.just("public")),
              st.sampled_from([None, "v1"])),
    st.tuples(st.just("delete_glob"), st.sampled_from(GLOBS)),
    st.tuples(st.just("delete_where"), st.integers(0, len(FILTERS) - 1), st.one_of(st.none(), st.just("a/*"))),
    st.tuples(st.just("delete_filter"), st.sampled_from(["lang=en", "n=3", "tags=x"])),
    st.tuples(st.just("delete_id"), existing, st.integers(0, 3)),
)
step = st.one_of(
    writes, writes, writes, writes,
    st.tuples(st.just("process"), writes),
    st.tuples(st.just("collection"), st.sampled_from(["create", "add", "drop"]), sources, texts),
    st.tuples(st.just("optimize"),),
    st.tuples(st.just("bad"), st.integers(0, 20), st.integers(0, 4), sources),
    st.tuples(st.just("checkpoint"),),
)
histories = st.lists(step, min_size=3, max_size=18)


class Run:
    def __init__(self, folder: Path, chunker: str, keep: bool) -> None:
        self.folder, self.path = folder, str(folder / "kb.db")
        self.options = {"chunker": chunker, "keep_versions": keep}
        args = ["init", "--chunker", chunker, "--keep-versions" if keep else "--no-keep-versions"]
        assert ragdb_cli(self.path, *args).code == 0
        self.model = Model(keep)
        self.files = 0

    def cli(self, *args: str, stdin: bytes | None = None, process: bool = False) -> Outcome:
        return ragdb_cli(self.path, *args, stdin=stdin, process=process)

    def jsonl(self, lines: list[bytes]) -> str:
        self.files += 1
        path = self.folder / f"import-{self.files}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        return str(path)

    def stamp(self, source: str) -> None:
        with ragdb.open(self.path) as db:
            self.model.stored[source][-1]["timestamp"] = db.get(source=source, with_text=False, principals=ALL).timestamp

    def pick(self, index: int) -> str | None:
        stored = list(self.model.stored)
        return stored[index % len(stored)] if stored else None

    # writes -----------------------------------------------------------------------------------------
    def write(self, op: tuple, process: bool = False) -> None:
        kind, model = op[0], self.model
        if kind == "import":
            pairs = op[1]
            path = self.jsonl([orjson.dumps({**r, "source": s}) for s, r in pairs])
            statuses = [model.add(s, r) for s, r in pairs]
            got = self.cli("import", path, "--json", process=process).json()
            assert (got["documents"], got["unchanged"]) == \
                (len(pairs) - statuses.count("unchanged"), statuses.count("unchanged")), (got, statuses)
        elif kind == "add":
            _, source, text, meta, acl, version = op
            data = text.encode()
            args = ["add", "-", "--source", source, "--kind", "txt", "--json"]
            for key, value in meta.items():
                for v in (value if isinstance(value, list) else [value]):
                    args += ["--metadata", f"{key}={orjson.dumps(v).decode() if not isinstance(v, str) else v}"]
            if acl == "public":
                args.append("--public")
            else:
                for label in acl or ():
                    args += ["--acl", label]
            if version is not None:
                args += ["--version", version]
            stored_meta = {**meta, "content_hash": hashlib.sha256(data).hexdigest(), "encoding": "utf-8",
                           "loader": "text", "size": len(data)}
            status = model.add(source, {"text": text, "metadata": stored_meta, "version": version,
                                        "acl": [ragdb.PUBLIC] if acl == "public" else (acl or None)})
            got = self.cli(*args, stdin=data, process=process).json()
            assert (got["added"], got["replaced"], got["unchanged"]) == \
                ([] if status == "unchanged" else [source], [source] if status == "replaced" else [],
                 [source] if status == "unchanged" else []), (got, status)
            if status != "unchanged":
                self.stamp(source)
        elif kind == "delete_glob":
            n = model.delete_where(lambda s, v: fnmatch.fnmatchcase(s, op[1]))
            assert self.cli("delete", "--source", op[1], "--json", process=process).json() == {"deleted": n}
        elif kind == "delete_where":
            condition, matches = FILTERS[op[1]]
            args = ["delete", "--where", orjson.dumps(condition).decode(), "--json"]
            if op[2] is not None:
                args += ["--source", op[2]]
            n = model.delete_where(lambda s, v: matches(v["metadata"]) and
                                   (op[2] is None or fnmatch.fnmatchcase(s, op[2])))
            assert self.cli(*args, process=process).json() == {"deleted": n}
        elif kind == "delete_filter":
            key, value = op[1].split("=")
            wanted = [value] + ([int(value)] if value.isdigit() else [])

            def matches(m: dict) -> bool:
                have = m.get(key)
                return any(w == have or (isinstance(have, list) and w in have) for w in wanted)

            n = model.delete_where(lambda s, v: matches(v["metadata"]))
            assert self.cli("delete", "--filter", op[1], "--json", process=process).json() == {"deleted": n}
        elif kind == "delete_id":
            source = self.pick(op[1])
            if source is None:
                return
            with ragdb.open(self.path) as db:
                docs = sorted(db.documents(source, glob=False, versions="all", principals=ALL), key=lambda d: d.id)
            position = op[2] % len(docs)
            doomed = model.stored[source][position]
            assert self.cli("delete", "--id", str(docs[position].id), "--json", process=process).json() == \
                {"deleted": 1}
            model.delete_where(lambda s, v: v is doomed)
        else:  # pragma: no cover
            raise AssertionError(op)

    def collection(self, action: str, source: str, text: str) -> None:
        model = self.model
        if action == "create":
            got = self.cli("collections", "create", SIDE)
            if model.side is None:
                assert got.code == 0, got.output
                model.side = set()
            else:
                self.refused(got, "already exists")
        elif action == "add":
            got = self.cli("-c", SIDE, "add", "-", "--source", source, "--kind", "txt", stdin=text.encode())
            assert got.code == 0, got.output  # (an add creates the collection)
            model.side = {*(model.side or set()), source}
        else:
            got = self.cli("collections", "drop", SIDE, "--yes")
            if model.side is None:
                self.refused(got, f"no collection {SIDE!r}")
            else:
                assert got.code == 0, got.output
                model.side = None

    # bad input --------------------------------------------------------------------------------------
    def refused(self, outcome: Outcome, why: str, code: int = 1) -> None:
        assert outcome.code == code, (outcome.code, outcome.output)
        assert why in outcome.output, (why, outcome.output)
        event(f"refused: {why[:50]}")

    def bad(self, which: int, variant: int, source: str) -> None:
        """A bad input: exit status 1 (the library's message) or 2 (a usage error naming the
        option), nothing stored changed, ``check()`` clean."""
        before = snapshot(self.path)
        good = orjson.dumps({"text": "apple evidence", "source": "n/good", "metadata": {"lang": "en"}})
        bad_records: list[dict] = [{"text": "", "source": source}, {"text": "apple", "source": source, "acl": "a"},
                                   {"text": "apple", "source": source, "metadata": {"n": 2 ** 70}},
                                   {"text": "apple", "source": source, "timestamp": "soon"},
                                   {"text": "apple", "source": source, "metadata": {"w": 1e309}}]
        record = bad_records[variant % len(bad_records)]
        cases: list[tuple[tuple[str, ...], bytes | None, Any, int]] = [
            (("import", self.jsonl([good, b"{not json"])), None, f"{self.files}.jsonl:2: invalid JSON", 1),
            (("import", "JSONL"), None, lambda db: ragdb.files.transfer.import_jsonl(db, self.folder / "bad.jsonl"), 1),
            (("add", "-", "--source", source, "--kind", "txt", "--acl", ""), b"apple",
             "acl must be a list of labels (non-empty strings), got ['']", 1),
            (("add", "-", "--source", source, "--kind", "txt", "--metadata", "novalue"), b"apple",
             "is not KEY=VALUE", 2),
            (("add", "-", "--source", source, "--acl", "a", "--public"), b"apple", "exclude each other", 2),
            (("add", "-", "--source", source, "--kind", "txt", "--strict"), b" \n", "empty", 1),
            (("delete", "--where", "{nope"), None, "not valid JSON", 2),
            (("delete", "--where", '{"$bogus": 1}'), None, lambda db: db.delete(filter={"$bogus": 1}), 1),
            (("delete", "--where", '{"n": {"$gte": "x"}}', "--source", "a/*"), None,
             lambda db: db.delete(source="a/*", glob=True, filter={"n": {"$gte": "x"}}), 1),
            (("delete",), None, "give --id ID", 2),
            (("delete", "--id", "3", "--source", "a/*"), None, "give it alone", 2),
            (("delete", "--id", str(2 ** 40)), None, lambda db: db.delete(2 ** 40), 1),
            (("delete", "--id", "many"), None, "is not a valid integer", 2),
            (("search", "apple", "--where", '{"n": {"$in": 5}}', "--json"), None,
             lambda db: db.search("apple", filter={"n": {"$in": 5}}), 1),
            (("search", "apple", "-k", "0"), None, "-k", 2),
            (("show", "nothing/here"), None, lambda db: db.get(source="nothing/here"), 1),
            (("list", "--where", '{"": 1}'), None, lambda db: db.documents(filter={"": 1}), 1),
            (("facets", "lang", "--where", '{"$and": 5}'), None, lambda db: db.facets("lang", filter={"$and": 5}), 1),
            (("collections", "drop", "default", "--yes"), None, lambda db: db.drop_collection("default"), 1),
            (("-c", "nowhere", "list"), None, "nowhere", 1),
            (("config", "keep_versions", "maybe"), None, "keep_versions", 2),
        ]
        args, stdin, want, code = cases[which % len(cases)]
        if args == ("import", "JSONL"):
            # (the standard library writes 2**70 as written and 1e309 as Infinity; orjson refuses both)
            (self.folder / "bad.jsonl").write_bytes(good + b"\n" + json.dumps(record).encode() + b"\n")
            args = ("import", str(self.folder / "bad.jsonl"))
        if callable(want):  # the library's message for the same call
            with ragdb.open(self.path) as db, pytest.raises(RagdbError) as raised, db.transaction():
                want(db)
            want = one_line(raised.value)
        got = self.cli(*args, stdin=stdin)
        self.refused(got, want, code)
        assert len([line for line in got.output.splitlines() if "Error" in line]) == 1, got.output
        assert snapshot(self.path) == before, args

    # the history ------------------------------------------------------------------------------------
    def apply(self, op: tuple) -> None:
        kind = op[0]
        if kind == "process":
            self.write(op[1], process=True)
        elif kind == "collection":
            self.collection(*op[1:])
        elif kind == "optimize":
            assert self.cli("optimize", "--no-vacuum").code == 0
        elif kind == "bad":
            self.bad(*op[1:])
        elif kind == "checkpoint":
            self.compare()
        else:
            self.write(op)

    def compare(self, process: bool = False, path: str | None = None) -> None:
        path = path or self.path
        check = ragdb_cli(path, "check", process=process)
        assert check.code == 0, check.output
        with ragdb.open(path) as here, ragdb.open(":memory:", **self.options) as fresh:
            fresh.add_many(self.model.records())
            ids = [d.id for d in here.documents(versions="all", principals=ALL)]
            for n, call in enumerate(read_calls(self.model, ids)):
                got = cli_reads(ragdb_cli(path, *call, process=process and n in (0, 12)), call)
                assert_same(got, library_reads(here, call), f"ragdb {' '.join(call)} (the library on the file)")
                if not call[1].isdigit() and "--all-versions" not in call:  # (a fresh build holds no older versions)
                    assert_same(without_ids(got), without_ids(library_reads(fresh, call)),
                                f"ragdb {' '.join(call)} (a fresh build)")
            side = [d.source for d in here.collection(SIDE, create=False).documents(principals=ALL)] \
                if SIDE in [c.name for c in here.collections()] else None
        assert (None if side is None else set(side)) == self.model.side

    def run(self, ops: list[tuple], process: bool) -> None:
        for op in ops:
            self.apply(op)
        self.compare(process=process)
        # an export of everything, imported into a new file, reads the same
        exported = str(self.folder / "export.jsonl")
        assert self.cli("export", exported, "--all-principals").code == 0
        copy_path = str(self.folder / "copy.db")
        assert ragdb_cli(copy_path, "init", "--chunker", self.options["chunker"],
                         "--keep-versions" if self.options["keep_versions"] else "--no-keep-versions").code == 0
        assert ragdb_cli(copy_path, "import", exported).code == 0
        side, self.model.side = self.model.side, None
        self.compare(path=copy_path)
        self.model.side = side


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), keep_versions=st.booleans(),
       process=st.booleans())
# An import of a record whose metadata holds 2**70: orjson read it as another number (a float)
# and stored it (found by CI, 2026-12-07).
@example(ops=[("bad", 1, 2, "a/0")], chunker="none", keep_versions=False, process=False)
def test_random_histories_through_the_cli(tmp_path_factory, ops, chunker, keep_versions, process):
    """After any history of writes through the commands (some in a fresh process), what the
    reading commands print is what the library returns, on the file and on a fresh build;
    bad input is a one-line error that changes nothing."""
    note(f"chunker={chunker!r}, keep_versions={keep_versions}, process={process}\nops={ops!r}")
    folder = tmp_path_factory.mktemp("cli")
    with small_segments(whole_vocabulary=False):
        Run(folder, chunker, keep_versions).run(ops, process)
