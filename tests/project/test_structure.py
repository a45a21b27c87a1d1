"""Architecture rules of the ``ragdb`` package, checked on its source with ``ast``.

* no SQL outside the storage layer (``ragdb/storage/``): no ``execute`` calls,
  no string that reads as a statement, no ``import sqlite3``;
* no import cycle between ragdb modules;
* the layers: a package (concern) imports only packages of lower layers (:data:`LAYERS`);
* no access to another module's ``_private`` names;
* the package ships ``py.typed``;
* docs/how-it-works.md names every table of a freshly created database.

Each checker is a plain function over a package folder, so the ``*_catches_*``
tests below run it on a small package written under ``tmp_path`` with a
planted violation: a checker that stopped finding anything fails them.
"""

from __future__ import annotations

import ast
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import ragdb

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ragdb"
STORAGE = "storage"  # the storage layer: ragdb/storage/, the only place SQL may live

# --------------------------------------------------------------------------- reading the package


def modules(pkg: Path) -> Iterator[tuple[str, Path, ast.Module]]:
    """(dotted module name, file, parsed tree) of every module under ``pkg``."""
    for path in sorted(pkg.rglob("*.py")):
        parts = [pkg.name, *path.relative_to(pkg).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def in_storage(pkg: Path, path: Path) -> bool:
    return path.relative_to(pkg).parts[0] == STORAGE


def where(pkg: Path, path: Path, node: ast.AST) -> str:
    return f"{pkg.name}/{path.relative_to(pkg).as_posix()}:{getattr(node, 'lineno', 0)}"


# --------------------------------------------------------------------------- rule 1: SQL only in storage

_VERBS = r"SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER|WITH"
SQL_PATTERNS = (
    # a statement verb followed (within one statement's length) by one of its clauses
    re.compile(rf"\b(?:{_VERBS})\b.{{0,400}}?\b(?:FROM|INTO|SET|TABLE|INDEX|TRIGGER|VIEW|WHERE|VALUES)\b", re.S),
    # a string that starts with SELECT, the one statement that needs no clause ("SELECT 1")
    re.compile(r"^\s*SELECT\s"),
    # a pragma ("PRAGMA foreign_keys = ON", "PRAGMA page_count")
    re.compile(r"\bPRAGMA\s+[a-z_]+"),
    # a whole string that is one bare transaction or maintenance statement
    # (PostgreSQL's too: savepoint and table names computed, shown as "?"; session settings)
    re.compile(r"^\s*(?:BEGIN(?:\s+(?:IMMEDIATE|EXCLUSIVE|DEFERRED))?(?:\s+TRANSACTION)?|COMMIT|ROLLBACK"
               r"(?:\s+TO(?:\s+SAVEPOINT)?\s+[\w?]+)?|SAVEPOINT\s+[\w?]+|RELEASE(?:\s+SAVEPOINT)?\s+[\w?]+"
               r"|VACUUM(?:\s+ANALYZE)?(?:\s+[\w?]+)?|ANALYZE|REINDEX|ATTACH\s.+|DETACH\s+\w+"
               r"|SET\s+SESSION\s+CHARACTERISTICS\s.+)\s*;?\s*$", re.S),
)
EXECUTE_METHODS = {"execute", "executemany", "executescript"}


def looks_like_sql(text: str) -> bool:
    return any(p.search(text) for p in SQL_PATTERNS)


def _rendered(node: ast.expr) -> str | None:
    """The text of a string expression, ``?`` for its computed parts: a constant, an
    f-string, or a ``+`` chain holding at least one string constant; else None."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "?" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _rendered(node.left), _rendered(node.right)
        if left is None and right is None:
            return None
        return (left or "?") + (right or "?")
    return None


def string_expressions(tree: ast.AST) -> Iterator[tuple[ast.expr, str]]:
    """Every string constant, f-string and string ``+`` chain, with its text. The parts
    of an f-string or chain are reported with it, not again on their own."""
    inner: set[int] = set()
    for node in ast.walk(tree):
        if id(node) in inner or not isinstance(node, ast.expr):
            continue
        text = _rendered(node)
        if text is None:
            continue
        yield node, text
        inner.update(id(n) for n in ast.walk(node) if n is not node)


def sql_problems(pkg: Path) -> list[str]:
    """SQL outside ``pkg/storage/``: execute calls, statement-like strings, sqlite3 imports."""
    problems = []
    for _name, path, tree in modules(pkg):
        if in_storage(pkg, path):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in EXECUTE_METHODS):
                problems.append(f"{where(pkg, path, node)}: calls .{node.func.attr}()")
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sqlite3" for a in node.names):
                problems.append(f"{where(pkg, path, node)}: imports sqlite3")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "sqlite3":
                problems.append(f"{where(pkg, path, node)}: imports from sqlite3")
        for node, text in string_expressions(tree):
            if looks_like_sql(text):
                problems.append(f"{where(pkg, path, node)}: SQL-like string {text[:80]!r}")
    return problems


def test_no_sql_outside_the_storage_layer():
    problems = sql_problems(PACKAGE)
    assert not problems, "SQL belongs in ragdb/storage/:\n" + "\n".join(problems)


def test_sqlite3_is_imported_only_by_the_storage_layer():
    importers = set()
    for _name, path, tree in modules(PACKAGE):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] == "sqlite3" for n in names):
                importers.add(path)
    outside = sorted(p.relative_to(ROOT).as_posix() for p in importers if not in_storage(PACKAGE, p))
    assert not outside, f"import sqlite3 outside ragdb/storage/: {outside}"
    assert importers, "the storage layer no longer imports sqlite3? the check is looking in the wrong place"


def test_the_sql_detector_recognizes_every_statement_of_the_storage_layer():
    """Each literal statement the storage layer executes reads as SQL to the detector
    (so the detector would catch it anywhere else), and it has found plenty."""
    seen, missed = 0, []
    for _name, path, tree in modules(PACKAGE):
        if not in_storage(PACKAGE, path):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in EXECUTE_METHODS and node.args):
                text = _rendered(node.args[0])
                if text is None or text.startswith("?"):  # a variable, or one built from one
                    continue
                seen += 1
                if not looks_like_sql(text):
                    missed.append(f"{where(PACKAGE, path, node)}: {text[:80]!r}")
    assert not missed, "the SQL detector misses these statements:\n" + "\n".join(missed)
    assert seen > 50


PROSE = [
    "Flush pending postings, merge each term's segments into one (dropping\n deleted chunks), "
    "forget unused terms, then ``ANALYZE`` and ``VACUUM``.",
    "Merge postings, drop deleted entries and reclaim space (ANALYZE, VACUUM).",
    "Every public method is one write transaction (``BEGIN IMMEDIATE``; nested in "
    "``Database.transaction()`` it is a savepoint).",
    "Select the best chunks from the index; delete a document by id.",
    "DELETE the stale documents, then UPDATE the statistics.",
    "A: added, M: modified, D: deleted",
]
STATEMENTS = [
    "SELECT id FROM chunks WHERE doc_id = ?",
    "INSERT INTO vocabulary (id, term, df) VALUES (?, ?, ?)",
    "UPDATE stats SET generation = generation + 1",
    "DELETE FROM chunk_log",
    "CREATE INDEX x ON chunks (doc_id)",
    "DROP TABLE dead_chunks",
    "SELECT 1",
    "PRAGMA foreign_keys = ON",
    "BEGIN IMMEDIATE",
    "COMMIT",
    "VACUUM",
]


@pytest.mark.parametrize("text", PROSE)
def test_the_sql_detector_lets_prose_pass(text):
    assert not looks_like_sql(text)


@pytest.mark.parametrize("text", STATEMENTS)
def test_the_sql_detector_flags_statements(text):
    assert looks_like_sql(text)


def test_the_sql_detector_wants_upper_case_keywords():
    """A known limit: lower-case SQL passes (ragdb writes its keywords in upper case,
    and lower-case prose such as "select ... from" is common)."""
    assert not looks_like_sql("select id from chunks")


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A throwaway package ``root/ragdb`` with these files (relative path -> source)."""
    pkg = root / "ragdb"
    for rel, source in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return pkg


def test_sql_problems_catches_planted_sql(tmp_path):
    storage_code = "import sqlite3\n\ndef f(conn):\n    conn.execute('DELETE FROM chunks WHERE id = ?', [1])\n"
    pkg = write_package(tmp_path, {
        "storage/__init__.py": "", "storage/store.py": storage_code,
        "clean.py": '"""Delete documents, then ``VACUUM``."""\nX = "ANALYZE the results"\n',
        "a.py": "def f(store):\n    store.conn.execute('x')\n",
        "b.py": "import sqlite3\n",
        "c.py": "def f(cols):\n    return f'SELECT {cols} FROM documents d'\n",
        "d.py": "def f(cols):\n    return 'SELECT ' + cols + ' FROM chunks'\n",
        "e.py": "Q = '''\n    UPDATE stats\n    SET n_docs = n_docs + 1\n'''\n",
        "f.py": "from sqlite3 import connect\n",
        "g.py": "def f(c):\n    c.executemany(None, [])\n    c.executescript(None)\n",
    })
    found = sql_problems(pkg)
    flagged = {p.split(":")[0] for p in found}
    assert flagged == {"ragdb/a.py", "ragdb/b.py", "ragdb/c.py", "ragdb/d.py", "ragdb/e.py", "ragdb/f.py",
                       "ragdb/g.py"}, found
    assert len([p for p in found if p.startswith("ragdb/g.py")]) == 2


# --------------------------------------------------------------------------- rule 2: no import cycle


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements at any depth (functions included) except those under
    ``if TYPE_CHECKING:``, which never run."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """module -> the package's modules whose code importing it runs.

    ``from X import n`` targets the submodule ``X.n`` when there is one, else ``X``
    (a package's ``__init__``). Importing ``a.b.c`` also runs the packages above it,
    except those the importer lives in (they are already being imported)."""
    found = {name: (path, tree) for name, path, tree in modules(pkg)}
    root = pkg.name
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, (path, tree) in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}  # itself and its packages
        for node in _runtime_imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in found else base)
            for target in targets:
                if target.split(".")[0] != root:
                    continue
                if target not in found:  # not a module of the package (a broken import)
                    continue
                parts = target.split(".")
                graph[name].add(target)  # explicit: counts even if it is a package the importer is in
                for i in range(1, len(parts)):
                    parent = ".".join(parts[:i])
                    if parent not in own:
                        graph[name].add(parent)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_between_ragdb_modules():
    graph = import_graph(PACKAGE)
    assert "ragdb.storage.store" in graph["ragdb.storage"]  # the graph sees relative imports
    assert "ragdb.database" in graph["ragdb"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# --------------------------------------------------------------------------- rule 2b: the layers

#: The concerns of ``ragdb``, bottom up: a module may import its own package and the packages
#: (or top-level modules) of lower layers, never one of its own layer or above. ``ragdb`` is the
#: public API (``ragdb/__init__.py``): the servers, the CLI and the integrations are thin layers
#: over it. docs/architecture.md draws the same map.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "patterns"}),
    frozenset({"records"}),
    frozenset({"types", "options", "plugins"}),
    frozenset({"storage"}),
    frozenset({"text", "query", "models"}),
    frozenset({"index"}),
    frozenset({"engine", "answers"}),
    frozenset({"database"}),
    frozenset({"files", "compat", "client"}),
    frozenset({"ragdb"}),
    frozenset({"serve"}),
    frozenset({"cli", "integrations"}),
)


def concern(module: str) -> str:
    """``ragdb.index.vectors`` -> ``index``; ``ragdb.errors`` -> ``errors``; ``ragdb`` -> ``ragdb``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layering_violations(pkg: Path, layers: tuple[frozenset[str], ...] = LAYERS) -> list[str]:
    """Each import that goes sideways or up the layers, and each concern no layer names."""
    layer = {name: i for i, names in enumerate(layers) for name in names}
    problems = []
    for module, targets in sorted(import_graph(pkg).items()):
        a = concern(module)
        if a not in layer:
            problems.append(f"{module}: its concern {a!r} is in no layer (add it to LAYERS)")
            continue
        for target in sorted(targets):
            b = concern(target)
            if b != a and layer.get(b, len(layers)) >= layer[a]:
                problems.append(f"{module} imports {target}: {a!r} (layer {layer[a]}) may not import "
                                f"{b!r} (layer {layer.get(b, '?')})")
    return problems


def test_packages_import_only_lower_layers():
    problems = layering_violations(PACKAGE)
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_layering_catches_a_planted_upward_import(tmp_path):
    pkg = tmp_path / "ragdb"
    files = {
        "__init__.py": "from .database import Database\n",
        "errors.py": "class RagdbError(Exception): ...\n",
        "database.py": "from .engine.state import Engine\nfrom .errors import RagdbError\n",
        "engine/__init__.py": "",
        "engine/state.py": "from ragdb.index import inverted\n\nclass Engine: ...\n",
        "index/__init__.py": "",
        "index/inverted.py": "from ragdb.errors import RagdbError\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert layering_violations(pkg) == []
    (pkg / "index" / "inverted.py").write_text("def f():\n    from ragdb.engine.state import Engine\n")  # upward
    (pkg / "engine" / "check.py").write_text("from ragdb import database\n")  # upward, to a top-level module
    (pkg / "oddity.py").write_text("")
    assert layering_violations(pkg) == [
        "ragdb.engine.check imports ragdb.database: 'engine' (layer 6) may not import 'database' (layer 7)",
        "ragdb.index.inverted imports ragdb.engine: 'index' (layer 5) may not import 'engine' (layer 6)",
        "ragdb.index.inverted imports ragdb.engine.state: 'index' (layer 5) may not import 'engine' (layer 6)",
        "ragdb.oddity: its concern 'oddity' is in no layer (add it to LAYERS)",
    ]


def test_find_cycle_catches_planted_cycles(tmp_path):
    pkg = write_package(tmp_path, {
        "__init__.py": "from .a import A\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\nA = 1\n",
        "b.py": "from . import a\nB = 2\n",
        "storage/__init__.py": "from .store import Store\n",
        "storage/store.py": "from . import codec\nfrom .codec import dumps\nclass Store: ...\n",
        "storage/codec.py": "def dumps(x): return x\n",
    })
    assert find_cycle(import_graph(pkg)) is None  # TYPE_CHECKING-only import, a package's own submodules

    (pkg / "storage" / "codec.py").write_text("def dumps(x):\n    from ..b import B\n    return x\n")
    (pkg / "b.py").write_text("from .storage.store import Store\nB = 2\n")
    cycle = find_cycle(import_graph(pkg))  # function-level import, absolute-in-package, package __init__
    assert cycle is not None and "ragdb.b" in cycle and "ragdb.storage.codec" in cycle, cycle

    (pkg / "storage" / "codec.py").write_text("def dumps(x): return x\n")
    (pkg / "storage" / "store.py").write_text("from . import dumps\nclass Store: ...\n")  # from its own __init__
    (pkg / "storage" / "__init__.py").write_text("from .codec import dumps\nfrom .store import Store\n")
    assert find_cycle(import_graph(pkg)) == ["ragdb.storage", "ragdb.storage.store", "ragdb.storage"]

    (pkg / "storage" / "store.py").write_text("class Store: ...\n")
    (pkg / "b.py").write_text("import ragdb.c\n")
    (pkg / "c.py").write_text("def f():\n    import ragdb\n")
    (pkg / "a.py").write_text("from . import b\nA = 1\n")
    assert find_cycle(import_graph(pkg)) == ["ragdb", "ragdb.a", "ragdb.b", "ragdb.c", "ragdb"]


# --------------------------------------------------------------------------- rule 3: no cross-module private access

#: (file, expression) -> why it is allowed. Every entry must still occur (a stale one fails).
PRIVATE_ACCESS_ALLOWED = {
    ("ragdb/text/analysis.py", "self.pool._receive"):
        "_Job and AnalysisPool are both defined in analysis.py: a module using its own private method",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_level_names(tree: ast.Module) -> set[str]:
    """Names the module itself defines at top level (def, class, assignment; not imports)."""
    names: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor,
                               ast.With, ast.AsyncWith)):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [item.optional_vars for item in node.items if item.optional_vars] \
                if isinstance(node, (ast.With, ast.AsyncWith)) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                stack.extend(node.body)
        elif isinstance(node, (ast.If, ast.Try, ast.While)):
            stack.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return names


def private_access(pkg: Path) -> list[tuple[str, str, str]]:
    """(file, expression, location) of every private name reached across objects:
    ``x._name`` where ``x`` is not ``self``, ``cls``, ``super()``, ``type(self)`` or a
    name the module defines, and ``from ragdb.other import _name``."""
    found = []
    for _name, path, tree in modules(pkg):
        rel = f"{pkg.name}/{path.relative_to(pkg).as_posix()}"
        own = module_level_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                obj = node.value
                if isinstance(obj, ast.Name) and (obj.id in ("self", "cls") or obj.id in own):
                    continue
                if (isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id in ("super", "type")
                        and all(isinstance(a, ast.Name) and a.id == "self" for a in obj.args)):
                    continue  # super()._x, type(self)._x: the object's own class
                found.append((rel, ast.unparse(node), where(pkg, path, node)))
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == pkg.name):
                for alias in node.names:
                    if _is_private(alias.name):
                        stmt = ast.unparse(ast.ImportFrom(module=node.module, names=[ast.alias(alias.name)],
                                                          level=node.level))
                        found.append((rel, stmt, where(pkg, path, node)))
    return found


def test_no_private_access_across_modules():
    found = private_access(PACKAGE)
    unexpected = [f"{loc}: {expr}" for rel, expr, loc in found if (rel, expr) not in PRIVATE_ACCESS_ALLOWED]
    assert not unexpected, "private names used across objects/modules:\n" + "\n".join(unexpected)
    stale = set(PRIVATE_ACCESS_ALLOWED) - {(rel, expr) for rel, expr, _ in found}
    assert not stale, f"allow-list entries that no longer occur (remove them): {sorted(stale)}"


def test_private_access_catches_planted_access(tmp_path):
    pkg = write_package(tmp_path, {
        "a.py": ("_cache = {}\n\nclass _Pool:\n    _n = 0\n\n"
                 "def f(db, vectors):\n"
                 "    _cache.clear(); _Pool._n += 1\n"  # the module's own names: fine
                 "    return db._store, vectors._minmax, db.__class__\n"),
        "b.py": ("from . import a\nfrom .a import _cache\nimport os as _os\n\nclass C(dict):\n"
                 "    def m(self, other):\n        super()._x; self._y; type(self)._z; type(other)._v\n"
                 "        return a._Pool, self.other._w\n"),
    })
    got = {(rel, expr) for rel, expr, _ in private_access(pkg)}
    assert got == {("ragdb/a.py", "db._store"), ("ragdb/a.py", "vectors._minmax"),
                   ("ragdb/b.py", "from .a import _cache"), ("ragdb/b.py", "type(other)._v"),
                   ("ragdb/b.py", "a._Pool"), ("ragdb/b.py", "self.other._w")}, got


# --------------------------------------------------------------------------- rule 4: typed


def test_the_package_ships_py_typed():
    assert (PACKAGE / "py.typed").is_file(), "ragdb/py.typed is missing: type checkers would ignore ragdb's hints"


# --------------------------------------------------------------------------- the schema is documented


def schema_objects(tmp_path: Path) -> dict[str, set[str]]:
    """type -> names (table, index, trigger) in a database freshly created by ragdb."""
    path = tmp_path / "x.db"
    ragdb.open(str(path)).close()
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    finally:
        conn.close()
    out: dict[str, set[str]] = {}
    for kind, name in rows:
        out.setdefault(kind, set()).add(name)
    return out


def test_how_it_works_lists_every_table_and_trigger(tmp_path):
    doc = (ROOT / "docs" / "how-it-works.md").read_text(encoding="utf-8")
    objects = schema_objects(tmp_path)
    assert {"documents", "chunks", "vocabulary", "postings"} <= objects["table"]
    missing = sorted(name for kind in ("table", "trigger") for name in objects.get(kind, ())
                     if f"`{name}`" not in doc)
    assert not missing, f"docs/how-it-works.md does not describe: {missing}"
