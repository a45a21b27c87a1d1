"""Which files of a folder ragdb indexes, and why it skips the others.

:func:`walk` goes through a folder depth first, in name order, and returns
the files to load and every path it skipped with a reason
(:class:`Skipped`). The rules, in the order they are applied to each entry:

1. ``vcs`` -- version-control folders (``.git``, ``.hg``, ``.svn``, ...);
   never entered, whatever the ignore files say.
2. ``excluded`` -- matches an ``exclude`` pattern (a matching folder is not
   entered); ``not included`` -- a file that matches none of the
   ``include`` patterns (when some are given).
3. by type (these cannot be turned back on): ``image`` (SVG too),
   ``font``, ``media`` (audio and video), ``archive``, ``office``,
   ``binary`` (compiled code, databases, model weights ...), by extension.
4. default rules: ``virtualenv`` (a folder holding ``pyvenv.cfg`` or
   ``conda-meta``), ``node_modules``, ``cache`` (``__pycache__``,
   ``.mypy_cache``, ``.tox`` ...), ``build`` (``build``, ``dist``,
   ``target``, ``_build``, ``*.egg-info`` ...), ``lockfile``
   (``package-lock.json``, ``uv.lock``, ``*.lock`` ...), ``minified``
   (``*.min.js``, ``*.min.css``, ``*.map``), ``hidden`` (a name starting with
   ``.``), ``unsupported`` (an extension that is not text or markup: see
   :data:`TEXT_SUFFIXES`).
5. ``ignored`` -- ``.gitignore`` and ``.ragdbignore`` files (git's syntax and
   semantics, through ``pathspec``): a file's patterns are relative to its
   folder, deeper files win, ``.ragdbignore`` wins over ``.gitignore`` of
   the same folder, an ignored folder is not entered (so nothing inside it
   can be re-included). When the walked folder lies inside a git work tree,
   the ``.gitignore`` files from the top of that tree down to it and
   ``.git/info/exclude`` count too.

The default rules of step 4 behave like patterns listed before the ignore
files: a negation there (``!build/``, ``!*.csv``, ``!.github/`` in a
``.ragdbignore``) turns one off for the paths it matches. The folder given
to :func:`walk` is never skipped itself, and callers take a file named
explicitly as it is; when it lies inside a folder its work tree ignores (a
build folder named on purpose), the ignore files above it are not applied.
Symbolic links are followed inside the folder only: ``link outside`` is a
link whose target lies elsewhere (git does not follow links either).

Two checks need the file's content and are made when it is loaded, not
while walking (a sync reads nothing but ``stat`` for unchanged files):
:func:`content_reason` finds ``binary`` content (NUL or control bytes) and
``minified`` bundles (code whose lines are extremely long).

Skipped folders are reported once (their path ends with ``/``); what they
hold is not walked, so a huge ``node_modules`` costs one entry.
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pathspec

from ragdb import plugins
from ragdb.errors import InvalidInput, LoaderError
from ragdb.storage import held_open

__all__ = ["Skipped", "Walk", "Patterns", "TEXT_SUFFIXES", "TEXT_NAMES", "REASONS", "walk", "file_reason",
           "content_reason", "looks_binary", "read_head", "read_file", "FileChanged", "expand_braces",
           "skip_counts", "reason_summary"]

#: Every skip reason, in the order a summary lists them when counts tie.
REASONS: tuple[str, ...] = (
    "vcs", "virtualenv", "node_modules", "cache", "build", "hidden", "ignored", "excluded", "not included",
    "lockfile", "minified", "image", "font", "media", "archive", "office", "binary", "unsupported", "not a file",
    "link outside", "vanished", "changed", "unreadable", "too large",
)

#: The largest file ragdb reads (bytes): a larger one is skipped as ``too large`` before any of
#: it is read (``loaders.load_file`` refuses it: :class:`FileTooLarge`). A 4 GiB sparse file took 20 s and 4.2 GB of
#: memory to be found binary, or ended the whole add with a MemoryError.
MAX_FILE_BYTES = 256 << 20

#: Suffixes (lower case) of the files a walk picks: documents and markup, source code, config text.
TEXT_SUFFIXES: frozenset[str] = frozenset(
    # documents and markup (see ragdb.files.loaders.SUPPORTED_SUFFIXES)
    ".txt .text .md .markdown .mdown .mkd .mdx .rst .rest .html .htm .xhtml .pdf .jsonl .ndjson .adoc .asciidoc"
    " .org .tex .bib .man .pod"
    # source code
    " .py .pyi .pyx .pxd .js .mjs .cjs .jsx .ts .mts .cts .tsx .vue .svelte .c .h .cc .cpp .cxx .hpp .hh .hxx"
    " .m .mm .go .rs .java .kt .kts .scala .groovy .gradle .swift .cs .fs .fsx .vb .rb .php .pl .pm .lua .r .jl"
    " .dart .ex .exs .erl .hrl .hs .ml .mli .clj .cljs .elm .zig .nim .sql .sh .bash .zsh .fish .ps1 .psm1 .bat"
    " .cmd .awk .sed .vim .el .lisp .scm .rkt .proto .graphql .gql .css .scss .sass .less .cmake .mk .make"
    " .dockerfile .tf .hcl .nix .asm .s .sv .vhd .vhdl .f90 .for .pas .d .cu .cuh .ipp .inl"
    # config text
    " .toml .yaml .yml .ini .cfg .conf .json .json5 .xml .properties .editorconfig .in .spec"
    .split()
)

#: File names (lower case) without a telling suffix that a walk picks.
TEXT_NAMES: frozenset[str] = frozenset(
    "makefile gnumakefile dockerfile containerfile jenkinsfile vagrantfile gemfile rakefile procfile brewfile"
    " justfile readme license licence copying notice authors contributors changelog changes history install"
    " todo codeowners manifest.in setup.cfg".split()
)

_TYPE_SUFFIXES: dict[str, str] = {
    **dict.fromkeys(".png .jpg .jpeg .gif .bmp .tif .tiff .webp .ico .icns .heic .heif .avif .psd .xcf .svg .svgz"
                    " .eps .ai .raw .cr2 .nef .dng .jxl".split(), "image"),
    **dict.fromkeys(".ttf .otf .woff .woff2 .eot .pfb .pfm .fon".split(), "font"),
    **dict.fromkeys(".mp3 .wav .flac .ogg .oga .opus .m4a .aac .wma .aiff .aif .mid .midi .mp4 .m4v .mkv .mov"
                    " .avi .wmv .webm .flv .mpg .mpeg .3gp".split(), "media"),
    **dict.fromkeys(".zip .tar .gz .tgz .bz2 .tbz2 .xz .txz .zst .7z .rar .jar .war .ear .whl .egg .apk .dmg .iso"
                    " .deb .rpm .cab .lz .lzma .lz4 .z".split(), "archive"),
    **dict.fromkeys(".doc .docx .xls .xlsx .ppt .pptx .odt .ods .odp .rtf .pages .numbers .key .epub .mobi"
                    .split(), "office"),
    **dict.fromkeys(".exe .dll .so .dylib .o .a .lib .obj .pyc .pyo .pyd .class .wasm .bin .dat .db .sqlite"
                    " .sqlite3 .db-wal .db-shm .pkl .pickle .npy .npz .parquet .feather .arrow .h5 .hdf5 .onnx"
                    " .pt .pth .ckpt .safetensors .gguf .tflite .pb .idx .pack .lockb".split(), "binary"),
}
#: Reasons no ignore-file negation turns off.
_FIXED = frozenset({"vcs", "image", "font", "media", "archive", "office", "binary"})

_VCS_NAMES = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", "CVS", ".jj"})
_NODE_DIRS = frozenset({"node_modules", "bower_components", "jspm_packages"})
_CACHE_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", ".tox",
                         ".nox", ".eggs", ".ipynb_checkpoints", ".sass-cache", ".parcel-cache", ".gradle",
                         ".cache", ".pyre", ".pytype"})
_BUILD_DIRS = frozenset({"build", "dist", "target", "_build", "htmlcov", ".next", ".nuxt", ".svelte-kit",
                         "__pypackages__"})
_VENV_NAMES = frozenset({"venv", ".venv", "env", ".env", "virtualenv"})
_LOCKFILES = frozenset({"package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "poetry.lock",
                        "cargo.lock", "uv.lock", "pipfile.lock", "gemfile.lock", "composer.lock", "go.sum",
                        "flake.lock", "pdm.lock", "bun.lockb", "mix.lock", "packages.lock.json", "podfile.lock",
                        "pubspec.lock", "gradle.lockfile", "conda-lock.yml", "deno.lock", "shrinkwrap.yaml"})
_MINIFIED_ENDINGS = (".min.js", ".min.mjs", ".min.css", ".map", "-min.js", ".bundle.js")
#: Suffixes of prose and markup: their long lines are paragraphs, not bundles.
_PROSE_SUFFIXES = frozenset(".txt .text .md .markdown .mdown .mkd .mdx .rst .rest .html .htm .xhtml .adoc"
                            " .asciidoc .org .tex .pdf .jsonl .ndjson".split())
_IGNORE_FILES = (".gitignore", ".ragdbignore")

# ---------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Skipped:
    """A path a walk left out: ``path`` as walked (the folder given joined with
    the path inside it; a folder's ends with ``/``), ``reason`` (one of
    :data:`REASONS`) and, for ``ignored``/``excluded``, the rule that matched."""

    path: str
    reason: str
    detail: str = ""


def skip_counts(skipped: Iterable[Skipped]) -> dict[str, int]:
    """Reason -> number of skipped paths, most frequent first."""
    counts: dict[str, int] = {}
    for s in skipped:
        counts[s.reason] = counts.get(s.reason, 0) + 1
    order = {r: i for i, r in enumerate(REASONS)}
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], order.get(kv[0], len(order)), kv[0])))


class FileIdentity(NamedTuple):
    """A walked file as :func:`read_file` holds it: the ``(device, inode)`` the walk saw and
    the real path of the folder walked, which the file opened must lie in (``""``: a file
    named on its own)."""

    dev: int
    ino: int
    root: str = ""


@dataclass(frozen=True)
class Walk:
    """What :func:`walk` found: ``files`` holds (path, path relative to the
    root in posix form) in walk order; ``unmatched`` the include/exclude
    patterns (as given) that matched no path at all."""

    root: str
    files: tuple[tuple[str, str], ...]
    skipped: tuple[Skipped, ...] = ()
    unmatched: tuple[str, ...] = ()
    #: path -> (device, inode) of each file as the walk saw it (links followed): what
    #: :func:`read_file` holds the file to when it is read
    identities: Mapping[str, FileIdentity] = field(default_factory=dict, compare=False, repr=False)
    #: the folders (relative to the root, in posix form, ending with ``/``; ``""``: the root)
    #: that could not be listed, and the files listed whose status could not be read (no
    #: trailing ``/``): what they hold is unknown, not gone (a sync deletes nothing there)
    unreadable: tuple[str, ...] = ()

    @property
    def skip_counts(self) -> dict[str, int]:
        return skip_counts(self.skipped)


# ---------------------------------------------------------------------------- patterns


def expand_braces(pattern: str) -> list[str]:
    """``*.{md,rst}`` -> ``["*.md", "*.rst"]`` (nested and several groups too).

    gitignore syntax has no braces, but shells and most glob tools do, and a
    pattern such as ``*.{md,rst}`` that silently matched nothing was the
    complaint. Hand-written (a dozen lines) rather than a dependency: a
    ``{`` without a matching ``}`` or without a comma stays literal, and a
    backslash escapes a brace.
    """
    depth = 0
    start = -1
    commas: list[int] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            if depth == 0:
                start, commas = i, []
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                if commas:
                    head, tail = pattern[:start], pattern[i + 1:]
                    cuts = [start, *commas, i]
                    out: list[str] = []
                    for a, b in zip(cuts, cuts[1:]):
                        for rest in expand_braces(head + pattern[a + 1:b] + tail):
                            if rest not in out:
                                out.append(rest)
                    return out
                start = -1
        elif c == "," and depth == 1:
            commas.append(i)
        i += 1
    return [pattern]


_PATTERN_ERRORS: tuple[type[BaseException], ...] = (re.error, ValueError, TypeError)
try:  # google-re2 matches in linear time; Python's re backtracks (see _spec)
    import re2

    _BACKEND = "re2"
    _PATTERN_ERRORS += (re2.error,)
except ImportError:  # pragma: no cover - google-re2 is a dependency; a platform without its wheel
    _BACKEND = "simple"

#: Without google-re2, a pattern line with more wildcards than this is skipped: Python's ``re``
#: backtracks exponentially in their number (``a*a*...a*b`` against ``aaa...a``).
MAX_SIMPLE_WILDCARDS = 4


def _too_many_wildcards(line: str) -> bool:
    return _BACKEND == "simple" and len(re.findall(r"\*+|\?|\[", line)) > MAX_SIMPLE_WILDCARDS


def _spec(lines: Sequence[str]) -> pathspec.GitIgnoreSpec:
    """A spec of gitignore lines, matched in time linear in the path and the pattern.

    pathspec turns each line into a regular expression; matched by Python's ``re``, a line
    such as ``a*a*a*...a*b`` backtracks exponentially (``a*`` x 20 + ``b`` against a
    30-letter name took 9 s, x 200 never ended), where git's wildmatch does not. pathspec's
    ``re2`` backend (google-re2, an automaton without backtracking) keeps git's semantics
    (pathspec writes the same expressions for both) and bounds the time.
    """
    return pathspec.GitIgnoreSpec.from_lines(lines, backend=_BACKEND)


def _matchable(path: str) -> str:
    """``path`` as the pattern matchers take it: a name that is not UTF-8 (its undecodable
    bytes held as lone surrogates, as ``os.fsdecode`` gives them) with each such byte as
    U+FFFD. google-re2 matches UTF-8 only, and raised UnicodeEncodeError on such a name
    (any sync of a folder with an ignore file, ``include`` or ``exclude``); ``?`` and ``*``
    still match the byte, as git's wildmatch does."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return path


def _compile(lines: Sequence[str], label: str) -> pathspec.GitIgnoreSpec:
    for line in lines:
        if _too_many_wildcards(line):
            raise InvalidInput(f"{label}: more than {MAX_SIMPLE_WILDCARDS} wildcards in {line!r} "
                               "(install google-re2 for patterns with more)")
    try:
        return _spec(lines)
    except _PATTERN_ERRORS as e:
        raise InvalidInput(f"{label}: not a valid gitignore-style pattern ({e})") from None


class Patterns:
    """Gitignore-style patterns relative to a walk's root (``--include``/``--exclude``).

    Each pattern is brace-expanded; the whole list is one spec (a later
    ``!pattern`` overrides an earlier match, as in a ``.gitignore``).
    :meth:`match` tells whether a relative path (a folder's ending with
    ``/``) matches; the patterns that ever matched are remembered so that
    :meth:`unmatched` can name the ones that matched nothing.
    """

    def __init__(self, patterns: Iterable[str] | None, option: str) -> None:
        self.option = option
        self.given: tuple[str, ...] = ()
        self._lines: list[str] = []
        self._owner: list[int] = []  # line -> index of the given pattern it came from
        if patterns is None:
            patterns = ()
        if isinstance(patterns, (str, bytes)) or not isinstance(patterns, Iterable):
            raise InvalidInput(f"{option} must be a list of patterns, got {patterns!r}")
        given = []
        for p in patterns:
            if not isinstance(p, str) or not p.strip() or p.lstrip().startswith("#"):
                raise InvalidInput(f"{option}: {p!r} is not a pattern (a non-empty gitignore-style glob)")
            given.append(p)
            for line in expand_braces(p.strip()):
                self._lines.append(line)
                self._owner.append(len(given) - 1)
        self.given = tuple(given)
        self._spec = _compile(self._lines, f"{option} {', '.join(repr(g) for g in self.given)}")
        self._each = [_compile([line], f"{option} {line!r}") for line in self._lines]
        self._hit = [False] * len(self.given)

    def __bool__(self) -> bool:
        return bool(self.given)

    def match(self, rel: str) -> bool:
        if not self.given:
            return False
        rel = _matchable(rel)
        for n, spec in enumerate(self._each):
            if not self._hit[self._owner[n]] and not self._lines[n].startswith("!") and spec.match_file(rel):
                self._hit[self._owner[n]] = True
        return bool(self._spec.match_file(rel))

    def test(self, rel: str) -> bool:
        """Like :meth:`match`, without recording hits (for stored sources)."""
        return bool(self.given) and bool(self._spec.match_file(_matchable(rel)))

    def unmatched(self) -> tuple[str, ...]:
        return tuple(g for g, hit in zip(self.given, self._hit)
                     if not hit and not g.lstrip().startswith("!"))


# ---------------------------------------------------------------------------- ignore files


@dataclass
class _IgnoreFile:
    base: str   # folder relative to the top, "" or ending with "/"
    label: str  # for Skipped.detail
    spec: pathspec.GitIgnoreSpec


#: The largest ignore file read (bytes). A larger one, or one that cannot be read, makes its
#: folder unreadable (:func:`_folder_rules`): the files it ignores (secrets, say) are unknown.
MAX_IGNORE_BYTES = 1 << 20


def _read_ignore(path: Path, base: str, label: str) -> list[_IgnoreFile] | None:
    """The rules of one ignore file, none where there is no such file (or what has its name is
    not a file: a folder, a FIFO); None where it is there but cannot be read (no permission, an
    I/O error) or is over :data:`MAX_IGNORE_BYTES`."""
    try:
        # (without blocking: a FIFO of that name blocked the walk until a writer came)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | _O_NONBLOCK | getattr(os, "O_BINARY", 0))
    except OSError as e:
        return [] if e.errno in (errno.ENOENT, errno.ENOTDIR) else None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a folder named .gitignore made its whole folder unreadable
            return []
        if st.st_size > MAX_IGNORE_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            raw = fh.read(MAX_IGNORE_BYTES + 1)
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > MAX_IGNORE_BYTES:  # (grew since the fstat)
        return None
    # a byte order mark (Windows editors write one) is skipped, as git skips it: it made the
    # first rule another pattern, which matched nothing
    text = raw.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace")
    lines = []
    for line in text.splitlines():
        if _too_many_wildcards(line):  # pragma: no cover - only without google-re2
            continue
        try:  # git skips a pattern it cannot parse; so does this
            _spec([line])
        except _PATTERN_ERRORS:
            continue
        lines.append(line)
    if not any(line.strip() and not line.startswith("#") for line in lines):
        return []
    return [_IgnoreFile(base, label, spec) for spec in _specs(lines)]


def _specs(lines: Sequence[str]) -> list[pathspec.GitIgnoreSpec]:
    """Specs of ``lines`` in order, as few as google-re2 compiles: its automaton of all the
    lines of a file has a memory budget, which ~2,000 lines such as ``name*.md`` exceed, and
    the error ended the whole walk. Halves are split again until each compiles (each line
    compiles alone); the walk applies them in order, the last match winning, as one spec
    would (``_state``)."""
    try:
        return [_spec(lines)]
    except _PATTERN_ERRORS:
        if len(lines) < 2:  # pragma: no cover - each line compiled alone in _read_ignore
            return []
        mid = len(lines) // 2
        return _specs(lines[:mid]) + _specs(lines[mid:])


def _folder_rules(folder: Path, base: str, display: str) -> list[_IgnoreFile] | None:
    """The rules of a folder's ignore files; None where one cannot be read (or is too large):
    which of the folder's files it ignores is unknown, so the folder is skipped as
    ``unreadable`` (a sync keeps its documents, and adds none of its files). Before, such a
    file was passed over, and every file it ignored was indexed."""
    out = []
    for name in _IGNORE_FILES:
        rules = _read_ignore(folder / name, base, os.path.normpath(os.path.join(display, name)))
        if rules is None:
            return None
        out.extend(rules)
    return out


def _state(rules: Sequence[_IgnoreFile], full: str) -> tuple[bool | None, str]:
    """(True: ignored, False: re-included by a negation, None: no rule matched; the rule).

    Only a ``.ragdbignore`` negation gives False: one in a ``.gitignore``
    is about git's own ignores and says nothing about ragdb's default
    rules (so it gives None once it has undone an earlier match)."""
    state: bool | None = None
    detail = ""
    for r in rules:
        if not full.startswith(r.base):
            continue
        res = r.spec.check_file(_matchable(full[len(r.base):]))
        if res.include is not None:
            state = True if res.include else (False if r.label.endswith(".ragdbignore") else None)
            assert res.index is not None
            pattern = r.spec.patterns[res.index].pattern
            detail = f"{r.label}: {pattern if isinstance(pattern, str) else ''}"
    return state, detail


def _git_top(root: Path) -> Path | None:
    """The top of the git work tree holding ``root`` (a folder with a ``.git`` entry), or None."""
    try:
        here = Path(os.path.abspath(root))
    except OSError:  # pragma: no cover - cwd gone
        return None
    for folder in (here, *here.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def _outer_rules(root: Path, display: str) -> tuple[list[_IgnoreFile] | None, str]:
    """The ignore rules above ``root`` within its git work tree (None where one of their files
    cannot be read: :func:`_folder_rules`), and the root's path from the top."""
    top = _git_top(root)
    if top is None:
        return [], ""
    here = Path(os.path.abspath(root))
    rel = here.relative_to(top).as_posix()
    prefix = "" if rel == "." else rel + "/"
    rules: list[_IgnoreFile] = []
    ups = len([p for p in prefix.split("/") if p])
    shown = os.path.join(display, *([os.pardir] * ups))
    info = top / ".git" / "info" / "exclude"
    if info.is_file():
        found = _read_ignore(info, "", os.path.normpath(os.path.join(shown, ".git", "info", "exclude")))
        if found is None:
            return None, prefix
        rules.extend(found)
    folder, base = top, ""
    parts = [p for p in prefix.split("/") if p]
    for part in parts:
        found = _folder_rules(folder, base, shown)
        if found is None:
            return None, prefix
        rules.extend(found)
        folder, base = folder / part, f"{base}{part}/"
        shown = os.path.join(shown, part)
    return rules, prefix


# ---------------------------------------------------------------------------- classification


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def file_reason(name: str) -> str | None:
    """Why a walk skips a file called ``name`` (a reason from :data:`REASONS`), or None to pick it."""
    lower = name.lower()
    if name in _VCS_NAMES:  # a worktree's or submodule's ".git" file
        return "vcs"
    suffix = _suffix(name)
    if suffix and suffix in plugins.loader_suffixes():  # a plugin loader reads it (ragdb.plugins)
        return None
    kind = _TYPE_SUFFIXES.get(suffix)
    if kind is not None:
        return kind
    if lower in _LOCKFILES or suffix == ".lock":
        return "lockfile"
    if lower.endswith(_MINIFIED_ENDINGS):
        return "minified"
    if name.startswith("."):
        return "hidden"
    if not suffix or suffix in TEXT_SUFFIXES or lower in TEXT_NAMES:
        return None  # no suffix at all: the content check decides when it is loaded
    return "unsupported"


def _sqlite_file(entry: os.DirEntry[str]) -> bool:
    """A database file this process holds open, whatever its name (``kb``, ``notes.ragdb``), or
    the ``-wal``, ``-shm`` or ``-journal`` file beside a database: reading one and closing it
    would drop every SQLite lock this process holds on it (sqlite.org/howtocorrupt.html 2.2),
    after which another process may delete the write-ahead log under an open handle."""
    name = entry.name
    for tail in ("-wal", "-shm", "-journal"):
        if name.endswith(tail) and len(name) > len(tail) and os.path.isfile(entry.path[:-len(tail)]):
            return True
    return held_open(entry.path)


def _dir_reason(path: str, name: str) -> str | None:
    if name in _VCS_NAMES:
        return "vcs"
    if name in _NODE_DIRS:
        return "node_modules"
    if name in _CACHE_DIRS:
        return "cache"
    if name in _BUILD_DIRS or name.endswith(".egg-info"):
        return "build"
    if os.path.isfile(os.path.join(path, "pyvenv.cfg")) or os.path.isdir(os.path.join(path, "conda-meta")):
        return "virtualenv"
    if name in _VENV_NAMES and (os.path.isfile(os.path.join(path, "bin", "activate"))
                                or os.path.isfile(os.path.join(path, "Scripts", "activate.bat"))):
        return "virtualenv"
    if name.startswith("."):
        return "hidden"
    return None


# C0 controls that never appear in text (tab, LF, VT, FF, CR and ESC are allowed), and DEL.
_CONTROL_DELETE = bytes(sorted(set(range(0x00, 0x09)) | set(range(0x0E, 0x1B)) | set(range(0x1C, 0x20)) | {0x7F}))
_CONTROL_RATIO = 0.05
SNIFF_BYTES = 8192
_BUNDLE_SAMPLE = 1 << 16
_BUNDLE_LINE = 10_000     # one line this long is generated code
_BUNDLE_MEAN = 1_000      # nor do people write code whose lines average this


_BOM_CODECS = ((b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xef\xbb\xbf", "utf-8"),
               (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def looks_binary(data: bytes) -> bool:
    """NUL bytes or more than 5% control bytes in the first 8 KiB. Text with a byte-order
    mark is text (UTF-16 holds NULs) when what follows the mark decodes in its encoding;
    bytes that merely start like a mark (``\\xff\\xfe\\x00\\x00...``) are binary (issue 30,
    item 12: they were stored as replacement characters)."""
    sample = data[:SNIFF_BYTES]
    if not sample:
        return False
    for bom, encoding in _BOM_CODECS:
        if sample.startswith(bom):
            try:  # incremental: a character cut at the end of the sample is not an error
                codecs.getincrementaldecoder(encoding)("strict").decode(sample[len(bom):], final=False)
            except UnicodeDecodeError:
                return True
            return False
    if b"\x00" in sample:
        return True
    controls = len(sample) - len(sample.translate(None, _CONTROL_DELETE))
    return controls / len(sample) > _CONTROL_RATIO


def content_reason(head: bytes, name: str) -> str | None:
    """``binary`` or ``minified`` for a file called ``name`` whose first bytes
    (64 KiB are enough) are ``head``; None when it reads as text. PDFs are
    not checked here (the PDF loader reads them)."""
    suffix = _suffix(name)
    if suffix == ".pdf" or head.startswith(b"%PDF-") or (suffix and suffix in plugins.loader_suffixes()):
        return None  # the PDF loader (or the plugin loader of the suffix) reads them
    if looks_binary(head):
        return "binary"
    if suffix not in _PROSE_SUFFIXES and name.lower() not in TEXT_NAMES:
        sample = head[:_BUNDLE_SAMPLE]
        lines = sample.split(b"\n")
        longest = max(len(line) for line in lines)
        if longest >= _BUNDLE_LINE or (len(sample) >= 4096 and len(sample) / len(lines) >= _BUNDLE_MEAN):
            return "minified"
    return None


def read_head(path: str | os.PathLike[str], n: int = _BUNDLE_SAMPLE) -> bytes:
    """The first ``n`` bytes of a file (raises OSError)."""
    with open(path, "rb") as fh:
        return fh.read(n)


class FileChanged(LoaderError):
    """A walked file that is not the file the walk saw when it is read: gone (``reason``
    ``"vanished"``), or replaced by a link, a FIFO, a folder or another file (``"changed"``).
    Skipped, not failed, by whoever reads a walk's files (and so is :class:`FileTooLarge`)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class FileTooLarge(FileChanged):
    """A file over :data:`MAX_FILE_BYTES` (``reason`` ``"too large"``), found before it is read."""


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def read_file(path: str | os.PathLike[str], identity: FileIdentity | None = None,
              *, limit: int | None = None) -> tuple[bytes, os.stat_result]:
    """A file's bytes (the first ``limit`` when given) and its status, read from one descriptor.

    With ``identity`` (the ``(device, inode)`` a walk recorded, :attr:`Walk.identities`),
    the file must still be that regular file: it is opened without following a link in its
    last component (``O_NOFOLLOW``) and without blocking (``O_NONBLOCK``: a FIFO swapped in
    would otherwise block the open forever), and the descriptor is checked with ``fstat``;
    a file that is gone or is something else now raises :class:`FileChanged` (issue 32,
    item 8: a file swapped for a link to a file outside the folder after the walk was read
    through the link). Without it (a file named explicitly) links are followed, and it must
    be a regular file. Other failures raise OSError.
    """
    where = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | _O_NONBLOCK | getattr(os, "O_BINARY", 0)
    if identity is not None:
        flags |= _O_NOFOLLOW
    try:
        try:
            fd = os.open(where, flags)
        except OSError as e:
            if identity is None or e.errno not in (errno.ELOOP, errno.EMLINK):
                raise
            # a link: a walk follows links inside its folder; read its target, which the
            # identity check below holds to the file the walk saw
            fd = os.open(os.path.realpath(where), flags)
    except FileNotFoundError:
        raise FileChanged(f"{where}: vanished after the folder was walked", "vanished") from None
    except (OSError, RuntimeError) as e:
        if identity is not None and (isinstance(e, RuntimeError)
                                     or e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.ENOTDIR)):
            raise FileChanged(f"{where}: changed after the folder was walked (now a link or not a file)",
                              "changed") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            if identity is not None:
                raise FileChanged(f"{where}: changed after the folder was walked (no longer a regular file)",
                                  "changed")
            raise LoaderError(f"{where}: not a regular file")
        if identity is not None and (st.st_dev, st.st_ino) != (identity.dev, identity.ino):
            raise FileChanged(f"{where}: changed after the folder was walked (another file now)", "changed")
        if identity is not None and identity.root:
            # where the file opened lies: a folder on its path swapped for a link since the walk
            # listed it leads the open (and an identity taken through it) outside the folder
            opened = _opened_path(fd, where)
            if opened is None or not _inside(opened, identity.root):
                raise FileChanged(f"{where}: changed after the folder was walked (it now lies outside "
                                  f"{identity.root}, through a link)", "changed")
        if st.st_size > MAX_FILE_BYTES and (limit is None or limit > MAX_FILE_BYTES):
            raise FileTooLarge(f"{where}: {st.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} a file "
                               f"may have", "too large")
        if _O_NONBLOCK:  # a regular file reads the same either way; back to plain reads
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as fh:
            fd = -1
            # never more than the limit, even from a file that grows after the fstat above (a
            # log being written, a download): read to its end, such a file was read whole.
            # (fh.read(n) allocates n bytes first: n is the size seen, then what a grown file
            # adds is read a piece at a time. A read of MAX_FILE_BYTES + 1 took 256 MiB of
            # address space for every file: MemoryError under a ulimit -v.)
            cap = MAX_FILE_BYTES + 1 if limit is None else limit
            data = fh.read(min(cap, st.st_size + 1))
            if len(data) == st.st_size + 1 < cap:
                parts = [data]
                got = len(data)
                while got < cap:
                    piece = fh.read(min(cap - got, 1 << 20))
                    if not piece:
                        break
                    parts.append(piece)
                    got += len(piece)
                data = b"".join(parts)
        if limit is None and len(data) > MAX_FILE_BYTES:
            raise FileTooLarge(f"{where}: more than the {MAX_FILE_BYTES:,} bytes a file may have (it grew "
                               f"while it was read)", "too large")
        return data, st
    finally:
        if fd >= 0:
            os.close(fd)


def _kernel_root(folder: str) -> str:
    """The folder's path as the kernel names it (:func:`_opened_path` of a descriptor of it),
    what a file's opened path is compared with: ``realpath`` keeps the letter case and Unicode
    form as typed, while macOS's ``F_GETPATH`` (and a case-insensitive mount's
    ``/proc/self/fd``) gives the ones on disk (``~/documents`` against ``Documents``)."""
    real = os.path.realpath(folder)
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError:
        return real
    try:
        return _opened_path(fd, real) or real
    finally:
        os.close(fd)


def _opened_path(fd: int, where: str) -> str | None:
    """The real path of the file open on ``fd``: what the kernel opened, whatever links the
    path went through (Linux: ``/proc/self/fd``; macOS: ``F_GETPATH``); elsewhere the path's
    real path now (``realpath``: a swap between it and the open goes unseen there)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    try:
        import fcntl

        get_path = getattr(fcntl, "F_GETPATH", None)
        if get_path is not None:
            return os.fsdecode(fcntl.fcntl(fd, get_path, bytes(1024)).rstrip(b"\0"))
    except (ImportError, OSError):
        pass
    try:
        return os.path.realpath(where)
    except (OSError, RuntimeError):
        return None


# ---------------------------------------------------------------------------- the walk


def _sorted_entries(directory: str) -> list[os.DirEntry[str]] | None:
    """The folder's entries by name, or None when it cannot be listed (no permission, a path
    too long, gone): not an empty folder, whose files a sync would take for deleted."""
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError:
        return None
    entries.sort(key=lambda e: e.name)
    return entries


@dataclass
class _Frame:
    entries: Iterator[os.DirEntry[str]]
    rel: str  # relative to the root, "" or ending with "/"
    rules: list[_IgnoreFile] = field(default_factory=list)


def _unknown(err: OSError) -> bool:
    """Whether a listed entry whose status failed with ``err`` may still be there (no
    permission to search its folder, an I/O error ...), rather than gone (``ENOENT``,
    ``ENOTDIR``: a folder on its path replaced) or a link loop (``ELOOP``)."""
    return err.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _inside(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or below it (links are not followed out
    of the folder walked, as git does not follow them: a link to ``/etc`` or to another
    project would otherwise pull files the folder does not hold into the index)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def walk(root: str | os.PathLike[str], *, recursive: bool = True, include: Patterns | Sequence[str] | None = None,
         exclude: Patterns | Sequence[str] | None = None) -> Walk:
    """The files under ``root`` ragdb would index and the paths it skips (see the module docs).

    ``include``/``exclude``: gitignore-style patterns relative to ``root``
    (``*.md``, ``docs/``, ``/top.txt``, ``**/api/*.rst``; braces expand).
    A ``root`` that is a file is the one file (if ``include`` lets it).
    Symbolic links are followed within ``root`` (each real folder entered once); a link
    leading outside it is skipped ("link outside").
    Raises :class:`~ragdb.errors.LoaderError` when ``root`` does not exist.
    """
    inc = include if isinstance(include, Patterns) else Patterns(include, "include")
    exc = exclude if isinstance(exclude, Patterns) else Patterns(exclude, "exclude")
    where = os.fspath(root)
    try:
        st = os.stat(where)
    except OSError as e:
        raise LoaderError(f"{where}: no such file or folder ({e.strerror or e})") from None
    if stat.S_ISREG(st.st_mode):
        name = os.path.basename(where)
        if exc.match(name):
            return Walk(where, (), (Skipped(where, "excluded"),), inc.unmatched())
        if inc and not inc.match(name):
            return Walk(where, (), (Skipped(where, "not included"),), inc.unmatched())
        return Walk(where, ((where, name),), (), inc.unmatched() + exc.unmatched(),
                    {where: FileIdentity(st.st_dev, st.st_ino)})
    if not stat.S_ISDIR(st.st_mode):
        return Walk(where, (), (Skipped(where, "not a file"),))
    outer_found, top_rel = _outer_rules(Path(where), where)
    outer = outer_found or []
    parts = [p for p in top_rel.split("/") if p]
    if any(_state(outer, "/".join(parts[:i]) + "/")[0] for i in range(1, len(parts) + 1)):
        # The folder asked for lies in a folder the work tree ignores (a build or cache folder
        # named on purpose): the ignore rules above it would drop every file, so they are not
        # applied; its own .gitignore/.ragdbignore files still are.
        outer = []
    base_real = os.path.realpath(where)
    kernel_root = _kernel_root(where)  # (what FileIdentity.root holds: see read_file)
    lead = "" if os.path.normpath(where) == os.curdir else where  # "./x" is shown as "x"
    files: list[tuple[str, str]] = []
    skipped: list[Skipped] = []
    identities: dict[str, FileIdentity] = {}
    seen: set[str] = {os.path.realpath(where)}
    unreadable: list[str] = []
    listed = _sorted_entries(where)
    own = _folder_rules(Path(where), top_rel, where) if listed is not None else []
    if listed is None or own is None or outer_found is None:
        unreadable.append("")
        skipped.append(Skipped(where, "unreadable", "" if listed is None else "an ignore file cannot be read"))
        listed = None
    stack = [_Frame(iter(listed or ()), "", outer + (own or []))]
    while stack:
        frame = stack[-1]
        entry = next(frame.entries, None)
        if entry is None:
            stack.pop()
            continue
        name = entry.name
        rel = frame.rel + name
        shown = os.path.join(lead, rel) if lead else rel
        try:
            is_dir = entry.is_dir()  # follows links; False for broken links
            is_file = not is_dir and entry.is_file()
        except OSError as e:  # ELOOP on a self-referencing link, permission problems
            if _unknown(e):  # what it is cannot be told: not gone (a sync keeps its documents)
                unreadable += [rel, rel + "/"]  # (a file or a folder: the documents of either are kept)
                skipped.append(Skipped(shown, "unreadable"))
                continue
            is_dir = is_file = False
        if is_dir:
            if not recursive:
                continue
            rel += "/"
            reason = _dir_reason(entry.path, name)
            if reason == "vcs":
                skipped.append(Skipped(shown + "/", "vcs"))
                continue
            excluded = exc.match(rel)
            inc.match(rel)  # a folder pattern ("docs/") counts as matched by the folder
            if excluded:
                skipped.append(Skipped(shown + "/", "excluded"))
                continue
            state, detail = _state(frame.rules, top_rel + rel)
            if reason is not None and state is not False:
                skipped.append(Skipped(shown + "/", reason))
                continue
            if state is True:
                skipped.append(Skipped(shown + "/", "ignored", detail))
                continue
            try:
                real = os.path.realpath(entry.path)
            except (OSError, RuntimeError):  # pragma: no cover - realpath rarely raises
                continue
            if real in seen:
                continue
            if not _inside(real, base_real):
                skipped.append(Skipped(shown + "/", "link outside", real))
                continue
            seen.add(real)
            listed = _sorted_entries(entry.path)
            own = _folder_rules(Path(entry.path), top_rel + rel, shown) if listed is not None else []
            if listed is None or own is None:
                unreadable.append(rel)
                skipped.append(Skipped(shown + "/", "unreadable", "" if listed is None else "an ignore file cannot be read"))
                continue
            stack.append(_Frame(iter(listed), rel, frame.rules + own))
            continue
        if not is_file:
            skipped.append(Skipped(shown, "not a file"))
            continue
        try:
            # the identity read_file holds the file to: the entry itself (never through a link
            # swapped in since the folder was listed), or for a link the file it resolves to
            # now, which must lie inside the folder (lstat: resolved, it is no link itself)
            real = os.path.realpath(entry.path) if entry.is_symlink() else ""
            st = os.lstat(real) if real else entry.stat(follow_symlinks=False)
        except (OSError, RuntimeError) as e:  # gone (or a link loop) since the folder was listed
            if isinstance(e, OSError) and _unknown(e):
                # listed, but its status cannot be read (a folder with read but not search
                # permission): not gone, and a sync must not delete its documents
                unreadable.append(rel)
                skipped.append(Skipped(shown, "unreadable"))
                continue
            skipped.append(Skipped(shown, "vanished"))
            continue
        if real and not _inside(real, base_real):
            skipped.append(Skipped(shown, "link outside", real))
            continue
        if not stat.S_ISREG(st.st_mode):  # swapped for a link, a FIFO ... since it was listed
            skipped.append(Skipped(shown, "changed"))
            continue
        if _sqlite_file(entry):  # never opened: closing a descriptor of it drops this process's SQLite locks
            skipped.append(Skipped(shown, "binary"))
            continue
        reason = file_reason(name)
        if reason == "vcs":
            skipped.append(Skipped(shown, "vcs"))
            continue
        excluded = exc.match(rel)
        included = inc.match(rel) if inc else True
        if excluded:
            skipped.append(Skipped(shown, "excluded"))
            continue
        if not included:
            skipped.append(Skipped(shown, "not included"))
            continue
        if reason in _FIXED:
            skipped.append(Skipped(shown, reason or ""))
            continue
        state, detail = _state(frame.rules, top_rel + rel)
        if reason is not None and state is not False:
            skipped.append(Skipped(shown, reason))
            continue
        if state is True:
            skipped.append(Skipped(shown, "ignored", detail))
            continue
        files.append((shown, rel))
        identities[shown] = FileIdentity(st.st_dev, st.st_ino, kernel_root)
    return Walk(where, tuple(files), tuple(skipped), inc.unmatched() + exc.unmatched(), identities,
                tuple(unreadable))


def reason_summary(counts: Mapping[str, int]) -> str:
    """``"1,100 node_modules, 80 binary"`` from :func:`skip_counts`."""
    return ", ".join(f"{n:,} {reason}" for reason, n in counts.items())
