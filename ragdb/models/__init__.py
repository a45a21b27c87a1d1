"""Models ragdb calls: embedders (one contract in :mod:`~ragdb.models.embedder`), rerankers,
and the one HTTP client every remote endpoint goes through."""
