"""Every error ragdb raises is a subclass of :class:`RagdbError`."""

from __future__ import annotations


class RagdbError(Exception):
    """Base class of all ragdb errors."""


class InvalidInput(RagdbError, ValueError):
    """An argument or a document is not acceptable (the message names it).

    ``param``: the name of the argument or option at fault, where one is (``"k"``,
    ``"alpha"``, ``"principals"``...), so a caller (the CLI, a server) can point at its
    own spelling of it (``--alpha``) without reading the message."""

    def __init__(self, message: str = "", *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[object, ...]:  # pickled across worker processes with its param
        return (_invalid_input, (str(self), self.param))


class NotADatabase(RagdbError):
    """The file is not a ragdb database (or not SQLite at all)."""


class DatabaseCorrupt(NotADatabase):
    """The file is not a database or is corrupt: SQLite cannot read it (damaged pages,
    a header that is not SQLite's, an encrypted file)."""


class SchemaTooNew(RagdbError):
    """The database was written by a newer ragdb schema than this one knows."""


class AnalyzerMismatch(RagdbError):
    """The database was built with another analyzer configuration."""


class DocumentNotFound(RagdbError, KeyError):
    """No document with that id or source."""

    def __str__(self) -> str:  # KeyError quotes its message; we want plain text
        return str(self.args[0]) if self.args else "document not found"


class CollectionNotFound(RagdbError, KeyError):
    """No collection of that name in the database file (or it was dropped)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "collection not found"


class CollectionExists(RagdbError):
    """A collection of that name already exists."""


class AccessDenied(RagdbError):
    """The caller may not do this (a server's HTTP 403): its token may not write, or not there."""


class WriteForbidden(AccessDenied):
    """A write outside the writer's scope (HTTP 403): a document it may see, but not write
    (:mod:`ragdb.serve.access`)."""


class Unauthorized(AccessDenied):
    """A server refused the caller's credentials (HTTP 401): no API token where one is
    needed, or a token the server does not know."""


class DatabaseBusy(RagdbError):
    """Another process held the write lock for longer than the busy timeout."""


class StorageError(RagdbError):
    """SQLite refused an operation (disk full, read-only file, corruption)."""


class DiskFull(StorageError):
    """The disk (or the PostgreSQL server's) is full: the write was rolled back, nothing of it
    stored."""


class TextDamaged(StorageError):
    """A stored (compressed) text cannot be read back: its zstd frame is damaged, names a
    dictionary the database does not have, or does not decompress to UTF-8. ``ragdb check``
    lists every such text; restore the file from a backup or an export."""


class InternalError(RagdbError):
    """An operation failed in a way ragdb did not expect: a bug, or damage that ``ragdb check``
    does not recognise. The original exception is kept as the cause (``__cause__``); the
    message names the database and the operation. Nothing a reader does raises anything
    but a :class:`RagdbError`, so a reader's unexpected failure comes as this one."""


class LoaderError(RagdbError):
    """A file could not be read as a document (binary, encrypted, empty, broken)."""


class MissingDependency(RagdbError, ImportError):
    """An optional dependency is not installed; the message says which extra to install."""

    @classmethod
    def of(cls, package: str, extra: str, exc: BaseException | None = None) -> MissingDependency:
        """``package`` is missing: install ``ragdb[extra]`` (``exc``: the ImportError, kept as the cause)."""
        err = cls(f"{package} is not installed; install it with: pip install 'ragdb[{extra}]'")
        if exc is not None:
            err.__cause__ = exc
        return err


class RemoteError(RagdbError):
    """A remote endpoint (chat, embeddings, rerank) failed: HTTP error, timeout,
    refused redirect or malformed reply. Messages never contain API keys or URL passwords."""


class LLMError(RemoteError):
    """The language model endpoint failed (HTTP error, timeout, malformed reply)."""


class EmbeddingError(RemoteError):
    """The embedding model or endpoint failed, or its vectors do not fit the database."""


class RerankError(RemoteError):
    """The re-ranking model or endpoint failed, or returned scores that do not fit the hits."""


def _invalid_input(message: str, param: str | None) -> InvalidInput:
    return InvalidInput(message, param=param)
