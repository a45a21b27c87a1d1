"""LangChain's own standard test suites (``langchain-tests``) run against ragdb's
vector store and retriever, unchanged: what every LangChain integration is held to.

The vector store suite embeds with ragdb's built-in offline model (wordllama, through
:class:`RagdbEmbeddings`) rather than the suite's ``DeterministicFakeEmbedding``: the
fake's random vectors give "foo" and "bar" a cosine of -0.35, and ragdb never returns a
hit without a positive cosine or a query word (it does not pad ``k`` with unrelated
documents), so the suite's "search 'bar' with k=2 returns both documents" would fail on
a difference of semantics, not of correctness. The fake is used in
``test_langchain_store.py`` where that does not matter.
"""

from __future__ import annotations

import pytest

import ragdb

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")

from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_tests.integration_tests import RetrieversIntegrationTests, VectorStoreIntegrationTests  # noqa: E402

from ragdb.integrations.langchain import RagdbEmbeddings, RagdbRetriever, RagdbVectorStore  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class TestRagdbVectorStoreStandard(VectorStoreIntegrationTests):
    @staticmethod
    def get_embeddings() -> Embeddings:
        return RagdbEmbeddings("wordllama")

    @pytest.fixture
    def vectorstore(self, tmp_path):
        db = ragdb.open(tmp_path / "store.db")
        try:
            yield RagdbVectorStore(db, self.get_embeddings())
        finally:
            db.close()


class TestRagdbVectorStoreStandardPostgres(VectorStoreIntegrationTests):
    """The same suite on ragdb's PostgreSQL backend."""

    @staticmethod
    def get_embeddings() -> Embeddings:
        return RagdbEmbeddings("wordllama")

    @pytest.fixture
    def vectorstore(self, pg_url):
        db = ragdb.open(pg_url)
        try:
            yield RagdbVectorStore(db, self.get_embeddings())
        finally:
            db.close()


TEXTS = [
    "Cats sleep most of the day and purr when content.",
    "A cat grooms its fur after eating.",
    "Dogs chase cats in the park.",
    "Kittens are young cats that play a lot.",
    "Black holes bend light.",
]


class TestRagdbRetrieverStandard(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def database(self, tmp_path):
        with ragdb.open(tmp_path / "kb.db") as db:
            for n, text in enumerate(TEXTS):
                db.add(text, source=f"doc{n}.md")
            self.db = db
            yield db

    @property
    def retriever_constructor(self) -> type[RagdbRetriever]:
        return RagdbRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"db": self.db}

    @property
    def retriever_query_example(self) -> str:
        return "cats"
