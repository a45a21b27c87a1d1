"""Section ``sync`` (issue 3): mirror 1,000 Markdown files, then one edited / deleted / added /
touched file: time, and the files loaded or hashed; worker stage ``sync``."""

from __future__ import annotations

import gc
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..common import iter_docs, log, median, ms_since
from ..harness import Context, section, worker_stage
from ..report import bar, cell, fmt, na_bars, ratio, xfmt


SYNC_FILES = 1000
SYNC_REPEATS = 5  # each single-file step is done this many times (on different files); median time


@worker_stage("sync")
def _stage_sync(spec: dict) -> dict:
    """Mirror a folder of SYNC_FILES Markdown files, then edit / touch / delete / add one
    file at a time, counting the files sync loads and hashes."""
    import ragdb
    from ragdb.files import loaders as rloaders
    from ragdb.files import sync as rsync

    n_files = spec.get("n_files", SYNC_FILES)
    root = Path(spec["index_dir"])
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    names = []
    t0 = time.perf_counter()
    for i, (_doc_id, text) in enumerate(iter_docs(Path(spec["docs"]))):
        if i >= n_files:
            break
        title, _sep, body = text.partition("\n\n")
        name = f"doc{i:04d}.md"
        (files / name).write_text(f"# {title}\n\n{body}\n" if body else f"{text}\n", encoding="utf-8")
        names.append(name)
    write_s = time.perf_counter() - t0

    calls = {"load_file": 0, "file_sha256": 0}
    real_load, real_hash = rloaders.load_read, rsync.file_sha256

    def counting_load(*a: Any, **kw: Any) -> Any:
        calls["load_file"] += 1
        return real_load(*a, **kw)

    def counting_hash(*a: Any, **kw: Any) -> Any:
        calls["file_sha256"] += 1
        return real_hash(*a, **kw)

    rloaders.load_read = counting_load  # sync.py loads a file's bytes with loaders.load_read, through the module
    rsync.file_sha256 = counting_hash
    steps: list[dict] = []
    db = ragdb.open(str(root / "ragdb.db"))

    def sync(label: str) -> dict:
        calls.update(load_file=0, file_sha256=0)
        gc.collect()
        t0 = time.perf_counter()
        rep = rsync.sync_folder(db, files, relative_to=files)  # sources: paths inside the folder
        s = {"label": label, "ms": ms_since(t0), "loaded": calls["load_file"], "hashed": calls["file_sha256"],
             "added": len(rep.added), "changed": len(rep.changed), "unchanged": len(rep.unchanged),
             "deleted": len(rep.deleted), "failed": len(rep.failed), "documents": rep.documents,
             "removed": rep.removed}
        return s

    try:
        steps.append({**sync("initial sync into an empty database"), "repeats": 1})

        def repeated(label: str, change: Callable[[int], None]) -> None:
            runs = []
            for r in range(SYNC_REPEATS):
                change(r)
                runs.append(sync(label))
            merged = {key: sorted({x[key] for x in runs}) for key in runs[0] if key not in ("label", "ms")}
            steps.append({"label": label, "ms": median([x["ms"] for x in runs]), "ms_all": [x["ms"] for x in runs],
                          "repeats": len(runs), **{k: v[0] if len(v) == 1 else v for k, v in merged.items()}})

        marker = "zyxwvutonium"
        edited = [names[(len(names) // 2 + 7 * r) % len(names)] for r in range(SYNC_REPEATS)]

        def edit(r: int) -> None:
            p = files / edited[r]
            p.write_text(p.read_text(encoding="utf-8") + f"\nEdited {marker}{r} sentence.\n", encoding="utf-8")

        def touch(r: int) -> None:  # the same file each time: it stays "touched" (hashed on every sync)
            p = files / names[len(names) // 3]
            st = p.stat()
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000_000))

        gone = [names[(len(names) // 4 + 13 * r) % len(names)] for r in range(SYNC_REPEATS)]

        def delete(r: int) -> None:
            (files / gone[r]).unlink()

        def add(r: int) -> None:
            (files / f"new{r}.md").write_text(f"# New note {r}\n\nA new note about {marker}new{r}.\n",
                                               encoding="utf-8")

        repeated("no change", lambda r: None)
        repeated("one file edited", edit)
        found = [[h.source for h in db.search(f"{marker}{r}", k=3)] for r in range(SYNC_REPEATS)]
        edit_ok = all(f == [edited[r]] for r, f in enumerate(found))
        repeated("one file deleted", delete)
        delete_ok = all(not list(db.documents(g)) for g in gone)
        repeated("one file added", add)
        # last: ragdb keeps the stored mtime of a touched file, so it is hashed again on every later sync
        repeated("one file touched (mtime changed, same bytes)", touch)
        docs_now = sum(1 for _ in db.documents())
    finally:
        rloaders.load_read, rsync.file_sha256 = real_load, real_hash
        db.close()
    return {"files": len(names), "write_s": write_s, "steps": steps, "edit_found": edit_ok,
            "delete_gone": delete_ok, "documents_after": docs_now}


SYNC_BARS = ["sync after editing 1 of {n} files loads and rewrites only that file",
             "no-change sync of {n} files reads no file (stat only)",
             "sync after deleting 1 of {n} files loads nothing and removes only that document"]


@section("sync")
def section_sync(ctx: Context) -> str:
    n = SYNC_FILES
    bar_names = [b.format(n=f"{n:,}") for b in SYNC_BARS]
    head = [f"## Sync: one changed file of {n:,} (issue 3)", ""]
    if not ctx.ragdb_ok:
        na_bars(ctx, bar_names, "ragdb not available")
        return "\n".join(head + ["ragdb not available: not measured.", ""])
    log(f"== sync: {n:,} Markdown files")
    folder = ctx.workdir / "index" / "sync"
    shutil.rmtree(folder, ignore_errors=True)
    r = ctx.run_worker("sync", "ragdb", ctx.corpora["scifact"], index_dir=str(folder), n_files=n)
    shutil.rmtree(folder, ignore_errors=True)
    ctx.results["sync"] = r
    lines = head + [
        f"Setup: the first {n:,} SciFact documents written as Markdown files (`# title`, blank line, abstract; "
        "about 1.5 KB each) into one folder; `ragdb.files.sync.sync_folder(db, folder)` into a fresh database, in one "
        "worker process. The benchmark counts calls by wrapping `ragdb.files.loaders.load_read` (a file's bytes parsed "
        "and loaded) and `ragdb.files.sync.file_sha256` (a file read to compare its hash; sync hashes only files whose "
        "size or mtime differ from the stored ones); every sync also `stat`s each file. Each single-file step "
        f"is repeated {SYNC_REPEATS} times, each time on another file and followed by its own sync; the time is "
        "the median, the counts are per sync (identical in every repeat unless a range is shown).",
        "",
    ]
    if "error" in r:
        na_bars(ctx, bar_names, f"not measured: error `{cell(r['error'], 120)}` (see the section)")
        return "\n".join(lines + [f"error: `{cell(r['error'], 300)}`", ""])
    steps = {s["label"]: s for s in r["steps"]}
    initial = steps["initial sync into an empty database"]
    lines += ["| step | sync ms | / initial sync | files loaded | files hashed | added | changed | unchanged "
              "| deleted | documents written | documents removed |", "|" + "---|" * 11]

    def show(v: Any) -> str:
        return f"{v[0]}–{v[-1]}" if isinstance(v, list) else str(v)

    for s in r["steps"]:
        lines.append(f"| {s['label']} | {fmt(s['ms'], '.1f')} | {xfmt(ratio(s['ms'], initial['ms']), '.3f')} "
                     f"| {show(s['loaded'])} | {show(s['hashed'])} | {show(s['added'])} | {show(s['changed'])} "
                     f"| {show(s['unchanged'])} | {show(s['deleted'])} | {show(s['documents'])} "
                     f"| {show(s['removed'])} |")
    edit, nochange = steps["one file edited"], steps["no change"]
    delete = steps["one file deleted"]
    lines += [
        "",
        f"- After each edit the edited file's new text was found by search (the edited file, and only it, "
        f"was the top hit for a word added to it): {'yes' if r.get('edit_found') else 'NO'}; after each "
        f"delete the file's document was gone: {'yes' if r.get('delete_gone') else 'NO'}.",
        f"- One-edit sync / no-change sync: {xfmt(ratio(edit['ms'], nochange['ms']))}; "
        f"one-edit sync / initial sync: {xfmt(ratio(edit['ms'], initial['ms']), '.3f')}. "
        f"Writing the {r['files']:,} files took {r['write_s']:.2f} s (not part of any sync).",
        "- A touched file (new mtime, same bytes) is hashed but not loaded; ragdb keeps its stored mtime, so "
        "it is hashed again on every later sync until its content changes (documented in `ragdb/files/sync.py`).",
        "",
    ]
    ok_edit = (edit["loaded"] == 1 and edit["changed"] == 1 and edit["added"] == 0 and edit["deleted"] == 0
               and edit["documents"] == 1 and edit["hashed"] == 1 and bool(r.get("edit_found"))
               and edit["unchanged"] == r["files"] - 1)
    bar(ctx, bar_names[0], ok_edit,
        f"loaded {show(edit['loaded'])}, hashed {show(edit['hashed'])}, changed {show(edit['changed'])}, "
        f"unchanged {show(edit['unchanged'])}; {fmt(edit['ms'], '.1f')} ms vs {fmt(initial['ms'], '.0f')} ms initial")
    bar(ctx, bar_names[1], nochange["loaded"] == 0 and nochange["hashed"] == 0 and nochange["changed"] == 0,
        f"loaded {show(nochange['loaded'])}, hashed {show(nochange['hashed'])}; {fmt(nochange['ms'], '.1f')} ms")
    bar(ctx, bar_names[2], delete["loaded"] == 0 and delete["deleted"] == 1 and delete["removed"] == 1
        and bool(r.get("delete_gone")),
        f"loaded {show(delete['loaded'])}, deleted {show(delete['deleted'])}, removed {show(delete['removed'])}")
    return "\n".join(lines)
