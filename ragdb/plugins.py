"""Plugins: packages that add embedders, rerankers, loaders and analyzers to ragdb.

A plugin is a module (or any object) with :data:`hookimpl`-marked functions,
named by an entry point in the ``ragdb`` group of its package::

    # pyproject.toml of the plugin package
    [project.entry-points.ragdb]
    myplugin = "ragdb_myplugin"

    # ragdb_myplugin.py
    import ragdb.plugins

    @ragdb.plugins.hookimpl
    def register_embedders(register):
        register("myplugin-embedder", MyEmbedder)          # get_embedder("myplugin-embedder")

    @ragdb.plugins.hookimpl
    def register_loaders(register):
        register("xyz", load_xyz, suffixes=[".xyz"])       # ragdb add notes.xyz

The hooks (see :class:`Hooks`) each receive a ``register`` callback. What a
plugin registers extends the built-in lookups: :func:`ragdb.embeddings.get_embedder`,
:func:`ragdb.rerank.get_reranker`, the loaders of :func:`ragdb.loaders.load_file`
and :func:`ragdb.loaders.load_bytes`, and :meth:`ragdb.analysis.Analyzer.from_spec`.
Built-in names cannot be replaced, and a name two plugins register goes to the
first (the second is reported as a problem).

Plugins are found once per process, on the first lookup that needs them
(entry points are read lazily, so importing ragdb loads no plugin). A plugin
that fails to import, or whose hook raises, does not break ragdb: it is
skipped and reported by :func:`plugin_infos` (``ragdb plugins``). The
environment variable ``RAGDB_LOAD_PLUGINS`` restricts loading to a
comma-separated list of entry-point or distribution names (empty: none).

The hook machinery is `pluggy <https://pluggy.readthedocs.io>`_ (the plugin
system of pytest, llm and sqlite-utils).
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from .errors import InvalidInput

__all__ = ["hookimpl", "hookspec", "Hooks", "Provided", "PluginInfo", "ENTRY_POINT_GROUP", "KINDS",
           "BUILTIN_SUFFIXES", "manager", "register", "unregister", "provided", "lookup", "loader_suffixes", "plugin_infos", "reset"]

#: The entry-point group plugins declare themselves in.
ENTRY_POINT_GROUP = "ragdb"

#: What plugins can provide, in the order ``ragdb plugins`` lists it.
KINDS: tuple[str, ...] = ("embedder", "reranker", "loader", "analyzer")

hookspec = pluggy.HookspecMarker("ragdb")
hookimpl = pluggy.HookimplMarker("ragdb")


class Hooks:
    """The hook specifications. Each hook gets ``register``; call it once per thing provided."""

    @hookspec
    def register_embedders(self, register: Callable[..., None]) -> None:
        """``register(name, factory)``: ``factory()`` (spec ``name``) or ``factory(arg)``
        (spec ``name:arg``) returns an :class:`ragdb.embeddings.Embedder`. The embedder's
        ``name`` (recorded in a database with its vectors) should be a spec that
        reaches the same model again, e.g. ``name`` itself."""

    @hookspec
    def register_rerankers(self, register: Callable[..., None]) -> None:
        """``register(name, factory)``: ``factory()`` / ``factory(arg)`` (spec ``name`` /
        ``name:arg``) returns a :class:`ragdb.rerank.Reranker`."""

    @hookspec
    def register_loaders(self, register: Callable[..., None]) -> None:
        """``register(kind, load, suffixes=(".xyz",))``: ``load(data: bytes, source: str)``
        returns a :class:`ragdb.types.LoadedDocument`, a list of them, or the text (str).
        Files with one of ``suffixes`` are read with it; ``--kind KIND`` /
        ``load_bytes(kind=KIND)`` selects it for bytes."""

    @hookspec
    def register_analyzers(self, register: Callable[..., None]) -> None:
        """``register(name, cls)``: ``cls`` is a :class:`ragdb.analysis.Analyzer` subclass
        whose ``config()`` has ``"name": name`` (stored in the database, so keep it
        stable) and whose ``from_config(config)`` rebuilds it from that mapping;
        ``cls()`` is the analyzer of spec ``name``."""


_HOOKS: dict[str, str] = {"embedder": "register_embedders", "reranker": "register_rerankers",
                          "loader": "register_loaders", "analyzer": "register_analyzers"}


@dataclass(frozen=True)
class Provided:
    """One thing a plugin provides: its ``kind`` (:data:`KINDS`), ``name``, the object
    registered (factory, loader function or analyzer class), the plugin's name, and
    for loaders the file ``suffixes``."""

    kind: str
    name: str
    obj: Any
    plugin: str
    suffixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PluginInfo:
    """A plugin as ``ragdb plugins`` lists it: entry-point ``name``, its distribution
    (``package``, ``version``), what it ``provides`` and the ``problems`` met
    (an import error, a hook that raised, a name already taken). ``loaded`` is
    False when it could not be imported at all."""

    name: str
    package: str | None
    version: str | None
    loaded: bool
    provides: tuple[Provided, ...] = ()
    problems: tuple[str, ...] = ()
    hooks: tuple[str, ...] = field(default=())


class _State:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("ragdb")
        self.pm.add_hookspecs(Hooks)
        self.dists: dict[str, tuple[str | None, str | None]] = {}  # plugin name -> (package, version)
        self.failed: dict[str, str] = {}  # entry point that did not import -> why
        self.registry: dict[str, dict[str, Provided]] | None = None
        self.problems: dict[str, list[str]] = {}
        self.provided: dict[str, list[Provided]] = {}
        self.suffixes: frozenset[str] = frozenset()


_lock = threading.RLock()
_state: _State | None = None


def _builtin_names(kind: str) -> frozenset[str]:
    """Names a plugin may not take: the built-in specs of each lookup."""
    return {
        "embedder": frozenset({"hash", "wordllama", "e5", "openai", "st"}),
        "reranker": frozenset({"http", "cross-encoder"}),
        "loader": frozenset({"text", "markdown", "rst", "html", "pdf", "jsonl", "txt", "plain", "md", "rest",
                             "restructuredtext", "htm", "ndjson"}),
        "analyzer": frozenset({"default", "jieba", "simple", "ragdb"}),
    }[kind]


#: The suffixes ragdb's own loaders read (kept in step with ragdb.loaders; plugins.py imports
#: nothing of ragdb but its errors, so that every module may use it).
BUILTIN_SUFFIXES = frozenset(".txt .text .md .markdown .mdown .mkd .rst .rest .html .htm .pdf .jsonl .ndjson".split())


def _wanted(ep: importlib.metadata.EntryPoint) -> bool:
    only = os.environ.get("RAGDB_LOAD_PLUGINS")
    if only is None:
        return True
    names = {n.strip().lower() for n in only.split(",") if n.strip()}
    dist = ep.dist.name.lower() if ep.dist is not None else None
    return ep.name.lower() in names or (dist is not None and dist in names)


def _load_entry_points(state: _State) -> None:
    try:
        eps: Iterable[importlib.metadata.EntryPoint] = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as e:  # a broken metadata folder on sys.path must not break ragdb
        state.failed["(entry points)"] = f"cannot read entry points: {type(e).__name__}: {e}"
        return
    seen: set[str] = set()
    for ep in sorted(eps, key=lambda e: e.name):
        if ep.name in seen or not _wanted(ep):
            continue
        seen.add(ep.name)
        dist = (ep.dist.name, ep.dist.version) if ep.dist is not None else (None, None)
        state.dists[ep.name] = dist
        try:
            obj = ep.load()
            state.pm.register(obj, name=ep.name)
        except Exception as e:  # any failure of a plugin's import: report it, keep going
            state.failed[ep.name] = f"cannot load {ep.value}: {type(e).__name__}: {' '.join(str(e).split())}"


def manager() -> pluggy.PluginManager:
    """The process's plugin manager, with the installed plugins loaded (on first call)."""
    return _ensure().pm


def _ensure() -> _State:
    global _state
    with _lock:
        if _state is None:
            state = _State()
            _load_entry_points(state)
            _state = state
        return _state


def register(plugin: object, name: str | None = None) -> None:
    """Register a plugin object in this process (what an entry point does; for tests and
    applications that bring their own embedders or loaders)."""
    with _lock:
        state = _ensure()
        try:
            plugin_name = state.pm.register(plugin, name=name)
        except ValueError as e:  # pluggy: that name or object is registered already
            raise InvalidInput(f"plugin {name or plugin!r}: {e}") from None
        except pluggy.PluginValidationError as e:
            raise InvalidInput(f"plugin {name or plugin!r} does not fit ragdb's hooks: {e}") from None
        if plugin_name is None:
            raise InvalidInput(f"plugin {name or plugin!r} is blocked")
        state.registry = None


def unregister(name: str) -> None:
    """Remove the plugin registered under ``name`` (no error if there is none)."""
    with _lock:
        state = _ensure()
        plugin = state.pm.get_plugin(name)
        if plugin is not None:
            state.pm.unregister(plugin, name=name)
        state.registry = None


def reset() -> None:
    """Forget every plugin; the next lookup reads the entry points again."""
    global _state
    with _lock:
        _state = None


class _Registrar:
    """The ``register`` callback one plugin's hook gets: checks what is registered and
    records it (or the problem) under the plugin's name."""

    def __init__(self, kind: str, plugin: str, registry: dict[str, dict[str, Provided]],
                 suffix_owner: dict[str, str], mine: list[Provided], problems: list[str]) -> None:
        self.kind, self.plugin, self.registry = kind, plugin, registry
        self.suffix_owner, self.mine, self.problems = suffix_owner, mine, problems

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        try:
            self._take(*args, **kwargs)
        except (InvalidInput, TypeError) as e:  # TypeError: called with the wrong arguments
            self.problems.append(f"{_HOOKS[self.kind]}: {e}")

    def _take(self, name: Any, obj: Any, *, suffixes: Iterable[str] = ()) -> None:
        kind = self.kind
        if not isinstance(name, str) or not name.strip() or ":" in name:
            raise InvalidInput(f"{kind} name must be a non-empty string without ':', got {name!r}")
        key = name.strip().lower()
        if key in _builtin_names(kind):
            raise InvalidInput(f"{kind} {name!r} is built into ragdb")
        if key in self.registry[kind]:
            raise InvalidInput(f"{kind} {name!r} is already provided by plugin {self.registry[kind][key].plugin!r}")
        if not callable(obj):
            raise InvalidInput(f"{kind} {name!r}: expected a callable or a class, got {type(obj).__name__}")
        fixed: list[str] = []
        for suffix in suffixes if kind == "loader" else ():
            suffix = str(suffix).lower()
            suffix = suffix if suffix.startswith(".") else "." + suffix
            if suffix in self.suffix_owner:
                raise InvalidInput(f"loader {name!r}: suffix {suffix!r} is already read by {self.suffix_owner[suffix]}")
            fixed.append(suffix)
        for suffix in fixed:
            self.suffix_owner[suffix] = f"plugin {self.plugin!r}"
        provided = Provided(kind=kind, name=name.strip(), obj=obj, plugin=self.plugin, suffixes=tuple(fixed))
        self.registry[kind][key] = provided
        self.mine.append(provided)


def _collect(state: _State) -> dict[str, dict[str, Provided]]:
    registry: dict[str, dict[str, Provided]] = {kind: {} for kind in KINDS}
    state.problems = {}
    state.provided = {}
    # the built-in suffixes are not the plugins' to take
    suffix_owner: dict[str, str] = dict.fromkeys(BUILTIN_SUFFIXES, "ragdb itself")
    for plugin_name, plugin in state.pm.list_name_plugin():
        if plugin is None:
            continue
        mine: list[Provided] = []
        problems = state.problems.setdefault(plugin_name, [])
        for kind, hook_name in _HOOKS.items():
            registrar = _Registrar(kind, plugin_name, registry, suffix_owner, mine, problems)
            # Each plugin's hook implementation is called on its own (not through
            # pm.hook, which calls them all in one go) so that what is registered can be
            # attributed to its plugin, and one raising hook does not hide the others.
            for impl in getattr(state.pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    impl.function(register=registrar)
                except Exception as e:  # a plugin bug: reported, the rest of ragdb works
                    problems.append(f"{hook_name} raised {type(e).__name__}: {' '.join(str(e).split())}")
        state.provided[plugin_name] = mine
    return registry


def _registry() -> dict[str, dict[str, Provided]]:
    with _lock:
        state = _ensure()
        if state.registry is None:
            state.registry = _collect(state)
            state.suffixes = frozenset(s for p in state.registry["loader"].values() for s in p.suffixes)
        return state.registry


def provided(kind: str) -> Mapping[str, Provided]:
    """What the plugins provide of ``kind`` (:data:`KINDS`), by lower-cased name."""
    if kind not in KINDS:
        raise InvalidInput(f"unknown plugin kind {kind!r}; one of {', '.join(KINDS)}")
    return dict(_registry()[kind])


def lookup(kind: str, name: str) -> Provided | None:
    """The plugin-provided ``kind`` called ``name`` (case-insensitive), or None."""
    return _registry()[kind].get(name.strip().lower()) if kind in KINDS else None


def loader_suffixes() -> frozenset[str]:
    """The file suffixes (lower case, with the dot) that plugin loaders read."""
    _registry()
    return _ensure().suffixes


def plugin_infos() -> list[PluginInfo]:
    """Every plugin found (loaded or not), sorted by name, with what it provides and its problems."""
    with _lock:
        _registry()
        state = _ensure()
        out: list[PluginInfo] = []
        for name, plugin in state.pm.list_name_plugin():
            if plugin is None:
                continue
            package, version = state.dists.get(name, (None, None))
            hooks = tuple(sorted(h.name for h in state.pm.get_hookcallers(plugin) or ()))
            out.append(PluginInfo(name=name, package=package, version=version, loaded=True,
                                  provides=tuple(state.provided.get(name, ())),
                                  problems=tuple(state.problems.get(name, ())), hooks=hooks))
        for name, why in state.failed.items():
            package, version = state.dists.get(name, (None, None))
            out.append(PluginInfo(name=name, package=package, version=version, loaded=False, problems=(why,)))
        return sorted(out, key=lambda p: p.name)
