"""ragdb list/delete --filter and show SOURCE: the CLI over documents(filter=), delete(filter=), get(source=)."""

from __future__ import annotations

import pytest

import ragdb
from cli_helpers import out_json, run


@pytest.fixture
def kb(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add_many([
            {"text": "pump maintenance schedule", "source": "ops/pump.md", "metadata": {"team": "ops", "year": 2024}},
            {"text": "valve inspection notes", "source": "ops/valve.md", "metadata": {"team": "ops", "year": 2023}},
            {"text": "quarterly revenue figures", "source": "fin/q3.md", "metadata": {"team": "finance"}},
        ])
    return path


def sources(runner, kb, *args):
    return sorted(d["source"] for d in out_json(run(runner, "-d", kb, "list", *args, "--json")))


def test_list_with_filter(runner, kb):
    assert sources(runner, kb, "--filter", "team=ops") == ["ops/pump.md", "ops/valve.md"]
    assert sources(runner, kb, "--filter", "team=ops", "--filter", "year=2024") == ["ops/pump.md"]
    assert sources(runner, kb, "--filter", "team=finance", "--filter", "team=ops") == [
        "fin/q3.md", "ops/pump.md", "ops/valve.md"]  # a repeated key is "any of"
    assert sources(runner, kb, "--source", "ops/*", "--filter", "year=2023") == ["ops/valve.md"]
    assert sources(runner, kb, "--filter", "team=nobody") == []


def test_delete_with_filter(runner, kb):
    assert out_json(run(runner, "-d", kb, "delete", "--filter", "team=ops", "--filter", "year=2023",
                        "--json")) == {"deleted": 1}
    assert sources(runner, kb) == ["fin/q3.md", "ops/pump.md"]
    assert out_json(run(runner, "-d", kb, "delete", "--source", "fin/*", "--filter", "team=ops",
                        "--json")) == {"deleted": 0}  # both must match
    assert out_json(run(runner, "-d", kb, "delete", "--filter", "team=ops", "--json")) == {"deleted": 1}
    assert sources(runner, kb) == ["fin/q3.md"]
    assert out_json(run(runner, "-d", kb, "check", "--json"))["ok"]


def test_delete_usage_errors(runner, kb):
    assert run(runner, "-d", kb, "delete", ok=False).exit_code == 2
    assert run(runner, "-d", kb, "delete", "--id", "1", "--filter", "team=ops", ok=False).exit_code == 2
    bad = run(runner, "-d", kb, "delete", "--filter", "team", ok=False)
    assert bad.exit_code == 2 and "KEY=VALUE" in bad.output
    assert sources(runner, kb) == ["fin/q3.md", "ops/pump.md", "ops/valve.md"]  # nothing deleted


def test_show_by_source(runner, kb):
    doc = out_json(run(runner, "-d", kb, "show", "ops/valve.md", "--json"))
    assert doc["source"] == "ops/valve.md" and doc["text"] == "valve inspection notes"
    missing = run(runner, "-d", kb, "show", "ops/none.md", ok=False)
    assert missing.exit_code == 1 and "ops/none.md" in missing.stderr
