"""Old import paths keep working: the modules that moved into packages by concern
(``ragdb.embeddings`` is now :mod:`ragdb.models.embeddings`, ``ragdb.server`` is
:mod:`ragdb.serve.http_api`, ...) are still importable by their old names, as the same
module objects (so ``isinstance`` checks and ``mock.patch`` see one module).

``ragdb.index``, ``ragdb.engine`` and ``ragdb.query`` are packages now; their ``__init__``
resolves the old modules' names lazily. New code imports the new paths
(docs/architecture.md has the map).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

#: old module -> where it lives now
MOVED = {
    "ragdb.analysis": "ragdb.text.analysis",
    "ragdb.chunking": "ragdb.text.chunking",
    "ragdb.fields": "ragdb.text.fields",
    "ragdb.snippets": "ragdb.text.snippets",
    "ragdb.filters": "ragdb.query.filters",
    "ragdb.matching": "ragdb.index.matching",
    "ragdb.scoring": "ragdb.index.scoring",
    "ragdb.confidence": "ragdb.index.confidence",
    "ragdb.vectors": "ragdb.index.vectors",
    "ragdb.ann": "ragdb.index.ann",
    "ragdb.fusion": "ragdb.index.fusion",
    "ragdb.hits": "ragdb.index.hits",
    "ragdb.write": "ragdb.engine.write",
    "ragdb.search": "ragdb.engine.search",
    "ragdb.check": "ragdb.engine.check",
    "ragdb.ingest": "ragdb.engine.prepare",
    "ragdb.facets": "ragdb.engine.facets",
    "ragdb.embeddings": "ragdb.models.embeddings",
    "ragdb.rerank": "ragdb.models.rerank",
    "ragdb.http": "ragdb.models.http_client",
    "ragdb.prompt": "ragdb.answers.prompt",
    "ragdb.llm": "ragdb.answers.llm",
    "ragdb.evaluation": "ragdb.answers.evaluation",
    "ragdb.walk": "ragdb.files.walk",
    "ragdb.loaders": "ragdb.files.loaders",
    "ragdb.sync": "ragdb.files.sync",
    "ragdb.transfer": "ragdb.files.transfer",
    "ragdb.server": "ragdb.serve.http_api",
    "ragdb.integrations.mcp": "ragdb.serve.mcp",
    "ragdb.integrations.common": "ragdb.serve.shapes",
}


class _OldPaths:
    """Finds an old module name and loads it as the module at its new path.

    A meta path finder and loader by protocol (find_spec; create_module, exec_module), not by
    subclassing importlib.abc: importing importlib.abc imports importlib.resources, tempfile,
    shutil and the compression modules, about 9 ms of every ``ragdb`` start."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, cast("Loader", self))
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module at the new path is imported (executed) already


def install() -> None:
    """Put the old-path finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.append(_OldPaths())
