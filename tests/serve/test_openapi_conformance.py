"""``ragdb serve`` against its own ``/openapi.json``: schemathesis generates requests from the
schema (valid and invalid ones, every method of every path) and checks each answer against it,
on a real server process on 127.0.0.1. Bounded (a fixed seed, few examples per operation)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("schemathesis")

import ragdb  # noqa: E402
from cli_helpers import serving  # noqa: E402

ADMIN = "admin-token-dddddddddddddddddd"

#: What the run checks. Left out: positive_data_acceptance, since a request the schema allows may
#: still be refused for what no JSON Schema states (offset + k over --max-k, a metadata filter the
#: library refuses); ignored_auth, object_level_authorization and use_after_free, which need
#: credentials or ids schemathesis cannot know.
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection,missing_required_header,unsupported_method,"
          "allow_header_conformance")


def test_the_server_answers_as_its_schema_says(tmp_path: Path) -> None:
    st = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if st is None:
        pytest.skip("the schemathesis command is not installed")
    kb = tmp_path / "kb.db"
    with ragdb.open(kb, embedder="hash") as db:  # vectors, so that every scorer answers
        db.add("The cat sat on the mat.", source="docs/cats.md", metadata={"lang": "en"})
        db.add("Team notes about mats.", source="team/a.md", acl=["team-a"])
    with serving(str(kb), tmp_path, "--collections", env={"RAGDB_API_TOKEN": ADMIN}) as url:
        result = subprocess.run([st, "run", f"{url}/openapi.json", "--checks", CHECKS, "--max-examples", "15",
                                 "--seed", "31", "--phases", "examples,coverage,fuzzing", "--no-color",
                                 "-H", f"Authorization: Bearer {ADMIN}"],
                                capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
