"""Text analysis: turning text into index terms, the same way for documents and queries.

The default analyzer handles English and Chinese (and both mixed in one text):

* Unicode NFKC normalization, so full-width forms (``ＡＢＣ``, ``１２３``) match
  their ASCII forms, then case folding.
* Latin/Cyrillic/other word runs: split on non-word characters, English
  stopwords removed, Snowball English stemming (PyStemmer).
* CJK runs (Han ideographs, kana): character unigrams plus bigrams. Unigrams
  give recall for one-character words, bigrams give most of the precision of
  a word segmenter without a dictionary.
* Optionally (``cjk="jieba"``, extra ``ragdb[jieba]``) CJK runs are segmented
  with jieba's search mode instead.

The configuration is stored in the database (:meth:`Analyzer.config`) and a
database refuses to be opened with another one, so indexing and querying
always agree.
"""

from __future__ import annotations

import collections
import re
import sys
import unicodedata
from array import array
from collections import Counter
from typing import Any
from collections.abc import Iterator, Mapping

from .errors import InvalidInput, MissingDependency, RagdbError

# CJK ideographs (unified + extension A + compatibility + supplementary planes)
# and Japanese kana. Hangul is space-delimited, so it is treated as words.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_TERM_RE = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
# Words: two or more letters/digits (longer ones are cut at MAX_TOKEN_CHARS),
# or a single digit. Single letters carry no meaning as index terms.
_WORD_RE = re.compile(r"[^\W_]{2,64}|\d")
# For chunking: every CJK character is one token, words are tokens.
_SPAN_RE = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")
_CJK_CHAR = re.compile(rf"[{_CJK}]")

# English stopwords (the NLTK list, which bm25s and most BM25 setups use).
ENGLISH_STOPWORDS = frozenset(
    """a about above after again against ain all am an and any are aren aren't as at be
    because been before being below between both but by can couldn couldn't d did didn
    didn't do does doesn doesn't doing don don't down during each few for from further had
    hadn hadn't has hasn hasn't have haven haven't having he her here hers herself him
    himself his how i if in into is isn isn't it it's its itself just ll m ma me mightn
    mightn't more most mustn mustn't my myself needn needn't no nor not now o of off on once
    only or other our ours ourselves out over own re s same shan shan't she she's should
    should've shouldn shouldn't so some such t than that that'll the their theirs them
    themselves then there these they this those through to too under until up ve very was
    wasn wasn't we were weren weren't what when where which while who whom why will with won
    won't wouldn wouldn't y you you'd you'll you're you've your yours yourself
    yourselves""".split()
)

# Chinese stopwords: the interrogatives and question particles, the
# counterparts of the interrogatives in the English list (what, which, who,
# how...). Questions are full of them and encyclopedic or technical text
# rarely has them, so their high IDF made a document that merely contains
# "什么" outrank the one that answers "X 是什么？" (measured on CMRC 2018:
# nDCG@10 0.9904 -> 0.9928; BENCHMARKS.md). With bigram analysis these are
# the unigram and bigram terms dropped; a bigram that holds a stopword
# character but means something else (几乎, 茶几) is kept.
CHINESE_STOPWORDS = frozenset(
    "什 么 哪 谁 几 吗 呢 什么 哪些 哪个 哪里 怎么 怎样 如何 为何 多少 为什么 是什么".split()
)
STOPWORD_LISTS = {None: frozenset(), "english": ENGLISH_STOPWORDS, "chinese": CHINESE_STOPWORDS,
                  "english+chinese": ENGLISH_STOPWORDS | CHINESE_STOPWORDS}

# Upper bound on the length of one word token. A 1 MB "word" is not a word;
# cutting it keeps the vocabulary and the stemmer sane.
MAX_TOKEN_CHARS = 64  # keep in step with _WORD_RE

# ASCII text is split by bytes.translate: every byte that is not an ASCII
# letter or digit becomes a space (for ASCII, ``[^\W_]`` is exactly [A-Za-z0-9]).
_ASCII_SPLIT = bytes(c if chr(c).isascii() and chr(c).isalnum() else 0x20 for c in range(256))
# Bound of the token memo (distinct tokens); it is emptied when full.
MEMO_SIZE = 200_000


def is_cjk(text: str) -> bool:
    """True when ``text`` contains at least one CJK ideograph or kana."""
    return _CJK_CHAR.search(text) is not None


def describe_config(config: Any) -> str:
    """A stored analyzer configuration in words (see :meth:`Analyzer.describe`)."""
    if isinstance(config, Mapping) and isinstance(config.get("name"), str) and config.get("name") != "ragdb":
        name = config["name"]
        return f"{name} (a plugin analyzer{'' if _plugin_analyzer(name) is not None else ', plugin not installed'})"
    if not isinstance(config, Mapping) or config.get("name") != "ragdb":
        return f"an unknown analyzer ({config!r})"
    stem, stop, cjk = config.get("stem"), config.get("stopwords"), config.get("cjk", "bigram")
    parts = ["English stemming" if stem == "english" else "no stemming",
             f"{stop.replace('+', ' and ')} stopwords".replace("english", "English").replace("chinese", "Chinese")
             if stop else "no stopwords",
             "CJK bigrams" if cjk == "bigram" else "jieba word segmentation"]
    names = {("english", "english+chinese", "bigram"): "default", ("english", "english+chinese", "jieba"): "jieba",
             (None, None, "bigram"): "simple"}
    name = names.get((stem, stop, cjk), "custom")
    return f"{name} ({', '.join(parts)})"


class Analyzer:
    """Turns text into index terms.

    Parameters are part of the stored configuration: ``stem`` (``"english"``
    or ``None``), ``stopwords`` (``"english+chinese"``, ``"english"``,
    ``"chinese"`` or ``None``), ``cjk`` (``"bigram"`` or ``"jieba"``).
    English stopwords are dropped from words, Chinese ones from CJK terms.
    """

    def __init__(self, *, stem: str | None = "english", stopwords: str | None = "english+chinese",
                 cjk: str = "bigram") -> None:
        if stem not in (None, "english"):
            raise InvalidInput(f"analyzer stem={stem!r}: only 'english' or None are supported")
        if stopwords not in STOPWORD_LISTS:
            raise InvalidInput(f"analyzer stopwords={stopwords!r}: choose one of "
                               f"{', '.join(repr(k) for k in STOPWORD_LISTS)}")
        if cjk not in ("bigram", "jieba"):
            raise InvalidInput(f"analyzer cjk={cjk!r}: choose 'bigram' or 'jieba'")
        self.stem = stem
        self.stopwords = stopwords
        self.cjk = cjk
        self._stop = ENGLISH_STOPWORDS if stopwords in ("english", "english+chinese") else frozenset()
        self._cjk_stop = CHINESE_STOPWORDS if stopwords in ("chinese", "english+chinese") else frozenset()
        self._stemmer: Any = None
        if stem == "english":
            import Stemmer  # PyStemmer, a core dependency

            self._stemmer = Stemmer.Stemmer("english", 0)  # no cache: _memo is ours (its cache made new words ~2.5x slower)
        self._jieba: Any = None
        if cjk == "jieba":
            try:
                import jieba
            except ImportError as e:  # pragma: no cover - depends on environment
                raise MissingDependency(
                    "the jieba analyzer needs jieba: pip install 'ragdb[jieba]'"
                ) from e
            jieba.setLogLevel(60)  # jieba logs its dictionary loading otherwise
            self._jieba = jieba
        # Memo of raw word token -> its index terms (see _tokens).
        self._memo: dict[Any, str] = {}
        self._multi: dict[Any, tuple[str, ...]] = {}  # tokens that yield several terms

    # -- configuration ---------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The configuration stored in the database."""
        return {"name": "ragdb", "version": 1, "stem": self.stem,
                "stopwords": self.stopwords, "cjk": self.cjk}

    def describe(self) -> str:
        """The configuration in words: its spec name when it has one, then what it does
        (``"simple (no stemming, no stopwords, CJK bigrams)"``)."""
        return describe_config(self.config())

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Analyzer":
        """The analyzer of a stored configuration: ragdb's own (``"name": "ragdb"``), or
        one a plugin provides under the configuration's ``name`` (see :mod:`ragdb.plugins`);
        a plugin that is not installed is an :class:`InvalidInput` saying so."""
        name = config.get("name") if isinstance(config, Mapping) else None
        if name == "ragdb" and config.get("version") == 1:
            return Analyzer(stem=config.get("stem"), stopwords=config.get("stopwords"),
                            cjk=config.get("cjk", "bigram"))
        if isinstance(name, str) and name != "ragdb":
            found = _plugin_analyzer(name)
            if found is None:
                raise InvalidInput(
                    f"the analyzer {name!r} of this database comes from a plugin that is not installed (or "
                    f"failed to load: 'ragdb plugins' lists them and their problems); install the package "
                    f"that provides it to open the database (stored configuration {dict(config)!r})")
            factory = found.obj
            overridden = getattr(getattr(factory, "from_config", None), "__func__", None) is not \
                Analyzer.from_config.__func__  # type: ignore[attr-defined]
            made = _checked_plugin_analyzer(found, lambda: factory.from_config(config) if overridden else factory())
            if made.config() != dict(config):
                raise InvalidInput(f"analyzer {name!r} (plugin {found.plugin!r}) cannot rebuild the stored "
                                   f"configuration {dict(config)!r}: it gives {made.config()!r}")
            return made
        raise InvalidInput(f"unknown analyzer configuration {dict(config) if isinstance(config, Mapping) else config!r}")

    @classmethod
    def from_spec(cls, spec: "str | Analyzer | Mapping[str, Any] | None") -> "Analyzer":
        """``None``/``"default"``, ``"jieba"``, ``"simple"`` (no stemming or stopwords),
        the name of an analyzer an installed plugin provides, a config mapping, or an
        :class:`Analyzer`."""
        if spec is None or spec == "default":
            return cls()
        if isinstance(spec, Analyzer):
            return spec
        if spec == "jieba":
            return cls(cjk="jieba")
        if spec == "simple":
            return cls(stem=None, stopwords=None)
        if isinstance(spec, Mapping):
            return cls.from_config(spec)
        found = _plugin_analyzer(spec) if isinstance(spec, str) and spec.strip() else None
        if found is not None:
            factory = found.obj
            return _checked_plugin_analyzer(found, lambda: factory())
        from . import plugins

        extra = "".join(f", {p.name!r}" for p in sorted(plugins.provided("analyzer").values(), key=lambda p: p.name))
        raise InvalidInput(f"analyzer {spec!r}: use 'default', 'jieba', 'simple'{extra} or an Analyzer "
                           f"('ragdb plugins' lists the installed plugins)")

    # -- analysis --------------------------------------------------------
    # Speed matters here: analysis is most of the work of adding a document.
    # Text is split into raw word tokens first (ASCII text with one C-level
    # bytes.translate + split instead of a Unicode regex), tokens are counted,
    # and each distinct token is expanded once through a memo of
    # token -> index terms (stopwords dropped, Snowball stem applied, words
    # over MAX_TOKEN_CHARS cut). The result is the same as applying
    # ``_WORD_RE`` to the whole text: that regex never matches across a
    # non-alphanumeric character, and it is what expands a token on a miss.
    def _tokens(self, text: str) -> tuple[list[Any], list[str]]:
        """Raw word tokens (bytes for ASCII text, else str) and CJK terms, both in text order."""
        if not text.isascii():
            text = unicodedata.normalize("NFKC", text).casefold()
        if text.isascii():
            return text.lower().encode("ascii").translate(_ASCII_SPLIT).split(), []
        if _CJK_CHAR.search(text) is None:
            return _WORD_RE.findall(text), []
        words: list[Any] = []
        cjk: list[str] = []
        for run in _TERM_RE.findall(text):
            if _CJK_CHAR.match(run):
                cjk.extend(self._cjk_terms(run))
            else:
                words.extend(_WORD_RE.findall(run))
        return words, cjk

    def _word_terms(self, words: list[Any]) -> list[str]:
        """The index term of each raw token, in order ("" where a token yields none)."""
        memo = self._memo
        try:
            terms = list(map(memo.__getitem__, words))
        except KeyError:
            self._learn(words)
            terms = list(map(memo.__getitem__, words))
        multi = self._multi
        if multi and not multi.keys().isdisjoint(words):  # rare: words over MAX_TOKEN_CHARS
            terms = [t for tok, term in zip(words, terms) for t in multi.get(tok, (term,))]
        return terms

    def _learn(self, words: list[Any]) -> None:
        """Memoize the terms of the tokens of ``words`` not seen before (stemmed in one batch)."""
        memo = self._memo
        missing = set(words).difference(memo)
        if len(memo) + len(missing) > MEMO_SIZE:
            memo.clear()
            self._multi.clear()
            missing = set(words)
        stop = self._stop
        pending: list[Any] = []
        plain: list[str] = []
        for tok in missing:
            if isinstance(tok, bytes):  # an ASCII alphanumeric run: cut or dropped like _WORD_RE does
                word = tok.decode("ascii")
                if len(word) > MAX_TOKEN_CHARS:
                    found = [w for w in _WORD_RE.findall(word) if w not in stop]
                    if self._stemmer is not None:
                        found = self._stemmer.stemWords(found)
                    memo[tok] = found[0] if len(found) == 1 else ""
                    if len(found) > 1:
                        self._multi[tok] = tuple(found)
                    continue
                if len(word) == 1 and not ("0" <= word <= "9"):
                    memo[tok] = ""
                    continue
            else:  # already a _WORD_RE match
                word = tok
            if word in stop:
                memo[tok] = ""
            else:
                pending.append(tok)
                plain.append(word)
        if plain and self._stemmer is not None:
            plain = self._stemmer.stemWords(plain)
        memo.update(zip(pending, plain))

    def terms(self, text: str) -> list[str]:
        """Index terms of ``text``: word terms first, then CJK terms (with repeats).

        The order is deterministic (queries sum term scores in this order)."""
        words, cjk = self._tokens(text)
        out = [t for t in self._word_terms(words) if t] if words else []
        if cjk:
            out.extend(cjk)
        return out

    def term_counts(self, text: str) -> dict[str, int]:
        """Term frequencies of ``text`` (the terms of :meth:`terms`, counted, in order of
        first appearance)."""
        words, cjk = self._tokens(text)
        counts = Counter(self._word_terms(words)) if words else Counter()
        counts.pop("", None)
        if cjk:
            counts.update(cjk)  # CJK terms never equal word terms: they follow them
        return dict(counts)

    def _cjk_terms(self, run: str) -> list[str]:
        if self._jieba is not None:
            terms = [w for w in self._jieba.cut_for_search(run) if w.strip()]
        elif len(run) == 1:
            terms = [run]
        else:
            terms = list(run)
            terms.extend(run[i:i + 2] for i in range(len(run) - 1))
        stop = self._cjk_stop
        if stop:
            terms = [t for t in terms if t not in stop]
        return terms


def _plugin_analyzer(name: str) -> Any:
    from . import plugins

    return plugins.lookup("analyzer", name)


def _checked_plugin_analyzer(found: Any, make: Any) -> Analyzer:
    """Build a plugin's analyzer; it must be an :class:`Analyzer` whose stored
    configuration carries the plugin's name for it (how the database finds it again)."""
    try:
        made = make()
    except RagdbError:
        raise
    except Exception as e:  # a plugin's bug: one clear error naming it
        raise InvalidInput(f"analyzer {found.name!r} (plugin {found.plugin!r}) failed to start: "
                           f"{type(e).__name__}: {e}") from e
    if not isinstance(made, Analyzer):
        raise InvalidInput(f"analyzer {found.name!r} (plugin {found.plugin!r}) is a {type(made).__name__}, "
                           f"not a ragdb.analysis.Analyzer subclass")
    config = made.config()
    if not isinstance(config, Mapping) or config.get("name") != found.name:
        raise InvalidInput(f"analyzer {found.name!r} (plugin {found.plugin!r}): its config() must have "
                           f"'name': {found.name!r} (the name the database stores), got {config!r}")
    return made


# Whitespace and the invisible format characters text editors and converters
# leave behind (zero-width space/joiners, direction marks, word joiner, BOM).
_BLANK_RE = re.compile(r"[\s\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]*")


def is_blank(text: str) -> bool:
    """True when ``text`` has nothing to read: only whitespace and invisible format
    characters. Such a document would be stored but could never be found."""
    return _BLANK_RE.fullmatch(text) is not None


def token_spans(text: str) -> Iterator[tuple[int, int]]:
    """Character spans of the chunking tokens of ``text``: words, and every CJK
    character on its own. Computed on the original text so spans index it."""
    for m in _SPAN_RE.finditer(text):
        yield m.start(), m.end()


# -- analysis in worker processes (bulk loads) ------------------------------
# Analysis is pure Python and holds the GIL, so threads cannot overlap it with
# the SQLite writes of a bulk load; worker processes can. Workers are forked
# (fast to start, no re-import); where fork is unavailable bulk loads analyze
# in-process. Not multiprocessing.Pool: its task and result threads in the
# writing process wait for the GIL while that process is busy, which left a
# worker idle most of the time. Here the writing process sends and receives on
# a pipe itself, and each worker has a reading and a sending thread, so
# neither side ever waits on the other's pipe buffer.


def _pack(analyzer: Analyzer, texts: list[str]) -> list[tuple[str, bytes]]:
    """Term counts of each text, packed for the trip back: the terms joined by NUL
    (never part of a term) and the counts as uint32s. Unpickling a dict of a
    hundred terms per text cost the writing process more than the analysis it saved."""
    out = []
    for t in texts:
        counts = analyzer.term_counts(t)
        out.append(("\0".join(counts), array("I", counts.values()).tobytes()))
    return out


class PackedCounts:
    """Term counts as a worker sends them: the terms (in order of first appearance)
    and their counts. Iterates like the dict :meth:`Analyzer.term_counts` returns
    (terms, ``values()``), which is all the writer needs, without building one."""

    __slots__ = ("terms", "counts")

    def __init__(self, terms: list[str], counts: array) -> None:
        self.terms, self.counts = terms, counts

    def __iter__(self) -> Iterator[str]:
        return iter(self.terms)

    def __len__(self) -> int:
        return len(self.terms)

    def values(self) -> array:
        return self.counts

    def items(self) -> Iterator[tuple[str, int]]:
        return zip(self.terms, self.counts)


def _unpack_counts(packed: list[tuple[str, bytes]]) -> list[PackedCounts]:
    out = []
    for joined, raw in packed:
        counts = array("I")
        counts.frombytes(raw)
        out.append(PackedCounts(joined.split("\0") if raw else [], counts))
    return out


def _worker_main(conn: Any, config: dict[str, Any]) -> None:
    """A worker: texts in, packed term counts out (or ("error", message)), in order."""
    import queue
    import threading

    analyzer = Analyzer.from_config(config)
    # Analysis holds the GIL; let the reading and sending threads in promptly
    # (the default 5 ms switch interval left the writer blocked on a full pipe).
    sys.setswitchinterval(0.0005)
    tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def receive() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = None
            tasks.put(msg)
            if msg is None:
                return

    def send() -> None:
        while (msg := results.get()) is not None:
            try:
                conn.send(msg)
            except (BrokenPipeError, OSError):
                return

    threading.Thread(target=receive, daemon=True).start()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    while (texts := tasks.get()) is not None:
        try:
            results.put(("ok", _pack(analyzer, texts)))
        except Exception as e:  # reported to the writing process, which raises it
            results.put(("error", f"{type(e).__name__}: {e}"))
    results.put(None)
    sender.join()


class AnalysisPool:
    """Worker processes running :meth:`Analyzer.term_counts` with one configuration."""

    def __init__(self, analyzer: Analyzer, workers: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.workers = workers
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._waiting: list[collections.deque[_Job]] = []  # per worker, in send order
        self._jobs: collections.deque[_Job] = collections.deque()
        self._next = 0
        try:
            for _ in range(workers):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, args=(child, analyzer.config()), daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
                self._waiting.append(collections.deque())
        except BaseException:
            self.close(wait=False)
            raise

    @staticmethod
    def available() -> bool:
        import multiprocessing

        return "fork" in multiprocessing.get_all_start_methods()

    def submit(self, texts: list[str]) -> _Job:
        """Start analyzing ``texts``; ``.get()`` on the result gives their term counts in order."""
        w = self._next
        self._next = (w + 1) % self.workers
        job = _Job(self, w)
        self._conns[w].send(texts)
        self._waiting[w].append(job)
        self._jobs.append(job)
        return job

    def _receive(self, w: int, block: bool) -> None:
        """Hand worker ``w``'s finished results to its oldest waiting jobs."""
        conn, waiting = self._conns[w], self._waiting[w]
        while waiting and (block or conn.poll()):
            try:
                status, value = conn.recv()
            except EOFError:
                raise RagdbError("an analysis worker process ended unexpectedly") from None
            job = waiting.popleft()
            job.done, job.value = True, value
            if status != "ok":
                raise RagdbError(f"text analysis failed in a worker process: {value}")
            if block:
                return

    def backlog(self) -> int:
        """Submitted parts not finished yet."""
        for w in range(self.workers):
            self._receive(w, block=False)
        jobs = self._jobs
        while jobs and jobs[0].done:
            jobs.popleft()
        return len(jobs)

    def close(self, *, wait: bool = True) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=5 if wait else 0.2)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self._conns:
            conn.close()


class _Job:
    def __init__(self, pool: AnalysisPool, worker: int) -> None:
        self.pool, self.worker = pool, worker
        self.done = False
        self.value: Any = None

    def get(self) -> list[PackedCounts]:
        while not self.done:
            self.pool._receive(self.worker, block=True)
        return _unpack_counts(self.value)
