"""A ragdb plugin: the embedder ``myplugin-embedder`` and the ``xyz`` loader (``.xyz`` files).

An ``.xyz`` file is ``key: value`` header lines, a blank line, then the text; ``title``
becomes the document's title, the other keys its metadata (prefixed ``xyz_``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

import ragdb.plugins
from ragdb.types import LoadedDocument


class PluginEmbedder:
    """Words hashed into 16 buckets, L2-normalized (zero rows for blank texts)."""

    name = "myplugin-embedder"
    dimensions = 16

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[i, hashlib.sha256(word.encode()).digest()[0] % self.dimensions] += 1.0
            norm = float(np.linalg.norm(out[i]))
            if norm:
                out[i] /= norm
        return out


def load_xyz(data: bytes, source: str) -> LoadedDocument:
    header, _, body = data.decode("utf-8").partition("\n\n")
    fields = dict(line.split(":", 1) for line in header.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    title = fields.pop("title", None)
    return LoadedDocument(text=body, source=source, title=title,
                          metadata={f"xyz_{k}": v for k, v in fields.items()})


@ragdb.plugins.hookimpl
def register_embedders(register):
    register("myplugin-embedder", PluginEmbedder)


@ragdb.plugins.hookimpl
def register_loaders(register):
    register("xyz", load_xyz, suffixes=[".xyz"])
