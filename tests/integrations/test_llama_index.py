"""ragdb.integrations.llama_index against the real llama-index-core (the ``llama-index``
extra): a real RetrieverQueryEngine with LlamaIndex's MockLLM retrieves through ragdb,
and what it gets is what ``db.search`` returns; principals fail closed; documents and
nodes go into a database. No network: the LLM and embedding model are LlamaIndex's mocks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ragdb
from ragdb.errors import InvalidInput
from ragdb.options import SearchOptions

pytest.importorskip("llama_index.core")

from llama_index.core import Settings  # noqa: E402
from llama_index.core.embeddings import MockEmbedding  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.query_engine import RetrieverQueryEngine  # noqa: E402
from llama_index.core.schema import Document, MetadataMode, NodeRelationship, NodeWithScore, TextNode  # noqa: E402

from ragdb.integrations.llama_index import RagdbRetriever, add_documents, add_nodes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

#: (source, text, metadata, acl, version)
DOCS = (
    ("guide/cats.md", "Cats sleep most of the day. A cat purrs when it is content. Cats groom their fur.",
     {"lang": "en", "topic": "pets"}, None, "v1"),
    ("guide/dogs.md", "Dogs chase cats in the park. A dog wags its tail when it is happy.",
     {"lang": "en", "topic": "pets", "rank": 2}, None, None),
    ("guide/physics.md", "Black holes bend light. Quantum physics describes particles.",
     {"lang": "en", "topic": "science"}, None, "2"),
    ("hr/salaries.md", "Salary bands for cat sitters are confidential. The secret zebra budget.",
     {"lang": "en", "topic": "hr"}, ["hr"], None),
    ("notes/public.md", "Cats and dogs are welcome in the office on Fridays.",
     {"lang": "en", "topic": "office"}, [ragdb.PUBLIC, "staff"], None),
)


@pytest.fixture(autouse=True, scope="module")
def offline_settings():
    """Whatever LlamaIndex resolves from its global Settings is a local mock, never OpenAI."""
    Settings.llm = MockLLM()
    Settings.embed_model = MockEmbedding(embed_dim=8)


@pytest.fixture
def kb(tmp_path):
    db = ragdb.open(tmp_path / "kb.db", chunker="window:size=6,overlap=2")  # several chunks per document
    for source, text, metadata, acl, version in DOCS:
        db.add(text, source=source, metadata=metadata, acl=acl, version=version)
    yield db
    db.close()


def expected(db, query, **options):
    return [(f"chunk:{h.chunk_id}", h.text, h.score, h.confidence, h.source) for h in db.search(query, **options)]


def got(nodes):
    # a node's score is ragdb's confidence (what a postprocessor thresholds); the raw score is in its metadata
    return [(n.node.node_id, n.node.get_content(), n.node.metadata["score"], n.score, n.node.metadata["source"])
            for n in nodes]


def test_a_query_engine_with_the_mock_llm_retrieves_through_ragdb(kb):
    retriever = RagdbRetriever(kb, k=3)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query("how do cats sleep")
    hits = kb.search("how do cats sleep", k=3)
    assert len(hits) == 3
    assert got(response.source_nodes) == expected(kb, "how do cats sleep", k=3)
    # MockLLM answers with its prompt: the context it was given is ragdb's chunks, best first
    text = response.response
    assert "Query: how do cats sleep" in text
    positions = [text.index(h.text) for h in hits]
    assert positions == sorted(positions)
    assert f"source: {hits[0].source}" in text
    assert "score:" not in text and "chunk_id:" not in text  # retrieval numbers are not shown to the LLM


def test_the_async_query_engine_gets_the_same_nodes(kb):
    engine = RetrieverQueryEngine.from_args(RagdbRetriever(kb, k=4, scorer="tfidf"), llm=MockLLM())
    response = asyncio.run(engine.aquery("dogs chase cats"))
    assert got(response.source_nodes) == expected(kb, "dogs chase cats", k=4, scorer="tfidf")


@pytest.mark.parametrize("query, options", [
    ("cats", {}),
    ("cats dogs park", {"k": 2}),
    ("quantum particles light", {"k": 5, "scorer": "tfidf"}),
    ("cats", {"k": 10, "filter": {"topic": "pets"}}),
    ("cats office", {"k": 3, "principals": ["staff"]}),
    ("cats", {"k": 10, "principals": ragdb.ALL}),
])
def test_nodes_are_db_search_in_order_with_scores_and_metadata(kb, query, options):
    nodes = RagdbRetriever(kb, **options).retrieve(query)
    search_options = {"k": 4, **options}
    hits = kb.search(query, **search_options)
    assert hits, "the case must retrieve something"
    assert got(nodes) == expected(kb, query, **search_options)
    for item, hit in zip(nodes, hits):
        assert isinstance(item, NodeWithScore) and isinstance(item.node, TextNode)
        node = item.node
        assert node.metadata == {**hit.metadata, "source": hit.source, "version": hit.version,
                                 "timestamp": hit.timestamp, "start": hit.start, "end": hit.end,
                                 "ordinal": hit.ordinal, "score": hit.score, "confidence": hit.confidence,
                                 "doc_id": hit.doc_id, "chunk_id": hit.chunk_id}
        assert (node.start_char_idx, node.end_char_idx) == (hit.start, hit.end)
        assert node.ref_doc_id == f"doc:{hit.doc_id}"
        assert node.relationships[NodeRelationship.SOURCE].metadata == {"source": hit.source}
        whole = kb.get(hit.doc_id, principals=ragdb.ALL).text
        assert whole[node.start_char_idx:node.end_char_idx] == node.text
        llm_view = node.get_content(metadata_mode=MetadataMode.LLM)
        assert f"source: {hit.source}" in llm_view and "confidence:" not in llm_view
    raw = [n.node.metadata["score"] for n in nodes]
    assert raw == sorted(raw, reverse=True)


def test_other_search_options_come_through_options(kb):
    retriever = RagdbRetriever(kb, options=SearchOptions(k=7, min_score=0.0), filter={"lang": "en"})
    assert retriever.search_options.k == 7
    assert got(retriever.retrieve("cats")) == expected(kb, "cats", k=7, min_score=0.0, filter={"lang": "en"})
    assert RagdbRetriever(kb, options=SearchOptions(min_score=1e9)).retrieve("cats") == []


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k must be an integer"),
    ({"scorer": "bm42"}, "scorer 'bm42' is unknown"),
    ({"principals": "hr"}, "principals must be a list"),
    ({"options": SearchOptions(restrictions=ragdb.Restrictions(principals=["hr"]))}, "must not hold principals"),
])
def test_bad_options_are_refused_when_the_retriever_is_made(kb, kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        RagdbRetriever(kb, **kwargs)
    with pytest.raises(InvalidInput, match="db must be a ragdb.Database"):
        RagdbRetriever(None)


def test_a_labelled_document_never_reaches_a_retriever_without_its_principal(kb):
    query = "secret zebra budget salary"
    assert {h.source for h in kb.search(query, principals=ragdb.ALL)} == {"hr/salaries.md"}
    for principals in (None, (), ["staff"], ["HR"]):
        retriever = RagdbRetriever(kb, k=10, principals=principals)
        assert retriever.retrieve(query) == []
        assert asyncio.run(retriever.aretrieve(query)) == []
        engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
        response = engine.query(query)
        assert response.source_nodes == [] and "zebra budget" not in str(response)
        assert all(n.node.metadata["source"] != "hr/salaries.md" for n in retriever.retrieve("cats"))
    for principals in (["hr"], ragdb.ALL):
        nodes = RagdbRetriever(kb, k=10, principals=principals).retrieve(query)
        assert {n.node.metadata["source"] for n in nodes} == {"hr/salaries.md"}


def test_async_retrieval_equals_sync(kb):
    retriever = RagdbRetriever(kb, k=5, principals=["staff"])
    queries = ["cats", "dogs park", "quantum light", "office fridays", "nothing matches xyzzy"]

    async def main():
        return await asyncio.gather(*(retriever.aretrieve(q) for q in queries))

    concurrent = asyncio.run(main())
    sync = [retriever.retrieve(q) for q in queries]
    assert [got(n) for n in concurrent] == [got(n) for n in sync]
    assert [[n.node.metadata for n in ns] for ns in concurrent] == [[n.node.metadata for n in ns] for ns in sync]
    assert sync[0] and sync[-1] == []


# ---------------------------------------------------------------------------------------------- add paths
def test_add_documents_round_trips_through_the_retriever(db, tmp_path):
    docs = [
        Document(text="Owls hunt at night in the forest.", metadata={"source": "owls.md", "lang": "en"}),
        Document(text="Owls sleep by day in hollow trees.", metadata={"file_path": os.fspath(tmp_path / "b.txt"),
                                                                      "file_name": "b.txt"}),
        Document(text="Owls are birds of prey.", doc_id="owl-doc", metadata={"version": "3"}),
        Document(text="Owls of the HR department.", metadata={"source": "hr.md", "acl": ["hr"]}),
    ]
    report = add_documents(db, docs)
    assert len(report.added) == 4
    assert db.get(source="owls.md").metadata == {"lang": "en"}
    assert db.get(source=os.fspath(tmp_path / "b.txt")).metadata == {"file_path": os.fspath(tmp_path / "b.txt"),
                                                                     "file_name": "b.txt"}
    owl = db.get(source="owl-doc")
    assert owl.version == "3" and owl.text == "Owls are birds of prey."
    assert db.get(source="hr.md", principals=["hr"]).acl == ("hr",)
    nodes = RagdbRetriever(db, k=10).retrieve("owls")
    assert {n.node.metadata["source"] for n in nodes} == {"owls.md", os.fspath(tmp_path / "b.txt"), "owl-doc"}
    assert {n.node.text for n in nodes} == {d.text for d in docs[:3]}  # one chunk each: the whole text
    assert len(add_documents(db, docs).unchanged) == 4


def test_add_nodes_one_document_per_node(db):
    nodes = [TextNode(text="Herons wade in shallow water.", id_="heron-1", metadata={"file_path": "birds.txt"}),
             TextNode(text="Herons nest in colonies.", id_="heron-2", metadata={"file_path": "birds.txt"}),
             NodeWithScore(node=TextNode(text="Herons eat fish.", metadata={"source": "fish.md"}), score=0.5)]
    report = add_nodes(db, nodes, chunker="none")
    assert [d.source for d in report] == ["heron-1", "heron-2", "fish.md"]  # file_path is shared: not a source
    assert db.get(source="heron-1").metadata == {"file_path": "birds.txt"}
    got_nodes = RagdbRetriever(db, k=10).retrieve("herons")
    assert sorted(n.node.text for n in got_nodes) == sorted(n.get_content() for n in nodes)


def test_retrieved_nodes_added_back_keep_text_and_metadata(kb, db):
    nodes = RagdbRetriever(kb, k=1).retrieve("quantum")
    add_nodes(db, nodes)
    stored = db.get(source="guide/physics.md")
    assert stored.metadata == {"lang": "en", "topic": "science"} and stored.version == "2"
    assert stored.text == nodes[0].node.text


def test_add_nodes_acl_labels_every_node(db):
    add_nodes(db, [TextNode(text="storks fly south", id_="s1", metadata={"acl": [ragdb.PUBLIC]})], acl=["staff"])
    assert db.get(source="s1", principals=ragdb.ALL).acl == ("staff",)
    assert RagdbRetriever(db).retrieve("storks") == []
    assert len(RagdbRetriever(db, principals=["staff"]).retrieve("storks")) == 1


def test_adding_pieces_of_one_source_is_refused_and_writes_nothing(db):
    with pytest.raises(InvalidInput, match=r"nodes 0 and 1 have the same source 'same.md'"):
        add_nodes(db, [TextNode(text="first", metadata={"source": "same.md"}),
                       TextNode(text="second", metadata={"source": "same.md"})])
    with pytest.raises(InvalidInput, match=r"nodes 0 and 1 have the same source 'f.txt'"):
        add_documents(db, [Document(text="one", metadata={"file_path": "f.txt"}),
                           Document(text="two", metadata={"file_path": "f.txt"})])
    with pytest.raises(InvalidInput, match="node 1 must be a llama_index Document or node, got str"):
        add_documents(db, [Document(text="one"), "two"])
    with pytest.raises(InvalidInput, match="text is empty"):
        add_nodes(db, [TextNode(text="  ")])
    assert db.count(principals=ragdb.ALL) == 0


# -------------------------------------------------------------------------------------- optional extra
def test_import_ragdb_does_not_import_llama_index_and_a_missing_extra_is_named():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = ("import sys, ragdb, ragdb.integrations\n"
            "assert not any(m.startswith('llama_index') for m in sys.modules), 'llama_index imported'\n"
            "sys.modules['llama_index'] = None  # as if not installed\n"
            "from ragdb.errors import MissingDependency\n"
            "try:\n    import ragdb.integrations.llama_index\n"
            "except MissingDependency as e:\n    print('MISSING', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert "MISSING llama-index-core is not installed; install it with: pip install 'ragdb[llama-index]'" in p.stdout


def test_a_question_is_read_as_plain_words_unless_asked(tmp_path):
    """Issue 30, item 1: "-snake" in a question is a word, not an exclusion."""
    with ragdb.open(tmp_path / "q.db") as db:
        db.add("A python is a snake that squeezes.", source="snake.md")
        assert [n.node.metadata["source"] for n in RagdbRetriever(db).retrieve("python -snake")] == ["snake.md"]
        assert RagdbRetriever(db, options=SearchOptions(syntax="query")).retrieve("python -snake") == []
