"""Fixtures shared by the test modules.

A module that defines a fixture of the same name (several define their own
``db``) overrides the one here for its tests.
"""

import gc

import pytest
from click.testing import CliRunner

import ragdb


@pytest.fixture(autouse=True)
def _collector_left_as_found():
    """Every test leaves the garbage collector as it found it: one test's fixture once left it
    off, and every test after it in the session ran without it."""
    was = gc.isenabled()
    yield
    now = gc.isenabled()
    if now != was:
        (gc.enable if was else gc.disable)()
        pytest.fail(f"the test left the garbage collector {'on' if now else 'off'} (it was {'on' if was else 'off'})")


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def db(tmp_path):
    """A fresh, empty database file (``kb.db`` in the test's temporary folder), closed afterwards."""
    database = ragdb.open(tmp_path / "kb.db")
    try:
        yield database
    finally:
        database.close()


#: (source, text, metadata, acl) of the documents in ``filled_db``
SMALL_DOCS = (
    ("docs/cats.md", "The cat sat on the mat near the door.", {"lang": "en", "team": "x", "tags": ["pets"]}, ("staff",)),
    ("docs/dogs.md", "Dogs chase cats around the park every morning.", {"lang": "en", "team": "y"}, ("staff", "public")),
    ("docs/physics.md", "Quantum physics describes black holes and particles.", {"lang": "en", "team": "x"}, ()),
    ("notes/katze.txt", "Die Katze schläft auf der Matte.", {"lang": "de", "team": "y", "tags": ["pets", "de"]}, ("public",)),
    ("notes/mats.txt", "A mat is a flat piece of fabric on the floor.", {"lang": "en", "team": "y", "rank": 2}, ()),
)


@pytest.fixture
def small_docs():
    """The (source, text, metadata, acl) tuples that ``filled_db`` holds."""
    return SMALL_DOCS


@pytest.fixture
def filled_db(db):
    """``db`` holding ``SMALL_DOCS`` (one chunk each)."""
    for source, text, metadata, acl in SMALL_DOCS:
        db.add(text, source=source, metadata=metadata, acl=list(acl), chunker="none")
    return db


# -- PostgreSQL ------------------------------------------------------------------------------
# The PostgreSQL tests need a server: RAGDB_TEST_PG (and RAGDB_TEST_PG_REPLICA for the replica
# test) name one, as `eval "$(scripts/pg-test-cluster start)"` exports them (.ci/run does so).
# Without them, a throwaway cluster is started with that script when PostgreSQL's binaries are
# installed; otherwise the tests skip, saying why, except under CI=true, where that is a failure.
import os  # noqa: E402
import subprocess  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import quote  # noqa: E402

_REPO = Path(__file__).resolve().parent.parent
_CLUSTER: dict[str, str] = {}


def _pg_unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required under CI=true: {reason}")
    pytest.skip(f"no PostgreSQL server: {reason} (set RAGDB_TEST_PG, or install PostgreSQL: see docs/postgresql.md)")


def _start_cluster() -> dict[str, str]:
    if _CLUSTER:
        return _CLUSTER
    script = _REPO / "scripts" / "pg-test-cluster"
    try:
        done = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=180,
                              env={**os.environ, "RAGDB_PG_INSTALL": "0"})
    except (OSError, subprocess.TimeoutExpired) as e:
        _CLUSTER["error"] = f"scripts/pg-test-cluster could not run: {e}"
        return _CLUSTER
    if done.returncode != 0:
        _CLUSTER["error"] = " ".join((done.stderr or done.stdout).split())[-300:] or "pg-test-cluster failed"
        return _CLUSTER
    for line in done.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            _CLUSTER[key] = value.strip("'")
    return _CLUSTER


@pytest.fixture(scope="session")
def pg_server():
    """The URL of the PostgreSQL primary the tests use (see above)."""
    url = os.environ.get("RAGDB_TEST_PG")
    started = False
    if not url:
        cluster = _start_cluster()
        if "error" in cluster:
            _pg_unavailable(cluster["error"])
        url = cluster["RAGDB_TEST_PG"]
        started = True
    try:
        import psycopg
    except ImportError:
        _pg_unavailable("psycopg is not installed (pip install 'ragdb[postgres]')")
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.Error as e:
        _pg_unavailable(f"cannot connect to RAGDB_TEST_PG: {type(e).__name__}")
    yield url
    if started and _CLUSTER.get("RAGDB_PG_CLUSTER_DIR"):
        subprocess.run(["bash", str(_REPO / "scripts" / "pg-test-cluster"), "stop", _CLUSTER["RAGDB_PG_CLUSTER_DIR"]],
                       capture_output=True, timeout=120)
        _CLUSTER.clear()


@pytest.fixture(scope="session")
def pg_replica(pg_server):
    """The URL of a hot-standby replica streaming from ``pg_server``."""
    url = os.environ.get("RAGDB_TEST_PG_REPLICA") or _CLUSTER.get("RAGDB_TEST_PG_REPLICA")
    if not url:
        _pg_unavailable("RAGDB_TEST_PG_REPLICA names no replica")
    return url


def with_schema(url: str, schema: str) -> str:
    """``url`` whose connections use ``schema`` (libpq options=-csearch_path=...)."""
    return url + ("&" if "?" in url else "?") + "options=" + quote(f"-csearch_path={schema}", safe="")


@pytest.fixture
def pg_url(pg_server):
    """A URL of an empty schema of its own on the test server (dropped afterwards): a new
    ragdb database."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a generated name, not input
    yield with_schema(pg_server, schema)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- markers ---------------------------------------------------------------------------------------
# The whole suite runs by default (CI, and the README's second command). For the development loop,
# `pytest -m "not slow"` leaves out what takes most of the time; the markers are given here, from
# what a test is, so that a new test is marked without anyone remembering to:
#   postgres     it uses the PostgreSQL server (the pg_server, pg_url or pg_replica fixture);
#   reliability  the reliability scenarios (tests/engine/test_reliability.py: crashes, concurrency);
#   slow         any of those, a hypothesis property test, or a test that starts servers/processes.
_SLOW_MODULES = {"test_reliability", "test_server", "test_mcp", "test_embed_follow", "test_langchain",
                 "test_llama_index", "test_reopen", "test_api_parity", "test_client"}
_PG_FIXTURES = {"pg_server", "pg_url", "pg_replica"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.stem
        slow = module in _SLOW_MODULES
        if _PG_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.postgres)
            slow = True
        if module == "test_reliability":
            item.add_marker(pytest.mark.reliability)
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            slow = True
        if slow:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=["compiled", "numpy"])
def each_kernel(request):
    """Runs the test once per scoring kernel (``ragdb.index.kernel``): the compiled one and the
    numpy reference, so property tests hold the two to the same hits, order and scores. Where
    the compiled kernel is not installed its run skips, except under CI=true, where it fails."""
    from ragdb.index import kernel

    if request.param not in kernel.available():
        if os.environ.get("CI") == "true":
            pytest.fail("the compiled kernel is not installed (setup.py could not build it)")
        pytest.skip("the compiled kernel is not installed")
    before = kernel.use(request.param)
    try:
        yield request.param
    finally:
        kernel.use(before)
