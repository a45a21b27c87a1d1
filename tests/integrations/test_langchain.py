"""ragdb.integrations.langchain against the real langchain-core (the ``langchain`` extra):
a real LCEL chain with LangChain's fake chat model retrieves through ragdb, and what
it gets is what ``db.search`` returns; principals fail closed; the loader and
``add_documents`` fill a database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.errors import InvalidInput
from ragdb.options import SearchOptions

pytest.importorskip("langchain_core")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.language_models import FakeListChatModel, FakeListLLM  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate  # noqa: E402
from langchain_core.runnables import RunnablePassthrough  # noqa: E402

from ragdb.integrations.langchain import RagdbLoader, RagdbRetriever, add_documents  # noqa: E402

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


@pytest.fixture
def kb(tmp_path):
    db = ragdb.open(tmp_path / "kb.db", chunker="window:size=6,overlap=2")  # several chunks per document
    for source, text, metadata, acl, version in DOCS:
        db.add(text, source=source, metadata=metadata, acl=acl, version=version)
    yield db
    db.close()


def expected(db, query, **options):
    """What a LangChain retriever with these options should return: db.search's hits, as documents."""
    return [(f"chunk:{h.chunk_id}", h.text, h.score, h.source) for h in db.search(query, **options)]


def got(documents):
    return [(d.id, d.page_content, d.metadata["score"], d.metadata["source"]) for d in documents]


class PromptRecorder(BaseCallbackHandler):
    """Records the messages each chat model call received (LangChain's callback API)."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def on_chat_model_start(self, serialized, messages, **kwargs):
        self.prompts.extend(m.content for batch in messages for m in batch)

    def on_llm_start(self, serialized, prompts, **kwargs):
        self.prompts.extend(prompts)


def format_docs(docs):
    return "\n\n".join(f"[{d.metadata['source']}] {d.page_content}" for d in docs)


def test_a_chain_with_a_fake_chat_model_retrieves_through_ragdb(kb):
    retriever = RagdbRetriever(kb, k=3)
    prompt = ChatPromptTemplate.from_template("Answer from the context.\n{context}\nQuestion: {question}")
    llm = FakeListChatModel(responses=["Cats sleep a lot."])
    chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
             | prompt | llm | StrOutputParser())
    recorder = PromptRecorder()
    answer = chain.invoke("how do cats sleep", config={"callbacks": [recorder]})
    assert answer == "Cats sleep a lot."
    hits = kb.search("how do cats sleep", k=3)
    assert len(hits) == 3
    context = "\n\n".join(f"[{h.source}] {h.text}" for h in hits)
    assert recorder.prompts == [f"Answer from the context.\n{context}\nQuestion: how do cats sleep"]


def test_a_chain_keeps_the_documents_beside_the_answer(kb):
    """The usual 'answer with sources' shape: the retrieved documents travel with the answer."""
    retriever = RagdbRetriever(kb, k=4, scorer="tfidf")
    prompt = PromptTemplate.from_template("{context}\n\nQ: {question}\nA:")
    answer_chain = (RunnablePassthrough.assign(context=lambda x: format_docs(x["docs"]))
                    | prompt | FakeListLLM(responses=["dogs"]) | StrOutputParser())
    chain = {"docs": retriever, "question": RunnablePassthrough()} | RunnablePassthrough.assign(answer=answer_chain)
    out = chain.invoke("dogs chase cats")
    assert out["answer"] == "dogs"
    assert got(out["docs"]) == expected(kb, "dogs chase cats", k=4, scorer="tfidf")


@pytest.mark.parametrize("query, options", [
    ("cats", {}),
    ("cats dogs park", {"k": 2}),
    ("quantum particles light", {"k": 5, "scorer": "tfidf"}),
    ("cats", {"k": 10, "filter": {"topic": "pets"}}),
    ("cats office", {"k": 3, "principals": ["staff"]}),
    ("cats", {"k": 10, "principals": ragdb.ALL}),
])
def test_documents_are_db_search_in_order_with_scores_and_metadata(kb, query, options):
    retriever = RagdbRetriever(kb, **options)
    docs = retriever.invoke(query)
    search_options = {"k": 4, **options}
    hits = kb.search(query, **search_options)
    assert hits, "the case must retrieve something"
    assert got(docs) == expected(kb, query, **search_options)
    for doc, hit in zip(docs, hits):
        meta = doc.metadata
        assert meta == {**hit.metadata, "source": hit.source, "version": hit.version, "timestamp": hit.timestamp,
                        "start": hit.start, "end": hit.end, "ordinal": hit.ordinal, "score": hit.score,
                        "confidence": hit.confidence, "doc_id": hit.doc_id, "chunk_id": hit.chunk_id}
        assert meta["confidence"] is not None
        whole = kb.get(meta["doc_id"], principals=ragdb.ALL).text
        assert whole[meta["start"]:meta["end"]] == doc.page_content  # the span is the chunk's place in its text
    assert [d.metadata["score"] for d in docs] == sorted((d.metadata["score"] for d in docs), reverse=True)


def test_document_metadata_and_ragdb_fields(kb):
    doc = RagdbRetriever(kb, k=1, filter={"topic": "science"}).invoke("quantum")[0]
    assert doc.metadata["source"] == "guide/physics.md"
    assert doc.metadata["version"] == "2"
    assert doc.metadata["lang"] == "en" and doc.metadata["topic"] == "science"
    assert doc.id == f"chunk:{doc.metadata['chunk_id']}"


def test_ragdb_fields_win_over_document_metadata_of_the_same_name(db):
    db.add("zebra stripes", source="z.md", metadata={"score": "mine", "source": "elsewhere", "keep": 1})
    meta = RagdbRetriever(db).invoke("zebra")[0].metadata
    assert meta["source"] == "z.md" and isinstance(meta["score"], float) and meta["keep"] == 1


def test_other_search_options_come_through_options(kb):
    base = SearchOptions(min_score=0.0, k=7)
    retriever = RagdbRetriever(kb, options=base, filter={"lang": "en"})
    assert retriever.search_options.k == 7  # options' k, no k given
    assert got(retriever.invoke("cats")) == expected(kb, "cats", k=7, min_score=0.0, filter={"lang": "en"})
    strict = RagdbRetriever(kb, options=SearchOptions(min_score=1e9))
    assert strict.invoke("cats") == []
    assert RagdbRetriever(kb, k=2, options=base).search_options.k == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k must be an integer"),
    ({"k": "3"}, "k must be an integer"),
    ({"scorer": "bm42"}, "scorer 'bm42' is unknown"),
    ({"filter": ["lang"]}, "filter must be a mapping"),
    ({"principals": "hr"}, "principals must be a list"),
    ({"principals": [ragdb.PUBLIC]}, "is the public label"),
    ({"options": {"k": 3}}, "options must be a ragdb.options.SearchOptions"),
    ({"options": SearchOptions(restrictions=ragdb.Restrictions(principals=["hr"]))}, "must not hold principals"),
    ({"scorer": "tfidf", "options": SearchOptions(k1=1.0)}, "k1 applies to"),
])
def test_bad_options_are_refused_when_the_retriever_is_made(kb, kwargs, message):
    with pytest.raises(InvalidInput, match=message):
        RagdbRetriever(kb, **kwargs)


def test_db_must_be_a_database():
    with pytest.raises(InvalidInput, match="db must be a ragdb.Database"):
        RagdbRetriever("kb.db")
    with pytest.raises(InvalidInput, match="db must be a ragdb.Database"):
        RagdbLoader("kb.db")


# ------------------------------------------------------------------------------- principals fail closed
def test_a_labelled_document_never_reaches_a_retriever_without_its_principal(kb):
    query = "secret zebra budget salary"  # only hr/salaries.md has these words
    assert {h.source for h in kb.search(query, principals=ragdb.ALL)} == {"hr/salaries.md"}
    for principals in (None, (), ["staff"], ["HR"], ["hr2"]):
        retriever = RagdbRetriever(kb, k=10, principals=principals)
        assert retriever.invoke(query) == []
        assert asyncio.run(retriever.ainvoke(query)) == []
        assert all(d.metadata["source"] != "hr/salaries.md" for d in retriever.invoke("cats"))
        # query-time arguments never widen the retriever's principals: asking is an error
        with pytest.raises(InvalidInput, match="principals are fixed"):
            retriever.invoke(query, principals=ragdb.ALL)
        with pytest.raises(InvalidInput, match="principals are fixed"):
            retriever.invoke(query, restrictions=ragdb.Restrictions(principals=ragdb.ALL))
        assert retriever.invoke(query, config={"configurable": {"principals": ragdb.ALL}}) == []
    for principals in (["hr"], ["hr", "staff"], ragdb.ALL):
        docs = RagdbRetriever(kb, k=10, principals=principals).invoke(query)
        assert {d.metadata["source"] for d in docs} == {"hr/salaries.md"}


def test_the_principals_are_fixed_on_the_retriever(kb):
    retriever = RagdbRetriever(kb)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError: the model is frozen
        retriever.principals = ragdb.ALL
    assert retriever.principals == ()
    assert retriever.search_options.restrictions.principals == ()
    assert retriever.invoke("secret zebra budget") == []


LABELS = ["a", "b", ragdb.PUBLIC]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(labels=st.lists(st.lists(st.sampled_from(LABELS), max_size=2, unique=True), min_size=1, max_size=6),
       principals=st.one_of(st.none(), st.just(ragdb.ALL), st.lists(st.sampled_from(["a", "b", "c"]), max_size=2)))
def test_the_retriever_returns_only_what_its_principals_may_see(labels, principals):
    with ragdb.open(":memory:") as db:
        for n, acl in enumerate(labels):
            db.add(f"shared words document {n}", source=f"d{n}.md", acl=acl)
        docs = RagdbRetriever(db, k=10, principals=principals).invoke("shared words")
        held = set(principals or ()) if principals is not ragdb.ALL else None
        allowed = {f"d{n}.md" for n, acl in enumerate(labels)
                   if held is None or not acl or ragdb.PUBLIC in acl or held & set(acl)}
        assert {d.metadata["source"] for d in docs} == allowed


# ------------------------------------------------------------------------------------------------ async
def test_async_retrieval_equals_sync(kb):
    retriever = RagdbRetriever(kb, k=5, principals=["staff"])
    queries = ["cats", "dogs park", "quantum light", "office fridays", "nothing matches xyzzy"]

    async def main():
        one = await retriever.ainvoke(queries[0])
        many = await retriever.abatch(queries)
        concurrent = await asyncio.gather(*(retriever.ainvoke(q) for q in queries))
        return one, many, concurrent

    one, many, concurrent = asyncio.run(main())
    sync = [retriever.invoke(q) for q in queries]
    assert one == sync[0]
    assert many == sync and concurrent == sync
    assert retriever.batch(queries) == sync
    assert sync[0] and sync[-1] == []


# ------------------------------------------------------------------------------------ loader, add paths
def test_the_loader_yields_the_documents_the_caller_may_see(kb):
    anonymous = RagdbLoader(kb).load()
    assert [d.metadata["source"] for d in anonymous] == sorted(s for s, *_ in DOCS if s != "hr/salaries.md")
    everything = RagdbLoader(kb, principals=ragdb.ALL).load()
    assert [d.metadata["source"] for d in everything] == sorted(s for s, *_ in DOCS)
    by_source = {d.metadata["source"]: d for d in everything}
    for source, text, metadata, acl, version in DOCS:
        doc = by_source[source]
        stored = kb.get(source=source, principals=ragdb.ALL)
        assert doc.page_content == text
        assert doc.id == f"doc:{stored.id}"
        expected_meta = {**metadata, "source": source, "version": version, "timestamp": stored.timestamp,
                         "doc_id": stored.id}
        if acl:
            expected_meta["acl"] = sorted(acl)
        assert doc.metadata == expected_meta
    assert [d.metadata["source"] for d in RagdbLoader(kb, "guide/*", filter={"topic": "pets"}).load()] == \
        ["guide/cats.md", "guide/dogs.md"]
    assert [d.metadata["source"] for d in asyncio.run(RagdbLoader(kb, "notes/*").aload())] == ["notes/public.md"]


def test_loader_then_add_documents_copies_a_database(kb, tmp_path):
    with ragdb.open(tmp_path / "copy.db", chunker="window:size=6,overlap=2") as copy:
        report = add_documents(copy, RagdbLoader(kb, principals=ragdb.ALL).lazy_load())
        assert len(report.added) == len(DOCS)

        def records(db):
            return sorted((r["source"], r["text"], r["metadata"], r["acl"], r["version"], r["timestamp"])
                          for r in db.records(principals=ragdb.ALL))

        assert records(copy) == records(kb)  # labels and timestamps included: nothing labelled became public
        for query in ("cats", "secret zebra budget", "dogs park"):
            for principals in (None, ["hr"], ragdb.ALL):
                original = RagdbRetriever(kb, k=10, principals=principals).invoke(query)
                copied = RagdbRetriever(copy, k=10, principals=principals).invoke(query)
                strip = ("doc_id", "chunk_id")
                assert [(d.page_content, {k: v for k, v in d.metadata.items() if k not in strip}) for d in copied] \
                    == [(d.page_content, {k: v for k, v in d.metadata.items() if k not in strip}) for d in original]
        again = add_documents(copy, RagdbLoader(kb, principals=ragdb.ALL).load())
        assert len(again.unchanged) == len(DOCS)  # adding the same documents again changes nothing


def test_add_documents_maps_page_content_and_metadata(db, tmp_path):
    docs = [
        Document(page_content="Alpha text about owls.", metadata={"source": "a.md", "page": 3, "version": 7}),
        Document(page_content="Beta text about owls.", metadata={"source": tmp_path / "b.txt"}),
        Document(page_content="Gamma text about owls.", id="gamma-id"),
        Document(page_content="Delta text about owls.", metadata={"timestamp": "2024-05-01T00:00:00Z"}),
        Document(page_content="Epsilon text about owls.", metadata={"source": "e.md", "acl": ["hr"]}),
    ]
    report = add_documents(db, docs)
    assert len(report.added) == 5
    a = db.get(source="a.md")
    assert a.metadata == {"page": 3} and a.version == "7" and a.text == "Alpha text about owls."
    assert db.get(source=os.fspath(tmp_path / "b.txt")).text == "Beta text about owls."
    assert db.get(source="gamma-id").text == "Gamma text about owls."
    delta = report[3]
    assert delta.source.startswith("sha256:") and delta.timestamp.startswith("2024-05-01")
    assert db.get(source="e.md", principals=["hr"]).acl == ("hr",)
    assert {d.metadata["source"] for d in RagdbRetriever(db, k=10).invoke("owls")} == \
        {"a.md", os.fspath(tmp_path / "b.txt"), "gamma-id", delta.source}  # e.md is labelled hr


def test_add_documents_acl_labels_every_document(db):
    add_documents(db, [Document(page_content="owls at night", metadata={"source": "o.md", "acl": [ragdb.PUBLIC]}),
                       Document(page_content="owls by day", metadata={"source": "p.md"})], acl=["staff"])
    assert [d.acl for d in db.documents(principals=ragdb.ALL)] == [("staff",), ("staff",)]
    assert RagdbRetriever(db).invoke("owls") == []


def test_retrieved_documents_added_back_drop_the_retrieval_fields(kb, db):
    docs = RagdbRetriever(kb, k=1).invoke("quantum")
    add_documents(db, docs)
    stored = db.get(source="guide/physics.md")
    assert stored.metadata == {"lang": "en", "topic": "science"} and stored.version == "2"
    assert stored.text == docs[0].page_content


def test_add_documents_refuses_pieces_of_one_source_and_writes_nothing(db):
    pieces = [Document(page_content="first half", metadata={"source": "s.md"}),
              Document(page_content="other text", metadata={"source": "t.md"}),
              Document(page_content="second half", metadata={"source": "s.md"})]
    with pytest.raises(InvalidInput, match=r"documents 0 and 2 have the same source 's.md'"):
        add_documents(db, pieces)
    assert db.count(principals=ragdb.ALL) == 0


@pytest.mark.parametrize("documents, message", [
    (["just a string"], "document 0 must be a langchain_core Document, got str"),
    ([Document(page_content="x", metadata={"source": 5})], r"document 0: metadata\['source'\] must be"),
    ([Document(page_content="   ")], "text is empty"),
    ([Document(page_content="ok", metadata={"source": "a", "acl": "hr"})], "acl must be a list"),
])
def test_add_documents_refuses_bad_documents(db, documents, message):
    with pytest.raises(InvalidInput, match=message):
        add_documents(db, documents)
    assert db.count(principals=ragdb.ALL) == 0


# -------------------------------------------------------------------------------------- optional extra
def run_python(code):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_import_ragdb_does_not_import_langchain_and_a_missing_extra_is_named():
    p = run_python(
        "import sys, ragdb, ragdb.integrations\n"
        "assert not any(m.startswith('langchain') for m in sys.modules), 'langchain imported'\n"
        "sys.modules['langchain_core'] = None  # as if not installed\n"
        "from ragdb.errors import MissingDependency\n"
        "try:\n    import ragdb.integrations.langchain\n"
        "except MissingDependency as e:\n    print('MISSING', e)\n")
    assert p.returncode == 0, p.stderr
    assert "MISSING langchain-core is not installed; install it with: pip install 'ragdb[langchain]'" in p.stdout


def test_a_copy_with_other_fields_searches_with_them(kb):
    retriever = RagdbRetriever(kb, k=1)
    wider = retriever.model_copy(update={"k": 3})
    assert len(retriever.invoke("cats")) == 1 and got(wider.invoke("cats")) == expected(kb, "cats", k=3)
    with pytest.raises(InvalidInput, match="k must be an integer"):
        retriever.model_copy(update={"k": 0}).invoke("cats")


def test_the_loader_skips_a_document_deleted_while_it_loads(kb):
    docs = RagdbLoader(kb, "guide/*").lazy_load()
    first = next(docs)  # the listing is made here
    assert first.metadata["source"] == "guide/cats.md"
    kb.delete(source="guide/dogs.md")
    assert [d.metadata["source"] for d in docs] == ["guide/physics.md"]


def test_a_question_is_read_as_plain_words_unless_asked(tmp_path):
    """Issue 30, item 1: "-fPIC" or "-snake" in a question is a word, not an exclusion."""
    with ragdb.open(tmp_path / "q.db") as db:
        db.add("A python is a snake that squeezes.", source="snake.md")
        assert [d.metadata["source"] for d in RagdbRetriever(db).invoke("python -snake")] == ["snake.md"]
        asked = RagdbRetriever(db, options=SearchOptions(syntax="query"))
        assert asked.invoke("python -snake") == []
