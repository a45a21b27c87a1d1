"""Random write histories through the MCP server (``build_server(..., allow_writes=True)``),
driven by the official SDK's client connected in process: what the read tools return equals
what the library returns, and every refused call is a tool error carrying the library's (or
the access rules') message, with nothing stored changed.

Each example opens a file (``keep_versions``, ``public_unlabeled`` and the chunker drawn;
postings flushed every few chunks and merged after two segments, as
tests/engine/test_random_operations.py does) and serves it as one of :data:`SERVERS`:
anonymous, reading as ``["a"]``, reading as ``["a", "b"]`` and writing ``["a"]`` only, or the
full view. A history mixes the write tools (``add_text``, ``add_texts`` with duplicates,
``update_document`` by id and by source, ``delete`` by id, source, filter and source with
filter, ``create_collection``/``drop_collection`` and adds to that collection), writes of the
library beside the server (documents with other labels, so some are hidden from it, and
relabels), bad calls (bad filters, bad metadata, missing and hidden documents), reopenings
(a new handle, server and client) and checkpoints.

:class:`Model` follows the file and predicts each write tool's answer from the access rules
of docs/filters-and-access.md and :mod:`ragdb.serve.access`: a document is visible where its
labels (and its latest version's) let the server read it; a write touches only visible
documents whose labels, and the labels it would give, lie within what the server writes.

At each checkpoint and at the end, every read tool's result (``search`` with both lexical
scorers, filters and an offset; ``get_document`` by source and by id; ``list_sources`` with a
prefix, a filter and paging; ``facets``; ``build_prompt``; ``stats``) equals the same call's
answer from the library on the same handle (ids included) and, ids left out, from the library
on a fresh build of the model's latest documents with the server's principals; ``check()``
finds nothing.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

pytest.importorskip("mcp")

import anyio  # noqa: E402  (installed with mcp)
from mcp import Client  # noqa: E402

import ragdb  # noqa: E402
from engine.test_random_operations import (DAYS, FILTERS, SOURCES, TITLES, assert_same, labels,  # noqa: E402
                                           metadata, small_segments, texts)
from ragdb.errors import RagdbError  # noqa: E402
from ragdb.serve.access import client_message  # noqa: E402
from ragdb.serve.mcp import SNIPPET_CHARS, build_server  # noqa: E402
from ragdb.serve.shapes import facets_json, stats_json  # noqa: E402

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "15"))

ALL = ragdb.ALL
PUBLIC = ragdb.PUBLIC
#: name -> (principals, write_labels)
SERVERS: dict[str, tuple[Any, list[str] | None]] = {
    "anonymous": (None, None), "a": (["a"], None), "a,b writing a": (["a", "b"], ["a"]), "ALL": (ALL, None)}
VERSIONS = [None, "v1", "v2"]
QUERIES = ["apple retrieval", "检索增强生成", '"apple note"', "retr* evidence", "search -model", "note OR 向量"]
BAD_FILTERS = [{"$bogus": 1}, {"n": {"$gte": "x"}}, {"n": {"$in": 5}}, {"": 1}, {"$and": 5}, {"tags": {"$all": []}},
               {"lang": {"$eq": {"a": 1}}}, {"$not": []}]
BAD_METADATA = [{"n": 2 ** 70}, {"m": [1, -2 ** 64]}]
SIDE = "side"
#: the sources written: the engine test's, and one holding glob characters (a delete by source is exact)
ALL_SOURCES = [*SOURCES, "a/[0]*"]


# -- the model -----------------------------------------------------------------------------------

def sees(principals: Any, acl: tuple[str, ...], public_unlabeled: bool) -> bool:
    """Whether a caller reading as ``principals`` may read a document labelled ``acl``."""
    if principals is ALL:
        return True
    if not acl:
        return public_unlabeled
    return PUBLIC in acl or bool(set(acl) & set(principals or ()))


class Model:
    """What the file holds: per source its stored versions, oldest first, each a dict of text,
    title, metadata, version, acl (a sorted tuple) and timestamp; the side collection (source ->
    acl of its one version) while it exists. Knows the server's principals and write scope."""

    def __init__(self, keep: bool, public_unlabeled: bool, principals: Any, write_labels: list[str] | None) -> None:
        self.keep, self.public_unlabeled, self.principals = keep, public_unlabeled, principals
        self.stored: dict[str, list[dict]] = {}
        self.side: dict[str, dict] | None = None
        self.seen: set[str] = set(ALL_SOURCES)
        if principals is ALL:
            self.scope: Any = None  # unbounded
            self.acl: list[str] | None = None
        elif write_labels is not None:
            self.scope, self.acl = (tuple(write_labels), False), list(write_labels)
        elif not principals:
            self.scope, self.acl = ((), True), None
        else:
            self.scope, self.acl = (tuple(principals), False), list(principals)

    # reading
    def sees(self, acl: tuple[str, ...]) -> bool:
        return sees(self.principals, acl, self.public_unlabeled)

    def visible_versions(self, source: str) -> list[dict]:
        versions = self.stored.get(source, [])
        if not versions or not self.sees(versions[-1]["acl"]):
            return []
        return [v for v in versions if self.sees(v["acl"])]

    def allows(self, acl: tuple[str, ...]) -> bool:
        """WriteScope.allows_labels: whether the server may write a document labelled ``acl``."""
        if self.scope is None:
            return True
        mine, public = self.scope
        named = [a for a in acl if a != PUBLIC]
        if (not named or len(named) < len(acl)) and not public:
            return False
        return all(a in mine for a in named)

    # writing
    def add(self, source: str, record: dict) -> str:
        self.seen.add(source)
        versions = self.stored.get(source)
        latest = versions[-1] if versions else None
        acl = tuple(sorted(set(record["acl"]))) if record["acl"] is not None else (latest["acl"] if latest else ())
        new = {"text": record["text"], "title": record["title"], "metadata": copy.deepcopy(record["metadata"]),
               "version": record["version"], "acl": acl, "timestamp": record.get("timestamp")}
        if latest is not None and all(new[k] == latest[k] for k in ("text", "title", "metadata", "version", "acl")):
            return "unchanged"
        older = self.stored.pop(source, [])
        self.stored[source] = [*older, new] if self.keep else [new]
        return "replaced" if latest is not None else "added"

    def refuse_add(self, source: str) -> str | None:
        """Why the server refuses to add ``source`` with its labels (None: it adds it)."""
        versions = self.stored.get(source)
        current = versions[-1] if versions and self.sees(versions[-1]["acl"]) else None
        if versions and current is None and self.principals is not ALL:
            return "not replacing it"
        if self.scope is None:
            return None
        if current is not None and not self.allows(current["acl"]):
            return "are outside what it writes"
        new = tuple(self.acl) if self.acl is not None else (current["acl"] if current is not None else ())
        if not self.allows(new):
            return "may not write a document labelled"
        return None

    def refuse_change(self, version: dict | None, what: str, acl: list[str] | None = None) -> str | None:
        """Why the server refuses to update (``acl``: the labels it sets) or delete ``version``
        (None: not visible, named by ``what``)."""
        if self.scope is None:
            return None if version is not None else f"no document with {what}"
        if version is None:
            # (a source that is missing or hidden: the labels an update would set are checked first)
            return "may not write a document labelled" if acl is not None and not what.startswith("id ") and \
                not self.allows(tuple(acl)) else f"no document with {what}"
        if not self.allows(version["acl"]):
            return "are outside what it writes"
        if acl is not None and not self.allows(tuple(acl)):
            return "may not write a document labelled"
        return None

    def delete_versions(self, doomed: list[dict]) -> None:
        ids = {id(v) for v in doomed}
        for source in list(self.stored):
            kept = [v for v in self.stored[source] if id(v) not in ids]
            if kept:
                self.stored[source] = kept
            else:
                del self.stored[source]

    def records(self) -> list[dict]:
        return [{"text": v["text"], "source": s, "title": v["title"], "metadata": v["metadata"],
                 "version": v["version"], "acl": list(v["acl"]), "timestamp": v["timestamp"]}
                for s, versions in sorted(self.stored.items()) for v in versions[-1:]]

    def side_hidden(self) -> bool:
        return self.principals is not ALL and bool(self.side) and \
            not any(self.sees(acl) for acl in self.side.values())  # type: ignore[union-attr]


def filter_matches(index: int, source: str, version: dict) -> bool:
    return FILTERS[index][1](version["metadata"])


# -- what the read tools answer --------------------------------------------------------------------

def checkpoint_calls(model: Model, ids: list[int]) -> list[tuple[str, dict]]:
    """The read calls compared at a checkpoint (``ids``: every stored document's id)."""
    calls: list[tuple[str, dict]] = []
    for q in QUERIES:
        for scorer in ("bm25", "tfidf"):
            calls.append(("search", {"query": q, "k": 40, "scorer": scorer}))
    calls += [("search", {"query": QUERIES[0], "k": 3, "offset": 2}),
              ("search", {"query": "apple note", "k": 40, "filter": {"n": {"$gte": 2}}}),
              ("search", {"query": "apple 检索", "k": 40, "filter": {"source": "a/*"}}),
              ("list_sources", {}), ("list_sources", {"prefix": "a/"}), ("list_sources", {"limit": 2, "offset": 1}),
              ("list_sources", {"filter": {"tags": "x"}}), ("list_sources", {"prefix": "a/["}),
              ("facets", {"field": "lang"}), ("facets", {"field": "tags", "query": "apple OR 检索", "by": "documents"}),
              ("facets", {"field": "source", "query": "apple", "limit": 3}),
              ("facets", {"field": "n", "filter": {"lang": "en"}}),
              ("build_prompt", {"question": "apple retrieval evidence", "min_confidence": 0.0}),
              ("build_prompt", {"question": "检索 模型", "min_confidence": 0.3}),
              ("build_prompt", {"question": "apple note"}),  # (the floor the file measured: not a fresh build's)
              ("stats", {})]
    calls += [("get_document", {"source": s}) for s in sorted(model.seen)]
    calls += [("get_document", {"source": s, "offset": 3, "max_chars": 7}) for s in sorted(model.stored)[:2]]
    calls += [("get_document", {"doc_id": i}) for i in ids]
    return calls


def library_answer(db: ragdb.Database, principals: Any, tool: str, args: dict, writes: bool = True) -> Any:
    """What ``tool`` answers for ``args`` as the library computes it (the tool's shape), or
    ``["error", message]``."""
    try:
        return _library_answer(db, principals, tool, dict(args), writes)
    except RagdbError as e:
        return ["error", client_message(e, database=db.path)]


def _library_answer(db: ragdb.Database, who: Any, tool: str, args: dict, writes: bool) -> Any:
    kw: dict[str, Any] = {"principals": who}
    if args.get("filter") is not None:
        kw["filter"] = args["filter"]
    if tool == "search":
        offset = args.get("offset", 0)
        hits = db.search(args["query"], args.get("k", 5), offset=offset, scorer=args.get("scorer", "bm25"),
                         highlight=True, snippet_chars=SNIPPET_CHARS, **kw)
        out = []
        for rank, h in enumerate(hits, offset + 1):
            assert h.snippet is not None
            out.append({"rank": rank, "source": h.source, "doc_id": h.doc_id, "chunk_id": h.chunk_id,
                        "version": h.version, "start": h.start, "end": h.end, "score": h.score,
                        "confidence": h.confidence, "snippet": h.snippet.text, "snippet_start": h.snippet.start,
                        "highlights": [list(s) for s in h.snippet.highlights],
                        "truncated": len(h.snippet.text) < len(h.text), "metadata": dict(h.metadata)})
        return {"query": args["query"], "hits": out}
    if tool == "get_document":
        d = db.get(args.get("doc_id"), source=args.get("source"), principals=who)
        text = d.text or ""
        offset, chars = args.get("offset", 0), args.get("max_chars", 20_000)
        page = text[offset:offset + chars]
        return {"id": d.id, "source": d.source, "version": d.version, "timestamp": d.timestamp, "latest": d.latest,
                "chunks": d.chunk_count, "metadata": dict(d.metadata), "text": page, "offset": offset,
                "text_length": len(text), "next_offset": offset + len(page) if offset + len(page) < len(text) else None}
    if tool == "list_sources":
        limit, offset = args.get("limit", 100), args.get("offset", 0)
        prefix = args.get("prefix", "")
        pattern = "".join(f"[{c}]" if c in "*?[" else c for c in prefix) + "*"
        docs = db.documents(pattern if prefix else None, glob=True, limit=limit + 1, offset=offset, **kw)
        return {"sources": [{"id": d.id, "source": d.source, "version": d.version, "timestamp": d.timestamp,
                             "chunks": d.chunk_count, "metadata": dict(d.metadata)} for d in docs[:limit]],
                "next_offset": offset + limit if len(docs) > limit else None}
    if tool == "facets":
        return facets_json(db.facets(args["field"], args.get("query"), by=args.get("by", "chunks"),
                                     limit=args.get("limit", 20), **kw))
    if tool == "build_prompt":
        p = db.build_prompt(args["question"], k=5, min_confidence=args.get("min_confidence"), **kw)
        return {"refused": p.refused, "language": p.language, "system": p.system, "user": p.user,
                "messages": p.messages, "confidence": p.confidence, "min_confidence": p.min_confidence,
                "sources": [{"number": i, "source": h.source, "doc_id": h.doc_id, "chunk_id": h.chunk_id,
                             "start": h.start, "end": h.end, "score": h.score, "confidence": h.confidence}
                            for i, h in enumerate(p.sources, 1)]}
    if tool == "stats":
        if who is ALL:
            s = db.stats()
            return {**stats_json(s), "visible_documents": s.documents, "writes_allowed": writes}
        visible = db.count(principals=who)
        return {"documents": visible, "visible_documents": visible,
                "chunks": db.facets("source", limit=1, principals=who).total, "collection": db.collection_name,
                "writes_allowed": writes}
    raise AssertionError(tool)


def tool_answer(result: Any, tool: str) -> Any:
    """A tool call's result as :func:`library_answer` gives it."""
    if result.is_error:
        text = " ".join(c.text for c in result.content if c.type == "text")
        head = f"Error executing tool {tool}: "
        return ["error", text[len(head):] if text.startswith(head) else text]
    out = dict(result.structured_content)
    if tool == "build_prompt":
        out.pop("refusal")
    if tool == "stats" and "vocabulary" in out and out["vocabulary"] is None:
        out = {k: v for k, v in out.items() if v is not None}
    return out


#: the fields of a stats answer that a fresh build of the same documents shares
FRESH_STATS = ("documents", "visible_documents", "chunks", "vocabulary", "postings", "avg_chunk_length",
               "collection", "writes_allowed")


def without_ids(value: Any, tool: str = "") -> Any:
    """``value`` without ids (a fresh build numbers its documents and chunks anew)."""
    if tool == "stats" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k in FRESH_STATS}
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in ("id", "doc_id", "chunk_id")}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def snapshot(db: ragdb.Database) -> Any:
    """Everything a write could change, for 'nothing stored changed'."""
    def docs(handle: ragdb.Database) -> list:
        return [[d.id, d.source, d.version, d.timestamp, d.content_hash, dict(d.metadata), list(d.acl), d.latest]
                for d in handle.documents(versions="all", principals=ALL)]
    names = [c.name for c in db.collections()]
    return [docs(db), names, docs(db.collection(SIDE, create=False)) if SIDE in names else None]


# -- the operations --------------------------------------------------------------------------------

mcp_records = st.fixed_dictionaries({"text": texts, "title": st.sampled_from(TITLES), "metadata": metadata,
                                     "version": st.sampled_from(VERSIONS)})
lib_records = st.fixed_dictionaries({"text": texts, "title": st.sampled_from(TITLES), "metadata": metadata,
                                     "version": st.sampled_from(VERSIONS), "timestamp": st.sampled_from(DAYS),
                                     "acl": st.one_of(st.none(), st.lists(st.sampled_from(["a", "b", PUBLIC]),
                                                                          max_size=2))})
sources = st.sampled_from(ALL_SOURCES)
existing = st.integers(0, 50)
new_labels = st.one_of(st.none(), labels)

mcp_writes = st.one_of(
    st.tuples(st.just("add_text"), sources, mcp_records),
    st.tuples(st.just("add_texts"), st.lists(st.tuples(sources, mcp_records), min_size=1, max_size=4)),
    st.tuples(st.just("update"), existing, st.booleans(), st.one_of(st.none(), metadata), new_labels),
    st.tuples(st.just("delete_id"), existing, st.integers(0, 3)),
    st.tuples(st.just("delete_source"), sources),
    st.tuples(st.just("delete_filter"), st.integers(0, len(FILTERS) - 1), st.one_of(st.none(), sources)),
)
step = st.one_of(
    mcp_writes, mcp_writes, mcp_writes, mcp_writes,
    st.tuples(st.just("library"), sources, lib_records),
    st.tuples(st.just("relabel"), existing, labels),
    st.tuples(st.just("collection"), st.sampled_from(["create", "add", "add", "drop"]), sources, texts),
    st.tuples(st.just("bad"), st.integers(0, 12), st.integers(0, 7), sources, mcp_records),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("checkpoint")),
)
histories = st.lists(step, min_size=3, max_size=25)


class Run:
    """One random history against the file at ``path``, served by ``server``."""

    def __init__(self, path: str, server: str, chunker: str, keep: bool, public_unlabeled: bool) -> None:
        self.path, self.chunker = path, chunker
        self.principals, self.write_labels = SERVERS[server]
        self.options = {"chunker": chunker, "keep_versions": keep, "public_unlabeled": public_unlabeled}
        self.model = Model(keep, public_unlabeled, self.principals, self.write_labels)
        self.db = ragdb.open(path, **self.options)
        self.client: Any = None

    async def connect(self, stack: contextlib.AsyncExitStack) -> None:
        server = build_server(self.db, principals=self.principals, allow_writes=True, write_labels=self.write_labels)
        self.client = await stack.enter_async_context(Client(server))

    async def call(self, tool: str, args: dict) -> Any:
        return await self.client.call_tool(tool, args)

    async def ok(self, tool: str, args: dict) -> dict:
        result = await self.call(tool, args)
        assert not result.is_error, (tool, args, result.content)
        return dict(result.structured_content)

    async def refused(self, tool: str, args: dict, why: str) -> str:
        """The call is a tool error whose message holds ``why``, and nothing stored changed."""
        before = snapshot(self.db)
        result = await self.call(tool, args)
        assert result.is_error, (tool, args, why, result.structured_content)
        text = tool_answer(result, tool)[1]
        assert why in text, (tool, args, text)
        event(f"refused: {tool}: {why[:40]}")
        assert "Traceback" not in text and "<path>" not in text, text
        assert snapshot(self.db) == before, (tool, args)
        return str(text)

    def pick(self, index: int) -> str | None:
        stored = list(self.model.stored)
        return stored[index % len(stored)] if stored else None

    def stamp(self, source: str, status: str, handle: ragdb.Database | None = None) -> None:
        """The model's latest version of ``source`` gets the timestamp the write stored."""
        if status != "unchanged":
            doc = (handle or self.db).get(source=source, with_text=False, principals=ALL)
            self.model.stored[source][-1]["timestamp"] = doc.timestamp

    # the write tools --------------------------------------------------------------------------------
    async def add(self, pairs: list[tuple[str, dict]], one: bool) -> None:
        """``add_text`` of one record (``one``), or ``add_texts`` of them all."""
        model = self.model
        if one:
            tool, args = "add_text", {**pairs[0][1], "source": pairs[0][0]}
        else:
            tool, args = "add_texts", {"documents": [{**r, "source": s} for s, r in pairs]}
        seen: set[str] = set()
        for source, _ in pairs:
            if source in seen:
                await self.refused(tool, args, "have the same source")
                return
            seen.add(source)
        for source, _ in pairs:
            why = model.refuse_add(source)
            if why is not None:
                await self.refused(tool, args, why)
                return
        previous = {s: model.stored[s][-1] for s, _ in pairs if s in model.stored}
        before = {s: self.db.get(source=s, with_text=False, principals=ALL).id for s in previous}
        got = await self.ok(tool, args)
        answers = [got] if tool == "add_text" else got["documents"]
        for (source, record), answer in zip(pairs, answers, strict=True):
            status = model.add(source, {**record, "acl": model.acl})
            doc = self.db.get(source=source, with_text=False, principals=ALL)
            assert (answer["status"], answer["id"], answer["source"], answer["version"], answer["chunks"]) == \
                (status, doc.id, source, doc.version, doc.chunk_count), (source, record, previous.get(source))
            assert answer["previous"] == (before.get(source) if status == "replaced" else None)
            self.stamp(source, status)

    async def update(self, index: int, by_id: bool, new_metadata: dict | None, new_acl: list[str] | None) -> None:
        model = self.model
        source = self.pick(index)
        if source is None:
            source = "nothing/here"
        doc_id = self.db.get(source=source, with_text=False, principals=ALL).id if source in model.stored else 2 ** 40
        args: dict[str, Any] = {"doc_id": doc_id} if by_id else {"source": source}
        if new_metadata is not None:
            args["metadata"] = new_metadata
        if new_acl is not None:
            args["labels"] = new_acl
        if new_metadata is None and new_acl is None:
            await self.refused("update_document", args, "give metadata and/or labels")
            return
        visible = model.visible_versions(source)
        latest = visible[-1] if visible and visible[-1] is model.stored[source][-1] else None
        what = f"id {doc_id}" if by_id else f"source {source!r}"
        why = model.refuse_change(latest, what, new_acl)
        if why is not None:
            await self.refused("update_document", args, why)
            return
        got = await self.ok("update_document", args)
        assert latest is not None
        if new_metadata is not None:
            latest["metadata"] = copy.deepcopy(new_metadata)
        if new_acl is not None:
            for version in model.stored[source]:
                version["acl"] = tuple(sorted(set(new_acl)))
        doc = self.db.get(doc_id if by_id else None, source=None if by_id else source, with_text=False,
                          principals=ALL)
        assert got == {"id": doc.id, "source": source, "version": doc.version, "metadata": dict(doc.metadata),
                       "labels": list(doc.acl)}

    async def delete_id(self, index: int, which: int) -> None:
        model = self.model
        source = self.pick(index)
        if source is None:
            await self.refused("delete", {"doc_id": 2 ** 40}, f"no document with id {2 ** 40}")
            return
        docs = sorted(self.db.documents(source, glob=False, versions="all", principals=ALL), key=lambda d: d.id)
        versions = model.stored[source]
        assert len(docs) == len(versions)
        position = which % len(versions)
        doc_id, version = docs[position].id, versions[position]  # (both oldest first)
        visible = any(v is version for v in model.visible_versions(source))
        why = model.refuse_change(version if visible else None, f"id {doc_id}")
        if why is not None:
            await self.refused("delete", {"doc_id": doc_id}, why)
            return
        assert await self.ok("delete", {"doc_id": doc_id}) == {"deleted": 1}
        model.delete_versions([version])

    async def delete_matching(self, source: str | None, filter_index: int | None) -> None:
        model = self.model
        args: dict[str, Any] = {}
        if source is not None:
            args["source"] = source
        if filter_index is not None:
            args["filter"] = FILTERS[filter_index][0]
        doomed = [v for s in sorted(model.stored) if source is None or s == source
                  for v in model.visible_versions(s) if filter_index is None or filter_matches(filter_index, s, v)]
        if source is not None and not doomed:
            await self.refused("delete", args, f"no document with source {source!r}")
            return
        for version in doomed:
            why = model.refuse_change(version, "")
            if why is not None:
                await self.refused("delete", args, why)
                return
        assert await self.ok("delete", args) == {"deleted": len(doomed)}
        model.delete_versions(doomed)

    async def collection(self, action: str, source: str, text: str) -> None:
        model = self.model
        if action == "create":
            if model.side is None:
                assert await self.ok("create_collection", {"name": SIDE}) == {"name": SIDE, "status": "created"}
                model.side = {}
            else:
                await self.refused("create_collection", {"name": SIDE}, "already exists")
        elif action == "add":
            args = {"text": text, "source": source, "collection": SIDE}
            if model.side is None or model.side_hidden():
                await self.refused("add_text", args, f"no collection {SIDE!r}")
                return
            acl = model.side.get(source)
            labels = tuple(model.acl) if model.acl is not None else (acl or ())
            if acl is not None and not model.sees(acl) and model.principals is not ALL:
                await self.refused("add_text", args, "not replacing it")
            elif model.scope is not None and ((acl is not None and not model.allows(acl)) or not model.allows(labels)):
                await self.refused("add_text", args, "writes")
            else:
                await self.ok("add_text", args)
                model.side[source] = labels
        elif model.side is None or model.side_hidden():
            await self.refused("drop_collection", {"name": SIDE}, f"no collection {SIDE!r}")
        elif model.principals is not ALL and not all(model.sees(a) and model.allows(a) for a in model.side.values()):
            await self.refused("drop_collection", {"name": SIDE}, "may not delete")
        else:
            assert await self.ok("drop_collection", {"name": SIDE}) == {"name": SIDE, "status": "dropped"}
            model.side = None

    # beside the server ------------------------------------------------------------------------------
    def library_add(self, source: str, record: dict) -> None:
        status = self.model.add(source, record)
        assert self.db.add_many([{**record, "source": source}]).changes[0].status == status
        self.stamp(source, status)

    def relabel(self, index: int, acl: list[str]) -> None:
        source = self.pick(index)
        if source is None:
            return
        self.db.update(self.db.get(source=source, with_text=False, principals=ALL).id, acl=acl)
        for version in self.model.stored[source]:
            version["acl"] = tuple(sorted(set(acl)))

    # bad calls --------------------------------------------------------------------------------------
    async def bad(self, which: int, variant: int, source: str, record: dict) -> None:
        """A bad call: its tool error carries the library's message for the same call."""
        who = self.principals
        bad_filter = BAD_FILTERS[variant % len(BAD_FILTERS)]
        reads = [("search", {"query": "apple", "filter": bad_filter}),
                 ("list_sources", {"filter": bad_filter}),
                 ("facets", {"field": "lang", "query": "apple", "filter": bad_filter}),
                 ("build_prompt", {"question": "apple", "filter": bad_filter}),
                 ("get_document", {"source": source}),  # missing, hidden or there
                 ("get_document", {"source": "nothing/here"}),
                 ("get_document", {"doc_id": 2 ** 40}),
                 ("search", {"query": "apple", "collection": "nowhere"})]
        calls = [*reads, "delete_filter", "add_metadata", "add_texts_metadata", "update_metadata", "empty_text"]
        call = calls[which % len(calls)]
        if isinstance(call, tuple):
            tool, args = call
            want = library_answer(self.db, who, tool, args) if "collection" not in args else \
                ["error", "no collection 'nowhere'"]
            got = tool_answer(await self.call(tool, args), tool)
            assert_same(got, want, f"bad call {tool} {args}")
            return
        library: Any
        if call == "delete_filter":
            tool, args = "delete", {"filter": bad_filter}
            library = lambda db: db.delete(filter=bad_filter)  # noqa: E731
        elif call in ("add_metadata", "add_texts_metadata"):
            bad = {**record, "source": "n/bad", "metadata": BAD_METADATA[variant % len(BAD_METADATA)]}
            if call == "add_metadata":
                tool, args = "add_text", bad
            else:
                tool, args = "add_texts", {"documents": [{**record, "source": "n/ok"}, bad]}
            if self.model.refuse_add("n/ok") is not None or self.model.refuse_add("n/bad") is not None:
                return
            library = lambda db: db.add_many([{**r, "acl": self.model.acl} for r in  # noqa: E731
                                              (args["documents"] if tool == "add_texts" else [args])])
        elif call == "update_metadata":
            visible = [s for s in self.model.stored if self.model.visible_versions(s)
                       and self.model.refuse_change(self.model.stored[s][-1], "") is None]
            if not visible:
                return
            doc_id = self.db.get(source=visible[0], with_text=False, principals=ALL).id
            bad_metadata = BAD_METADATA[variant % len(BAD_METADATA)]
            tool, args = "update_document", {"doc_id": doc_id, "metadata": bad_metadata}
            library = lambda db: db.update(doc_id, metadata=bad_metadata)  # noqa: E731
        else:
            if self.model.refuse_add("n/empty") is not None:
                return
            tool, args = "add_text", {"text": " \u200b ", "source": "n/empty"}
            library = lambda db: db.add(" \u200b ", source="n/empty", acl=self.model.acl)  # noqa: E731
        with pytest.raises(RagdbError) as raised, self.db.transaction():  # (nothing of it stays)
            library(self.db)
        await self.refused(tool, args, client_message(raised.value, database=self.db.path))

    # the history ------------------------------------------------------------------------------------
    async def apply(self, op: tuple, stack: contextlib.AsyncExitStack) -> contextlib.AsyncExitStack:
        kind = op[0]
        if kind == "add_text":
            await self.add([(op[1], op[2])], True)
        elif kind == "add_texts":
            await self.add(list(op[1]), False)
        elif kind == "update":
            await self.update(*op[1:])
        elif kind == "delete_id":
            await self.delete_id(*op[1:])
        elif kind == "delete_source":
            await self.delete_matching(op[1], None)
        elif kind == "delete_filter":
            await self.delete_matching(op[2], op[1])
        elif kind == "library":
            self.library_add(op[1], op[2])
        elif kind == "relabel":
            self.relabel(op[1], op[2])
        elif kind == "collection":
            await self.collection(*op[1:])
        elif kind == "bad":
            await self.bad(*op[1:])
        elif kind == "reopen":
            await stack.aclose()
            self.db.close()
            self.db = ragdb.open(self.path)
            stack = contextlib.AsyncExitStack()
            await self.connect(stack)
        elif kind == "checkpoint":
            await self.compare()
        else:  # pragma: no cover
            raise AssertionError(op)
        return stack

    async def compare(self) -> None:
        model = self.model
        assert self.db.check() == []
        ids = [d.id for d in self.db.documents(versions="all", principals=ALL)]
        calls = checkpoint_calls(model, ids)
        with ragdb.open(":memory:", **self.options) as fresh:
            fresh.add_many(model.records())
            for tool, args in calls:
                got = tool_answer(await self.call(tool, args), tool)
                here = library_answer(self.db, self.principals, tool, args)
                assert_same(got, here, f"{tool} {args} (the library on the same file)")
                if "doc_id" not in args and not (tool == "build_prompt" and "min_confidence" not in args):
                    assert_same(without_ids(got, tool), without_ids(library_answer(fresh, self.principals, tool, args),
                                                                    tool), f"{tool} {args} (a fresh build)")
        await self.compare_side()

    async def compare_side(self) -> None:
        side = self.model.side
        args = {"query": "apple retrieval 检索", "k": 40, "collection": SIDE}
        if side is None or self.model.side_hidden():
            assert tool_answer(await self.call("search", args), "search") == ["error", f"no collection {SIDE!r}"]
            return
        handle = self.db.collection(SIDE, create=False)
        assert sorted(d.source for d in handle.documents(principals=ALL)) == sorted(side)
        assert [list(d.acl) for d in handle.documents(principals=ALL)] == [list(side[d.source]) for d in
                                                                          handle.documents(principals=ALL)]
        got = tool_answer(await self.call("search", args), "search")
        assert_same(got, library_answer(handle, self.principals, "search", args), "the side collection")

    async def run(self, ops: list[tuple]) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            await self.connect(stack)
            for op in ops:
                stack = await self.apply(op, stack)
            await self.compare()
        finally:
            await stack.aclose()
            self.db.close()


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=histories, server=st.sampled_from(sorted(SERVERS)),
       chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), keep_versions=st.booleans(),
       public_unlabeled=st.booleans())
def test_random_histories_through_the_mcp_server(tmp_path_factory, ops, server, chunker, keep_versions,
                                                 public_unlabeled):
    """After any history of writes through the MCP tools (and of the library's writes beside
    them), every read tool answers what the library answers with the server's principals, on
    the same file and on a fresh build; every refused call is a tool error with the library's
    message and changes nothing."""
    note(f"server={server!r}, chunker={chunker!r}, keep_versions={keep_versions}, "
         f"public_unlabeled={public_unlabeled}\nops={ops!r}")
    path = str(tmp_path_factory.mktemp("mcp") / "kb.db")
    with small_segments(whole_vocabulary=False):
        anyio.run(Run(path, server, chunker, keep_versions, public_unlabeled).run, ops)
