"""Random write histories through the LangChain and LlamaIndex vector stores: what each store
returns equals what the library returns for the same call on a fresh build, and every bad call
raises a RagdbError (the library's own type where the library has the same call) and writes
nothing.

Each example opens a database file (``keep_versions`` and ``public_unlabeled`` on or off; with
or without an embedding model, LangChain's ``DeterministicFakeEmbedding``, given to both stores
or as the database's embedder, so that every chunk is embedded) and makes a LangChain store and a LlamaIndex store over
it, each with its own principals and labels (anonymous, ``["a"]`` or ``ragdb.ALL``; ``acl``
within them). A random list of steps then writes through them: LangChain ``add_texts``,
``add_documents`` (ids from ``ids=``, a None in it, ``Document.id`` or made by the store) and
``from_texts(db=...)``, ``delete(ids)``; LlamaIndex ``add`` of nodes (some with a
``ref_doc_id``), ``delete(ref_doc_id)``, ``delete_nodes`` by ids and/or ``MetadataFilters``,
``clear()``; the plain library (``add_many``, ``delete(source=)``, ``update``), LangChain's
``add_documents`` and LlamaIndex's ``add_nodes`` helpers, with labels of their own. Ids of
the two stores and the library overlap (and some hold glob characters, which a filter's
``source`` reads as a pattern), so each replaces what the others wrote where its principals
allow. A step may close and reopen the database (new stores), write through the stores of a
second handle opened mid-history (with principals of their own; kept open across steps, or
opened for a few writes), or make one bad call.

:class:`Model` (tests/engine/test_random_operations.py) follows the stored versions; the
step's expectations (which ids a store may replace or delete) follow ragdb's access rule
(docs/filters-and-access.md). At checkpoints and at the end, every store (and those of a
second handle) is compared with a fresh build of the model's latest documents (``add_many``,
chunker ``"none"``, embedded when the stores have a model): ``get_by_ids``,
``similarity_search_with_score`` with and without filters, ``..._with_relevance_scores``,
``as_retriever`` (with a score threshold too), ``max_marginal_relevance_search``,
``asimilarity_search``, ``RagdbLoader``; ``get_nodes`` by ids and filters and ``query``
with ``MetadataFilters``, ``node_ids`` and ``doc_ids``: ids, texts, metadata, scores and order
equal the library's ``db.search``/``get``/``documents`` of the fresh build with the store's
principals.

``RAGDB_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 20).
"""

from __future__ import annotations

import asyncio
import copy
import os
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

import ragdb  # noqa: E402
from engine.test_random_operations import Model, assert_same, metadata, texts  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402
from langchain_core.vectorstores.utils import maximal_marginal_relevance  # noqa: E402
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict  # noqa: E402
from ragdb.errors import DocumentNotFound, InvalidInput, RagdbError  # noqa: E402
from ragdb.files.sync import escape_glob  # noqa: E402
from ragdb.integrations import langchain as lc  # noqa: E402
from ragdb.integrations import llama_index as li  # noqa: E402

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "20"))

IDS = ["d0", "d1", "d2", "d*", "[d]0"]  # ids, never patterns (as a filter's source is)
REFS = ["r0", "r1"]
QUERIES = ["apple retrieval", "检索 model answer", "note evidence search"]
NAN, INF = float("nan"), float("inf")
PUBLIC = ragdb.PUBLIC

#: (principals, acl) of a store: its labels lie within its principals
STORES = [(None, None), (None, [PUBLIC]), (["a"], ["a"]), (["a"], None), (["a"], ["a", PUBLIC]),
          (ragdb.ALL, None), (ragdb.ALL, ["b"])]
#: labels the library writes with (beside the stores)
LABELS = [None, [], ["a"], ["b"], [PUBLIC], ["a", "b"]]


def _li(key: str, op: FilterOperator, value: Any) -> MetadataFilter:
    return MetadataFilter(key=key, value=value, operator=op)


#: (ragdb filter, the same as LlamaIndex MetadataFilters, whether a metadata mapping matches)
FILTERS = [
    ({"lang": "en"}, MetadataFilters(filters=[_li("lang", FilterOperator.EQ, "en")]),
     lambda m: m.get("lang") == "en"),
    ({"n": {"$gte": 3}}, MetadataFilters(filters=[_li("n", FilterOperator.GTE, 3)]),
     lambda m: isinstance(m.get("n"), int) and not isinstance(m.get("n"), bool) and m["n"] >= 3),
    ({"$not": {"lang": "zh"}},
     MetadataFilters(filters=[_li("lang", FilterOperator.EQ, "zh")], condition=FilterCondition.NOT),
     lambda m: m.get("lang") != "zh"),
    ({"$or": [{"lang": "zh"}, {"n": {"$lt": 2}}]},
     MetadataFilters(filters=[_li("lang", FilterOperator.EQ, "zh"), _li("n", FilterOperator.LT, 2)],
                     condition=FilterCondition.OR),
     lambda m: m.get("lang") == "zh" or (type(m.get("n")) is int and m["n"] < 2)),
    ({"lang": {"$in": ["en", "zh"]}}, MetadataFilters(filters=[_li("lang", FilterOperator.IN, ["en", "zh"])]),
     lambda m: m.get("lang") in ("en", "zh")),
]

#: a LlamaIndex filter ragdb cannot run, and bad ragdb filters
UNSUPPORTED = MetadataFilters(filters=[_li("lang", FilterOperator.TEXT_MATCH, "e")])
BAD_FILTERS = [{"$bogus": 1}, {"n": {"$gte": "x"}}, {"n": {"$in": 5}}, {"": 1}, {"n": NAN}, {"$and": 5},
               {"lang": {"$eq": {"a": 1}}}, {1: "x"}]
BAD_LI_FILTERS = [MetadataFilters(filters=[_li("n", FilterOperator.GTE, "x")]),
                  MetadataFilters(filters=[_li("n", FilterOperator.IN, [NAN])]), UNSUPPORTED]
BAD_METADATA = [{"w": NAN}, {"w": [1.0, INF]}, {"n": {1, 2}}, {"o": object()}, {"b": b"x"}, {"m": {"k": -INF}}]

EMBEDDING = DeterministicFakeEmbedding(size=8)


def readable(acl, principals, public_unlabeled: bool) -> bool:
    """ragdb's access rule (docs/filters-and-access.md) for one version's labels."""
    if principals is ragdb.ALL:
        return True
    if not acl:
        return public_unlabeled
    return bool(set(acl) & ({PUBLIC} | set(principals or ())))


# -- the steps -------------------------------------------------------------------------------------

ids = st.one_of(st.sampled_from(IDS), st.none())  # None: the store makes one (add_texts), or Document.id
lc_rows = st.lists(st.tuples(ids, texts, metadata), min_size=1, max_size=4)
li_rows = st.lists(st.tuples(st.sampled_from(IDS), st.one_of(st.none(), st.sampled_from(REFS)), texts, metadata),
                   min_size=1, max_size=4)
lib_rows = st.lists(st.tuples(st.sampled_from(IDS), texts, metadata, st.sampled_from(LABELS)), min_size=1,
                    max_size=3, unique_by=lambda r: r[0])
filter_index = st.integers(0, len(FILTERS) - 1)
lc_add = st.tuples(st.just("lc_add"), st.sampled_from(["texts", "documents", "doc_ids", "from_texts"]), lc_rows)
li_add = st.tuples(st.just("li_add"), li_rows)
#: the library's add_many, LangChain's add_documents helper or LlamaIndex's add_nodes helper
lib_add = st.tuples(st.just("lib_add"), st.sampled_from(["library", "langchain", "llama_index"]), lib_rows)
writes = st.one_of(
    lc_add, lc_add, li_add, li_add, lib_add,
    st.tuples(st.just("lc_delete"), st.lists(st.sampled_from([*IDS, "nope"]), min_size=1, max_size=3)),
    st.tuples(st.just("li_delete"), st.sampled_from([*REFS, "nope"])),
    st.tuples(st.just("li_delete_nodes"), st.one_of(st.none(), st.lists(st.sampled_from(IDS), max_size=3)),
              st.one_of(st.none(), filter_index)),
    st.tuples(st.just("li_clear")),
    st.tuples(st.just("lib_delete"), st.sampled_from(IDS)),
    st.tuples(st.just("lib_update"), st.sampled_from(IDS), st.one_of(st.none(), metadata),
              st.one_of(st.none(), st.sampled_from(LABELS[1:]))),
)
step = st.one_of(
    writes, writes, writes, writes, writes, writes, writes, writes,
    st.tuples(st.just("bad"), st.integers(0, 10_000), st.sampled_from(IDS)),
    st.tuples(st.just("bad"), st.integers(0, 10_000), st.sampled_from(IDS)),
    st.tuples(st.just("reopen"), st.integers(0, 100)),
    st.tuples(st.just("beside"), writes, st.sampled_from(STORES), st.sampled_from(STORES)),
    st.tuples(st.just("beside"), writes, st.sampled_from(STORES), st.sampled_from(STORES)),
    st.tuples(st.just("close_beside")),
    st.tuples(st.just("second"), st.lists(writes, min_size=1, max_size=3), st.booleans(), st.sampled_from(STORES),
              st.sampled_from(STORES)),
    st.tuples(st.just("checkpoint")),
)
histories = st.lists(step, min_size=6, max_size=30)


def node_of(node_id: str, ref: str | None, text: str, meta: dict) -> TextNode:
    relationships = {} if ref is None else {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=ref)}
    return TextNode(id_=node_id, text=text, metadata=copy.deepcopy(meta), relationships=relationships)


def record(text: str, meta: dict, acl) -> dict:
    return {"text": text, "title": None, "metadata": copy.deepcopy(meta), "acl": acl, "timestamp": None}


class Stores:
    """The LangChain and LlamaIndex stores of one handle."""

    def __init__(self, db, lc_who, li_who, embedding: str | None) -> None:
        self.db = db
        self.lc_who, self.li_who = lc_who, li_who
        mine = embedding == "store"  # else the database's embedder, or none
        self.lc = lc.RagdbVectorStore(db, EMBEDDING if mine else None, principals=lc_who[0], acl=lc_who[1])
        self.li = li.RagdbVectorStore(db, embedder=lc.LangChainEmbedder(EMBEDDING) if mine else None,
                                      principals=li_who[0], acl=li_who[1])


class Run:
    def __init__(self, path: str, keep_versions: bool, public_unlabeled: bool, embedding: str | None, lc_who,
                 li_who):
        self.path, self.embedding = path, embedding
        self.options = {"keep_versions": keep_versions, "public_unlabeled": public_unlabeled}
        self.public_unlabeled = public_unlabeled
        self.lc_who, self.li_who = lc_who, li_who
        self.db = self.open(**self.options)
        self.stores = Stores(self.db, lc_who, li_who, embedding)
        self.model = Model(keep_versions)
        self.model.seen = set(IDS)
        self.beside: Stores | None = None  # the stores of a second handle kept open across steps

    def open(self, **options: Any) -> Any:
        """The database file; with the embedding model as the database's embedder (``"db"``)."""
        if self.embedding == "db":
            options["embedder"] = lc.LangChainEmbedder(EMBEDDING)
        return ragdb.open(self.path, **options)

    # expectations ---------------------------------------------------------------------------------
    def can_read(self, acl, principals) -> bool:
        return readable(acl, principals, self.public_unlabeled)

    def writable(self, source: str, principals) -> bool:
        latest = self.model.latest().get(source)
        return principals is ragdb.ALL or latest is None or self.can_read(latest["acl"], principals)

    def delete_visible(self, principals, doomed) -> None:
        """The model's side of ``stores.delete_visible``: every version ``principals`` may read
        (its own labels and its latest's) that ``doomed(source, version)`` says."""
        latest = self.model.latest()
        self.model.delete_where(lambda s, v: doomed(s, v) and self.can_read(v["acl"], principals)
                                and self.can_read(latest[s]["acl"], principals))

    def adds(self, principals, acl, rows: list[tuple[str, dict]], call) -> list[str] | None:
        """``call()`` adds ``rows`` (source, record) through a store with ``principals``:
        refused (InvalidInput) when two share a source, (DocumentNotFound) when one is hidden
        from the store, and then nothing is written."""
        sources = [s for s, _ in rows]
        if len(set(sources)) < len(sources):
            with pytest.raises(InvalidInput, match="have the same source"):
                call()
            return None
        if not all(self.writable(s, principals) for s in sources):
            with pytest.raises(DocumentNotFound, match="not replacing it"):
                call()
            return None
        out = call()
        for source, rec in rows:
            self.model.add(source, {**rec, "acl": acl})
        return out

    # writes ---------------------------------------------------------------------------------------
    def write(self, stores: Stores, op: tuple) -> None:
        kind = op[0]
        db = stores.db
        if kind == "lc_add":
            self.lc_add(stores, op[1], op[2])
        elif kind == "lc_delete":
            principals = stores.lc_who[0]
            assert stores.lc.delete(list(op[1])) is True
            self.delete_visible(principals, lambda s, v: s in op[1])
        elif kind == "li_add":
            principals, acl = stores.li_who
            nodes = [node_of(*row) for row in op[1]]
            rows = [(n.node_id, record(n.text, node_to_metadata_dict(n, remove_text=True), None)) for n in nodes]
            got = self.adds(principals, acl, rows, lambda: stores.li.add(nodes))
            assert got is None or got == [n.node_id for n in nodes]
        elif kind == "li_delete":
            stores.li.delete(op[1])
            self.delete_visible(stores.li_who[0], lambda s, v: v["metadata"].get("ref_doc_id") == op[1])
        elif kind == "li_delete_nodes":
            node_ids, which = op[1], op[2]
            filters = None if which is None else FILTERS[which][1]
            if node_ids is None and filters is None:
                with pytest.raises(InvalidInput, match="give node_ids and/or filters"):
                    stores.li.delete_nodes()
                return
            stores.li.delete_nodes(node_ids=node_ids, filters=filters)
            if node_ids == []:
                return  # an empty list deletes nothing (as SimpleVectorStore reads it)
            matches = (lambda m: True) if which is None else FILTERS[which][2]
            self.delete_visible(stores.li_who[0], lambda s, v: (node_ids is None or s in node_ids)
                                and matches(v["metadata"]))
        elif kind == "li_clear":
            stores.li.clear()
            self.delete_visible(stores.li_who[0], lambda s, v: "_node_content" in v["metadata"])
        elif kind == "lib_delete":  # every version of the source, whoever may read it
            assert db.delete(source=op[1]) == len(self.model.stored.pop(op[1], ()))
        elif kind == "lib_update":  # the latest version's metadata and/or labels (all versions' labels)
            source, new_metadata, new_acl = op[1:]
            if source not in self.model.stored or (new_metadata is None and new_acl is None):
                return
            doc = db.get(source=source, principals=ragdb.ALL)
            db.update(doc.id, metadata=new_metadata, acl=new_acl)
            if new_metadata is not None:
                self.model.stored[source][-1]["metadata"] = copy.deepcopy(new_metadata)
            if new_acl is not None:
                for version in self.model.stored[source]:
                    version["acl"] = tuple(sorted(set(new_acl)))
        elif kind == "lib_add":
            helper, rows = op[1], op[2]
            if helper == "langchain":  # the helpers: source and acl from the metadata
                docs = [Document(page_content=text, metadata={**copy.deepcopy(meta), "source": source,
                                                              **({} if acl is None else {"acl": acl})})
                        for source, text, meta, acl in rows]
                report = lc.add_documents(db, docs, chunker="none")
            elif helper == "llama_index":  # (the node's id is the source: no "source" key)
                nodes = [TextNode(text=text, id_=source, metadata={**copy.deepcopy(meta),
                                                                   **({} if acl is None else {"acl": acl})})
                         for source, text, meta, acl in rows]
                report = li.add_nodes(db, nodes, chunker="none")
            else:
                report = db.add_many([{"text": text, "source": source, "metadata": meta, "acl": acl}
                                      for source, text, meta, acl in rows], chunker="none")
            want = [self.model.add(source, record(text, meta, acl)) for source, text, meta, acl in rows]
            assert [c.status for c in report.changes] == want
            if self.embedding == "store":
                db.embed(stores.lc.embedder)  # as a store embeds what it adds (the database's embedder: add_many)
        else:  # pragma: no cover - the strategy makes no other write
            raise AssertionError(op)

    def lc_add(self, stores: Stores, how: str, rows) -> None:
        principals, acl = stores.lc_who
        store = stores.lc
        if how == "texts":  # ids given, or (all None) made by the store
            given = [r[0] for r in rows]
            ids_arg = given if all(given) else None
            if ids_arg is None:
                out = store.add_texts([r[1] for r in rows], [copy.deepcopy(r[2]) for r in rows])
                assert len(set(out)) == len(rows)
                for source, (_, text, meta) in zip(out, rows):
                    self.model.seen.add(source)
                    self.model.add(source, record(text, meta, acl))
                return
            call = lambda: store.add_texts([r[1] for r in rows], [copy.deepcopy(r[2]) for r in rows],  # noqa: E731
                                           ids=ids_arg)
            sources = ids_arg
        elif how == "from_texts":
            sources = [r[0] or f"ft{n}" for n, r in enumerate(rows)]

            def call() -> list[str]:
                lc.RagdbVectorStore.from_texts([r[1] for r in rows], store.embeddings if store.embedder else None,
                                               [copy.deepcopy(r[2]) for r in rows], ids=sources, db=stores.db,
                                               principals=principals, acl=acl)
                return sources
        elif how == "doc_ids":  # ids= over each Document.id; a None in ids: that document's own id
            docs = [Document(page_content=text, metadata=copy.deepcopy(meta), id=f"y{n}")
                    for n, (_, text, meta) in enumerate(rows)]
            sources = [r[0] or f"y{n}" for n, r in enumerate(rows)]
            call = lambda: store.add_documents(docs, ids=[r[0] for r in rows])  # noqa: E731
        else:  # each Document.id
            sources = [r[0] or f"x{n}" for n, r in enumerate(rows)]
            docs = [Document(page_content=r[1], metadata=copy.deepcopy(r[2]), id=source)
                    for source, r in zip(sources, rows)]
            call = lambda: store.add_documents(docs)  # noqa: E731
        self.model.seen.update(sources)
        got = self.adds(principals, acl, [(s, record(r[1], r[2], None)) for s, r in zip(sources, rows)], call)
        assert got is None or list(got) == list(sources)

    # bad calls ------------------------------------------------------------------------------------
    def bad(self, stores: Stores, which: int, source: str) -> None:
        """One bad call through a store: it raises a RagdbError (the library's for the same call,
        where there is one) or the framework's own, and writes nothing."""
        db, store, node_store = stores.db, stores.lc, stores.li
        principals = stores.lc_who[0]
        bad_filter = BAD_FILTERS[which % len(BAD_FILTERS)]
        bad_meta = BAD_METADATA[which % len(BAD_METADATA)]
        hidden = [s for s in self.model.stored if not self.writable(s, principals)]
        hidden_li = [s for s in self.model.stored if not self.writable(s, stores.li_who[0])]
        # a store refuses to replace what it cannot read before it reads the record (as the HTTP
        # API's writers do): a bad record of a hidden id is DocumentNotFound, as a good one is.
        # The bad records go to ids the store may write.
        mine = source if source not in hidden else "n/new"
        mine_li = source if source not in hidden_li else "n/new"
        who = {"principals": principals}
        # (store call, library call for the same thing or None)
        calls: list[tuple[Any, Any]] = [
            (lambda: store.similarity_search("apple", filter=bad_filter),
             lambda: db.search("apple", filter=bad_filter, **who)),
            (lambda: store.similarity_search_with_score("apple", k=0), lambda: db.search("apple", k=0, **who)),
            (lambda: store.similarity_search("apple", k=-1), lambda: db.search("apple", k=-1, **who)),
            (lambda: store.similarity_search("apple", scorer="bm42"), lambda: db.search("apple", scorer="bm42")),
            (lambda: store.similarity_search("apple", principals=ragdb.ALL), None),
            (lambda: store.as_retriever(search_kwargs={"filter": bad_filter}), None),
            (lambda: store.as_retriever(search_kwargs={"k": 2}).invoke("apple", filter=bad_filter), None),
            (lambda: store.get_by_ids("abc"), None),
            (lambda: store.get_by_ids([3]), None),
            (lambda: store.get_by_ids([""]), lambda: db.get(source="", **who)),
            (lambda: store.delete(source), None),
            (lambda: store.delete(), None),
            (lambda: store.delete([source, 5]), None),
            (lambda: store.delete([source], filter={"lang": "en"}), None),
            (lambda: store.add_texts(["apple"], [bad_meta], ids=[mine]),
             lambda: db.add_many([{"text": "apple", "source": mine, "metadata": bad_meta}])),
            (lambda: store.add_texts(["apple", "note"], [{}, bad_meta], ids=["n/ok", mine]),
             lambda: db.add_many([{"text": "apple", "source": "n/ok"},
                                  {"text": "note", "source": mine, "metadata": bad_meta}])),
            (lambda: store.add_texts(["  "], ids=[mine]),
             lambda: db.add_many([{"text": "  ", "source": mine}])),
            (lambda: store.add_texts([5], ids=[mine]), lambda: db.add_many([{"text": 5, "source": mine}])),
            (lambda: store.add_texts(["apple"], ["m"], ids=[mine]),
             lambda: db.add_many([{"text": "apple", "source": mine, "metadata": "m"}])),
            (lambda: store.add_texts(["apple"], ids=["a\ud800b"]),
             lambda: db.add_many([{"text": "apple", "source": "a\ud800b"}])),
            (lambda: store.add_texts(["apple", "note"], ids=[source, source]), None),
            (lambda: store.add_texts(["apple"], ids=[source, "d9"]), None),
            (lambda: store.add_texts(["apple"], ids=[""]), lambda: db.add_many([{"text": "apple", "source": ""}])),
            (lambda: store.add_documents(["apple"]), None),
            (lambda: store.add_documents([Document(page_content="apple")], ids=["a", "b"]), None),
            (lambda: store.similarity_search("apple", filter="lang"), lambda: db.search("apple", filter="lang")),
            (lambda: store.similarity_search("apple", k="3"), lambda: db.search("apple", k="3")),
            (lambda: lc.RagdbVectorStore.from_texts(["apple"], db=db, chunker="none"), None),
            (lambda: lc.RagdbVectorStore(db, principals=["c"], acl=["a"]), None),
            (lambda: lc.RagdbVectorStore(db, principals=[""]), lambda: db.search("apple", principals=[""])),
            (lambda: lc.RagdbLoader(db, principals=[PUBLIC]).load(), lambda: db.documents(principals=[PUBLIC])),
            (lambda: li.RagdbVectorStore(db, principals=None, acl=["a"]), None),
            (lambda: node_store.delete_nodes(node_ids=[5]), None),
            (lambda: node_store.query(VectorStoreQuery(  # an unsupported operator nested
                query_str="apple", filters=MetadataFilters(filters=[FILTERS[0][1], UNSUPPORTED]))), None),
            (lambda: store.add_documents([Document(page_content="apple", id=source)], bogus=1), None),
            (lambda: lc.RagdbLoader(db, filter=bad_filter, principals=principals).load(),
             lambda: db.documents(filter=bad_filter, **who)),
            (lambda: lc.RagdbLoader(db, versions="some").load(), lambda: db.documents(versions="some")),
            (lambda: lc.add_documents(db, [Document(page_content="apple", metadata={"source": source, **bad_meta})]),
             lambda: db.add_many([{"text": "apple", "source": source, "metadata": bad_meta}])),
            (lambda: lc.add_documents(db, [Document(page_content="apple", metadata={"source": source,
                                                                                     "acl": "a"})]),
             lambda: db.add_many([{"text": "apple", "source": source, "acl": "a"}])),
            # LlamaIndex
            (lambda: node_store.query(VectorStoreQuery(query_str="apple",
                                                       filters=BAD_LI_FILTERS[which % len(BAD_LI_FILTERS)])),
             None),
            (lambda: node_store.query(VectorStoreQuery(query_str="apple", similarity_top_k=0)),
             lambda: db.search("apple", k=0)),
            (lambda: node_store.query(VectorStoreQuery(query_embedding=[0.1] * 8)), None),
            (lambda: node_store.query(VectorStoreQuery(query_str="apple", node_ids=[5])), None),
            (lambda: node_store.get_nodes(node_ids=source), None),
            (lambda: node_store.get_nodes(filters=BAD_LI_FILTERS[which % len(BAD_LI_FILTERS)]), None),
            (lambda: node_store.get_nodes(filters={"lang": "en"}), None),
            (lambda: node_store.delete(""), None),
            (lambda: node_store.delete(5), None),
            (lambda: node_store.delete_nodes(), None),
            (lambda: node_store.delete_nodes(node_ids=source), None),
            (lambda: node_store.delete_nodes(filters=BAD_LI_FILTERS[which % len(BAD_LI_FILTERS)]), None),
            (lambda: node_store.add([TextNode(text="apple", id_=mine_li, metadata=bad_meta)]),
             lambda: db.add_many([{"text": "apple", "source": mine_li, "metadata": bad_meta}])),
            (lambda: node_store.add([TextNode(text="apple", id_="n/ok"), TextNode(text=" ", id_=mine_li)]),
             lambda: db.add_many([{"text": "apple", "source": "n/ok"}, {"text": " ", "source": mine_li}])),
            (lambda: node_store.add([TextNode(text="apple", id_=source), TextNode(text="note", id_=source)]), None),
            (lambda: node_store.add(["apple"]), None),
        ]
        if db.vector_info().vectors:  # a store of another model than the vectors' writes nothing
            other = lc.LangChainEmbedder(EMBEDDING, name="other")
            calls += [(lambda: lc.RagdbVectorStore(db, other, principals=principals, acl=stores.lc_who[1]).add_texts(
                          ["apple"], ids=[mine]), lambda: db.embed(other)),
                      (lambda: li.RagdbVectorStore(db, embedder=other, principals=stores.li_who[0]).add(
                          [TextNode(text="apple", id_=mine_li)]), lambda: db.embed(other))]
        if hidden:
            calls.append((lambda: store.add_texts(["apple"], ids=[hidden[which % len(hidden)]]), None))
        if hidden_li:
            calls.append((lambda: node_store.add([TextNode(text="x", id_=hidden_li[which % len(hidden_li)])]), None))
        store_call, lib_call = calls[which % len(calls)]
        before = self.everything(db)
        with pytest.raises(Exception) as raised:
            store_call()
        error = raised.value
        assert isinstance(error, RagdbError), f"bad call {which % len(calls)} raised {error!r}"
        if lib_call is not None:
            with pytest.raises(RagdbError) as library:
                lib_call()
            assert type(error) is type(library.value), (which % len(calls), error, library.value)
        assert self.everything(db) == before, f"bad call {which % len(calls)} ({error!r}) wrote"

    @staticmethod
    def closed(stores: Stores, which: int) -> None:
        """Call ``which`` of the stores of a closed handle raises what the library raises there
        (StorageError: the handle is closed)."""
        with pytest.raises(RagdbError) as library:
            stores.db.search("apple")
        calls = [lambda: stores.lc.similarity_search("apple"), lambda: stores.lc.add_texts(["apple"], ids=["d0"]),
                 lambda: stores.lc.get_by_ids(["d0"]), lambda: stores.lc.delete(["d0"]),
                 lambda: lc.RagdbLoader(stores.db).load(), lambda: stores.li.get_nodes(),
                 lambda: stores.li.query(VectorStoreQuery(query_str="apple")), lambda: stores.li.clear(),
                 lambda: stores.li.add([TextNode(text="apple", id_="d0")]), lambda: stores.li.delete("r0")]
        with pytest.raises(RagdbError) as raised:
            calls[which % len(calls)]()
        assert type(raised.value) is type(library.value), (raised.value, library.value)

    @staticmethod
    def everything(db) -> list:
        return [(d.source, d.content_hash, dict(d.metadata), d.acl, d.id)
                for d in db.documents(versions="all", principals=ragdb.ALL)]

    # steps ----------------------------------------------------------------------------------------
    def apply(self, op: tuple) -> None:
        kind = op[0]
        if kind == "bad":
            self.bad(self.stores, op[1], op[2])
        elif kind == "reopen":  # (a store of the closed handle raises the library's error)
            self.db.close()
            self.closed(self.stores, op[1])
            self.db = self.open()
            self.stores = Stores(self.db, self.lc_who, self.li_who, self.embedding)
        elif kind == "second":  # stores over a second handle write, and read what the first wrote
            with self.open() as other:
                stores = Stores(other, op[3], op[4], self.embedding)
                for inner in op[1]:
                    self.write(stores, inner)
                if op[2]:
                    self.compare(stores)
        elif kind == "beside":  # a write through the stores of a handle kept open beside the first
            if self.beside is None:
                self.beside = Stores(self.open(), op[2], op[3], self.embedding)
            self.write(self.beside, op[1])
        elif kind == "close_beside":
            if self.beside is not None:
                self.compare(self.beside)
                self.beside.db.close()
                self.beside = None
        elif kind == "checkpoint":
            self.compare(self.stores)
            if self.beside is not None:
                self.compare(self.beside)
        else:
            self.write(self.stores, op)

    # comparisons ----------------------------------------------------------------------------------
    def compare(self, stores: Stores) -> None:
        assert stores.db.check() == []
        with ragdb.open(":memory:", **self.options) as fresh:
            fresh.add_many(self.model.records(), chunker="none")
            if self.embedding:
                fresh.embed(lc.LangChainEmbedder(EMBEDDING))
            assert fresh.stats().documents == len(self.model.stored)
            self.compare_langchain(stores, fresh)
            self.compare_llama_index(stores, fresh)

    def fresh_search(self, fresh, store_scorer: str, query: str, k: int, filter, principals) -> list:
        scorer = "hybrid" if self.embedding and fresh.vector_info().vectors > 0 else "bm25"
        if store_scorer != scorer:
            # A store counts vectors until it has seen some, then keeps them in mind
            # (stores.store_scorer): a database emptied since searches hybrid, and finds nothing else
            assert (store_scorer, scorer) == ("hybrid", "bm25") and self.embedding
            scorer = store_scorer
        keywords = {"embedder": lc.LangChainEmbedder(EMBEDDING)} if scorer == "hybrid" else {}
        return fresh.search(query, k=k, filter=filter, principals=principals, syntax="plain", collapse=False,
                            scorer=scorer, **keywords)

    def compare_langchain(self, stores: Stores, fresh) -> None:
        store, principals = stores.lc, stores.lc_who[0]
        wanted = []
        for source in sorted(self.model.seen) + ["missing"]:
            try:
                doc = fresh.get(source=source, principals=principals)
            except DocumentNotFound:
                continue
            wanted.append(Document(page_content=doc.text, metadata=dict(doc.metadata), id=doc.source))
        assert store.get_by_ids(sorted(self.model.seen) + ["missing"]) == wanted
        for query in QUERIES:
            for k, filter in ((10, None), (2, None), (10, FILTERS[0][0]), (10, FILTERS[2][0]), (3, FILTERS[3][0]),
                              (10, {"source": {"$in": IDS[:3]}})):
                got = [[d.id, d.page_content, d.metadata, s]
                       for d, s in store.similarity_search_with_score(query, k=k, filter=filter)]
                hits = self.fresh_search(fresh, store.search_options().scorer, query, k, filter, principals)
                want = [[h.source, h.text, dict(h.metadata), h.confidence] for h in hits]
                assert_same(got, want, f"LangChain similarity_search_with_score({query!r}, k={k}, filter={filter})")
            retriever = store.as_retriever(search_kwargs={"k": 3, "filter": FILTERS[1][0]})
            assert retriever.invoke(query) == store.similarity_search(query, k=3, filter=FILTERS[1][0])
            scored = store.similarity_search_with_score(query, k=10)
            assert store.similarity_search_with_relevance_scores(query, k=10) == scored
            threshold = store.as_retriever(search_type="similarity_score_threshold",
                                           search_kwargs={"k": 10, "score_threshold": 0.3})
            with warnings.catch_warnings():  # ("No relevant docs were retrieved ...")
                warnings.simplefilter("ignore", UserWarning)
                assert threshold.invoke(query) == [d for d, s in scored if s >= 0.3]
            if self.embedding:  # MMR over the fresh build's candidates, embedded again
                hits = self.fresh_search(fresh, store.search_options().scorer, query, 6, None, principals)
                embedder = lc.LangChainEmbedder(EMBEDDING)
                chosen = maximal_marginal_relevance(embedder.embed_query(query),
                                                    embedder.embed([h.text for h in hits]).tolist(), 0.3, 3) \
                    if hits else []
                assert [[d.id, d.page_content, d.metadata]
                        for d in store.max_marginal_relevance_search(query, k=3, fetch_k=6, lambda_mult=0.3)] == \
                    [[hits[i].source, hits[i].text, dict(hits[i].metadata)] for i in chosen]
        assert asyncio.run(store.asimilarity_search(QUERIES[0], k=3)) == store.similarity_search(QUERIES[0], k=3)

        def loaded(db, **keywords) -> list:
            return [[d.page_content, {k: v for k, v in d.metadata.items() if k not in ("doc_id", "timestamp")}]
                    for d in lc.RagdbLoader(db, principals=principals, **keywords).load()]

        for keywords in ({}, {"source": "d[0-2]"}, {"filter": FILTERS[2][0]}):
            assert loaded(stores.db, **keywords) == loaded(fresh, **keywords), keywords

    def compare_llama_index(self, stores: Stores, fresh) -> None:
        store, principals = stores.li, stores.li_who[0]

        def nodes_of(docs) -> list:
            return [node_json(metadata_dict_to_node(dict(d.metadata), text=d.text))
                    for d in docs if "_node_content" in d.metadata]

        def fresh_docs(filter) -> list:
            return [fresh.get(d.id, principals=principals) for d in fresh.documents(filter=filter,
                                                                                      principals=principals)]

        seen = sorted(self.model.seen)
        by_ids = nodes_of(fresh_docs({"source": {"$in": [escape_glob(i) for i in seen]}}))
        assert [node_json(n) for n in store.get_nodes(node_ids=seen)] == by_ids
        assert [node_json(n) for n in store.get_nodes(node_ids=iter(seen))] == by_ids
        assert [node_json(n) for n in store.get_nodes()] == nodes_of(fresh_docs(None))
        assert store.get_nodes(node_ids=[]) == []  # no id, no node (as delete_nodes reads it)
        for ragdb_filter, filters, _ in FILTERS[:3]:
            assert [node_json(n) for n in store.get_nodes(filters=filters)] == nodes_of(fresh_docs(ragdb_filter))
        for query in QUERIES:
            for k, which in ((10, None), (2, None), (10, 0), (10, 3), (3, 4)):
                filters = None if which is None else FILTERS[which][1]
                result = store.query(VectorStoreQuery(query_str=query, similarity_top_k=k, filters=filters))
                scorer = store.search_options(VectorStoreQuery(query_str=query)).scorer
                hits = self.fresh_search(fresh, scorer, query, k,
                                         None if which is None else FILTERS[which][0], principals)
                got = [["chunk" if i.startswith("chunk:") else i, node_json(n), s]
                       for i, n, s in zip(result.ids, result.nodes, result.similarities)]
                want = [[*hit_node(h), h.confidence] for h in hits]
                assert_same(got, want, f"LlamaIndex query({query!r}, k={k}, filters={which})")
            for node_ids, doc_ids in ((IDS[:3], None), (None, ["r0"]), (IDS[1:], ["r0", "r1"]), ([], None)):
                vsq = VectorStoreQuery(query_str=query, similarity_top_k=10, node_ids=node_ids, doc_ids=doc_ids)
                result = store.query(vsq)
                exact = {"source": {"$in": [escape_glob(i) for i in node_ids]}} if node_ids else None
                parts = [f for f in (exact, {"ref_doc_id": {"$in": doc_ids}} if doc_ids else None) if f]
                hits = self.fresh_search(fresh, store.search_options(vsq).scorer, query, 10,
                                         {"$and": parts} if parts else None, principals)
                got = [["chunk" if i.startswith("chunk:") else i, node_json(n), s]
                       for i, n, s in zip(result.ids, result.nodes, result.similarities)]
                assert_same(got, [[*hit_node(h), h.confidence] for h in hits],
                            f"LlamaIndex query({query!r}, node_ids={node_ids}, doc_ids={doc_ids})")
        vsq = VectorStoreQuery(query_str=QUERIES[0], similarity_top_k=3)
        assert asyncio.run(store.aquery(vsq)).ids == store.query(vsq).ids


def node_json(node) -> list:
    """What a node holds, for comparison: a node ragdb made of another document (to_node) has
    the document's and chunk's ids in its id and metadata, which a fresh build numbers anew."""
    meta = dict(node.metadata)
    node_id = node.node_id
    if node_id.startswith("chunk:"):
        node_id = "chunk"
        for key in ("doc_id", "chunk_id", "timestamp"):
            meta.pop(key, None)
    return [node_id, node.get_content(), meta, node.ref_doc_id if not node.node_id.startswith("chunk:") else None]


def hit_node(hit) -> list:
    """The id and :func:`node_json` of the node the LlamaIndex store makes of a hit."""
    if "_node_content" in hit.metadata:
        node = metadata_dict_to_node(dict(hit.metadata), text=hit.text)
        node.metadata["score"] = hit.score
        return [node.node_id, node_json(node)]
    return ["chunk", node_json(li.to_node(hit).node)]


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(ops=histories, keep_versions=st.booleans(), public_unlabeled=st.booleans(),
       embedding=st.sampled_from([None, "store", "db"]),
       lc_who=st.sampled_from(STORES), li_who=st.sampled_from(STORES))
def test_random_store_histories_equal_the_library(tmp_path_factory, ops, keep_versions, public_unlabeled, embedding,
                                                  lc_who, li_who):
    """After any history of writes through both stores, the library and stores of a second
    handle, each store reads what the library reads in a fresh build, and every bad call raises
    a RagdbError (the library's own for the same call) and writes nothing."""
    note(f"keep_versions={keep_versions}, public_unlabeled={public_unlabeled}, embedding={embedding}, "
         f"lc={lc_who}, li={li_who}\nops={ops!r}")
    run = Run(str(tmp_path_factory.mktemp("stores") / "kb.db"), keep_versions, public_unlabeled, embedding,
              lc_who, li_who)
    try:
        for op in ops:
            run.apply(op)
        run.compare(run.stores)
        if run.beside is not None:
            run.compare(run.beside)
    finally:
        run.db.close()
        if run.beside is not None:
            run.beside.db.close()
