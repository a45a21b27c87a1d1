"""Types of the compiled half of the analyzer (``ragdb/text/canalysis.pyx``)."""

from collections.abc import Callable
from typing import Any

MEMO_TOKENS: int
MEMO_CHARS: int
MAX_TERMS: int

def word_class(chars: str) -> list[int]: ...

class Analysis:
    def __init__(self, expand: Callable[[list[str]], list[tuple[str, ...]]], cjk_stop: frozenset[str],
                 counts_type: type, overlap: str, stop: frozenset[str] = ...,
                 stem: Callable[[list[str]], list[str]] | None = ..., max_chars: int = ...,
                 dotted: frozenset[str] = ...) -> None: ...
    def counts(self, texts: list[str]) -> list[Any] | None: ...
    def pack(self, texts: list[str], numbering: Any, limit: int
             ) -> tuple[bool, str, bytes, bytes, bytes, bytes] | None: ...
    def give_back(self, numbering: Any) -> None: ...

def token_table(norm: str, memo: dict[str, tuple[list[tuple[str, int, int, int]], int]],
                starts: list[int] | None, ends: list[int] | None, cjk_stop: frozenset[str],
                learn: Callable[[list[str]], list[tuple[list[tuple[str, int, int, int]], int]]]
                ) -> tuple[list[str], bytes] | None: ...
