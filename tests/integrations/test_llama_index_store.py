"""ragdb.integrations.llama_index's vector store against the real llama-index-core:
``VectorStoreIndex.from_documents`` with ragdb's store answers a query,
``IngestionPipeline(vector_store=...)`` and ``delete_ref_doc`` work, ``MetadataFilters``
are translated (each operator against a reference), node scores are ragdb's confidence,
and loader bookkeeping stays out of what the LLM and the embedder see. LlamaIndex's
MockLLM and MockEmbedding are the framework's own offline fixtures (no network); the
store is a real ragdb database."""

from __future__ import annotations

import asyncio
import operator

import pytest

import ragdb
from ragdb.errors import DocumentNotFound, EmbeddingError, InvalidInput

pytest.importorskip("llama_index.core")

from llama_index.core import Settings, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.embeddings import MockEmbedding  # noqa: E402
from llama_index.core.ingestion import IngestionPipeline  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.node_parser import SentenceSplitter  # noqa: E402
from llama_index.core.postprocessor import SimilarityPostprocessor  # noqa: E402
from llama_index.core.schema import Document, MetadataMode, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

from ragdb.files.sync import add_paths  # noqa: E402
from ragdb.integrations.llama_index import RagdbRetriever, RagdbVectorStore, to_ragdb_filter  # noqa: E402

DOCS = [
    Document(text="Cats sleep most of the day. A cat purrs when it is content.", doc_id="cats",
             metadata={"topic": "pets", "year": 2023}),
    Document(text="Dogs chase cats in the park and wag their tails.", doc_id="dogs",
             metadata={"topic": "pets", "year": 2024}),
    Document(text="Black holes bend light. Quantum physics describes particles.", doc_id="physics",
             metadata={"topic": "science", "year": 2025}),
]


@pytest.fixture(autouse=True, scope="module")
def offline_settings():
    """Whatever LlamaIndex resolves from its global Settings is a local mock, never OpenAI."""
    Settings.llm = MockLLM()
    Settings.embed_model = MockEmbedding(embed_dim=8)


@pytest.fixture
def db(tmp_path):
    with ragdb.open(tmp_path / "li.db") as database:
        yield database


def test_vector_store_index_from_documents_answers_a_query(db):
    store = RagdbVectorStore(db)
    index = VectorStoreIndex.from_documents(DOCS, storage_context=StorageContext.from_defaults(vector_store=store))
    assert db.count() == 3  # one node per (short) document, each a ragdb document of one chunk
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
    response = engine.query("why do cats purr")
    sources = response.source_nodes
    assert sources and len(sources) <= 2
    assert sources[0].node.ref_doc_id == "cats"
    assert "purrs when it is content" in response.response  # MockLLM answers with its prompt: ragdb's context
    hits = db.search("why do cats purr", k=2, syntax="plain")
    assert [n.node.node_id for n in sources] == [h.source for h in hits]
    assert [n.score for n in sources] == [h.confidence for h in hits]  # thresholdable: confidence in [0, 1]
    assert [n.node.metadata["score"] for n in sources] == [h.score for h in hits]
    assert "score" not in sources[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert sources[0].node.metadata["topic"] == "pets"


def test_similarity_top_k_and_a_postprocessor_threshold(db):
    store = RagdbVectorStore(db)
    index = VectorStoreIndex.from_documents(DOCS, storage_context=StorageContext.from_defaults(vector_store=store))
    for k in (1, 2):
        assert len(index.as_retriever(similarity_top_k=k).retrieve("cats")) == k
    assert len(index.as_retriever(similarity_top_k=3).retrieve("cats")) == 2  # two hold "cats": never padded
    nodes = index.as_retriever(similarity_top_k=3).retrieve("cats purr content")
    cut = SimilarityPostprocessor(similarity_cutoff=0.5).postprocess_nodes(nodes)
    assert [n.node.node_id for n in cut] == [n.node.node_id for n in nodes if n.score >= 0.5]
    assert cut and len(cut) < len(nodes)


def test_ingestion_pipeline_and_delete_ref_doc(db):
    store = RagdbVectorStore(db)
    pipeline = IngestionPipeline(transformations=[SentenceSplitter(chunk_size=16, chunk_overlap=0),
                                                  MockEmbedding(embed_dim=8)], vector_store=store)
    nodes = pipeline.run(documents=DOCS)
    assert len(nodes) > 3 and db.count() == len(nodes)  # split by LlamaIndex, one ragdb document per node
    index = VectorStoreIndex.from_vector_store(store)
    assert {n.node.ref_doc_id for n in index.as_retriever(similarity_top_k=10).retrieve("cats")} == \
        {"cats", "dogs"}
    index.delete_ref_doc("cats")
    assert {n.node.ref_doc_id for n in index.as_retriever(similarity_top_k=10).retrieve("cats")} == {"dogs"}
    assert db.count() == len([n for n in nodes if n.ref_doc_id != "cats"])
    got = store.get_nodes(node_ids=[n.node_id for n in nodes])
    assert {n.node_id for n in got} == {n.node_id for n in nodes if n.ref_doc_id != "cats"}
    store.clear()
    assert db.count() == 0


def test_nodes_come_back_as_added(db):
    store = RagdbVectorStore(db)
    node = TextNode(text="Herons eat fish.", id_="heron", metadata={"bird": "heron", "file_path": "/x/birds.md"},
                    excluded_llm_metadata_keys=["file_path"], start_char_idx=3, end_char_idx=19)
    assert store.add([node]) == ["heron"]
    back = store.get_nodes(node_ids=["heron"])[0]
    assert (back.node_id, back.get_content(), back.metadata, back.excluded_llm_metadata_keys,
            back.start_char_idx) == ("heron", "Herons eat fish.", node.metadata, ["file_path"], 3)
    result = store.query(VectorStoreQuery(query_str="what do herons eat", similarity_top_k=1))
    assert result.ids == ["heron"] and 0 < result.similarities[0] <= 1
    assert "/x/birds.md" not in result.nodes[0].get_content(metadata_mode=MetadataMode.LLM)
    assert asyncio.run(store.aquery(VectorStoreQuery(query_str="herons", similarity_top_k=1))).ids == ["heron"]


# ------------------------------------------------------------------------------------ filters
ROWS = [{"year": y, "topic": t} for y, t in [(2020, "a"), (2021, "b"), (2022, "a"), (2023, "c"), (2024, "b")]]
PY = {FilterOperator.EQ: operator.eq, FilterOperator.NE: operator.ne, FilterOperator.GT: operator.gt,
      FilterOperator.GTE: operator.ge, FilterOperator.LT: operator.lt, FilterOperator.LTE: operator.le,
      FilterOperator.IN: lambda a, b: a in b, FilterOperator.NIN: lambda a, b: a not in b}
SINGLE = [MetadataFilter(key="year", value=2022, operator=op) for op in
          (FilterOperator.EQ, FilterOperator.NE, FilterOperator.GT, FilterOperator.GTE, FilterOperator.LT,
           FilterOperator.LTE)] + \
         [MetadataFilter(key="topic", value=["a", "c"], operator=FilterOperator.IN),
          MetadataFilter(key="topic", value=["a", "c"], operator=FilterOperator.NIN)]


def matches(f, row):
    """LlamaIndex's reading of the filters (``build_metadata_filter_fn``, which
    ``SimpleVectorStore`` uses; it refuses nested filters, so this recursion): NOT is "none of
    them" (this reference had it as "not all", as ragdb did)."""
    if isinstance(f, MetadataFilters):
        results = [matches(x, row) for x in f.filters]
        if f.condition == FilterCondition.OR:
            return any(results)
        if f.condition == FilterCondition.NOT:
            return not any(results)
        return all(results)
    return PY[f.operator](row[f.key], f.value)


def test_the_reference_reads_flat_filters_as_llama_index_does():
    from llama_index.core.vector_stores.utils import build_metadata_filter_fn

    for filters in [c for c in CASES if not any(isinstance(x, MetadataFilters) for x in c.filters)]:
        for row in ROWS:
            assert matches(filters, row) == build_metadata_filter_fn(lambda _node, row=row: row, filters)("node")


CASES = [MetadataFilters(filters=[f]) for f in SINGLE] + [
    MetadataFilters(filters=[SINGLE[3], SINGLE[6]], condition=FilterCondition.AND),
    MetadataFilters(filters=[SINGLE[0], SINGLE[7]], condition=FilterCondition.OR),
    MetadataFilters(filters=[SINGLE[4], MetadataFilters(filters=[SINGLE[2], SINGLE[6]])],
                    condition=FilterCondition.OR),
    MetadataFilters(filters=[SINGLE[6]], condition=FilterCondition.NOT),
    MetadataFilters(filters=[SINGLE[0], SINGLE[6]], condition=FilterCondition.NOT),
    MetadataFilters(filters=[SINGLE[4], MetadataFilters(filters=[SINGLE[2], SINGLE[6]])],
                    condition=FilterCondition.NOT),
]


@pytest.mark.parametrize("filters", CASES, ids=[str(to_ragdb_filter(c)) for c in CASES])
def test_metadata_filters_select_what_the_reference_selects(db, filters):
    store = RagdbVectorStore(db)
    store.add([TextNode(text=f"shared words row {n}", id_=f"n{n}", metadata=row) for n, row in enumerate(ROWS)])
    result = store.query(VectorStoreQuery(query_str="shared words", similarity_top_k=10, filters=filters))
    assert sorted(result.ids) == [f"n{n}" for n, row in enumerate(ROWS) if matches(filters, row)]


def test_unsupported_filters_and_bad_input_are_refused(db):
    store = RagdbVectorStore(db)
    text_match = MetadataFilters(filters=[MetadataFilter(key="t", value="x", operator=FilterOperator.TEXT_MATCH)])
    with pytest.raises(InvalidInput, match="TEXT_MATCH on 't' is not supported"):
        store.query(VectorStoreQuery(query_str="x", filters=text_match))
    with pytest.raises(InvalidInput, match="query_str"):
        store.query(VectorStoreQuery(query_embedding=[0.1] * 8))
    with pytest.raises(InvalidInput, match="same source.*give each its own node id$"):
        store.add([TextNode(text="a", id_="x"), TextNode(text="b", id_="x")])
    with pytest.raises(InvalidInput, match="RagdbRetriever"):
        RagdbRetriever(db, filter={"year": {"$bad": 1}})
    assert db.count(principals=ragdb.ALL) == 0


@pytest.mark.parametrize("metadata, message", [
    ({"w": float("nan")}, "metadata 'w' is nan"), ({"w": [1.0, float("inf")]}, r"metadata 'w\[1\]' is inf"),
    ({"n": {1, 2}}, "metadata is not JSON-serialisable.*set"),
    ({"b": b"x"}, "metadata is not JSON-serialisable.*bytes"),
    ({"o": object()}, "metadata is not JSON-serialisable.*object"),
])
def test_add_refuses_metadata_ragdb_cannot_store(db, metadata, message):
    """As ``db.add`` does (InvalidInput, nothing written): LlamaIndex's JSON dump of a node stored
    NaN and infinity as null, a set as a list and bytes as text, and raised pydantic's
    PydanticSerializationError for another object."""
    store = RagdbVectorStore(db)
    with pytest.raises(InvalidInput, match=f"add: node 1 \\('bad'\\): {message}"):
        store.add([TextNode(text="fine", id_="ok"), TextNode(text="apple", id_="bad", metadata=metadata)])
    assert db.count(principals=ragdb.ALL) == 0


# ---------------------------------------------------------------------- principals, loader keys
def test_principals_bound_reads_writes_and_deletes(db):
    db.add("secret heron budget", source="hidden", acl=["hr"],
           metadata={"ref_doc_id": "budget", "_node_content": "{}"})
    store = RagdbVectorStore(db)
    assert store.query(VectorStoreQuery(query_str="heron budget", similarity_top_k=5)).ids == []
    store.delete("budget")  # not visible: nothing deleted
    assert db.count(principals=ragdb.ALL) == 1
    with pytest.raises(DocumentNotFound, match="not replacing it"):
        store.add([TextNode(text="overwrite", id_="hidden")])
    with pytest.raises(InvalidInput, match="not among its principals"):
        RagdbVectorStore(db, principals=["staff"], acl=["hr"])
    RagdbVectorStore(db, principals=["hr"]).delete("budget")
    assert db.count(principals=ragdb.ALL) == 0


def test_loader_bookkeeping_is_hidden_from_the_llm_and_the_embedder(db, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "owls.md").write_text("# Owls\n\nOwls hunt at night and sleep by day.\n", encoding="utf-8")
    add_paths(db, [folder])
    node = RagdbRetriever(db, k=1).retrieve("owls hunt")[0].node
    bookkeeping = {"path", "mtime", "content_hash", "size", "encoding", "loader"}
    assert bookkeeping & set(node.metadata)  # the loader recorded them ...
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):  # ... and neither the LLM nor the embedder sees them
        shown = node.get_content(metadata_mode=mode)
        assert "Owls hunt at night" in shown
        for key in bookkeeping & set(node.metadata):
            assert f"{key}:" not in shown
    # the store gives a document ragdb loaded itself the same way
    result = RagdbVectorStore(db).query(VectorStoreQuery(query_str="owls hunt", similarity_top_k=1))
    assert "content_hash:" not in result.nodes[0].get_content(metadata_mode=MetadataMode.LLM)


def test_with_an_embedder_the_store_searches_hybrid(db):
    store = RagdbVectorStore(db, embedder="wordllama")
    VectorStoreIndex.from_documents(DOCS, storage_context=StorageContext.from_defaults(vector_store=store))
    assert db.vector_info().vectors == 3  # ragdb embedded the nodes with its own model
    query = VectorStoreQuery(query_str="kittens napping", similarity_top_k=3)
    assert store.search_options(query).scorer == "hybrid"
    result = store.query(query)
    hits = db.search("kittens napping", k=3, scorer="hybrid", syntax="plain", embedder=store_embedder(store))
    assert result.ids == [h.source for h in hits] and result.ids  # found by meaning: no query word is in a node


def store_embedder(store):
    return store.search_options(VectorStoreQuery(query_str="x")).embedder


def test_an_empty_list_of_node_ids_deletes_nothing(db):
    """``delete_nodes(node_ids=[], filters=F)`` deleted every node F matches; LlamaIndex's
    SimpleVectorStore deletes nothing. A query's empty list still restricts nothing (what
    VectorStoreIndex's retriever passes for a store keeping the text)."""
    store = RagdbVectorStore(db)
    store.add([TextNode(text=f"shared words row {n}", id_=f"n{n}", metadata=row) for n, row in enumerate(ROWS)])
    store.delete_nodes(node_ids=[], filters=MetadataFilters(filters=[SINGLE[6]]))
    store.delete_nodes(node_ids=[])
    store.delete_nodes(node_ids=iter([]))
    for bad in ("", "n1", {"n1": 1}):  # one string is not a list of ids (an empty one restricted nothing)
        with pytest.raises(InvalidInput, match="ids must be a list of ids"):
            store.delete_nodes(node_ids=bad, filters=MetadataFilters(filters=[SINGLE[6]]))
        with pytest.raises(InvalidInput, match="ids must be a list of ids"):
            store.get_nodes(node_ids=bad)
    assert db.count() == len(ROWS)
    result = store.query(VectorStoreQuery(query_str="shared words", similarity_top_k=10, node_ids=[]))
    assert len(result.ids) == len(ROWS)


def test_an_empty_list_of_node_ids_gets_no_node(db):
    """``get_nodes(node_ids=[])`` gave every node (and with ``filters``, every node they match)
    where ``delete_nodes(node_ids=[])`` deletes none: an empty list of ids names no node."""
    store = RagdbVectorStore(db)
    store.add([TextNode(text=f"shared words row {n}", id_=f"n{n}", metadata=row) for n, row in enumerate(ROWS)])
    assert store.get_nodes(node_ids=[]) == []
    assert store.get_nodes(node_ids=iter([]), filters=MetadataFilters(filters=[SINGLE[6]])) == []
    assert [n.node_id for n in store.get_nodes(node_ids=["n1", "n4"])] == ["n1", "n4"]
    assert [n.node_id for n in store.get_nodes(node_ids=iter(["n1", "n4"]))] == ["n1", "n4"]
    assert len(store.get_nodes()) == len(ROWS)


def test_node_ids_are_ids_not_patterns(db):
    """A filter's ``source`` is a glob, and node ids went into one as they were: ``delete_nodes(
    node_ids=["d*"])`` deleted every node whose id starts with ``d``; ``get_nodes`` and ``query``
    gave them."""
    store = RagdbVectorStore(db)
    store.add([TextNode(text="shared words", id_=i) for i in ["d*", "d0", "d1", "x?", "xy", "[a]", "a"]])
    assert [n.node_id for n in store.get_nodes(node_ids=["d*", "x?", "[a]"])] == ["[a]", "d*", "x?"]
    query = VectorStoreQuery(query_str="shared words", similarity_top_k=10, node_ids=["d*", "x?"])
    assert sorted(store.query(query).ids) == ["d*", "x?"]
    store.delete_nodes(node_ids=["d*", "x?", "[a]"])
    assert sorted(d.source for d in db.documents()) == ["a", "d0", "d1", "xy"]


def test_an_embedder_other_than_the_vectors_writes_nothing(db):
    """The nodes were added (committed), then embedding them raised EmbeddingError."""
    from langchain_core.embeddings import DeterministicFakeEmbedding

    from ragdb.integrations.langchain import LangChainEmbedder

    RagdbVectorStore(db, embedder=LangChainEmbedder(DeterministicFakeEmbedding(size=8))).add(
        [TextNode(text="apple", id_="a")])
    store = RagdbVectorStore(db, embedder=LangChainEmbedder(DeterministicFakeEmbedding(size=8), name="other"))
    with pytest.raises(EmbeddingError, match="vectors were made by"):
        store.add([TextNode(text="pear", id_="b"), TextNode(text="apple again", id_="a")])
    assert [(d.source, db.get(d.id).text) for d in db.documents()] == [("a", "apple")]
    assert (db.vector_info().vectors, db.vector_info().pending) == (1, 0)


def test_a_store_deletes_only_the_versions_its_principals_may_read(tmp_path):
    """A kept older version the store's principals may not read stays, as POST
    /documents/delete leaves it (deleting by source removed every version)."""
    with ragdb.open(tmp_path / "kb.db", keep_versions=True) as db:
        db.add("v1 secret hr", source="doc1", acl=["team:hr"], chunker="none")
        db.add("v2 team a", source="doc1", acl=["team-a"], chunker="none")
        db.add("other", source="doc2", acl=["team-a"], chunker="none", metadata={"ref_doc_id": "r"})
        store = RagdbVectorStore(db, principals=["team-a"])
        store.delete_nodes(node_ids=["doc1"])
        left = db.documents("doc1", glob=False, versions="all", principals=ragdb.ALL)
        assert [db.get(d.id, principals=ragdb.ALL).text for d in left] == ["v1 secret hr"]
        store.delete("r")
        assert db.count(principals=ragdb.ALL) == 1 and db.check() == []


def _embedded_store(db):
    store = RagdbVectorStore(db, embedder="wordllama")
    nodes = [TextNode(text=d.text, id_=d.doc_id, metadata=d.metadata) for d in DOCS]
    nodes += [TextNode(text="Cats sleep most of the day. A cat purrs when it is content.", id_=f"copy{i}")
              for i in range(3)]  # three copies of the first node: what MMR is for
    store.add(nodes)
    return store


def _ids(db, query, **options):
    return [h.source for h in db.search(query, syntax="plain", collapse=False, **options)]


def test_query_modes_run_the_search_they_name(db):
    """The mode, alpha and MMR of a VectorStoreQuery were ignored: every query ran the store's
    default search. Sparse and text search run BM25, hybrid modes the hybrid search (alpha:
    the dense side's weight, as in ragdb's weighted fusion; hybrid_top_k its top k)."""
    from llama_index.core.vector_stores.types import VectorStoreQueryMode as Mode

    store = _embedded_store(db)
    embedder = store_embedder(store)
    q = "kittens napping in the park"
    for mode in (Mode.SPARSE, Mode.TEXT_SEARCH):
        result = store.query(VectorStoreQuery(query_str=q, similarity_top_k=4, mode=mode))
        assert result.ids == _ids(db, q, k=4, scorer="bm25")
    assert _ids(db, q, k=4, scorer="bm25") != _ids(db, q, k=4, scorer="hybrid", embedder=embedder)
    for mode in (Mode.DEFAULT, Mode.HYBRID, Mode.SEMANTIC_HYBRID):
        result = store.query(VectorStoreQuery(query_str=q, similarity_top_k=4, mode=mode))
        assert result.ids == _ids(db, q, k=4, scorer="hybrid", embedder=embedder)
    for alpha in (0.0, 0.9):
        result = store.query(VectorStoreQuery(query_str=q, similarity_top_k=4, mode=Mode.HYBRID, alpha=alpha))
        assert result.ids == _ids(db, q, k=4, scorer="hybrid", embedder=embedder, fusion="weighted", alpha=alpha)
    result = store.query(VectorStoreQuery(query_str=q, similarity_top_k=4, mode=Mode.HYBRID, hybrid_top_k=2))
    assert result.ids == _ids(db, q, k=2, scorer="hybrid", embedder=embedder)
    # the default mode (hybrid here, as there are vectors) keeps similarity_top_k, as without vectors
    result = store.query(VectorStoreQuery(query_str=q, similarity_top_k=4, hybrid_top_k=2))
    assert result.ids == _ids(db, q, k=4, scorer="hybrid", embedder=embedder) and len(result.ids) == 4
    # a hybrid mode without vectors is the library's error, not a quiet BM25 search
    with ragdb.open(":memory:") as bare:
        plain = RagdbVectorStore(bare)
        plain.add([TextNode(text="Cats purr.", id_="c")])
        with pytest.raises(EmbeddingError, match="no vectors"):
            plain.query(VectorStoreQuery(query_str="cats", mode=Mode.HYBRID))
        with pytest.raises(InvalidInput, match="mode 'mmr' needs an embedding model"):
            plain.query(VectorStoreQuery(query_str="cats", mode=Mode.MMR))
    for mode in (Mode.SVM, Mode.LOGISTIC_REGRESSION, Mode.LINEAR_REGRESSION):
        with pytest.raises(InvalidInput, match=f"mode '{mode.value}' is not supported"):
            store.query(VectorStoreQuery(query_str=q, mode=mode))


def test_mmr_mode_chooses_among_the_prefetched_hits_by_llama_indexs_mmr(db):
    from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings
    from llama_index.core.vector_stores.types import VectorStoreQueryMode as Mode

    from ragdb.models.embedder import embed_batched, embed_query

    store = _embedded_store(db)
    embedder = store_embedder(store)
    q = "why do cats purr"
    top = _ids(db, q, k=3, scorer="hybrid", embedder=embedder)
    assert len({db.get(source=s).text for s in top}) == 1  # the default search: the three copies
    for threshold, prefetch in ((0.1, {}), (0.5, {"mmr_prefetch_k": 5}), (1.0, {"mmr_prefetch_factor": 2.0})):
        result = store.query(VectorStoreQuery(query_str=q, similarity_top_k=3, mode=Mode.MMR, mmr_threshold=threshold),
                             **prefetch)
        fetch = prefetch.get("mmr_prefetch_k", int(3 * prefetch.get("mmr_prefetch_factor", 4.0)))
        hits = db.search(q, k=fetch, scorer="hybrid", syntax="plain", collapse=False, embedder=embedder)
        vectors = embed_batched(embedder, [h.text for h in hits]).tolist()
        _, chosen = get_top_k_mmr_embeddings(embed_query(embedder, q).tolist(), vectors, similarity_top_k=3,
                                             embedding_ids=list(range(len(hits))), mmr_threshold=threshold)
        assert result.ids == [hits[i].source for i in chosen] and len(result.ids) == 3
    diverse = store.query(VectorStoreQuery(query_str=q, similarity_top_k=3, mode=Mode.MMR, mmr_threshold=0.1))
    assert len({db.get(source=s).text for s in diverse.ids}) > 1  # not three copies of one text
    # the retriever's own keywords reach it, as vector_store_kwargs
    index = VectorStoreIndex.from_vector_store(store)
    retriever = index.as_retriever(similarity_top_k=3, vector_store_query_mode="mmr",
                                   vector_store_kwargs={"mmr_threshold": 0.1})
    assert [n.node.node_id for n in retriever.retrieve(q)] == diverse.ids
    for bad, message in (({"mmr_threshold": 2}, "mmr_threshold"), ({"mmr_prefetch_k": 0}, "mmr_prefetch_k"),
                         ({"mmr_prefetch_factor": "x"}, "mmr_prefetch_factor")):
        with pytest.raises(InvalidInput, match=message):
            store.query(VectorStoreQuery(query_str=q, mode=Mode.MMR), **bad)
    # its top k is checked as the other modes' is: None raised TypeError, 0 was blamed on
    # mmr_prefetch_k, and more than ragdb's largest k was taken
    for top_k in (None, 0, 10 ** 9, True):
        with pytest.raises(InvalidInput, match="similarity_top_k must be an integer between 1 and"):
            store.query(VectorStoreQuery(query_str=q, mode=Mode.MMR, similarity_top_k=top_k))
