"""Types of the compiled scoring kernel (``ragdb/index/ckernel.pyx``)."""

from typing import Any

import numpy as np

def bm25_accumulate(scores: np.ndarray, norm: np.ndarray, postings: list[tuple[Any, Any] | None], idfs: list[float],
                    weights: list[float], flats: list[bool], flat: float) -> None: ...
def top_k(scores: np.ndarray, mask: np.ndarray, k: int, floor: float) -> tuple[np.ndarray, np.ndarray]: ...
def any_allowed(ids: Any, mask: np.ndarray) -> bool: ...
