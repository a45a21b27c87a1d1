"""Helpers shared by the CLI tests: invoking ``ragdb`` in process and reading its JSON, and
``ragdb serve`` / ``ragdb mcp`` as real subprocesses."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
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


# --------------------------------------------------------------------------- servers as subprocesses
# (framework imports inside the functions: modules that use the CLI helpers only need none of them)

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(database: str, folder: Path, *args: str, env: dict[str, str] | None = None,
            root_args: tuple[str, ...] = ()) -> Iterator[str]:
    """``ragdb serve -d DATABASE ARGS`` (a file or a PostgreSQL URL) as a subprocess on a free
    loopback port, its stderr in ``folder``; yields its base URL once /healthz answers, and
    asserts afterwards that it logged no traceback. ``RAGDB_API_TOKEN`` only from ``env``;
    ``PYTHONPATH`` the repository's unless ``env`` gives one."""
    import httpx

    port = free_port()
    err_path = folder / f"serve-{port}.err"
    environment = {k: v for k, v in os.environ.items() if k != "RAGDB_API_TOKEN"}
    environment.update({"PYTHONPATH": str(ROOT), **(env or {})})
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ragdb.cli", *root_args, "serve", "-d", database,
                                 "--port", str(port), *args], env=environment, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # a guard against a server that never starts, not a timing assertion
        while True:
            assert proc.poll() is None, err_path.read_text()
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        assert proc.wait(30) is not None
    assert "Traceback" not in err_path.read_text(), err_path.read_text()


@contextlib.asynccontextmanager
async def mcp_session(database: str, cwd: Path, *args: str) -> AsyncIterator[Any]:
    """An initialized MCP SDK ``ClientSession`` with ``ragdb mcp -d DATABASE ARGS`` (run in
    ``cwd``, its stderr in ``cwd/server.err``) as its stdio subprocess."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "ragdb.cli", "mcp", "-d", database, *args],
                                   cwd=str(cwd), env={"PYTHONPATH": str(ROOT)})
    with open(cwd / "server.err", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write, read_timeout_seconds=120) as session:
            await session.initialize()
            yield session


async def mcp_call(session: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool's structured result; asserts the call succeeded."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)
