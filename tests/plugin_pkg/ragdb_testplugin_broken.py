"""A plugin that cannot be imported: ragdb must report it and keep working."""

import ragdb_no_such_module  # noqa: F401
