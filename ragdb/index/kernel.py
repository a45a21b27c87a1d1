"""Which scoring kernel runs: the compiled one (``ragdb.index.ckernel``, C from Cython, built at
``pip install`` where a compiler is found) or numpy, the reference and the fallback.

Both give the same hits in the same order with the same scores (the property tests run on
both). The environment variable ``RAGDB_KERNEL`` chooses: ``numpy`` forces the fallback,
``compiled`` requires the compiled kernel (an import of ragdb fails without it: for wheel
tests), anything else or unset takes the compiled kernel when it is installed.

The same switch chooses for every compiled part of ragdb: collapsing copies of a passage
(``ragdb.index.cpassages``, :mod:`ragdb.index.hits`) and the analyzer's hot loop
(``ragdb.text.canalysis``, :meth:`ragdb.text.analysis.Analyzer.compiled`), whose Python code
gives the same terms and counts. ``RAGDB_KERNEL=numpy`` runs all of them in Python/numpy,
``RAGDB_KERNEL=compiled`` requires all of them (the wheel tests), and :func:`use` switches them
together (a part not installed runs in Python/numpy).
"""

from __future__ import annotations

import os
from types import ModuleType

from ragdb.errors import InvalidInput, MissingDependency

NAMES = ("compiled", "numpy")

try:  # built by setup.py; absent where no compiler was found
    from ragdb.index import ckernel as _compiled_module
    _compiled: ModuleType | None = _compiled_module
except ImportError:  # pragma: no cover - a platform without the extension
    _compiled = None


def _initial() -> ModuleType | None:
    wanted = os.environ.get("RAGDB_KERNEL", "").strip().lower()
    if wanted == "numpy":
        return None
    if wanted == "compiled" and (_compiled is None or not _analysis_compiled()):
        raise MissingDependency("RAGDB_KERNEL=compiled, but ragdb's compiled kernel is not installed "
                         "(reinstall ragdb where a C compiler is found)")
    return _compiled


def _analysis_compiled() -> bool:
    from ragdb.text import analysis

    return analysis.compiled_available()


_active: ModuleType | None = _initial()


def compiled() -> ModuleType | None:
    """The compiled kernel module when it runs, else None (numpy scores)."""
    return _active


def name() -> str:
    """``"compiled"`` or ``"numpy"``: the kernel searches use now."""
    return "numpy" if _active is None else "compiled"


def available() -> tuple[str, ...]:
    """The kernels this installation has (numpy always)."""
    return NAMES if _compiled is not None else ("numpy",)


def use(kernel: str) -> str:
    """Switch this process to ``kernel`` (``"compiled"`` or ``"numpy"``); returns the one before.
    For tests and benchmarks that compare the two; ``RAGDB_KERNEL`` is the way for users."""
    global _active
    if kernel not in NAMES:
        raise InvalidInput(f"unknown kernel {kernel!r}: expected one of {', '.join(NAMES)}")
    if kernel == "compiled" and _compiled is None:
        raise MissingDependency("the compiled kernel is not installed (reinstall ragdb where a C compiler is found)")
    before = name()
    _active = _compiled if kernel == "compiled" else None
    from ragdb.text import analysis

    analysis.use_compiled(kernel == "compiled")  # (the text layer cannot import this one: told here)
    return before
