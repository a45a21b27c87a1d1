"""Helpers shared by the CLI tests: invoking ``ragdb`` in process and reading its JSON."""

from __future__ import annotations

from typing import Any

import orjson
from click.testing import CliRunner, Result

from ragdb.cli import cli


def run(runner: CliRunner, *args: Any, input: str | None = None, env: dict[str, str] | None = None,
        ok: bool = True) -> Result:
    """``ragdb ARGS...`` through click's runner; asserts exit status 0 unless ``ok=False``."""
    result = runner.invoke(cli, [str(a) for a in args], input=input, env=env, catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def out_json(result: Result) -> Any:
    return orjson.loads(result.stdout)
