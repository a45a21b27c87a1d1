"""The storage layer: every SQL statement ragdb runs is in this package.

:class:`Store` is one SQLite connection with ragdb's schema (``migrations/``),
its transactions, and the statements of the engine: documents and chunks,
vocabulary and document frequencies, packed postings, the chunk change log,
the filter index (:mod:`.store`) and dense vectors (:mod:`.vectors`). The
other modules call its methods; none of them holds SQL.
"""

from __future__ import annotations

from .codec import dumps, loads, utcnow_iso
from .store import (MIGRATION_SET, Store, build_migrations, migration_files, migration_state,
                    migrations_dir)
from .vectors import DTYPES, check_model_args, model_mismatch

__all__ = ["MIGRATION_SET", "DTYPES", "Store", "build_migrations", "check_model_args", "dumps", "loads",
           "migration_files", "migration_state", "migrations_dir", "model_mismatch", "utcnow_iso"]
