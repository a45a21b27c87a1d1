"""Regular expressions compiled on their first use.

Python's ``re`` compiles a pattern in Python code: 0.1-0.7 ms each for ragdb's (2-3 ms for a
character class of the CJK ranges, whose 28,000 characters its compiler visits one by one),
and its cache lives only as long as the process. A module-level ``re.compile`` is paid by every
process that imports the module, whether it uses the pattern or not: every command-line
search. A :class:`LazyPattern` compiles when one of its methods is first looked up.
(No library does this; ``regex`` compiles eagerly too.)
"""

from __future__ import annotations

import re
from typing import Any


class LazyPattern:
    """A regex compiled on its first use, with the compiled pattern's methods and attributes
    (``search``, ``findall``, ``pattern``, ...). A method looked up once is kept on the object,
    so later lookups cost what an attribute does, not a call of ``__getattr__``."""

    def __init__(self, source: str, flags: int = 0) -> None:
        self._source = source
        self._flags = flags

    @property
    def compiled(self) -> bool:
        """Whether the pattern was used (and so compiled) in this process."""
        return len(self.__dict__) > 2  # (_source, _flags and the methods looked up)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # (copy, pickle and the like probe dunders: not the pattern's)
            raise AttributeError(name)
        value = getattr(re.compile(self._source, self._flags), name)  # (re's own cache: compiled once)
        self.__dict__[name] = value
        return value
