"""Commands that search: ``search`` (ranked hits), ``facets`` (value counts over the matches)
and ``eval`` (retrieval quality on a BEIR collection, and calibrating the refusal floor)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

import ragdb
import ragdb.index.confidence
from ragdb.cli.embedding import check_model, warn_pending
from ragdb.cli.options import (
    QueryCommand,
    VECTOR_SCORERS,
    check_analyzer,
    database_missing,
    database_option,
    db_path,
    filter_options,
    open_database,
    output_options,
    scorer_options,
    search_kwargs,
    search_options,
    shown_path,
)
from ragdb.cli.output import (
    visible,
    Output,
    cell,
    emit_pairs,
    emit_records,
    emit_table,
    fmt_score,
    hidden_note,
    one_line,
    progress_bar,
    setting_text,
    short,
    stdout_is_tty,
    warn,
)
from ragdb.errors import InvalidInput
from ragdb.serve.shapes import facets_json, hit_json


# --------------------------------------------------------------------------- search


#: The CSV columns of ``ragdb search`` (confidence and explain follow when present).
HIT_COLUMNS = ("rank", "score", "source", "doc_id", "chunk_id", "version", "timestamp", "start", "end", "ordinal",
               "metadata", "text")


@click.command(cls=QueryCommand)
@database_option
@click.argument("query")
@click.option("-k", "k", type=click.IntRange(1, 10_000), default=10, show_default=True, help="Number of hits.")
@scorer_options()
@click.option("--min-score", type=float, default=None, help="Drop hits scoring below this.")
@filter_options
@click.option("--explain", is_flag=True, help="Show each query term's contribution to a hit's score.")
@click.option("--snippet-chars", "snippet_chars", type=click.IntRange(20, 100_000), default=160, show_default=True,
              help="Length of the snippet shown of each hit: the part of its text with the most query terms, "
                   "matches marked (bold on a terminal, [brackets] when piped).")
@click.option("--offset", type=click.IntRange(min=0), default=0,
              help="Skip this many hits first: -k 10 --offset 10 is the second page of ten.")
@click.option("--rerank-url", default=None, metavar="URL",
              help="Re-rank the first --rerank-top hits with a /rerank endpoint (text-embeddings-inference, "
                   "or Cohere/Jina-style with --rerank-model); key from RAGDB_RERANK_API_KEY.")
@click.option("--rerank-model", default=None, metavar="NAME", help="Model name for Cohere/Jina-style /rerank.")
@click.option("--reranker", "reranker_spec", default=None, metavar="SPEC",
              help="Re-rank the first --rerank-top hits with this reranker: http (RAGDB_RERANK_* settings), "
                   "an http(s):// URL, cross-encoder:MODEL, or one a plugin provides ('ragdb plugins').")
@click.option("--rerank-top", type=click.IntRange(min=1), default=50, show_default=True,
              help="How many first-stage hits the re-ranker sees.")
@click.option("--all-copies", "all_copies", is_flag=True,
              help="Every copy of a passage as its own hit (default: one hit per passage, the other "
                   "copies named under it).")
@output_options
def search(database: str | None, query: str, k: int, scorer: str, fusion: str | None, alpha: float | None,
           rrf_k: int | None, embed_model: str | None, min_score: float | None,
           filters: tuple[str, ...], where: dict[str, Any] | None, since: str | None, until: str | None,
           principals: tuple[str, ...], all_principals: bool, as_of: str | None, all_versions: bool, explain: bool,
           offset: int, rerank_url: str | None,
           rerank_model: str | None, reranker_spec: str | None, rerank_top: int, snippet_chars: int, all_copies: bool,
           output: Output) -> None:
    """Search the knowledge base; the best chunks first.

    --scorer vector ranks by cosine of embeddings and hybrid fuses BM25 with
    it; both need vectors ('ragdb embed') and embed the query with the
    database's recorded model (or --model). Chunks still pending (no vector)
    are not seen by the vector side; a note on stderr says how many.
    """
    kw = search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals, where)
    if offset:
        kw["offset"] = offset
    if min_score is not None:
        kw["min_score"] = min_score
    if explain:
        kw["explain"] = True
    if all_copies:
        kw["collapse"] = False
    if reranker_spec is not None and (rerank_url is not None or rerank_model is not None):
        raise click.UsageError("--reranker and --rerank-url/--rerank-model exclude each other")
    if reranker_spec is not None:
        from ragdb.models.rerank import get_reranker

        try:
            kw["reranker"] = get_reranker(reranker_spec)
        except InvalidInput as e:
            raise click.BadParameter(one_line(e), param_hint="--reranker") from None
        kw["rerank_top"] = rerank_top
    if rerank_url is not None or rerank_model is not None:
        from ragdb.models.rerank import HTTPReranker

        kw["reranker"] = HTTPReranker(base_url=rerank_url, model=rerank_model)
        kw["rerank_top"] = rerank_top
    kw["highlight"] = True
    kw["snippet_chars"] = snippet_chars
    opts = search_options(k, scorer, fusion, alpha, rrf_k, embed_model, **kw)
    with open_database(database) as db:
        if opts.embedder is not None:
            check_model(db, opts.embedder, embed_model or "")
        warn_pending(db, scorer)
        hits, plan = db.search_and_plan(query, options=opts)  # one derivation, one snapshot
        if explain:
            for line in _plan_lines(plan):
                click.echo(line, err=not output.table)
        if not hits and not offset:
            if plan.filters or plan.excluded:
                warn(_no_hits_by_query_language(plan))
            elif not plan.terms:
                warn(_no_terms_message(db, query, plan.dropped))
            hidden_note(db, opts.restrictions.principals)
        typed = _typed_words(db, query)
    _plan_notes(plan, bool(hits), typed)
    if not output.table:
        emit_records(output, [hit_json(h, i) for i, h in enumerate(hits, offset + 1)], HIT_COLUMNS)
        return
    if not hits:
        click.echo("no hits")
        return
    tty = stdout_is_tty()
    for i, h in enumerate(hits, offset + 1):
        span = f"{visible(h.source)}:{h.start}-{h.end}"
        extra = f"  v{visible(h.version)}" if h.version else ""
        for key in ("section", "page"):
            if key in h.metadata:
                extra += f"  {key} {visible(str(h.metadata[key]))}"
        click.echo(f"{i:>2}. {fmt_score(h.score)}  {span}{extra}")
        click.echo(f"    {_marked(h.snippet, len(h.text), tty) if h.snippet is not None else visible(short(h.text, 160))}")
        if h.duplicates:
            click.echo(f"    also in: {', '.join(visible(d.source) for d in h.duplicates)}")
        if explain and h.explain:
            for term, c in sorted(h.explain.items(), key=lambda kv: -kv[1]):
                click.echo(f"      {c:>9.4f}  {term}")


def _marked(snip: ragdb.types.Snippet, text_len: int, tty: bool) -> str:
    """A snippet on one line, matches in bold on a terminal and in [brackets] when piped,
    "…" where it cuts the chunk's text."""
    parts, last = [], 0
    text = visible(snip.text)  # (one character for one: the highlights' offsets hold)
    for a, b in snip.highlights:
        parts.append(text[last:a])
        parts.append(click.style(text[a:b], bold=True) if tty else f"[{text[a:b]}]")
        last = b
    parts.append(text[last:])
    body = " ".join("".join(parts).split())
    return ("…" if snip.start > 0 else "") + body + ("…" if snip.end < text_len else "")


def _query_analysis(db: ragdb.Database, query: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The terms the database's analyzer makes of a query, and the words it drops (with why)."""
    an = db.analyzer
    return list(dict.fromkeys(an.terms(query))), an.dropped(query)


def _dq(word: str) -> str:
    return f'"{word}"'


def _quoted(words: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{_dq(w)} ({why})" for w, why in words)


def _no_hits_by_query_language(plan: ragdb.QueryPlan) -> str:
    """Why a query whose filters or exclusions (its own ``field:value`` and ``-word``) may
    have removed every hit found nothing: what they were, and how to search the words as typed."""
    parts = []
    if plan.filters:
        parts.append(f"filter{'s' * (len(plan.filters) > 1)} {', '.join(plan.filters)}")
    if plan.excluded:
        parts.append(f"exclusion{'s' * (len(plan.excluded) > 1)} {', '.join('-' + w for w in plan.excluded)}")
    return (f"no hits: the query language read {' and '.join(parts)} from the query, and no chunk "
            f"passes them; --plain searches every word as typed")


def _typed_words(db: ragdb.Database, query: str) -> dict[str, str]:
    """index term -> the word of the query it comes from (for messages about terms)."""
    try:
        return {t.term: query[t.start:t.end] for t in reversed(db.analyzer.tokens(query))}
    except ragdb.RagdbError:  # an analyzer that gives no token offsets
        return {}


def _no_terms_message(db: ragdb.Database, query: str, dropped: Sequence[tuple[str, str]]) -> str:
    """Why a query whose every word the analyzer dropped finds nothing; for an older analyzer
    version that drops words the current one keeps, how to get them."""
    from ragdb.text.analysis import ANALYZER_VERSION, Analyzer

    if not dropped:
        return "no hits: the query has no words"
    msg = f"no hits: every word of the query was dropped by the analyzer: {_quoted(dropped)}"
    config = db.analyzer.config()
    if config.get("name") == "ragdb" and config.get("version", ANALYZER_VERSION) < ANALYZER_VERSION:
        current = Analyzer(stem=config.get("stem"), stopwords=config.get("stopwords"), cjk=config.get("cjk", "bigram"))
        kept = [w for w, _why in dropped if current.terms(w)]
        if kept:
            msg += (f"; this database's analyzer is version {config.get('version')}, and version "
                    f"{ANALYZER_VERSION} keeps {', '.join(map(_dq, kept))}: 'ragdb reindex' "
                    f"rebuilds the index with it")
    return msg


def _plan_lines(plan: ragdb.QueryPlan) -> list[str]:
    """--explain: how the query was read (the terms scored, with boosts; dropped words; and
    what the query language did with it)."""
    shown = [_dq(t) + (f"^{plan.weights[t]:g}" if t in plan.weights else "") for t in plan.terms]
    lines = [f"query terms: {', '.join(shown) if shown else 'none'}"]
    if plan.dropped:
        lines.append(f"dropped: {_quoted(plan.dropped)}")
    if plan.error:
        lines.append(f"not parsed ({plan.error}): searched as plain words")
    for key, terms in plan.expansions.items():
        lines.append(f"{key} expands to: {', '.join(map(_dq, terms)) if terms else 'nothing'}")
    if plan.phrases:
        lines.append(f"phrases: {', '.join(map(_dq, plan.phrases))}")
    if plan.excluded:
        lines.append(f"excluded: {', '.join(map(_dq, plan.excluded))}")
    if plan.filters:
        lines.append(f"filters from the query: {', '.join(map(_dq, plan.filters))}")
    if plan.unknown:
        lines.append(f"not in the knowledge base: {', '.join(map(_dq, plan.unknown))}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return lines


def _plan_notes(plan: ragdb.QueryPlan, found: bool, typed: dict[str, str] | None = None) -> None:
    """On stderr: that a query found nothing as plain words because it could not be parsed,
    "did you mean" for words the knowledge base lacks (``typed``: the query's word of each
    term), and the plan's notes (a question whose script the knowledge base lacks)."""
    typed = typed or {}
    if not found and plan.error:
        warn(f"note: the query was searched as plain words ({plan.error})")
    if plan.suggestions:
        warn("did you mean: " + "; ".join(f"{' or '.join(s)} (for {typed.get(t, t)})"
                                          for t, s in plan.suggestions.items())
             + "? (or search with --fuzzy)")
    for note in plan.notes:
        warn(f"note: {note}")


# --------------------------------------------------------------------------- facets

@click.command("facets")
@database_option
@click.argument("key")
@click.argument("query", required=False)
@click.option("--by", type=click.Choice(["chunks", "documents"]), default="chunks", show_default=True,
              help="Count matching chunks, or documents with a matching chunk.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the N most frequent values.")
@filter_options
@output_options
def facets_cmd(database: str | None, key: str, query: str | None, by: str, limit: int | None,
               filters: tuple[str, ...], where: dict[str, Any] | None, since: str | None, until: str | None,
               principals: tuple[str, ...], all_principals: bool, as_of: str | None, all_versions: bool,
               output: Output) -> None:
    """Count the values of metadata KEY (or source, version) over the chunks that match QUERY and the filters.

    Exact counts over every match the caller may see, not only the top hits;
    without QUERY, over every chunk the filters keep. Most frequent first.
    """
    kw = search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals, where)
    with open_database(database) as db:
        f = db.facets(key, query, by=by, limit=limit, **kw)
        if not f.total:
            hidden_note(db, kw.get("principals"))
    value = facets_json(f)
    records = value["values"]
    if not output.table:
        emit_records(output, records, ("value", "count"), json_value=value)
        return
    if records:
        emit_table([key, by], [(cell(v), n) for v, n in f], right=(1,))
    what = by if f.total != 1 else by[:-1]
    note = f"{f.total} {what} matched, {f.missing} without {key}"
    if f.omitted:
        note += f"; {f.omitted} more value{'s' * (f.omitted != 1)} (--limit)"
    click.echo(note if records else f"no values; {note}")


# --------------------------------------------------------------------------- eval

@click.command("eval")
@click.option("--corpus", required=True, type=click.Path(dir_okay=False), help="BEIR corpus.jsonl.")
@click.option("--queries", required=True, type=click.Path(dir_okay=False), help="BEIR queries.jsonl.")
@click.option("--qrels", required=True, type=click.Path(dir_okay=False), help="BEIR qrels .tsv.")
@click.option("-k", "k", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Depth of the run (Recall@k).")
@scorer_options(("--model",))
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: check_analyzer(v),
              help="Analyzer of the temporary index: default, jieba, simple or a plugin's (default: 'default'; "
                   "with --calibrate, the database's).")
@click.option("--calibrate", is_flag=True,
              help="Choose the database's min_confidence (the refusal floor of prompt/ask) from these judged "
                   "queries and --off-topic questions, and store it in -d/--database.")
@click.option("--off-topic", "off_topic", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="With --calibrate: questions the knowledge base cannot answer, to be refused (queries.jsonl "
                   "or one question a line; repeatable).")
@database_option
@output_options
def eval_cmd(corpus: str, queries: str, qrels: str, k: int, scorer: str, fusion: str | None, alpha: float | None,
             rrf_k: int | None, embed_model: str | None, analyzer: str | None, calibrate: bool,
             off_topic: tuple[str, ...], database: str | None, output: Output) -> None:
    """Evaluate retrieval on a BEIR-layout collection: nDCG@10, Recall@k, MRR@10.

    The corpus is indexed into a temporary in-memory database (one chunk per
    document: title, blank line, text; source = corpus id), as the benchmark
    does; without --calibrate no database file is read or written. --scorer vector or hybrid
    needs --model SPEC: the corpus is embedded with it while indexing.

    --calibrate also chooses a refusal floor (min_confidence) with the
    database's analyzer and chunker (so the confidences are those its own
    searches give), with
    ragdb.answers.prompt.choose_threshold: the best hit confidence of each judged
    query (to be answered) and of each --off-topic question (to be refused),
    the threshold with the best F1 of answer decisions; and stores it in the
    database named by -d/--database, where prompt and ask use it by default.
    Without --off-topic it refuses none of the judged queries (their lowest
    confidence) and says so. --json prints the measures as one object; --nl,
    --csv and --tsv as one record (the calibration as JSON text in CSV).
    """
    from ragdb.answers.evaluation import calibrate_refusal, evaluate_database, load_beir, load_questions

    if scorer in VECTOR_SCORERS and embed_model is None:
        raise click.UsageError(f"--scorer {scorer} needs --model SPEC to embed the corpus "
                               f"(e.g. --model wordllama, the offline default)")
    if off_topic and not calibrate:
        raise click.UsageError("--off-topic applies with --calibrate only")
    target = db_path(database) if calibrate else None  # the database the floor is stored in
    if target is not None and database_missing(target):
        raise click.ClickException(f"{target}: no such database (create it with 'ragdb init' or 'ragdb add')")
    index_analyzer: Any = analyzer or "default"
    index_chunker = "none"
    if calibrate:  # confidences as the database's own analyzer and chunker make them
        with open_database(target, readonly=True) as kb:
            if analyzer is None:
                index_analyzer = kb.analyzer
            index_chunker = str(kb.settings.get("chunker") or "none")
    opts = search_options(k, scorer, fusion, alpha, rrf_k, embed_model)
    embedder = opts.embedder  # the temporary database embeds with it, and queries with it too
    docs, qs, judgements = load_beir((corpus, queries, qrels))
    negatives = [q for path in off_topic for q in load_questions(path)]
    records = [{"text": f"{title}\n\n{text}" if title else text, "source": doc_id}
               for doc_id, title, text in docs if (title + text).strip()]
    with ragdb.open(":memory:", analyzer=index_analyzer, chunker=index_chunker, embedder=embedder) as db:
        with progress_bar("indexing", len(records)) as progress:
            step = 1000
            for i in range(0, len(records), step):
                db.add_many(records[i:i + step])
                if progress is not None:
                    progress(len(records[i:i + step]))
        result = evaluate_database(db, qs, judgements, k=k, options=opts.replace(embedder=None))
        report = (calibrate_refusal(db, qs, judgements, negatives, k=k, options=opts.replace(embedder=None))
                  if calibrate else None)
    data: dict[str, Any] = {"ndcg@10": result["ndcg@10"], f"recall@{k}": result[f"recall@{k}"],
                            "mrr@10": result["mrr@10"], "queries": int(result["queries"]),
                            "documents": len(records), "k": k, "scorer": scorer}
    if embedder is not None:
        data["model"] = embedder.name
    if scorer == "hybrid":
        data.update(fusion=opts.fusion_method, alpha=opts.fusion_alpha, rrf_k=opts.fusion_rrf_k)
    rows: list[tuple[str, Any]] = [("nDCG@10", f"{data['ndcg@10']:.4f}"), (f"Recall@{k}", f"{data[f'recall@{k}']:.4f}"),
                                   ("MRR@10", f"{data['mrr@10']:.4f}"), ("queries", data["queries"]),
                                   ("documents", data["documents"])]
    if report is not None and target is not None:
        with open_database(target) as kb:
            old = kb.settings.get(ragdb.index.confidence.SETTING)
            kb.set_min_confidence(report.threshold)
        answerable = report.true_positives + report.false_negatives
        unanswerable = report.false_positives + report.true_negatives
        data["calibration"] = {
            "min_confidence": report.threshold, "previous": old, "database": target,
            "judged_queries": answerable, "judged_refused": report.false_negatives,
            "off_topic_questions": unanswerable, "off_topic_refused": report.true_negatives,
            "precision": report.precision, "recall": report.recall, "f1": report.f1}
        rows += [("min_confidence", f"{report.threshold:.4f} (stored in {shown_path(target)}; was "
                                    f"{setting_text('min_confidence', old)})"),
                 ("judged refused", f"{report.false_negatives} of {answerable}"),
                 ("off-topic refused", f"{report.true_negatives} of {unanswerable}" if unanswerable else "none given"),
                 ("F1 of answering", f"{report.f1:.4f}")]
        if not unanswerable:
            warn("note: no --off-topic questions: the floor refuses none of the judged queries but was not "
                 "tried on questions to refuse")
    if not output.table:
        emit_records(output, [data], list(data), json_value=data)
        return
    emit_pairs(rows)


#: The commands of this module (:mod:`ragdb.cli.main` adds them to the ``ragdb`` group).
COMMANDS: tuple[click.Command, ...] = (search, facets_cmd, eval_cmd)
