"""ragdb.integrations.langchain's vector store and the retriever's per-call options,
against the real langchain-core: scores in [0, 1], hybrid with vectors and BM25
without, LangChain's ``index()`` API with its ``InMemoryRecordManager``, principals
bounding reads and writes. (LangChain's standard suites: test_langchain_standard.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import ragdb
from ragdb.errors import DocumentNotFound, EmbeddingError, InvalidInput

pytest.importorskip("langchain_core")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402
from langchain_core.indexing import InMemoryRecordManager, index  # noqa: E402

from ragdb.integrations.langchain import (  # noqa: E402
    LangChainEmbedder,
    RagdbEmbeddings,
    RagdbRetriever,
    RagdbVectorStore,
)

DOCS = [
    Document(page_content="Cats sleep most of the day and purr when content.", id="cats",
             metadata={"topic": "pets", "year": 2023, "source": "notes/cats.md"}),
    Document(page_content="Dogs chase cats in the park.", id="dogs", metadata={"topic": "pets", "year": 2024}),
    Document(page_content="Black holes bend light; quantum physics describes particles.", id="physics",
             metadata={"topic": "science", "year": 2024}),
]


@pytest.fixture
def store(tmp_path):
    with ragdb.open(tmp_path / "store.db") as db:
        s = RagdbVectorStore(db, RagdbEmbeddings("wordllama"))
        s.add_documents(DOCS)
        yield s


def test_documents_come_back_as_added_with_their_ids_and_metadata(store):
    assert store.get_by_ids(["physics", "missing", "cats"]) == [DOCS[2], DOCS[0]]
    found = store.similarity_search("do cats sleep", k=1)
    assert found == [DOCS[0]]  # metadata as given: its own "source" key included, nothing of ragdb's added
    stored = store.db.get(source="cats")
    assert stored.chunk_count == 1 and stored.metadata == DOCS[0].metadata


def test_scores_are_ragdb_confidence_in_0_1(store):
    scored = store.similarity_search_with_score("cats sleep purr", k=3)
    hits = store.search_hits("cats sleep purr", k=3)
    assert store.search_options().scorer == "hybrid"  # vectors exist: hybrid search
    assert [d.id for d, _ in scored] == [h.source for h in hits]
    assert [s for _, s in scored] == [h.confidence for h in hits]
    assert all(0.0 <= s <= 1.0 for _, s in scored)
    assert scored[0][0].id == "cats" and scored[0][1] > 0.3
    assert store.similarity_search_with_relevance_scores("cats sleep purr", k=3) == scored
    # a threshold on it, through LangChain's own retriever
    retriever = store.as_retriever(search_type="similarity_score_threshold",
                                   search_kwargs={"k": 3, "score_threshold": 0.3})
    assert [d.id for d in retriever.invoke("cats sleep purr")] == [d.id for d, s in scored if s >= 0.3]


def test_without_vectors_the_store_is_lexical(tmp_path):
    with ragdb.open(tmp_path / "plain.db") as db:
        store = RagdbVectorStore(db)
        assert store.embeddings is None
        store.add_documents(DOCS)
        assert db.vector_info().vectors == 0
        assert store.search_options().scorer == "bm25"
        scored = store.similarity_search_with_score("quantum light", k=4)
        assert [(d.id, s) for d, s in scored] == [(h.source, h.confidence) for h in db.search("quantum light", k=4)]
        assert [d.id for d, _ in scored] == ["physics"]  # BM25 returns what matches, never padding


def test_a_question_is_read_as_plain_words(store):
    # "-day" is a word of the question, not an exclusion (issue 30: a flag is a word)
    assert [d.id for d in store.similarity_search("-day cats", k=1)] == ["cats"]


def test_as_retriever_search_kwargs_and_filters(store):
    retriever = store.as_retriever(search_kwargs={"k": 2, "filter": {"year": {"$gte": 2024}}})
    docs = retriever.invoke("cats")
    assert docs and {d.id for d in docs} <= {"dogs", "physics"}
    assert [d.id for d in store.similarity_search("bend light", k=3, filter={"topic": "science"})] == ["physics"]
    assert [d.id for d in store.similarity_search("cats", k=3, filter={"source": "dogs"})] == ["dogs"]
    with pytest.raises(InvalidInput, match="unknown operator"):
        store.similarity_search("cats", filter={"year": {"$bad": 1}})
    with pytest.raises(InvalidInput, match="principals are fixed"):
        store.similarity_search("cats", principals=ragdb.ALL)


def test_a_bad_filter_fails_when_the_store_retriever_is_made(store):
    with pytest.raises(InvalidInput, match="as_retriever: filter 'year': unknown operator"):
        store.as_retriever(search_kwargs={"filter": {"year": {"$bad": 1}}})


def test_max_marginal_relevance_picks_diverse_documents(tmp_path):
    with ragdb.open(tmp_path / "mmr.db") as db:
        store = RagdbVectorStore(db, RagdbEmbeddings("wordllama"))
        store.add_texts(["cats sleep all day", "cats sleep all day long", "dogs chase cats in the park"],
                        ids=["a", "a2", "b"])
        plain = [d.id for d in store.similarity_search("cats sleep", k=2)]
        diverse = [d.id for d in store.max_marginal_relevance_search("cats sleep", k=2, fetch_k=3, lambda_mult=0.1)]
        assert plain == ["a", "a2"] and diverse[0] == "a" and diverse[1] == "b"
        mmr = store.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 3, "lambda_mult": 0.1})
        assert [d.id for d in mmr.invoke("cats sleep")] == diverse
    with ragdb.open(":memory:") as db, pytest.raises(InvalidInput, match="needs an embedding model"):
        RagdbVectorStore(db).max_marginal_relevance_search("x")


def test_async_variants_equal_sync(store):
    async def main():
        return (await store.asimilarity_search("cats", k=2),
                await store.asimilarity_search_with_relevance_scores("cats", k=2),
                await store.aget_by_ids(["dogs"]))

    found, scored, got = asyncio.run(main())
    assert found == store.similarity_search("cats", k=2)
    assert scored == store.similarity_search_with_relevance_scores("cats", k=2)
    assert got == [DOCS[1]]


def test_langchain_index_api_with_a_record_manager(tmp_path):
    """LangChain's index(): unchanged documents skipped, changed ones replaced, a source's
    removed documents cleaned up, all through the store's add_documents and delete."""
    with ragdb.open(tmp_path / "indexed.db") as db:
        store = RagdbVectorStore(db, DeterministicFakeEmbedding(size=8))
        manager = InMemoryRecordManager(namespace="ragdb/test")
        manager.create_schema()
        docs = [Document(page_content=f"page {n} about owls", metadata={"source": "owls.md", "page": n})
                for n in range(3)]
        first = index(docs, manager, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
        assert first == {"num_added": 3, "num_updated": 0, "num_skipped": 0, "num_deleted": 0}
        assert db.count() == 3
        again = index(docs, manager, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
        assert again == {"num_added": 0, "num_updated": 0, "num_skipped": 3, "num_deleted": 0}
        changed = [docs[0], Document(page_content="page 1 about owls, rewritten", metadata=docs[1].metadata)]
        third = index(changed, manager, store, cleanup="incremental", source_id_key="source", key_encoder="sha256")
        assert third == {"num_added": 1, "num_updated": 0, "num_skipped": 1, "num_deleted": 2}
        assert sorted(d.page_content for d in store.similarity_search("owls", k=10)) == \
            ["page 0 about owls", "page 1 about owls, rewritten"]
        assert db.count() == 2 and db.vector_info().model == "langchain:DeterministicFakeEmbedding"
        full = index([], manager, store, cleanup="full", key_encoder="sha256")
        assert full["num_deleted"] == 2 and db.count() == 0


def test_from_texts_opens_a_database_and_closes_it(tmp_path):
    path = tmp_path / "fresh.db"
    store = RagdbVectorStore.from_texts(["alpha owls", "beta bats"], DeterministicFakeEmbedding(size=8),
                                       metadatas=[{"n": 1}, {"n": 2}], ids=["a", "b"], path=str(path))
    try:
        assert store.get_by_ids(["b"]) == [Document(page_content="beta bats", metadata={"n": 2}, id="b")]
        assert store.similarity_search("owls", k=1)[0].id == "a"
    finally:
        store.close()
    with ragdb.open(path) as db:
        assert db.count() == 2
    with ragdb.open(tmp_path / "mine.db") as db:
        RagdbVectorStore.from_texts(["gamma"], db=db)
        assert db.count() == 1
        with pytest.raises(InvalidInput, match="apply only without db="):
            RagdbVectorStore.from_texts(["gamma"], db=db, chunker="none")


def test_principals_bound_what_the_store_reads_writes_and_deletes(tmp_path):
    with ragdb.open(tmp_path / "acl.db") as db:
        db.add("salary bands are secret", source="hr-doc", acl=["hr"])
        public = RagdbVectorStore(db)
        assert public.get_by_ids(["hr-doc"]) == [] and public.similarity_search("salary secret") == []
        public.delete(["hr-doc"])  # not visible: skipped, as a missing id is
        assert db.count(principals=ragdb.ALL) == 1
        with pytest.raises(DocumentNotFound, match="not replacing it"):
            public.add_documents([Document(page_content="overwritten", id="hr-doc")])
        assert db.get(source="hr-doc", principals=ragdb.ALL).text == "salary bands are secret"
        with pytest.raises(InvalidInput, match="not among its principals"):
            RagdbVectorStore(db, principals=["staff"], acl=["hr"])
        hr = RagdbVectorStore(db, principals=["hr"], acl=["hr"])
        hr.add_documents([Document(page_content="bonus pool is secret too", id="hr-2")])
        assert db.get(source="hr-2", principals=["hr"]).acl == ("hr",)
        assert {d.id for d in hr.similarity_search("secret", k=5)} == {"hr-doc", "hr-2"}
        hr.delete(["hr-doc"])
        assert db.count(principals=ragdb.ALL) == 1


@pytest.mark.parametrize("call, message", [
    (lambda s: s.add_documents([Document(page_content="a", id="x"), Document(page_content="b", id="x")]),
     r"have the same source 'x'.*give each its own id$"),  # (it said metadata['source'], which the store ignores)
    (lambda s: s.add_texts(["a", "b"], ids=["only-one"]), "1 ids for 2 documents"),
    (lambda s: s.add_texts(["a"], metadatas=[{"bad": object()}]), "not JSON-serialisable"),
    (lambda s: s.delete(), "give the ids"),
    (lambda s: s.get_by_ids([3]), "ids must be non-empty strings"),
    # ragdb's errors, not pydantic's from making a Document; falsy metadata was read as {}
    (lambda s: s.add_texts([5], ids=["x"]), "text 0 must be a string, got int"),
    (lambda s: s.add_texts(["a", None]), "text 1 must be a string, got NoneType"),
    (lambda s: s.add_texts(["a"], ["m"]), "metadata 0 must be a mapping, got str"),
    (lambda s: s.add_texts(["a", "b"], [{}, []]), "metadata 1 must be a mapping, got list"),
    (lambda s: s.add_texts("abc"), "texts must be a list of texts, not str"),  # (it added 'a', 'b' and 'c')
])
def test_bad_input_is_refused_and_writes_nothing(tmp_path, call, message):
    with ragdb.open(tmp_path / "bad.db") as db:
        store = RagdbVectorStore(db, DeterministicFakeEmbedding(size=8))
        with pytest.raises(InvalidInput, match=message):
            call(store)
        assert db.count(principals=ragdb.ALL) == 0


def test_langchain_embeddings_as_a_ragdb_embedder():
    fake = DeterministicFakeEmbedding(size=6)
    emb = LangChainEmbedder(fake)
    assert emb.name == "langchain:DeterministicFakeEmbedding" and emb.dimensions == 6
    rows = emb.embed(["foo", "  ", "bar"])
    assert rows.shape == (3, 6) and not rows[1].any()
    assert abs(float((rows[0] ** 2).sum()) - 1.0) < 1e-5
    with ragdb.open(":memory:", embedder=emb) as db:
        db.add("foo", source="f")
        assert db.search("foo", scorer="vector", k=1)[0].source == "f"


# ------------------------------------------------------------------------- retriever per call
@pytest.fixture
def kb(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        for n, (text, lang) in enumerate([("cats sleep", "en"), ("cats purr", "en"), ("Katzen schlafen cats", "de")]):
            db.add(text, source=f"d{n}", metadata={"lang": lang})
        yield db


def test_invoke_k_and_filter_per_call(kb):
    retriever = RagdbRetriever(kb, k=3)
    assert len(retriever.invoke("cats")) == 3
    assert len(retriever.invoke("cats", k=1)) == 1
    assert [d.metadata["source"] for d in retriever.invoke("cats", filter={"lang": "de"})] == ["d2"]
    assert len(asyncio.run(retriever.ainvoke("cats", k=2))) == 2
    # a call's filter narrows the retriever's own: both hold
    english = RagdbRetriever(kb, k=3, filter={"lang": "en"})
    assert english.invoke("cats", filter={"lang": "de"}) == []
    with pytest.raises(InvalidInput, match="unknown search option"):
        retriever.invoke("cats", top_k=1)


def test_a_bad_filter_fails_when_the_retriever_is_made(kb):
    for bad in ({"year": {"$bad": 1}}, {"lang": {"$in": "en"}}, {"$or": "x"}):
        with pytest.raises(InvalidInput, match="RagdbRetriever"):
            RagdbRetriever(kb, filter=bad)
    with pytest.raises(InvalidInput, match="RagdbRetriever"):
        RagdbRetriever(kb, k=1).invoke("cats", filter={"year": {"$bad": 1}})


def test_delete_and_get_by_ids_refuse_one_string_for_a_list_of_ids(tmp_path):
    """``delete("abc")`` deleted the ids ``a``, ``b`` and ``c`` (a string is iterable)."""
    with ragdb.open(tmp_path / "kb.db") as db:
        store = RagdbVectorStore(db)
        store.add_texts(["a", "b", "c", "whole"], ids=["a", "b", "c", "abc"])
        for call in (lambda: store.delete("abc"), lambda: store.get_by_ids("abc"),
                     lambda: store.add_texts(["x", "y", "z"], ids="abc")):
            with pytest.raises(InvalidInput, match="ids must be a list of ids"):
                call()
        assert db.count() == 4
        store.delete(["abc"])
        assert sorted(d.source for d in db.documents()) == ["a", "b", "c"]


def test_delete_leaves_the_versions_the_stores_principals_may_not_read(tmp_path):
    """As POST /documents/delete: a kept older version the store's principals cannot read stays."""
    with ragdb.open(tmp_path / "kb.db", keep_versions=True) as db:
        db.add("v1 secret hr", source="doc1", acl=["team:hr"], chunker="none")
        db.add("v2 team a", source="doc1", acl=["team-a"], chunker="none")
        RagdbVectorStore(db, principals=["team-a"]).delete(["doc1"])
        left = db.documents("doc1", glob=False, versions="all", principals=ragdb.ALL)
        assert [db.get(d.id, principals=ragdb.ALL).text for d in left] == ["v1 secret hr"]
        RagdbVectorStore(db, principals=ragdb.ALL).delete(["doc1"])  # the full view: every version
        assert db.count(principals=ragdb.ALL) == 0 and db.check() == []


def test_a_none_in_ids_takes_that_documents_own_id(tmp_path):
    """As the class says (``ids=``, else ``Document.id``, else a new UUID), per document: a None
    in ``ids`` gave a document with an id of its own a new UUID, so adding it again made a copy
    beside the stored one instead of replacing it."""
    with ragdb.open(tmp_path / "kb.db") as db:
        store = RagdbVectorStore(db)
        store.add_documents([Document(page_content="first owls", id="owls")])
        got = store.add_documents([Document(page_content="second owls", id="owls"),
                                   Document(page_content="bats", id="ignored")], ids=[None, "bats"])
        assert got == ["owls", "bats"]
        assert sorted(d.source for d in db.documents()) == ["bats", "owls"]
        assert store.get_by_ids(["owls"])[0].page_content == "second owls"
        new = store.add_documents([Document(page_content="no id at all")], ids=[None])
        assert len(new) == 1 and len(new[0]) == 36 and db.count() == 3  # a new UUID


def test_an_embedding_model_other_than_the_vectors_writes_nothing(tmp_path):
    """The documents were added (committed), then embedding them raised EmbeddingError: a
    failed call had written, and its documents stayed without vectors."""
    with ragdb.open(tmp_path / "kb.db") as db:
        RagdbVectorStore(db, DeterministicFakeEmbedding(size=8)).add_texts(["apple"], ids=["a"])
        for other in (LangChainEmbedder(DeterministicFakeEmbedding(size=8), name="other"),
                      DeterministicFakeEmbedding(size=4)):
            store = RagdbVectorStore(db, other)
            with pytest.raises(EmbeddingError, match="vectors were made by"):
                store.add_texts(["pear"], ids=["b"])
            with pytest.raises(EmbeddingError, match="vectors were made by"):
                store.add_documents([Document(page_content="apple again", id="a")])
            with pytest.raises(EmbeddingError, match="vectors were made by"):
                RagdbVectorStore.from_texts(["plum"], other, db=db)
        assert [(d.source, db.get(d.id).text) for d in db.documents()] == [("a", "apple")]
        assert (db.vector_info().vectors, db.vector_info().pending) == (1, 0)


@pytest.mark.parametrize("bad", [[1 + 2j, 0.0, 1.0], [1e300, 0.0, 1.0], ["one", 0.0, 1.0]])
def test_langchain_embeddings_of_other_numbers_are_an_embedding_error_with_nothing_printed(bad, recwarn):
    """A LangChain Embeddings returning complex values, values past float32 or text: an
    EmbeddingError naming the embedder (numpy's cast dropped the imaginary parts, or made inf,
    printing a warning on stderr), for documents and for a query."""
    from langchain_core.embeddings import Embeddings

    class Odd(Embeddings):
        def embed_documents(self, texts):
            return [list(bad) for _ in texts]

        def embed_query(self, text):
            return list(bad)

    emb = LangChainEmbedder(Odd(), name="odd")
    if bad[0] == 1e300:  # inf in float32: the callers refuse it (not finite)
        emb.embed(["a text"])
        emb.embed_query("a query")
    else:
        with pytest.raises(EmbeddingError, match="odd"):
            emb.embed(["a text"])
        with pytest.raises(EmbeddingError, match="odd"):
            emb.embed_query("a query")
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning | np.exceptions.ComplexWarning)]
