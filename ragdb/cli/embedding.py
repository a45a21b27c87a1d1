"""Embedding from the ``ragdb`` commands: the embedder of a write (--embed, --model),
checking a model against the database's vectors, embedding with a progress bar
(``ragdb embed``, and add/sync/import after their write), and notes about chunks
vector search cannot see yet.
"""

from __future__ import annotations

from typing import Any

import click

import ragdb
from ragdb.cli.options import VECTOR_SCORERS
from ragdb.cli.main import one_line
from ragdb.cli.output import progress_bar, warn
from ragdb.errors import EmbeddingError


def write_embedder(db: ragdb.Database, embedder: Any, embed: bool) -> Any:
    """The embedder of an add, sync or import: --model's, else with --embed the recorded model's, else None."""
    if embedder is not None or not embed:
        return embedder
    recorded = db.recorded_embedder()
    if recorded is None:
        raise click.UsageError(f"--embed: {db.path} records no embedding model yet; give --model SPEC "
                               f"(e.g. --model wordllama)")
    return recorded


def check_model(db: ragdb.Database, embedder: Any, spec: str, flag: str = "--model") -> None:
    """One-line error, naming the flag, when the database holds vectors of another model than ``embedder``'s."""
    try:
        db.check_embedder(embedder)
    except EmbeddingError:
        info = db.vector_info()
        raise click.ClickException(
            f"{db.path}: its vectors were made by {info.model!r} ({info.dimensions} dimensions), not "
            f"{embedder.name!r} ({embedder.dimensions} dimensions) as {flag} {spec} asks; use the recorded model "
            f"(leave out {flag}), or re-embed every chunk with the new one: ragdb embed --model {spec} --rebuild"
        ) from None


def embed_chunks(db: ragdb.Database, embedder: Any, *, rebuild: bool = False, batch_size: int = 64) -> int:
    """``Database.embed`` with a progress bar on a terminal; returns the chunks embedded."""
    total = db.stats().stored_chunks if rebuild else db.vector_info().pending
    with progress_bar("embedding", total) as bar:
        shown = [0]

        def progress(done: int, _total: int) -> None:
            assert bar is not None
            bar(done - shown[0])
            shown[0] = done

        return db.embed(embedder, batch_size=batch_size, rebuild=rebuild,
                        progress=progress if bar is not None else None)


def embed_after_write(db: ragdb.Database, embedder: Any) -> tuple[int | None, str | None]:
    """Embed what the write left pending: (chunks embedded, None), or (None, the error) -
    the text is committed either way; failed chunks stay pending for 'ragdb embed'."""
    try:
        return embed_chunks(db, embedder), None
    except EmbeddingError as e:
        message = one_line(e)
        if "pending" not in message:  # failed before the first batch (e.g. probing the dimensions)
            left = db.vector_info().pending
            message += (f"; {left} chunk{'s stay' if left != 1 else ' stays'} pending (stored without vectors: "
                        f"lexical search finds them, vector search does not); run 'ragdb embed' to retry")
        return None, message


def report_embedding(embedder: Any, embedded: int | None, error: str | None, as_json: bool,
                     reused: int | None = None) -> dict[str, Any]:
    """JSON fields for add/sync/import --embed; prints the line in table mode. ``reused``:
    new chunks that took over the stored vector of an equal text in the write."""
    if embedder is None:
        return {}
    extra = {"reused": reused} if reused is not None else {}
    if error is not None:
        warn(f"error: {error}")
        return {"model": embedder.name, "embedded": 0, **extra, "embedding_error": error}
    if not as_json:
        kept = f"; {reused} reused a stored vector (same text)" if reused else ""
        click.echo(f"embedded {embedded} chunk{'s' * (embedded != 1)} with {embedder.name}{kept}")
    return {"model": embedder.name, "embedded": embedded, **extra}


def warn_pending(db: ragdb.Database, scorer: str) -> None:
    """Vector search does not see chunks without a vector: say so on stderr."""
    if scorer not in VECTOR_SCORERS:
        return
    info = db.vector_info()
    if info.model is not None and info.pending:
        warn(f"note: {info.pending} chunk{'s have' if info.pending != 1 else ' has'} no vector yet, unseen by "
             f"vector search; run 'ragdb embed'")
