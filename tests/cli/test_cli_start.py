"""The CLI starts without importing what its command does not need (issue 29, "CLI start"):
``ragdb --help`` imports click and the group, not numpy, the storage layer or tabulate; a
command imports its own module on first use; the listing equals the commands' own help."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import click
from click.testing import CliRunner

from ragdb.cli import main as cli_main


def _eager_group() -> click.Group:
    """The group as it was before lazy loading: every command module imported, every command added."""
    group = click.Group("ragdb", params=list(cli_main.cli.params), help=cli_main.cli.help,
                        context_settings=dict(cli_main.cli.context_settings))
    for module_name in sorted({m for m, _ in cli_main.COMMANDS.values()}):
        for command in importlib.import_module(f"ragdb.cli.commands.{module_name}").COMMANDS:
            group.add_command(command)
    return group


def test_the_table_names_every_command_its_module_and_its_help() -> None:
    eager = _eager_group()
    assert sorted(eager.commands) == sorted(cli_main.COMMANDS)
    for name, command in eager.commands.items():
        module_name, first = cli_main.COMMANDS[name]
        assert command in importlib.import_module(f"ragdb.cli.commands.{module_name}").COMMANDS
        assert " ".join((command.short_help or command.help or "").split("\n\n")[0].split()) == first


def test_help_lists_what_the_eager_group_lists() -> None:
    runner = CliRunner()
    lazy = runner.invoke(cli_main.cli, ["--help"], prog_name="ragdb")
    eager = runner.invoke(_eager_group(), ["--help"], prog_name="ragdb")
    assert lazy.exit_code == 0 and eager.exit_code == 0
    assert lazy.output.split("Commands:")[1] == eager.output.split("Commands:")[1]


_PROBE = """
import sys
from ragdb.cli.main import main
sys.argv = ["ragdb", *{args!r}]
try:
    main()
except SystemExit:
    pass
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("HEAVY", heavy, file=sys.stderr)
"""


def _heavy_after(args: list[str], heavy: list[str], cwd: str | None = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(args=args, heavy=heavy)], capture_output=True,
                         text=True, cwd=cwd, timeout=120)
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("HEAVY ")]
    assert line, out.stderr
    return eval(line[-1][len("HEAVY "):])  # a list literal printed by the probe above


def test_help_imports_no_engine_and_version_no_storage() -> None:
    heavy = ["numpy", "ragdb.database", "ragdb.storage", "tabulate", "httpx", "ragdb.cli.commands.documents"]
    assert _heavy_after(["--help"], heavy) == []
    # --version names the scoring kernel; where the compiled one is installed it tells so from the
    # extension's file without importing it (and numpy with it)
    from ragdb.index import kernel

    compiled = "compiled" in kernel.available() and os.environ.get("RAGDB_KERNEL", "").strip().lower() != "numpy"
    assert _heavy_after(["--version"], heavy if compiled else heavy[1:]) == []


def test_search_imports_no_table_drawing_nor_http_client(tmp_path) -> None:
    import ragdb

    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add("deleted documents leave the index at once", source="a.md")
    heavy = ["tabulate", "httpx", "ragdb.cli.commands.documents", "ragdb.cli.commands.serving"]
    assert _heavy_after(["-d", str(tmp_path / "kb.db"), "search", "deleted"], heavy) == []


def test_search_imports_nothing_of_ingest_nor_of_embedding(tmp_path) -> None:
    """A search chunks nothing, hashes nothing, starts no thread pool, embeds nothing (no
    vectors) and makes no document or report (``ragdb.records``, ~12 ms of frozen dataclasses):
    the modules for those are left unimported (together some 50 ms of a start), also when the
    question is all unknown words (the note about its script)."""
    import ragdb

    with ragdb.open(str(tmp_path / "kb.db")) as db:
        db.add("deleted documents leave the index at once", source="a.md")
    heavy = ["ragdb.text.chunking", "ragdb.models.embeddings", "hashlib", "concurrent.futures", "ragdb.records"]
    assert _heavy_after(["-d", str(tmp_path / "kb.db"), "search", "deleted"], heavy) == []
    assert _heavy_after(["-d", str(tmp_path / "kb.db"), "search", "deleted", "--format", "json"], heavy) == []
    # the script note needs the share of CJK letters: that one search imports the module
    assert "ragdb.models.embeddings" in _heavy_after(["-d", str(tmp_path / "kb.db"), "search", "删除文档"], heavy)


def test_a_command_runs_and_a_typo_is_still_a_usage_error() -> None:
    runner = CliRunner()
    result = runner.invoke(cli_main.cli, ["serch", "x"], prog_name="ragdb")
    assert result.exit_code == 2 and "No such command 'serch'" in result.output
    assert runner.invoke(cli_main.cli, ["plugins", "--help"], prog_name="ragdb").exit_code == 0


def test_main_rests_the_collector_only_while_the_command_loads(monkeypatch) -> None:
    """``main`` (the console entry point) turns the garbage collector off while the command and
    the library load, and on again before the command runs, the objects made until then frozen;
    a collector already off stays off, and nothing is frozen then."""
    import gc

    seen: list[bool] = []
    probe = click.Command("gc-probe", callback=lambda: seen.append(gc.isenabled()))
    cli_main.cli.add_command(probe)
    monkeypatch.setattr(sys, "argv", ["ragdb", "gc-probe"])
    was = gc.isenabled()
    gc.enable()  # (as a process starts; an earlier test may have left it off)
    frozen = gc.get_freeze_count()
    try:
        try:
            cli_main.main()
        except SystemExit as e:
            assert e.code in (0, None)
        assert seen == [True] and gc.isenabled()
        assert gc.get_freeze_count() > frozen  # (the start's objects)
        gc.unfreeze()
        gc.disable()
        try:
            try:
                cli_main.main()
            except SystemExit as e:
                assert e.code in (0, None)
            assert seen == [True, False] and not gc.isenabled()
            assert gc.get_freeze_count() == 0
        finally:
            gc.enable()
    finally:
        gc.unfreeze()
        del cli_main.cli.commands["gc-probe"]
        if not was:
            gc.disable()
