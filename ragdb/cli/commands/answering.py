"""Commands that answer questions from the knowledge base: ``prompt`` (the grounded prompt,
sent nowhere) and ``ask`` (a language model's answer with its sources).

Exit status 3 (:data:`EXIT_REFUSED`) when the question is refused. The work is the
library's: :mod:`ragdb.answers.prompt` and :mod:`ragdb.answers.llm`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

import ragdb
import ragdb.answers.llm
import ragdb.index.confidence
from ragdb.cli.embedding import check_model, warn_pending
from ragdb.cli.options import (
    QueryCommand,
    database_option,
    filter_options,
    json_option,
    open_database,
    question_option,
    scorer_options,
    search_kwargs,
    search_options,
)
from ragdb.cli.output import emit_json, emit_pairs, fmt_score, hidden_note, setting_text, stdout_is_tty, visible, warn
from ragdb.serve.shapes import hit_json


def _generation_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("-k", "k", type=click.IntRange(1, 10_000), default=8, show_default=True,
                     help="Hits retrieved before evidence selection."),
        click.option("--min-confidence", type=click.FloatRange(0.0, 1.0), default=None,
                     help="Drop evidence whose confidence (0-1) is below this; 0: never refuse by confidence "
                          "(default: the database's, 'ragdb config min_confidence', else the one it measures on "
                          "itself, 'ragdb calibrate'; none with --min-score)."),
        click.option("--min-score", type=float, default=None,
                     help="Drop evidence scoring below this raw score (replaces the confidence floor)."),
        click.option("--relative", type=click.FloatRange(0.0, 1.0), default=None,
                     help="Drop evidence scoring below this share of the best score."),
        click.option("--budget", type=click.IntRange(min=1), default=None, metavar="TOKENS",
                     help="Token budget of the sources."),
        click.option("--language", type=click.Choice(["en", "zh"]), default=None,
                     help="Language of the prompt (default: detected from the question)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _retrieve(database: str | None, question: str, opts: ragdb.SearchOptions, embed_model: str | None = None,
              model_flag: str = "--model") -> tuple[list[ragdb.Hit], float, tuple[str, ...]]:
    """The hits for ``question``, the database's confidence floor (``Database.min_confidence``)
    and the notes of the question's plan (e.g. a script the knowledge base lacks)."""
    if not question.strip():
        raise click.BadParameter("the question is empty", param_hint="QUESTION")
    with open_database(database) as db:
        if opts.embedder is not None:
            check_model(db, opts.embedder, embed_model or "", model_flag)
        warn_pending(db, opts.scorer)
        hits, plan = db.search_and_plan(question, options=opts.as_question())  # plain words unless --query-language
        if not hits:
            hidden_note(db, opts.restrictions.principals)
        return hits, db.min_confidence, plan.notes


#: Exit status of prompt/ask when the question is refused (see the module docstring).
EXIT_REFUSED = 3


def _refusal_reason(p: Any, hits: Sequence[ragdb.Hit], notes: Sequence[str] = ()) -> str:
    """Why a prompt has no sources, for the refusal line on stderr (``notes``: the question's
    plan's, e.g. that its script has no counterpart in the knowledge base, and the remedy)."""
    if not hits:
        reason = "no chunk matches the question"
    elif p.min_confidence and p.confidence is not None and p.confidence < p.min_confidence:
        reason = (f"the best evidence has confidence {p.confidence:.3f}, below min_confidence "
                  f"{p.min_confidence:.3f} (--min-confidence, 'ragdb config min_confidence')")
    else:
        reason = "no evidence passed --min-score/--relative/--budget"
    return "; ".join([reason, *notes])


def _source_lines(sources: Sequence[ragdb.Hit], cited: Sequence[int] = ()) -> list[str]:
    lines = []
    for i, h in enumerate(sources, 1):
        mark = "*" if i in cited else " "
        lines.append(f"{mark}[{i}] {h.source}:{h.start}-{h.end}  (score {fmt_score(h.score)})")
    return lines


# --------------------------------------------------------------------------- prompt

@click.command(cls=QueryCommand)
@database_option
@click.argument("question")
@_generation_options
@scorer_options()
@filter_options
@question_option
@json_option
def prompt(database: str | None, question: str, k: int, min_confidence: float | None, min_score: float | None,
           relative: float | None, budget: int | None, language: str | None, scorer: str, fusion: str | None,
           alpha: float | None, rrf_k: int | None, embed_model: str | None, filters: tuple[str, ...],
           where: dict[str, Any] | None, since: str | None, until: str | None, principals: tuple[str, ...],
           all_principals: bool, as_of: str | None, all_versions: bool, as_json: bool) -> None:
    """Print the grounded prompt that 'ask' would send for QUESTION; sends nothing.

    Exit status 3 when no evidence passed selection (the prompt, without
    sources, is still printed; stderr says why): 'ask' would refuse without
    calling the model.
    """
    from ragdb.index.confidence import effective_min_confidence
    from ragdb.answers.prompt import REFUSAL, build_prompt

    opts = search_options(k, scorer, fusion, alpha, rrf_k, embed_model,
                          **search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals,
                                          where))
    hits, stored, notes = _retrieve(database, question, opts, embed_model)
    p = build_prompt(question, hits, language=language, budget_tokens=budget, min_score=min_score,
                     relative=relative,
                     min_confidence=effective_min_confidence(min_confidence, min_score=min_score, stored=stored))
    if as_json:
        emit_json({"system": p.system, "user": p.user, "messages": p.messages, "language": p.language,
                   "refused": p.refused, "confidence": p.confidence, "min_confidence": p.min_confidence,
                   "sources": [hit_json(h, i) for i, h in enumerate(p.sources, 1)]})
    else:
        click.echo(visible(p.text) if stdout_is_tty() else p.text)  # (piped: the prompt as it is)
    if p.refused:
        warn(f"refused: {_refusal_reason(p, hits, notes)}; 'ask' would answer "
             f"\"{REFUSAL[p.language]}\" without calling the model")
        click.get_current_context().exit(EXIT_REFUSED)


# --------------------------------------------------------------------------- ask

def _stream_to_terminal() -> bool:
    return stdout_is_tty()


@click.command(cls=QueryCommand)
@database_option
@click.argument("question")
@_generation_options
@click.option("--model", default=None, help="Model name (default: $RAGDB_LLM_MODEL, else gpt-4o-mini).")
@click.option("--base-url", default=None, metavar="URL",
              help="OpenAI-compatible endpoint (default: $RAGDB_LLM_BASE_URL, else $OPENAI_BASE_URL, else OpenAI).")
@click.option("--timeout", type=click.FloatRange(min=0.0, min_open=True), default=60.0, show_default=True,
              help="Seconds to wait for the model.")
@scorer_options(("--embed-model",))
@filter_options
@question_option
@json_option
def ask(database: str | None, question: str, k: int, min_confidence: float | None, min_score: float | None,
        relative: float | None, budget: int | None, language: str | None, model: str | None,
        base_url: str | None, timeout: float, scorer: str, fusion: str | None, alpha: float | None,
        rrf_k: int | None, embed_model: str | None, filters: tuple[str, ...], where: dict[str, Any] | None,
        since: str | None, until: str | None, principals: tuple[str, ...], all_principals: bool,
        as_of: str | None, all_versions: bool, as_json: bool) -> None:
    """Answer QUESTION from the knowledge base with a language model, listing the sources under it.

    The API key is read only from RAGDB_LLM_API_KEY (OPENAI_API_KEY only for
    OpenAI's own API, or with OPENAI_BASE_URL). With no endpoint
    (--base-url, RAGDB_LLM_BASE_URL, OPENAI_BASE_URL) and no key it fails at
    once, before searching. Streams the answer on a terminal. Without
    evidence (see prompt) the answer is the refusal sentence and the model is
    not called; exit status 3 for a refusal, either way. --model names the
    chat model; the query embedder of --scorer vector/hybrid is --embed-model.
    """
    from ragdb.index.confidence import effective_min_confidence
    from ragdb.answers.llm import ChatClient

    opts = search_options(k, scorer, fusion, alpha, rrf_k, embed_model, "--embed-model",
                          **search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals,
                                          where))
    client = ChatClient(base_url=base_url, model=model, timeout=timeout)  # first: no endpoint fails at once
    hits, stored, notes = _retrieve(database, question, opts, embed_model, "--embed-model")
    stream = _stream_to_terminal() and not as_json

    def show(piece: str) -> None:  # (only to a terminal)
        click.echo(visible(piece), nl=False)

    answer = ragdb.answers.llm.ask(hits, question, client, language=language, budget_tokens=budget, min_score=min_score,
                           relative=relative, on_text=show if stream else None,
                           min_confidence=effective_min_confidence(min_confidence, min_score=min_score,
                                                                   stored=stored))
    if stream:
        click.echo("")
    p, text, sources, refused, citations = answer.prompt, answer.text, answer.hits, answer.refused, answer.citations
    without_model = refused and p.refused  # refused before any request
    if as_json:
        emit_json({"answer": text, "refused": refused, "model_called": not without_model, "language": p.language,
                   "confidence": p.confidence, "min_confidence": p.min_confidence,
                   "citations": {"cited": citations.cited, "invalid": citations.invalid,
                                 "uncited": citations.uncited},
                   "sources": [hit_json(h, i) for i, h in enumerate(sources, 1)]})
        _ask_exit(p, hits, refused, without_model, notes)
        return
    if not stream:
        click.echo(visible(text) if stdout_is_tty() else text)
    if sources:
        click.echo("")
        click.echo("Sources:")
        for line in _source_lines(sources, citations.cited):
            click.echo(visible(line))
    if citations.invalid:
        warn(f"warning: the answer cites sources that do not exist: {', '.join(map(str, citations.invalid))}")
    elif citations.uncited and not refused:
        warn("warning: the answer cites no source")
    _ask_exit(p, hits, refused, without_model, notes)


def _ask_exit(p: Any, hits: Sequence[ragdb.Hit], refused: bool, without_model: bool,
              notes: Sequence[str] = ()) -> None:
    """Say why an answer is a refusal, and exit with :data:`EXIT_REFUSED`."""
    if not refused:
        return
    if without_model:
        warn(f"refused without calling the model: {_refusal_reason(p, hits, notes)}")
    else:
        warn("refused: the model answered that the sources do not suffice")
    click.get_current_context().exit(EXIT_REFUSED)


@click.command()
@database_option
@click.option("--answerable", "answerable", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="Questions the knowledge base answers (one a line, or a .jsonl of {\"text\": ...}); repeatable.")
@click.option("--off-topic", "off_topic", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="Questions it should refuse (the same formats); repeatable.")
@click.option("--bundled/--no-bundled", default=True, show_default=True,
              help="Also refuse ragdb's bundled general-knowledge questions (English and Chinese).")
@click.option("--dry-run", is_flag=True, help="Show the floor without storing it.")
@json_option
def calibrate(database: str | None, answerable: tuple[str, ...], off_topic: tuple[str, ...], bundled: bool,
              dry_run: bool, as_json: bool) -> None:
    """Choose the refusal floor (min_confidence) of prompt and ask.

    Without files: the floor the database measures on itself (questions made from its own
    chunks against bundled off-topic questions), made again now; it applies while no floor is
    stored. With --answerable (and --off-topic): the floor with the best F1 of answering the
    answerable questions and refusing the off-topic ones, stored in the database.
    """
    from ragdb.answers.evaluation import PROMPT_K, bundled_off_topic, calibrate_questions, load_questions

    if off_topic and not answerable:
        raise click.UsageError("--off-topic needs --answerable: questions the knowledge base should answer")
    with open_database(database) as db:
        stored = db.settings.get(ragdb.index.confidence.SETTING)
        if not answerable:
            cal = db.self_calibration(refresh=True)
            data: dict[str, Any] = {"self_calibration": cal.to_setting() if cal is not None else None,
                                    "stored_min_confidence": stored, "min_confidence": db.min_confidence}
            if as_json:
                emit_json(data)
                return
            if cal is None:
                click.echo("the knowledge base is empty: nothing to calibrate on")
                return
            emit_pairs([("self-calibrated floor", f"{cal.floor:.4f}"), ("chunks", cal.chunks),
                        ("languages", ", ".join(cal.languages)),
                        ("off-topic refused", f"{100 * cal.off_topic_refused:.1f}% (95th percentile "
                                              f"{cal.off_topic_p95:.3f})"),
                        ("own questions answered", f"{100 * cal.pseudo_answered:.1f}% (5th percentile "
                                                   f"{cal.pseudo_p5:.3f})")])
            if stored is not None:
                warn(f"note: the stored min_confidence {stored} applies instead "
                     "('ragdb config min_confidence default' to use the self-calibrated one)")
            return
        positives = [q for path in answerable for q in load_questions(path)]
        negatives = [q for path in off_topic for q in load_questions(path)]
        if bundled:
            negatives += bundled_off_topic("en") + bundled_off_topic("zh")
        report = calibrate_questions(db, positives, negatives, k=PROMPT_K, principals=ragdb.ALL, syntax="plain")
        if not dry_run:
            db.set_min_confidence(report.threshold)
    n_pos = report.true_positives + report.false_negatives
    n_neg = report.false_positives + report.true_negatives
    data = {"min_confidence": report.threshold, "stored": not dry_run, "previous": stored,
            "answerable": n_pos, "answerable_refused": report.false_negatives,
            "off_topic": n_neg, "off_topic_refused": report.true_negatives, "f1": report.f1}
    if as_json:
        emit_json(data)
        return
    emit_pairs([("min_confidence", f"{report.threshold:.4f}" + (" (not stored: --dry-run)" if dry_run else
                                                               f" (stored; was {setting_text('min_confidence', stored)})")),
                ("answerable refused", f"{report.false_negatives} of {n_pos}"),
                ("off-topic refused", f"{report.true_negatives} of {n_neg}" if n_neg else "none given"),
                ("F1 of answering", f"{report.f1:.4f}")])


#: The commands of this module (:mod:`ragdb.cli.main` adds them to the ``ragdb`` group).
COMMANDS: tuple[click.Command, ...] = (prompt, ask, calibrate)
