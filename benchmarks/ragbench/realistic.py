"""A realistic corpus of N chunks: SciFact + CMRC 2018 as they are, among generated documents.

The scale section's corpus (issue 17). Exact replicas give every term ``N / 5,183``
identical copies and a vocabulary that never grows; this one keeps the term
statistics of real text as it grows:

* **The originals, unchanged.** Every SciFact document (5,183, English) and every
  CMRC 2018 trial paragraph (256, Chinese) is in the corpus with its own id, at a
  seeded random position, so the judged queries of both (SciFact train, CMRC trial)
  keep their qrels and quality (nDCG@10) is measured at every size.
* **Generated documents** fill the rest, in the base corpora's proportion of
  languages (4.7% Chinese). Each is written from two sources, in runs (a run is a
  stretch of consecutive tokens, whitespace-separated words for English and
  characters for Chinese, its length geometric with mean :attr:`Params.run_en` /
  :attr:`Params.run_zh`):

  - with probability :attr:`Params.p_topic` a run of its *seed* document (one base
    document of its language, drawn uniformly, the same for the whole document)
    from a random position: the generated document is about the seed's topic, its
    words repeat within it (burstiness) and co-occur with the seed's other words,
    so it competes on a query's rare terms with the document the query was
    judged on, and with the seed's ~``N / 5,439`` other offspring;
  - otherwise a run from a random position anywhere in the base corpus of its
    language: the empirical unigram distribution (and local bigrams) of real text,
    so every word's collection frequency, document frequency included, grows with
    ``N`` as in more text of the same kind.

  Its length is a base document's length (drawn uniformly) times a log-normal
  jitter, so lengths follow the base corpora's distribution; its first words (as
  many as its seed's title has) are a title line.
* **New words (Heaps' law).** A corpus drawn from SciFact's words alone stops
  growing its vocabulary at SciFact's 29k terms, while real text keeps finding new
  ones (Heaps' law ``V ∝ T^β``; SciFact's own β is 0.53-0.55 over its prefixes).
  So each generated English word is, with probability :attr:`Params.new_word`,
  replaced by a new word drawn from a power-law tail: rank ``j`` has probability
  ``∝ (R0 + j)^-s`` (:attr:`Params.tail_s`, ``R0`` = :attr:`Params.tail_r0`), the
  steep second regime of real rank-frequency curves (SciFact's own slope between
  ranks 5,000 and 15,000 is -1.66), each rank spelled as a pronounceable
  pseudo-word of consonant-vowel syllables (``bakoru``) that no analyzer stems
  into another. In Chinese text the runs' junctions make new character bigrams,
  the vocabulary growth of the analyzers' bigram terms.

Everything is drawn from ``numpy.random.Generator(PCG64)`` seeded with
``(SEED, language, block)``: the k-th generated document of a language is the same
at every size (10k, 100k and 1M share their generated prefix), and one numpy
version always writes the same bytes (the cache records their SHA-256). The
parameters were chosen so that the measured statistics match SciFact's where
both exist; benchmarks/README.md gives the measurements.

Generation is numpy-vectorised per block of documents; the result is cached
under ``benchmarks/.cache/corpora/`` keyed by the generator version, its
parameters, the seed, the size and a hash of the base data.

Run alone: ``python benchmarks/ragbench/realistic.py --n 100000 [--stats]``.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import numpy as np

GENERATOR_VERSION = 1  # bump when the same parameters would write other bytes
SEED = 17  # issue 17
BLOCK = 5_000  # generated documents per RNG block (~130 MiB of numpy temporaries)

# The base corpora: folder, BEIR split, language.
BASES = (("scifact", "train", "en"), ("cmrc2018-trial", None, "zh"))


@dataclass(frozen=True)
class Params:
    """The generator's parameters (see the module docstring)."""

    p_topic: float = 0.4  # share of runs taken from the document's seed
    run_en: float = 4.0  # mean run length, words
    run_zh: float = 6.0  # mean run length, characters
    length_sigma: float = 0.2  # log-normal jitter of a document's length
    length_scale_en: float = 0.88  # the cache model's repeats are content words: fewer words give the same terms
    p_self: float = 0.25  # share of English words that repeat an earlier content word of their document
    new_word: float = 0.02  # share of generated English words replaced by a tail word
    tail_s: float = 1.65  # exponent of the tail's rank-frequency law
    tail_r0: float = 5000.0  # the tail's rank offset (its first word's probability ~ new_word * (s-1) / r0)


PARAMS = Params()

# Pseudo-words: consonant-vowel syllables, vowels a/o/u only (no final e or y for a
# stemmer to strip, no "-iti"/"-li" endings), at least three syllables.
_CONS = "bdfgklmnprstvz"
_VOWELS = "aou"
_SYL = [c + v for c in _CONS for v in _VOWELS]


def pseudo_word(rank: int) -> str:
    """The tail word of ``rank`` (≥ 0): distinct ranks give distinct words."""
    j = rank + len(_SYL) ** 2  # three syllables or more
    out = []
    base = len(_SYL)
    while j:
        j, r = divmod(j, base)
        out.append(_SYL[r])
    return "".join(out)


# ---------------------------------------------------------------- the base model

_FUNCTION_WORDS = frozenset(
    """about above after again against also among been before being below between both could does doing
    down during each either from further have having here into itself more most much only other ours over
    same shall should since some such than that their theirs them then there these they this those through
    under until upon very were what when where which while whom whose will with within without would your
    however thus therefore although whereas""".split())


def _is_content(token: str) -> bool:
    word = "".join(ch for ch in token.lower() if ch.isalpha())
    return len(word) >= 4 and word not in _FUNCTION_WORDS



@dataclass
class BaseDoc:
    doc_id: str
    text: str  # title + "\n\n" + text, as the benchmark indexes it


class LangModel:
    """One language's base corpus as a token stream: the tokens of every document
    back to back, each document's span and its title's length in tokens."""

    def __init__(self, lang: str, docs: list[tuple[str, str, str]]) -> None:
        import numpy as np

        self.lang = lang
        vocab: dict[str, int] = {}
        stream: list[int] = []
        starts, lens, title_lens = [], [], []
        for _doc_id, title, text in docs:
            if lang == "zh":
                t_toks, b_toks = list(title), list(text)
            else:
                t_toks, b_toks = title.split(), text.split()
            toks = t_toks + b_toks
            starts.append(len(stream))
            lens.append(len(toks))
            title_lens.append(len(t_toks))
            stream.extend(vocab.setdefault(t, len(vocab)) for t in toks)
        self.words = np.array(list(vocab), dtype=object)
        self.stream = np.array(stream, dtype=np.int64)
        self.starts = np.array(starts, dtype=np.int64)
        self.lens = np.array(lens, dtype=np.int64)
        self.title_lens = np.array(title_lens, dtype=np.int64)
        self.sep = "" if lang == "zh" else " "
        # content words (for the cache model): four letters or more, not a function word
        self.content = np.array([_is_content(w) for w in vocab], dtype=bool)


def load_bases(data: Path) -> tuple[list[BaseDoc], dict[str, LangModel], str]:
    """The base documents (both languages, in file order), each language's model and a
    SHA-256 of the base files."""
    h = hashlib.sha256()
    originals: list[BaseDoc] = []
    models: dict[str, LangModel] = {}
    for folder, _split, lang in BASES:
        path = data / folder / "corpus.jsonl"
        raw = path.read_bytes()
        h.update(raw)
        rows = []
        for line in raw.splitlines():
            if not line.strip():
                continue
            d = orjson.loads(line)
            title, text = d.get("title") or "", d.get("text") or ""
            rows.append((str(d["_id"]), title, text))
            originals.append(BaseDoc(str(d["_id"]), f"{title}\n\n{text}" if title else text))
        models[lang] = LangModel(lang, rows)
    return originals, models, h.hexdigest()


# ---------------------------------------------------------------- generation


def _rng(lang: str, block: int, seed: int) -> np.random.Generator:
    import numpy as np

    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 1 if lang == "zh" else 0, block])))


class TailWords:
    """Spellings of tail ranks, memoised."""

    def __init__(self) -> None:
        self.cache: dict[int, str] = {}

    def get(self, rank: int) -> str:
        w = self.cache.get(rank)
        if w is None:
            w = self.cache[rank] = pseudo_word(rank)
        return w


def generate_block(model: LangModel, params: Params, block: int, n_docs: int, seed: int,
                   tail: TailWords) -> list[str]:
    """The texts of ``n_docs`` generated documents: block ``block`` of ``model``'s language."""
    import numpy as np

    rng = _rng(model.lang, block, seed)
    n_base = len(model.lens)
    seeds = rng.integers(0, n_base, n_docs)
    jitter = np.exp(rng.normal(0.0, params.length_sigma, n_docs))
    if model.lang == "en":
        jitter *= params.length_scale_en
    lens = np.maximum(5, np.rint(model.lens[rng.integers(0, n_base, n_docs)] * jitter)).astype(np.int64)
    total = int(lens.sum())
    doc_of = np.repeat(np.arange(n_docs), lens)
    run_mean = params.run_zh if model.lang == "zh" else params.run_en
    # runs (segments) laid over the block's token stream back to back
    n_seg = int(total / run_mean * 1.1) + 64
    seg_len = rng.geometric(1.0 / run_mean, n_seg)
    while int(seg_len.sum()) < total:
        seg_len = np.concatenate([seg_len, rng.geometric(1.0 / run_mean, n_seg // 4 + 64)])
    seg_topic = rng.random(len(seg_len)) < params.p_topic
    seg_frac = rng.random(len(seg_len))
    seg_of = np.repeat(np.arange(len(seg_len)), seg_len)[:total]
    seg_start = np.cumsum(seg_len) - seg_len
    pos = np.arange(total) - seg_start[seg_of]
    seed_of = seeds[doc_of]
    s_len = model.lens[seed_of]
    frac = seg_frac[seg_of]
    topical = model.starts[seed_of] + (np.floor(frac * s_len).astype(np.int64) + pos) % s_len
    n_stream = len(model.stream)
    background = (np.floor(frac * n_stream).astype(np.int64) + pos) % n_stream
    ids = model.stream[np.where(seg_topic[seg_of], topical, background)]
    if params.p_self > 0 and model.lang == "en":
        # a cache model (burstiness): repeat a content word from earlier in the same
        # document; of three earlier positions drawn, the first holding one
        doc_start = np.cumsum(lens) - lens
        at = np.arange(total) - doc_start[doc_of]  # position within the document
        rep = np.flatnonzero((rng.random(total) < params.p_self) & (at > 0))
        base_at = doc_start[doc_of[rep]]
        chosen = np.full(len(rep), -1, np.int64)
        for _ in range(3):
            src = ids[base_at + np.floor(rng.random(len(rep)) * at[rep]).astype(np.int64)]
            take = (chosen < 0) & model.content[src]
            chosen[take] = src[take]
        ok = chosen >= 0
        ids[rep[ok]] = chosen[ok]
    words = model.words[ids].tolist()
    if params.new_word > 0 and model.lang == "en":
        new = np.flatnonzero(rng.random(total) < params.new_word)
        u = 1.0 - rng.random(len(new))  # (0, 1]
        x = params.tail_r0 * u ** (-1.0 / (params.tail_s - 1.0))
        ranks = np.floor(np.minimum(x, 1e15) - params.tail_r0).astype(np.int64)
        for i, r in zip(new.tolist(), ranks.tolist()):
            words[i] = tail.get(r)
    title_lens = np.minimum(model.title_lens[seeds], lens - 1).tolist()
    ends = np.cumsum(lens).tolist()
    sep = model.sep
    out = []
    a = 0
    for b, tl in zip(ends, title_lens):
        if tl > 0:
            out.append(sep.join(words[a:a + tl]) + "\n\n" + sep.join(words[a + tl:b]))
        else:
            out.append(sep.join(words[a:b]))
        a = b
    return out


def _generated(model: LangModel, params: Params, seed: int, count: int) -> Iterator[str]:
    tail = TailWords()
    block = 0
    done = 0
    while done < count:
        n = min(BLOCK, count - done)
        yield from generate_block(model, params, block, n, seed, tail)
        done += n
        block += 1
        if len(tail.cache) > 2_000_000:
            tail.cache.clear()


@dataclass
class Layout:
    n: int
    n_zh: int
    n_en: int
    gen_en: int
    gen_zh: int


def layout(n: int, originals: list[BaseDoc], models: dict[str, LangModel]) -> Layout:
    base_en, base_zh = len(models["en"].lens), len(models["zh"].lens)
    n = max(n, base_en + base_zh)
    n_zh = max(base_zh, round(n * base_zh / (base_en + base_zh)))
    n_en = n - n_zh
    return Layout(n, n_zh, n_en, n_en - base_en, n_zh - base_zh)


def write_corpus(path: Path, n: int, data: Path, params: Params = PARAMS, seed: int = SEED) -> dict[str, Any]:
    """Write the corpus of ``n`` documents to ``path`` (``[doc_id, text]`` JSON lines);
    returns its description (counts, parameters, the file's SHA-256, seconds taken)."""
    import numpy as np

    t0 = time.perf_counter()
    originals, models, base_hash = load_bases(data)
    lay = layout(n, originals, models)
    # kinds in final order: 0 generated en, 1 generated zh, 2 original
    kinds = np.concatenate([np.zeros(lay.gen_en, np.int8), np.ones(lay.gen_zh, np.int8),
                            np.full(len(originals), 2, np.int8)])
    order = _rng("en", 10**6, seed).permutation(len(kinds))
    kinds = kinds[order]
    gens = {0: _generated(models["en"], params, seed, lay.gen_en),
            1: _generated(models["zh"], params, seed, lay.gen_zh)}
    counters = [0, 0]
    orig = iter(originals)
    h = hashlib.sha256()
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    buf: list[bytes] = []
    with open(tmp, "wb") as fh:
        for kind in kinds.tolist():
            if kind == 2:
                d = next(orig)
                line = orjson.dumps([d.doc_id, d.text])
            else:
                i = counters[kind]
                counters[kind] += 1
                line = orjson.dumps([f"gen-{'zh' if kind else 'en'}-{i}", next(gens[kind])])
            buf.append(line)
            if len(buf) >= 4096:
                chunk = b"\n".join(buf) + b"\n"
                h.update(chunk)
                fh.write(chunk)
                buf.clear()
        if buf:
            chunk = b"\n".join(buf) + b"\n"
            h.update(chunk)
            fh.write(chunk)
    os.replace(tmp, path)
    return {"n": lay.n, "n_en": lay.n_en, "n_zh": lay.n_zh, "originals": len(originals),
            "generated_en": lay.gen_en, "generated_zh": lay.gen_zh, "seed": seed, "version": GENERATOR_VERSION,
            "params": asdict(params), "sha256": h.hexdigest(), "base_sha256": base_hash,
            "bytes": path.stat().st_size, "generate_s": time.perf_counter() - t0}


def cache_key(n: int, data: Path, params: Params = PARAMS, seed: int = SEED) -> str:
    """Folder name of a cached corpus: generator version, seed, size and a hash of the
    parameters and the base files' contents (~20 ms for both; not their modification times,
    which change whenever the same data is copied in again, and each change left another
    1.4 GiB copy of the 1M corpus behind)."""
    h = hashlib.sha256(orjson.dumps([asdict(params), BLOCK]))
    for folder, _split, _lang in BASES:
        h.update(hashlib.sha256((data / folder / "corpus.jsonl").read_bytes()).digest())
    return f"realistic-v{GENERATOR_VERSION}-s{seed}-{n}-{h.hexdigest()[:10]}"


def cached_corpus(cache: Path, n: int, data: Path, params: Params = PARAMS, seed: int = SEED
                  ) -> tuple[Path, dict[str, Any]]:
    """The corpus of ``n`` documents from the cache, generated first if missing."""
    folder = cache / cache_key(n, data, params, seed)
    docs, meta_path = folder / "docs.jsonl", folder / "meta.json"
    if docs.exists() and meta_path.exists():
        meta = orjson.loads(meta_path.read_bytes())
        if docs.stat().st_size == meta.get("bytes"):
            meta["cached"] = True
            return docs, meta
    meta = write_corpus(docs, n, data, params, seed)
    meta_path.write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    meta["cached"] = False
    return docs, meta


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, run as a script
    from ragbench.common import DEFAULT_DATA, REPO

    p = argparse.ArgumentParser(description="generate the realistic corpus (cached) and print its description")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    path, meta = cached_corpus(REPO / "benchmarks" / ".cache" / "corpora", args.n, args.data, PARAMS, args.seed)
    print(path)
    print(orjson.dumps(meta, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
