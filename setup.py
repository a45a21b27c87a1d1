"""The build of ragdb's optional compiled kernel, and of the wheel's migrations.

Metadata lives in pyproject.toml; this file adds what its tables cannot say:

* ``ragdb.index.ckernel`` (``ragdb/index/ckernel.pyx``, Cython 3) compiled with the C compiler.
  It is optional: where it cannot be built (no compiler, no Cython) the build warns and goes
  on, and ragdb scores with numpy, exactly, slower (``ragdb/index/kernel.py``). Set
  ``RAGDB_REQUIRE_KERNEL=1`` to make such a failure fail the build (cibuildwheel does).
  The C code is compiled without floating-point contraction (no fused multiply-add), so the
  kernel's sums are the very operations numpy does, bit for bit.
* ``ragdb.index.cpassages`` (``ragdb/index/cpassages.pyx``): the same, optional, for collapsing
  copies of one passage (word shingles and which hits share them; ``ragdb/index/hits.py`` holds
  the numpy reference, which gives the same values). Its Unicode tables are made here, by
  ``ragdb/index/unitables.py`` with the building Python, and compiled in as constant data.
* ``ragdb.text.canalysis`` (``ragdb/text/canalysis.pyx``): the same, optional, for the analyzer's
  hot loop (splitting, CJK terms, counting, a worker's term numbers; ``ragdb/text/analysis.py``
  holds the Python reference, which gives the same terms and counts).
* ``ragdb.index.cforward`` (``ragdb/index/cforward.pyx``): the same, optional, for decoding
  packed forward indexes (``ragdb/index/forward.py`` holds the numpy reference, the same values).
* ``migrations/`` (the numbered SQL files) copied into the wheel as ``ragdb/_migrations``
  (``ragdb.storage.store.migrations_dir``); a source checkout reads them where they are.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("RAGDB_REQUIRE_KERNEL", "") not in ("", "0")


def _warn(message: str) -> None:
    if REQUIRED:
        raise SystemExit(f"ragdb: {message} (RAGDB_REQUIRE_KERNEL is set)")
    sys.stderr.write(f"WARNING ragdb: {message}; ragdb will score with numpy (slower, same results)\n")


class OptionalBuildExt(build_ext):
    """build_ext that warns and goes on when an extension does not compile."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001 - no compiler: DistutilsPlatformError and friends
            _warn(f"the compiled kernel was not built ({e})")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001 - a compiler error, a missing header
            _warn(f"the compiled kernel {ext.name} was not built ({e})")

    def build_extensions(self) -> None:
        flags = ["/O2", "/fp:precise"] if self.compiler.compiler_type == "msvc" else ["-O3", "-ffp-contract=off"]
        generated = _write_unicode_tables(Path(self.build_temp) / "generated")
        for ext in self.extensions:
            ext.extra_compile_args = flags + list(ext.extra_compile_args or [])
            ext.include_dirs = [str(generated), *ext.include_dirs]
        super().build_extensions()


def _write_unicode_tables(folder: Path) -> Path:
    """``ragdb_unitables.h`` in ``folder``: the Unicode tables cpassages reads, as constant C
    arrays, made by ragdb/index/unitables.py with this Python (the one the modules are built
    for, whose Unicode data they must follow). The file is loaded by its path: importing the
    ragdb package would need its dependencies, which a build does not have."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ragdb_unitables", HERE / "ragdb" / "index" / "unitables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder.mkdir(parents=True, exist_ok=True)
    module.write_header(str(folder / "ragdb_unitables.h"))
    return folder


class BuildPyWithMigrations(build_py):
    """build_py that also copies ``migrations/`` into the package as ``ragdb/_migrations``."""

    def run(self) -> None:
        super().run()
        source = HERE / "migrations"
        if source.is_dir():
            target = Path(self.build_lib) / "ragdb" / "_migrations"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed, so the compiled kernel was not built")
        return []
    exts = [Extension("ragdb.index.ckernel", ["ragdb/index/ckernel.pyx"]),
            Extension("ragdb.index.cpassages", ["ragdb/index/cpassages.pyx"]),
            Extension("ragdb.text.canalysis", ["ragdb/text/canalysis.pyx"]),
            Extension("ragdb.index.cforward", ["ragdb/index/cforward.pyx"]),
            Extension("ragdb.index.cterms", ["ragdb/index/cterms.pyx"])]
    return cythonize(exts, compiler_directives={"language_level": "3"}, quiet=True)


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithMigrations},
)
