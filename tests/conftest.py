"""Fixtures shared by the test modules.

A module that defines a fixture of the same name (several define their own
``db``) overrides the one here for its tests.
"""

import pytest
from click.testing import CliRunner

import ragdb


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
