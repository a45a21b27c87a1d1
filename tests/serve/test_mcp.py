"""``ragdb mcp``: a real MCP client from the official SDK talks to a real server process.

Each test spawns ``python -m ragdb.cli mcp -d kb.db ...`` (stdio; one test the
Streamable HTTP transport on 127.0.0.1) and compares what the tools return with
what the library returns for the same call.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import anyio  # noqa: E402  (installed with mcp)
from mcp import Client, ClientSession  # noqa: E402

import ragdb  # noqa: E402
from cli_helpers import free_port, mcp_call, mcp_session  # noqa: E402
from ragdb.cli import cli  # noqa: E402
from ragdb.serve.mcp import SNIPPET_CHARS, is_loopback, parse_http_address  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
READ_TOOLS = {"search", "get_document", "list_sources", "build_prompt", "facets", "stats"}
WRITE_TOOLS = {"add_text", "add_texts", "update_document", "delete", "list_collections", "create_collection",
               "drop_collection"}
SECRET = "zanzibar"  # a word only the labelled document holds (the probes ask for it)
MARK = "quokkas"  # another: the probes never say it, so seeing it means seeing the document

DOCS = (
    ("docs/cats.md", "The cat sat on the mat. Cats like a warm mat near the door.", {"lang": "en", "n": 1}, None),
    ("docs/dogs.md", "Dogs chase cats around the park; a dog rarely sits on a mat.", {"lang": "en", "n": 2}, None),
    ("docs/physics.md", "Quantum physics describes particles, and cats in boxes.", {"lang": "en", "n": 3}, None),
    ("notes/katze.txt", "Die Katze schläft auf der Matte.", {"lang": "de", "n": 4}, None),
    ("odd/a[1]*.md", "A file whose name holds glob characters: cats again.", {"lang": "en", "n": 5}, None),
    ("team/plan.md", f"The {SECRET} plan: cats and {MARK} take over the mat at dawn.", {"lang": "en", "n": 6}, ["team"]),
)


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        for source, text, metadata, acl in DOCS:
            db.add(text, source=source, metadata=metadata, acl=acl)
        db.add("A long chunk about mats. " + "Mats are woven. " * 400, source="docs/long.md", chunker="none")
    return path


def _run(fn: Callable[[], Any]) -> Any:
    return anyio.run(fn)


def _session(kb: Path, *args: str) -> contextlib.AbstractAsyncContextManager[ClientSession]:
    """An initialized SDK ClientSession with ``ragdb mcp -d kb.db ARGS`` as its stdio subprocess."""
    return mcp_session(kb.name, kb.parent, *args)


_call = mcp_call


async def _error(session: ClientSession, tool: str, arguments: dict[str, Any]) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return " ".join(c.text for c in result.content if c.type == "text")


def _hit_key(h: Any) -> tuple[Any, ...]:
    if isinstance(h, dict):
        return (h["source"], h["doc_id"], h["chunk_id"], h["start"], h["end"], h["score"], h["confidence"])
    return (h.source, h.doc_id, h.chunk_id, h.start, h.end, h.score, h.confidence)


# --------------------------------------------------------------------------- read tools equal the library

def test_read_tools_list_and_equal_the_library(kb: Path) -> None:
    async def main() -> None:
        async with _session(kb) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == READ_TOOLS  # no write tools without --allow-writes
            for t in tools.values():
                assert t.description and len(t.description) > 30
                assert t.input_schema["type"] == "object"
                assert t.input_schema.get("additionalProperties") is False
                assert not any("principal" in p for p in t.input_schema.get("properties", {}))
                assert t.annotations is not None and t.annotations.read_only_hint is True
            assert tools["search"].input_schema["required"] == ["query"]
            assert set(tools["search"].input_schema["properties"]) == {"query", "k", "scorer", "filter", "offset"}

            with ragdb.open(kb) as db:
                for args in ({"query": "cats on a mat"}, {"query": "cats", "k": 3, "scorer": "tfidf"},
                             {"query": "cats", "k": 10, "filter": {"source": "docs/*", "lang": ["en"]}}):
                    got = await _call(s, "search", args)
                    want = db.search(args["query"], args.get("k", 5), scorer=args.get("scorer", "bm25"),
                                     highlight=True, snippet_chars=SNIPPET_CHARS,
                                     **({"filter": args["filter"]} if "filter" in args else {}))
                    assert want, args
                    assert [_hit_key(h) for h in got["hits"]] == [_hit_key(h) for h in want]
                    assert [h["rank"] for h in got["hits"]] == list(range(1, len(want) + 1))
                    assert [h["snippet"] for h in got["hits"]] == [h.snippet.text for h in want]
                    assert [[tuple(x) for x in h["highlights"]] for h in got["hits"]] == \
                        [list(h.snippet.highlights) for h in want]
                    assert all(h["highlights"] for h in got["hits"])  # every hit matches a query term
                    assert [h["truncated"] for h in got["hits"]] == [len(h.text) > SNIPPET_CHARS for h in want]
                    assert [h["metadata"] for h in got["hits"]] == [dict(h.metadata) for h in want]

                # offset: a page is that slice of the deeper search, ranks counted from the top
                page = await _call(s, "search", {"query": "cats mat", "k": 2, "offset": 1,
                                                 "filter": {"lang": {"$in": ["en"]}}})
                deeper = db.search("cats mat", 3, filter={"lang": {"$in": ["en"]}})
                assert len(deeper) == 3
                assert [_hit_key(h) for h in page["hits"]] == [_hit_key(h) for h in deeper[1:]]
                assert [h["rank"] for h in page["hits"]] == [2, 3]

                long = (await _call(s, "search", {"query": "woven mats", "k": 1}))["hits"][0]
                (whole,) = db.search("woven mats", 1)
                assert long["source"] == "docs/long.md" and long["truncated"] is True
                start = long["snippet_start"]
                assert long["snippet"] == whole.text[start:start + len(long["snippet"])]
                assert 0 < len(long["snippet"]) <= SNIPPET_CHARS < len(whole.text)
                assert all(long["snippet"][a:b].lower().startswith(("woven", "mat")) for a, b in long["highlights"])

                cats = db.get(source="docs/cats.md")
                by_source = await _call(s, "get_document", {"source": "docs/cats.md"})
                by_id = await _call(s, "get_document", {"doc_id": cats.id})
                assert by_source == by_id
                assert (by_id["id"], by_id["source"], by_id["text"], by_id["metadata"], by_id["chunks"]) == \
                    (cats.id, cats.source, cats.text, dict(cats.metadata), cats.chunk_count)
                assert by_id["next_offset"] is None and by_id["text_length"] == len(cats.text or "")
                page = await _call(s, "get_document", {"source": "docs/cats.md", "offset": 4, "max_chars": 10})
                assert page["text"] == (cats.text or "")[4:14] and page["next_offset"] == 14

                listed = await _call(s, "list_sources", {})
                assert [d["source"] for d in listed["sources"]] == [d.source for d in db.documents()]
                assert [d["id"] for d in listed["sources"]] == [d.id for d in db.documents()]
                assert listed["next_offset"] is None
                first = await _call(s, "list_sources", {"limit": 2})
                second = await _call(s, "list_sources", {"limit": 2, "offset": first["next_offset"]})
                assert first["next_offset"] == 2
                assert [d["source"] for d in first["sources"] + second["sources"]] == \
                    [d.source for d in db.documents(limit=4)]
                docs = await _call(s, "list_sources", {"prefix": "docs/"})
                assert [d["source"] for d in docs["sources"]] == [d.source for d in db.documents("docs/*")]
                odd = await _call(s, "list_sources", {"prefix": "odd/a[1]*"})  # glob characters are literal
                assert [d["source"] for d in odd["sources"]] == ["odd/a[1]*.md"]
                assert (await _call(s, "list_sources", {"prefix": "odd/a["}))["sources"] == odd["sources"]
                assert (await _call(s, "list_sources", {"prefix": "odd/a?"}))["sources"] == []

                prompt = await _call(s, "build_prompt", {"question": "Where do cats sit?"})
                p = db.build_prompt("Where do cats sit?", k=5)
                assert not p.refused and p.sources
                assert (prompt["system"], prompt["user"], prompt["refused"], prompt["language"]) == \
                    (p.system, p.user, p.refused, p.language)
                assert prompt["messages"] == p.messages
                assert [(x["number"], x["source"], x["score"]) for x in prompt["sources"]] == \
                    [(i, h.source, h.score) for i, h in enumerate(p.sources, 1)]
                assert "<<<SOURCE 1>>>" in prompt["user"]
                refused = await _call(s, "build_prompt", {"question": "volcanic eruptions in Iceland"})
                assert refused["refused"] is True and refused["sources"] == []
                assert refused["refusal"] == "I don't know based on the provided context."
                assert db.build_prompt("volcanic eruptions in Iceland").refused

                for args in ({"field": "lang"}, {"field": "source", "query": "cats", "by": "documents", "limit": 2},
                             {"field": "n", "filter": {"lang": "en"}, "query": "mat"}):
                    got = await _call(s, "facets", args)
                    want = db.facets(args["field"], args.get("query"), by=args.get("by", "chunks"),
                                     limit=args.get("limit", 20), filter=args.get("filter"))
                    assert want.total, args
                    assert got == {"field": want.field, "by": want.by, "total": want.total, "missing": want.missing,
                                   "omitted": want.omitted, "values": [{"value": v, "count": n} for v, n in want]}
                lang = await _call(s, "facets", {"field": "lang"})  # the labelled one is not counted
                assert lang["values"] == [{"value": "en", "count": 4}, {"value": "de", "count": 1}]
                assert (lang["total"], lang["missing"]) == (6, 1)  # docs/long.md has no lang
                assert (await _call(s, "facets", {"field": "source", "limit": 2}))["omitted"] == 4

                stats = await _call(s, "stats", {})
                st = db.stats()
                # an anonymous server counts what it may read, nothing of the whole collection
                assert (stats["documents"], stats["chunks"], stats["vocabulary"], stats["postings"]) == \
                    (st.documents - 1, st.chunks - 1, None, None)
                assert stats["visible_documents"] == db.count() == st.documents - 1
                assert stats["writes_allowed"] is False

    _run(main)


# --------------------------------------------------------------------------- access: principals fixed at start

def test_a_labelled_document_never_reaches_a_server_without_its_principal(kb: Path) -> None:
    with ragdb.open(kb) as db:
        secret = db.get(source="team/plan.md", principals=ragdb.ALL)

    async def probe(s: ClientSession) -> list[str]:
        """Everything each read tool shows of the knowledge base, as text."""
        seen = [str(await _call(s, "search", {"query": f"{SECRET} plan cats", "k": 100}))]
        seen.append(str(await _call(s, "list_sources", {"limit": 1000})))
        seen.append(str(await _call(s, "build_prompt", {"question": f"What is the {SECRET} plan?",
                                                        "min_confidence": 0})))
        for args in ({"doc_id": secret.id}, {"source": "team/plan.md"}):
            result = await s.call_tool("get_document", args)
            seen.append(" ".join(c.text for c in result.content if c.type == "text"))
        return seen

    async def main() -> None:
        async with _session(kb) as s:  # anonymous
            seen = await probe(s)
            assert not any(MARK in text for text in seen), seen
            assert not any("team/plan.md" in text for text in seen[:3]), seen  # (get_document's error names it)
            assert "no document with id" in await _error(s, "get_document", {"doc_id": secret.id})
            # an offset past a 64-bit integer is refused by its schema (the reply, JSON, could not
            # hold it: the SDK's bare "Error executing tool get_document")
            for tool, args in (("get_document", {"source": "docs/cats.md", "offset": 10**30}),
                               ("list_sources", {"offset": 10**30})):
                assert "less than or equal to" in await _error(s, tool, args)
            # a principals argument is refused, not honoured (and not silently dropped)
            message = await _error(s, "search", {"query": SECRET, "principals": ["team"]})
            assert "unknown argument 'principals'" in message
            assert (await _call(s, "search", {"query": SECRET}))["hits"] == []
            # facets count only what the server may read: the labelled document is not among them
            counted = await _call(s, "facets", {"field": "source", "limit": 1000})
            assert "team/plan.md" not in str(counted) and counted["total"] == len(DOCS)  # + long.md - plan.md
            assert (await _call(s, "facets", {"field": "lang", "query": SECRET}))["total"] == 0
        async with _session(kb, "--principal", "other") as s:
            assert not any(MARK in text for text in await probe(s))
        async with _session(kb, "--principal", "team") as s:  # the same probes do see it with the label
            seen = await probe(s)
            assert all(MARK in seen[i] for i in (0, 2, 3, 4)), seen  # search, build_prompt, get_document x2
            assert "team/plan.md" in seen[1]  # list_sources shows sources, not text
            with ragdb.open(kb) as db:
                got = await _call(s, "search", {"query": "cats mat", "k": 10})
                assert [_hit_key(h) for h in got["hits"]] == \
                    [_hit_key(h) for h in db.search("cats mat", 10, principals=["team"])]
                assert (await _call(s, "stats", {}))["visible_documents"] == db.count(principals=["team"])
                assert (await _call(s, "facets", {"field": "source", "query": SECRET}))["values"] == \
                    [{"value": "team/plan.md", "count": 1}]
        async with _session(kb, "--all-principals") as s:
            assert SECRET in (await _call(s, "get_document", {"source": "team/plan.md"}))["text"]

    _run(main)


# --------------------------------------------------------------------------- errors are tool errors

def test_bad_arguments_are_tool_errors_and_the_server_keeps_serving(kb: Path) -> None:
    async def main() -> None:
        async with _session(kb) as s:
            assert "greater than or equal to 1" in await _error(s, "search", {"query": "cats", "k": 0})
            assert "less than or equal to 100" in await _error(s, "search", {"query": "cats", "k": 101})
            assert "valid integer" in await _error(s, "search", {"query": "cats", "k": "many"})
            assert "query" in await _error(s, "search", {})
            assert "scorer" in await _error(s, "search", {"query": "cats", "scorer": "magic"})
            # the library's own messages (a RagdbError becomes the tool error)
            assert "values must be strings, numbers or booleans" in \
                await _error(s, "search", {"query": "cats", "filter": {"lang": {"nested": 1}}})
            assert "ragdb embed" in await _error(s, "search", {"query": "cats", "scorer": "vector"})
            assert "exactly one of doc_id or source" in \
                await _error(s, "get_document", {"doc_id": 1, "source": "docs/cats.md"})
            assert "exactly one of doc_id or source" in await _error(s, "get_document", {})
            assert "no document with id 999" in await _error(s, "get_document", {"doc_id": 999})
            assert "no document with source 'nope'" in await _error(s, "get_document", {"source": "nope"})
            assert "doc_id" in await _error(s, "get_document", {"doc_id": -1})
            assert "limit" in await _error(s, "list_sources", {"limit": 0})
            assert "unknown argument 'question_'" in \
                await _error(s, "build_prompt", {"question": "cats", "k": 1, "question_": 1})
            assert "min_confidence" in await _error(s, "build_prompt", {"question": "cats", "min_confidence": 2})
            assert "add_text" in await _error(s, "add_text", {"text": "x", "source": "x"})  # absent: unknown tool
            assert "delete" in await _error(s, "delete", {"doc_id": 1})
            # still serving, with the same answers
            with ragdb.open(kb) as db:
                got = await _call(s, "search", {"query": "cats"})
                assert [_hit_key(h) for h in got["hits"]] == [_hit_key(h) for h in db.search("cats", 5)]
        assert "Traceback" not in (kb.parent / "server.err").read_text()

    _run(main)


# --------------------------------------------------------------------------- writes

def test_writes_only_with_allow_writes(kb: Path) -> None:
    with ragdb.open(kb) as db:
        before = db.count(principals=ragdb.ALL)
        secret = db.get(source="team/plan.md", principals=ragdb.ALL)

    async def main() -> None:
        async with _session(kb, "--allow-writes") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == READ_TOOLS | WRITE_TOOLS
            assert tools["delete"].annotations is not None and tools["delete"].annotations.destructive_hint
            for t in tools.values():
                assert not any("principal" in p for p in t.input_schema.get("properties", {}))
            assert "writes_allowed': True" in str(await _call(s, "stats", {}))

            added = await _call(s, "add_text", {"text": "Ferrets are curious animals.", "source": "pets/ferret.md",
                                                "metadata": {"lang": "en"}, "version": "v1"})
            assert added["status"] == "added" and added["previous"] is None
            with ragdb.open(kb) as db:
                doc = db.get(source="pets/ferret.md")
                assert (doc.id, doc.version, dict(doc.metadata)) == (added["id"], "v1", {"lang": "en"})
                assert [h.source for h in db.search("ferrets", 3)] == ["pets/ferret.md"]
            hits = (await _call(s, "search", {"query": "ferrets"}))["hits"]
            assert [h["source"] for h in hits] == ["pets/ferret.md"]
            again = await _call(s, "add_text", {"text": "Ferrets are curious animals.", "source": "pets/ferret.md",
                                                "metadata": {"lang": "en"}, "version": "v1"})
            assert again["status"] == "unchanged" and again["id"] == added["id"]
            replaced = await _call(s, "add_text", {"text": "Ferrets sleep a lot.", "source": "pets/ferret.md"})
            assert replaced["status"] == "replaced" and replaced["previous"] == added["id"]

            # a document this (anonymous) server cannot see is neither replaced nor deleted
            assert "not replacing it" in await _error(s, "add_text", {"text": "mine now", "source": "team/plan.md"})
            assert "no document with id" in await _error(s, "delete", {"doc_id": secret.id})
            assert "no document with source" in await _error(s, "delete", {"source": "team/plan.md"})
            assert "give doc_id, or source and/or filter" in await _error(s, "delete", {})
            assert "source" in await _error(s, "add_text", {"text": "no source"})
            assert "chunker" in await _error(s, "add_text", {"text": "x", "source": "y", "chunker": "none"})

            assert (await _call(s, "delete", {"source": "pets/ferret.md"}))["deleted"] == 1
            assert "no document with id" in await _error(s, "delete", {"doc_id": 10_000})
            cats = (await _call(s, "get_document", {"source": "docs/cats.md"}))["id"]
            assert (await _call(s, "delete", {"doc_id": cats}))["deleted"] == 1

        with ragdb.open(kb) as db:
            assert db.count(principals=ragdb.ALL) == before - 1  # cats.md; ferret added then deleted
            kept = db.get(source="team/plan.md", principals=ragdb.ALL)
            assert (kept.id, kept.text, kept.acl) == (secret.id, secret.text, secret.acl)

        async with _session(kb, "--allow-writes", "--principal", "team") as s:  # with the label it may
            replaced = await _call(s, "add_text", {"text": f"The {SECRET} plan, revised.", "source": "team/plan.md"})
            assert replaced["status"] == "replaced"
        with ragdb.open(kb) as db:
            assert db.get(source="team/plan.md", principals=ragdb.ALL).acl == ("team",)  # labels kept
            assert db.count() == db.count(principals=ragdb.ALL) - 1

    _run(main)


# --------------------------------------------------------------------------- HTTP transport

@contextlib.contextmanager
def _http_server(kb: Path, *args: str) -> Iterator[str]:
    port = free_port()
    with open(kb.parent / "http.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ragdb.cli", "mcp", "-d", str(kb),
                                 "--http", f"127.0.0.1:{port}", *args],
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60  # a guard against a server that never starts, not a timing assertion
        while True:
            assert proc.poll() is None, (kb.parent / "http.err").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start listening"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(30)


def test_streamable_http_transport_on_loopback(kb: Path) -> None:
    with _http_server(kb) as url:
        async def main() -> None:
            async with Client(url) as client:
                tools = await client.list_tools()
                assert {t.name for t in tools.tools} == READ_TOOLS
                result = await client.call_tool("search", {"query": "cats mat", "k": 4})
                assert not result.is_error and result.structured_content is not None
                with ragdb.open(kb) as db:
                    assert [_hit_key(h) for h in result.structured_content["hits"]] == \
                        [_hit_key(h) for h in db.search("cats mat", 4)]
                bad = await client.call_tool("search", {"query": "cats", "k": -3})
                assert bad.is_error
                assert not (await client.call_tool("stats", {})).is_error

        _run(main)
        assert "serving MCP (Streamable HTTP) on http://127.0.0.1:" in (kb.parent / "http.err").read_text()


# --------------------------------------------------------------------------- the command's own checks

def test_mcp_command_refuses_bad_options_before_serving(kb: Path, runner: Any) -> None:
    def fails(*args: str) -> str:
        result = runner.invoke(cli, ["mcp", "-d", str(kb), *args])
        assert result.exit_code == 2, result.output
        return result.output

    assert "not a loopback address" in fails("--http", "0.0.0.0:8765")
    assert "not a loopback address" in fails("--http", "example.com:8765")
    assert "not HOST:PORT" in fails("--http", "127.0.0.1:http")
    assert "not HOST:PORT" in fails("--http", "127.0.0.1:70000")
    assert "--all-principals already sees everything" in fails("--all-principals", "--principal", "x")
    result = runner.invoke(cli, ["--readonly", "mcp", "-d", str(kb), "--allow-writes"])
    assert result.exit_code == 2 and "--readonly" in result.output
    result = runner.invoke(cli, ["mcp", "-d", str(kb.parent / "missing.db")])
    assert result.exit_code == 1 and "no such database" in result.output


def test_http_addresses() -> None:
    assert parse_http_address("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_http_address("[::1]:9000") == ("::1", 9000)
    assert parse_http_address("8765") == ("127.0.0.1", 8765)
    assert parse_http_address("localhost:1") == ("localhost", 1)
    for bad in ("", ":", "host:", "host:0", "host:65536", "host:-1"):
        with pytest.raises(ragdb.RagdbError, match="not HOST:PORT"):
            parse_http_address(bad)
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.5.0.1", "::1", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", "127.0.0.1.example.com"))


def test_without_the_sdk_the_command_says_what_to_install(kb: Path, runner: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if the mcp package were not installed
    monkeypatch.delitem(sys.modules, "ragdb.serve.mcp")
    monkeypatch.delattr(sys.modules["ragdb.serve"], "mcp")
    result = runner.invoke(cli, ["mcp", "-d", str(kb)])
    assert result.exit_code == 1 and "pip install 'ragdb[mcp]'" in result.output


def test_vector_and_hybrid_search_use_the_recorded_model(kb: Path) -> None:
    with ragdb.open(kb) as db:
        db.embed("hash")  # an offline test embedder; the database records it

    async def main() -> None:
        async with _session(kb) as s:
            with ragdb.open(kb) as db:
                embedder = db.recorded_embedder()
                for scorer in ("vector", "hybrid"):
                    got = await _call(s, "search", {"query": "cats on a mat", "k": 4, "scorer": scorer})
                    want = db.search("cats on a mat", 4, scorer=scorer, embedder=embedder)
                    assert want and [_hit_key(h) for h in got["hits"]] == [_hit_key(h) for h in want]

    _run(main)


def test_serves_the_collection_it_is_given(kb: Path) -> None:
    with ragdb.open(kb, collection="notes") as db:
        db.add("Collections keep their own documents and statistics.", source="notes/one.md")
        expected = [_hit_key(h) for h in db.search("collections statistics", k=5)]

    async def main() -> None:
        async with _session(kb, "-c", "notes") as session:
            found = await _call(session, "search", {"query": "collections statistics", "k": 5})
            assert [_hit_key(h) for h in found["hits"]] == expected
            stats = await _call(session, "stats", {})
            assert stats["documents"] == 1
        async with _session(kb) as session:
            found = await _call(session, "search", {"query": "collections statistics", "k": 5})
            assert [h["source"] for h in found["hits"]] != ["notes/one.md"]

    _run(main)


# --------------------------------------------------------------------------- the server's trust model

def test_writes_carry_the_servers_labels_and_stay_within_them(kb: Path) -> None:
    """``--principal team --allow-writes``: what the agent adds is the team's (not public); it
    changes nothing labelled beyond the team, nor anything public; a source it cannot see is
    deleted exactly as one that does not exist."""
    with ragdb.open(kb) as db:
        db.add("Shared by team and ops.", source="shared.md", acl=["team", "ops"])
        db.add("Ops only.", source="ops.md", acl=["ops"])

    async def main() -> None:
        async with _session(kb, "--allow-writes", "--principal", "team") as s:
            added = await _call(s, "add_text", {"text": "A team note about ferrets.", "source": "notes/f.md"})
            assert added["status"] == "added"
            assert "outside what it writes" in await _error(s, "add_text", {"text": "x", "source": "shared.md"})
            assert "outside what it writes" in await _error(s, "add_text", {"text": "x", "source": "docs/cats.md"})
            assert "outside what it writes" in await _error(s, "delete", {"source": "docs/cats.md"})
            hidden = await _error(s, "delete", {"source": "ops.md"})
            missing = await _error(s, "delete", {"source": "nothing.md"})
            assert hidden == missing.replace("nothing.md", "ops.md")
            stats = await _call(s, "stats", {})
            with ragdb.open(kb) as db:
                visible = db.count(principals=["team"])
            assert stats["documents"] == stats["visible_documents"] == visible
            assert stats["vocabulary"] is None and stats["file_size"] is None
        async with _session(kb, "--allow-writes") as s:  # anonymous: public documents only
            missing = await _error(s, "delete", {"source": "nothing.md"})
            assert await _error(s, "delete", {"source": "notes/f.md"}) == missing.replace("nothing.md", "notes/f.md")
        with ragdb.open(kb) as db:
            assert db.get(source="notes/f.md", principals=ragdb.ALL).acl == ("team",)
            assert db.count(principals=ragdb.ALL) == len(DOCS) + 4
            assert db.get(source="shared.md", principals=ragdb.ALL).text == "Shared by team and ops."

    _run(main)


def test_write_labels_must_be_among_the_principals(kb: Path, runner: Any) -> None:
    result = runner.invoke(cli, ["mcp", "-d", str(kb), "--allow-writes", "--principal", "team",
                                 "--write-label", "ops"])
    assert result.exit_code == 2 and "not among the server's principals" in result.output

    async def main() -> None:
        async with _session(kb, "--allow-writes", "--principal", "team", "--principal", "ops",
                            "--write-label", "ops") as s:
            await _call(s, "add_text", {"text": "An ops note.", "source": "ops/n.md"})
        with ragdb.open(kb) as db:
            assert db.get(source="ops/n.md", principals=ragdb.ALL).acl == ("ops",)

    _run(main)


def test_query_length_and_k_are_bounded(kb: Path) -> None:
    async def main() -> None:
        async with _session(kb, "--max-query", "50") as s:
            for tool, arg in (("search", "query"), ("build_prompt", "question"), ("facets", "query")):
                args = {arg: "cats " * 20, **({"field": "lang"} if tool == "facets" else {})}
                assert "at most 50 characters" in await _error(s, tool, args)
            assert "valid integer" in await _error(s, "search", {"query": "cats", "k": True})
            assert "valid integer" in await _error(s, "build_prompt", {"question": "cats", "k": True})
            assert "valid integer" in await _error(s, "search", {"query": "cats", "offset": True})
            # every integer argument of every tool is strict: a boolean is not a number
            for tool, args in (("get_document", {"doc_id": True}), ("get_document", {"source": "x", "offset": True}),
                               ("get_document", {"source": "x", "max_chars": True}), ("list_sources", {"limit": True}),
                               ("list_sources", {"offset": True}), ("facets", {"field": "lang", "limit": True}),
                               ("build_prompt", {"question": "cats", "budget_tokens": True})):
                assert "valid integer" in await _error(s, tool, args), (tool, args)
            assert (await _call(s, "search", {"query": "cats " * 10}))["hits"]

    _run(main)


def test_results_are_compact_json(kb: Path) -> None:
    """Each tool's text is its structured result as JSON without indentation (what a model reads)."""
    async def main() -> None:
        async with _session(kb, "--allow-writes") as s:
            for tool, args in (("search", {"query": "cats mat"}), ("list_sources", {}), ("stats", {}),
                               ("get_document", {"source": "docs/cats.md"}), ("facets", {"field": "lang"}),
                               ("build_prompt", {"question": "where do cats sit?"}),
                               ("add_text", {"text": "Compact.", "source": "c.md"}),
                               ("add_texts", {"documents": [{"text": "Two.", "source": "d.md"}]}),
                               ("update_document", {"source": "d.md", "metadata": {"a": 1}}),
                               ("list_collections", {}), ("create_collection", {"name": "x"}),
                               ("drop_collection", {"name": "x"}),
                               ("delete", {"source": "c.md"})):
                result = await s.call_tool(tool, args)
                assert not result.is_error, result.content
                text = result.content[0].text  # type: ignore[union-attr]
                assert json.loads(text) == result.structured_content
                assert text == json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"))

    _run(main)


# --------------------------------------------------------------------------- what Chroma's users expect

PETS = [{"text": "Ferrets are curious animals that love tunnels.", "source": "pets/ferret.md",
         "metadata": {"topic": "pets", "lang": "en"}},
        {"text": "Hamsters store food in their cheeks.", "source": "pets/hamster.md",
         "metadata": {"topic": "pets", "lang": "en"}, "version": "v1", "title": "Hamsters"},
        {"text": "Rivers carve canyons over millions of years.", "source": "geo/river.md",
         "metadata": {"topic": "geo", "lang": "en"}}]


def test_batch_add_update_list_and_delete_by_filter(kb: Path) -> None:
    async def main() -> None:
        async with _session(kb, "--allow-writes") as s:  # anonymous: public documents only
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert tools["add_texts"].input_schema["properties"]["documents"]["maxItems"] == 100
            assert tools["update_document"].annotations.destructive_hint  # type: ignore[union-attr]
            assert tools["list_collections"].annotations.read_only_hint  # type: ignore[union-attr]

            added = (await _call(s, "add_texts", {"documents": PETS}))["documents"]
            assert [a["status"] for a in added] == ["added"] * 3
            with ragdb.open(kb) as db:
                for a, want in zip(added, PETS):
                    d = db.get(source=str(want["source"]))
                    meta = {**want["metadata"], **({"title": want["title"]} if "title" in want else {})}  # type: ignore[dict-item]
                    assert (d.id, d.text, dict(d.metadata), d.version, d.acl) == \
                        (a["id"], want["text"], meta, want.get("version"), ())
            # an upsert: an identical one unchanged, a changed one replaced, a new one added
            again = (await _call(s, "add_texts", {"documents": [
                PETS[0], {**PETS[1], "text": "Hamsters run at night."},
                {"text": "Lakes freeze in winter.", "source": "geo/lake.md", "metadata": {"topic": "geo"}}]}))
            assert [a["status"] for a in again["documents"]] == ["unchanged", "replaced", "added"]
            assert again["documents"][1]["previous"] == added[1]["id"]
            # all or nothing: a refused batch writes none of it
            with ragdb.open(kb) as db:
                before = db.count(principals=ragdb.ALL)
            same = await _error(s, "add_texts", {"documents": [PETS[2], PETS[2]]})
            assert "same source" in same and "its own source" in same and "metadata['source']" not in same
            assert "not replacing it" in await _error(s, "add_texts", {"documents": [
                {"text": "new", "source": "pets/new.md"}, {"text": "mine", "source": "team/plan.md"}]})
            assert "at most 100" in await _error(s, "add_texts", {"documents": [
                {"text": "x", "source": f"x/{i}"} for i in range(101)]})
            assert "at least 1" in await _error(s, "add_texts", {"documents": []})
            assert "acl" in await _error(s, "add_texts", {"documents": [{"text": "x", "source": "y", "acl": []}]})
            with ragdb.open(kb) as db:
                assert db.count(principals=ragdb.ALL) == before

            # listing by filter equals the library's
            for flt in ({"topic": "pets"}, {"source": "geo/*"}, {"lang": "en", "n": {"$gte": 2}}):
                listed = await _call(s, "list_sources", {"filter": flt})
                with ragdb.open(kb) as db:
                    want_docs = db.documents(filter=flt)
                assert want_docs
                assert [(d["id"], d["source"], d["metadata"]) for d in listed["sources"]] == \
                    [(d.id, d.source, dict(d.metadata)) for d in want_docs]
            assert "team/plan.md" not in str(await _call(s, "list_sources", {"filter": {"n": 6}}))

            # update metadata in place (ids and chunks stay), by source or by id
            ferret = await _call(s, "update_document", {"source": "pets/ferret.md",
                                                        "metadata": {"topic": "pets", "legs": 4}})
            assert ferret["metadata"] == {"topic": "pets", "legs": 4} and ferret["labels"] == []
            assert ferret["id"] == added[0]["id"]
            assert (await _call(s, "update_document", {"doc_id": ferret["id"], "labels": []}))["labels"] == []
            with ragdb.open(kb) as db:
                assert [d.source for d in db.documents(filter={"legs": 4})] == ["pets/ferret.md"]
            # labels outside what this server writes, a hidden document, bad arguments
            assert "may not write a document labelled ['team']" in \
                await _error(s, "update_document", {"source": "pets/ferret.md", "labels": ["team"]})
            hidden = await _error(s, "update_document", {"source": "team/plan.md", "metadata": {}})
            missing = await _error(s, "update_document", {"source": "nothing.md", "metadata": {}})
            assert hidden == missing.replace("nothing.md", "team/plan.md")
            assert "exactly one of doc_id or source" in await _error(s, "update_document", {"metadata": {}})
            assert "metadata and/or labels" in await _error(s, "update_document", {"source": "pets/ferret.md"})
            assert "valid integer" in await _error(s, "update_document", {"doc_id": True, "metadata": {}})
            assert "valid integer" in await _error(s, "delete", {"doc_id": True})

            # delete by filter: only what this server can see (the labelled plan matches too, and stays)
            with ragdb.open(kb) as db:
                visible_en = len(db.documents(filter={"lang": "en", "n": {"$gte": 5}}, versions="all"))
            assert visible_en == 1  # odd/a[1]*.md; team/plan.md (n=6) is hidden
            assert (await _call(s, "delete", {"filter": {"lang": "en", "n": {"$gte": 5}}}))["deleted"] == 1
            assert (await _call(s, "delete", {"filter": {"topic": "pets"}}))["deleted"] == 2  # ferret, hamster
            assert (await _call(s, "delete", {"filter": {"topic": "pets"}}))["deleted"] == 0
            assert (await _call(s, "delete", {"source": "geo/lake.md", "filter": {"topic": "geo"}}))["deleted"] == 1
            assert "no document with source 'geo/lake.md'" in await _error(s, "delete", {"source": "geo/lake.md"})
            assert "matches every document" in await _error(s, "delete", {"filter": {}})
            assert "give doc_id, or source and/or filter" in \
                await _error(s, "delete", {"doc_id": 1, "filter": {"topic": "geo"}})
        with ragdb.open(kb) as db:
            assert db.get(source="team/plan.md", principals=ragdb.ALL).text == DOCS[-1][1]
            assert [d.source for d in db.documents(filter={"topic": "geo"})] == ["geo/river.md"]
        assert "Traceback" not in (kb.parent / "server.err").read_text()

    _run(main)


def test_scoped_writes_update_and_delete_only_within_the_servers_labels(kb: Path) -> None:
    with ragdb.open(kb) as db:
        db.add("Ops only.", source="ops.md", acl=["ops"], metadata={"lang": "en"})

    async def main() -> None:
        async with _session(kb, "--allow-writes", "--principal", "team") as s:
            batch = await _call(s, "add_texts", {"documents": PETS[:2]})
            assert [a["status"] for a in batch["documents"]] == ["added", "added"]
            # a filter matching public documents it may read but not write: refused whole, nothing deleted
            assert "outside what it writes" in await _error(s, "delete", {"filter": {"lang": "en"}})
            assert "outside what it writes" in await _error(s, "update_document", {"source": "docs/cats.md",
                                                                                   "metadata": {}})
            assert "may not write a document labelled []" in \
                await _error(s, "update_document", {"source": "pets/ferret.md", "labels": []})
            assert "may not write a document labelled ['ops']" in \
                await _error(s, "update_document", {"source": "pets/ferret.md", "labels": ["ops"]})
            hidden = await _error(s, "update_document", {"source": "ops.md", "labels": ["team"]})
            assert hidden == (await _error(s, "update_document", {"source": "no.md", "labels": ["team"]})
                              ).replace("no.md", "ops.md")
            # the team's own documents: by filter (ops.md matches the filter too, hidden: untouched)
            assert (await _call(s, "delete", {"filter": {"topic": "pets", "$or": [{"lang": "en"}]}}))["deleted"] == 2
            assert (await _call(s, "delete", {"filter": {"source": "ops.md"}}))["deleted"] == 0
        with ragdb.open(kb) as db:
            assert db.count(principals=ragdb.ALL) == len(DOCS) + 2  # + long.md + ops.md; the pets are gone
            assert db.get(source="ops.md", principals=ragdb.ALL).acl == ("ops",)
            assert db.documents(filter={"topic": "pets"}, principals=ragdb.ALL) == []

    _run(main)


def test_collections_over_mcp_within_what_the_server_may_read(kb: Path) -> None:
    with ragdb.open(kb) as db:
        db.collection("secret").add("Hidden facts.", source="s.md", acl=["ops"])
        mixed = db.collection("mixed")
        mixed.add("Public words.", source="p.md")
        mixed.add("Ops words.", source="o.md", acl=["ops"])
        db.collection("empty")

    async def main() -> None:
        async with _session(kb) as s:  # read-only: no collection tools, no collection argument
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == READ_TOOLS
            assert "unknown argument 'collection'" in \
                await _error(s, "search", {"query": "words", "collection": "mixed"})
        async with _session(kb, "--allow-writes") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            for name in ("search", "get_document", "list_sources", "build_prompt", "facets", "add_text",
                         "add_texts", "update_document", "delete"):
                assert "collection" in tools[name].input_schema["properties"], name
            listed = (await _call(s, "list_collections", {}))["collections"]
            with ragdb.open(kb) as db:
                served = db.count()
            assert listed == [{"name": "default", "documents": served, "served": True},
                              {"name": "mixed", "documents": 1, "served": False},
                              {"name": "empty", "documents": 0, "served": False}]  # "secret": every document hidden
            assert (await _call(s, "create_collection", {"name": "notes"}))["status"] == "created"
            assert "already exists" in await _error(s, "create_collection", {"name": "notes"})
            added = await _call(s, "add_texts", {"collection": "notes", "documents": [
                {"text": "Collections keep their own statistics.", "source": "n/1.md"},
                {"text": "Another note about statistics and words.", "source": "n/2.md"}]})
            assert len(added["documents"]) == 2
            with ragdb.open(kb, collection="notes") as notes:
                want = notes.search("statistics words", 5)
                assert [d.source for d in notes.documents()] == ["n/1.md", "n/2.md"]
            got = await _call(s, "search", {"query": "statistics words", "collection": "notes"})
            assert [_hit_key(h) for h in got["hits"]] == [_hit_key(h) for h in want]
            assert (await _call(s, "search", {"query": "statistics words"}))["hits"] == []  # not in the default
            assert [d["source"] for d in (await _call(s, "list_sources", {"collection": "mixed"}))["sources"]] == \
                ["p.md"]
            assert (await _call(s, "get_document", {"source": "n/1.md", "collection": "notes"}))["text"] == \
                "Collections keep their own statistics."
            counts = {c["name"]: c["documents"] for c in (await _call(s, "list_collections", {}))["collections"]}
            assert counts["notes"] == 2

            # a collection whose every document is hidden answers exactly as a missing one
            for tool, args in (("search", {"query": "facts"}), ("list_sources", {}),
                               ("add_text", {"text": "x", "source": "x.md"})):
                hidden = await _error(s, tool, {**args, "collection": "secret"})
                missing = await _error(s, tool, {**args, "collection": "nowhere"})
                assert hidden == missing.replace("nowhere", "secret")
                assert hidden.endswith(": no collection 'secret'")
            assert await _error(s, "drop_collection", {"name": "secret"}) == \
                (await _error(s, "drop_collection", {"name": "nowhere"})).replace("nowhere", "secret")
            # one holding a document it cannot read (or write) is not dropped
            assert "may not delete" in await _error(s, "drop_collection", {"name": "mixed"})
            assert "cannot drop it" in await _error(s, "drop_collection", {"name": "default"})
            assert (await _call(s, "drop_collection", {"name": "notes"}))["status"] == "dropped"
            assert (await _call(s, "drop_collection", {"name": "empty"}))["status"] == "dropped"
            assert (await _error(s, "search", {"query": "x", "collection": "notes"})).endswith(
                ": no collection 'notes'")
        with ragdb.open(kb) as db:
            assert [c.name for c in db.collections()] == ["default", "secret", "mixed"]
            assert db.collection("mixed").count(principals=ragdb.ALL) == 2
        async with _session(kb, "--allow-writes", "--all-principals") as s:  # the full view may drop it
            assert "secret" in str(await _call(s, "list_collections", {}))
            assert (await _call(s, "drop_collection", {"name": "mixed"}))["status"] == "dropped"
        assert "Traceback" not in (kb.parent / "server.err").read_text()

    _run(main)
