"""Random write histories through ``ragdb.connect(url, token)`` of a real ``ragdb serve``:
what every caller reads through the server equals what the library reads in the same file,
which equals a fresh build; and every error the client raises is the library's for the same
bad call.

One ``ragdb serve --collections`` on 127.0.0.1 serves one file for the whole module (the
repo's :func:`cli_helpers.serving`); each example is a new collection of it, created by the
administrator's token with the example's chunker, ``keep_versions`` and ``public_unlabeled``,
and dropped after. The server flushes postings every few chunks and merges after two segments,
as :func:`test_random_operations.small_segments` does in this process (a ``sitecustomize`` on
its path; its writers look up every term they do not hold).

The histories are those of tests/engine/test_random_operations.py (its strategies,
:class:`Model` and :class:`Run`, imported), applied as :class:`RemoteRun` says: the writes a
client makes (adds, batches, replaces, re-adds, updates, deletes by id, source, glob and
filter) go through the administrator's client; what a client cannot do (``optimize``, a
transaction block that raises midway and is rolled back, the writes of "another handle")
goes through the library on the same file while the server keeps its handles open; the side
collection is created, written and dropped through the client; "reopen" reconnects every
client and reopens the library's handle. Added here: a step that makes one bad call (a bad
filter on every read and on delete, missing documents by id and by source, documents hidden
from the caller, bad add and update arguments) through a client and through the library.

At checkpoints and at the end, :func:`observe` of the library's handle equals that of a fresh
build (``add_many`` of the model's latest documents), ``check()`` finds nothing, and
:func:`observe` through the server equals the library's. ``observe`` runs unchanged against
:class:`Callers`, which stands for the library's ``principals=`` argument with a client per
caller: no principals is the client without a token (anonymous), ``["a"]`` and
``["b", "c"]`` clients whose tokens (``--tokens``) read as those labels, ``ragdb.ALL`` the
administrator's token (the full view; also ``stats()``). A client cannot search with
``collapse=False`` (refused with InvalidInput, checked): that observation is left out of the
comparison with the server.

Not carried over: the kernels (the compiled one on both sides) and the fresh-process and
older-handle readers (tests/engine/test_random_operations.py has them).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import ragdb  # noqa: E402
from cli_helpers import ROOT, serving  # noqa: E402
from engine.test_random_operations import (QUERIES, Model, Run, assert_same, observe,  # noqa: E402
                                           observed, records, small_segments, sources, step)
from ragdb.client.remote import Client  # noqa: E402
from ragdb.errors import (CollectionExists, CollectionNotFound, DocumentNotFound, InvalidInput,  # noqa: E402
                          RagdbError)

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "20"))

ADMIN = "remote-admin-token-aaaaaaaaaaaaaaaa"
TOKENS = {"a": "remote-reader-a-bbbbbbbbbbbbbbbbbb", "b,c": "remote-reader-bc-cccccccccccccccc"}

#: the server's small segments (as small_segments(whole_vocabulary=False) in this process)
SITECUSTOMIZE = """
import ragdb.engine.write
import ragdb.index.inverted

ragdb.engine.write.FLUSH_THRESHOLD = 4
ragdb.engine.write.WRITER_TERM_CACHE = 0
ragdb.index.inverted.MAX_SEGMENTS = 2
ragdb.index.inverted.MERGE_PART_POSTINGS = 7
ragdb.index.inverted._capacity = lambda size: size
"""

NAN, INF = float("nan"), float("inf")
#: bad filters: each refused by every read that takes a filter, and by delete(filter=)
BAD_FILTERS = [{"$bogus": 1}, {"n": {"$gte": "x"}}, {"n": {"$in": 5}}, {"": 1}, {"$and": 5}, {"n": {"$between": 1}},
               {"tags": {"$all": []}}, {"$not": []}, {"lang": {"$eq": {"a": 1}}}, {"n": NAN}, {"n": {"$in": [INF]}},
               {"w": {"$ne": -INF}}, {1: "x"}, {"$or": [{"lang": "en"}, {"n": {"$lt": NAN}}]}]
#: bad changes of a record (add_many) and bad arguments of update()
BAD_CHANGES = [{"metadata": {"n": {1, 2}}}, {"acl": [5]}, {"acl": [""]}, {"source": ""}, {"version": [3]},
               {"title": ["t"]}, {"text": ""}, {"timestamp": "2026-13-01"}, {"metadata": {"w": NAN}},
               {"metadata": {"w": [1.0, INF]}}, {"metadata": {1: "x"}}, {"metadata": {"m": {"k": -INF}}}]
BAD_UPDATES = [{"metadata": {"n": {1}}}, {"metadata": {"w": NAN}}, {"metadata": {2: "x"}}, {"metadata": 5},
               {"acl": "a"}, {"acl": [5]}, {"metadata": {"m": [INF]}}]


class Callers:
    """The library's ``principals=`` argument, for :func:`observe` and :meth:`Run.write`, as
    one client per caller: each read goes to the client whose token reads as those
    principals, without them; the writes (and ``stats()``) to the administrator's."""

    def __init__(self, clients: dict[str, Client]) -> None:
        self.clients = clients

    def __getattr__(self, name: str) -> Any:  # add_many, update, delete
        return getattr(self.clients["ALL"], name)

    def pick(self, principals: Any) -> Client:
        if principals is None:
            return self.clients["anonymous"]
        if principals is ragdb.ALL:
            return self.clients["ALL"]
        return self.clients[",".join(principals)]

    def search(self, query: str, k: int | None = None, *, principals: Any = None, collapse: bool = True,
               **keywords: Any) -> list:
        client = self.pick(principals)
        if not collapse:
            with pytest.raises(InvalidInput):
                client.search(query, k, collapse=False, **keywords)
            return []
        return client.search(query, k, **keywords)

    def query_plan(self, query: str, *, principals: Any = None, **keywords: Any) -> Any:
        return self.pick(principals).query_plan(query, **keywords)

    def count(self, *, principals: Any = None, **keywords: Any) -> int:
        return self.pick(principals).count(**keywords)

    def documents(self, source: str | None = None, *, principals: Any = None, **keywords: Any) -> list:
        return self.pick(principals).documents(source, **keywords)

    def facets(self, field: str, query: str | None = None, *, principals: Any = None, **keywords: Any) -> Any:
        return self.pick(principals).facets(field, query, **keywords)

    def get(self, doc_id: int | None = None, *, principals: Any = None, **keywords: Any) -> Any:
        return self.pick(principals).get(doc_id, **keywords)

    def stats(self) -> Any:
        return self.clients["ALL"].stats()


def without_all_copies(observations: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in observations.items() if not key.endswith(" all copies")}


def bad_call(which: int, db: Any, principals: Any, writer: bool, source: str, record: dict, doc_id: int) -> None:
    """Bad call ``which`` (modulo how many) on ``db``: the library's handle (``principals`` a
    keyword) or a client reading as its token's (``principals`` None); the bad writes only for
    a ``writer`` (the administrator's token, the library's full view). ``doc_id``: a stored
    document's, or one that is not."""
    who = {} if principals is None else {"principals": principals}
    bad = BAD_FILTERS[which % len(BAD_FILTERS)]
    calls = [
        lambda: db.search("apple", k=5, filter=bad, **who),
        lambda: db.count(filter=bad, **who),
        lambda: db.documents(filter=bad, **who),
        lambda: db.documents("a/*", filter=bad, **who),
        lambda: db.facets("lang", "apple", filter=bad, **who),
        lambda: db.query_plan("apple", filter=bad, **who),
        lambda: db.get(source="nothing/here", **who),
        lambda: db.get(2 ** 40, **who),
        lambda: db.get(doc_id, **who),  # hidden from some callers, or missing
        lambda: db.get(source=source, **who),
        lambda: db.search("apple", k=0, **who),
        lambda: db.search("apple", scorer="bm42", **who),
        lambda: db.search("apple", since=INF, **who),
        lambda: db.search("apple", until="soon", **who),
        lambda: db.facets("lang", by="pages", **who),
        lambda: db.documents(versions="some", **who),
    ]
    if writer:
        change = BAD_CHANGES[which % len(BAD_CHANGES)]
        calls += [
            lambda: db.delete(filter=bad),
            lambda: db.delete(2 ** 40),
            lambda: db.update(2 ** 40, metadata={"n": 1}),
            lambda: db.update(doc_id, **BAD_UPDATES[which % len(BAD_UPDATES)]),
            lambda: db.add_many([{**record, "source": source, **change}]),
            lambda: db.add_many([{**record, "source": "n/ok"}, {**record, "source": source, **change}]),
        ] * 2
    calls[which % len(calls)]()


class RemoteRun(Run):
    """A :class:`Run` whose writer is the administrator's client of the served collection
    ``name``; ``lib`` is the library's handle on it, ``root`` the library's on the file."""

    def __init__(self, url: str, path: str, name: str, chunker: str, keep_versions: bool,
                 public_unlabeled: bool) -> None:
        self.url, self.path, self.name, self.chunker, self.kernel = url, path, name, chunker, "compiled"
        self.side_name = f"{name}-side"
        self.options = {"chunker": chunker, "keep_versions": keep_versions, "public_unlabeled": public_unlabeled}
        with ragdb.connect(url, ADMIN) as admin:
            admin.create_collection(name, **self.options)
        self.root = ragdb.open(path)
        self.lib = self.root.collection(name, create=False)
        self.model = Model(keep_versions)
        self.serial = 0
        self.clients: dict[str, Client] = {}
        self.connect()

    def connect(self) -> None:
        for client in self.clients.values():
            client.close()
        if self.clients:
            self.admin.close()
        self.clients = {"anonymous": ragdb.connect(self.url, collection=self.name),
                        "ALL": ragdb.connect(self.url, ADMIN, collection=self.name),
                        **{name: ragdb.connect(self.url, token, collection=self.name)
                           for name, token in TOKENS.items()}}
        self.admin = ragdb.connect(self.url, ADMIN)  # the file's collections
        self.db = Callers(self.clients)

    def add_rows(self, db, rows: list[dict], **keywords):
        if isinstance(db, Callers):
            return db.add_many(rows, **keywords)
        return super().add_rows(db, rows, **keywords)

    def write(self, db, model, op: tuple) -> None:
        """:meth:`Run.write`, except that a client's ``add_many`` sends a request per
        ``batch_size`` records, each one transaction, and the server refuses a request holding
        two records of one source (InvalidInput, that request and the later ones unwritten),
        where the library's replaces the first with the second."""
        if not (op[0] == "add_many" and isinstance(db, Callers)):
            return super().write(db, model, op)
        pairs = self.batch(op[1])
        requests = [pairs[i:i + op[2]] for i in range(0, len(pairs), op[2])]
        sent = []
        for request in requests:
            if len({source for source, _ in request}) < len(request):
                break
            sent.extend(request)
        rows = [{**record, "source": source} for source, record in pairs]
        if len(sent) == len(pairs):
            want = [model.add(source, record) for source, record in pairs]
            assert [c.status for c in db.add_many(rows, batch_size=op[2]).changes] == want, pairs
            return
        with pytest.raises(InvalidInput, match="have the same source"):
            db.add_many(rows, batch_size=op[2])
        for source, record in sent:
            model.add(source, record)

    def both_raise(self, which: int, source: str, record: dict) -> None:
        """Bad call ``which`` raises the same RagdbError through each caller's client as through
        the library with the caller's principals; the bad writes raise (so write nothing)."""
        try:
            doc_id = self.lib.get(source=source, principals=ragdb.ALL).id
        except DocumentNotFound:
            doc_id = 2 ** 40
        for name, principals in (("anonymous", None), ("a", ["a"]), ("b,c", ["b", "c"]), ("ALL", ragdb.ALL)):
            errors: list[BaseException | None] = []
            for db, who in ((self.lib, principals), (self.clients[name], None)):
                try:
                    bad_call(which, db, who, name == "ALL", source, record, doc_id)
                except Exception as e:  # noqa: BLE001 - compared below
                    errors.append(e)
                else:
                    errors.append(None)
            lib_error, remote_error = errors
            where = f"bad call {which} as {name}"
            if lib_error is None:
                assert remote_error is None, f"{where}: the client raised {remote_error!r}, the library nothing"
                continue
            assert isinstance(lib_error, RagdbError), f"{where}: the library raised {lib_error!r}"
            assert type(remote_error) is type(lib_error), \
                f"{where}: the client raised {remote_error!r}, the library {lib_error!r}"

    def apply(self, op: tuple) -> None:
        kind = op[0]
        if kind == "bad_batch":
            pairs = self.batch(op[1])
            bad = {**op[3], "source": "bad"}
            rows = [{**record, "source": source} for source, record in pairs]
            rows.insert(op[2] % (len(rows) + 1), bad)
            got = []
            for db in (self.db, self.lib):
                with pytest.raises(RagdbError) as raised:
                    self.add_rows(db, copy.deepcopy(rows))
                got.append(raised.value)
            assert type(got[0]) is type(got[1]) and isinstance(got[1], InvalidInput), got
        elif kind == "bad_call":
            self.both_raise(*op[1:])
        elif kind == "optimize":
            self.lib.optimize(vacuum=op[1])
        elif kind == "elsewhere":  # the library writes, then optimizes or not
            for inner in op[1]:
                self.write(self.lib, self.model, inner)
            if op[2]:
                self.lib.optimize(vacuum=False)
        elif kind == "transaction":
            self.rolled_back(self.lib, op[1])
        elif kind == "collection":
            self.collection(*op[1:])
        elif kind == "reopen":
            self.connect()
            self.root.close()
            self.root = ragdb.open(self.path)
            self.lib = self.root.collection(self.name, create=False)
        elif kind == "checkpoint":
            self.compare(process=False)
        else:
            self.write(self.db, self.model, op)

    def collection(self, action: str, source: str, text: str) -> None:
        model, admin, name = self.model, self.admin, self.side_name
        if action == "create":
            if model.side is None:
                admin.create_collection(name, chunker="none")
                model.side = {}
            else:
                with pytest.raises(CollectionExists):
                    admin.create_collection(name)
        elif action == "add":
            admin.collection(name, chunker="none").add(text, source=source)
            model.side = {**(model.side or {}), source: text}
        elif model.side is None:
            with pytest.raises(CollectionNotFound):
                admin.drop_collection(name)
        else:
            admin.drop_collection(name)
            model.side = None

    def compare(self, process: bool) -> None:
        srcs = sorted(self.model.seen)
        with ragdb.open(":memory:", **self.options) as fresh:
            fresh.add_many(self.model.records(), chunker=self.chunker)
            want = observed(fresh, srcs)
        assert self.lib.check() == []
        library = observed(self.lib, srcs)
        assert_same(library, want, "the library")
        remote = observe(Callers(self.clients), srcs, QUERIES)
        assert_same(without_all_copies(orjson.loads(orjson.dumps(remote))), without_all_copies(library),
                    "the server's clients")
        self.compare_side()

    def compare_side(self) -> None:
        side, name = self.model.side, self.side_name
        for handle_of in (lambda create: self.root.collection(name, create=create),
                          lambda create: self.admin.collection(name, create=create)):
            if side is None:
                with pytest.raises(CollectionNotFound):
                    handle_of(False)
                continue
            with ragdb.open(":memory:", chunker="none") as fresh:
                fresh.add_many([{"text": t, "source": s} for s, t in sorted(side.items())])
                handle = handle_of(False)
                for q in QUERIES[:4]:
                    got = [[h.source, h.text, h.score] for h in handle.search(q, k=40)]
                    assert_same(got, [[h.source, h.text, h.score] for h in fresh.search(q, k=40)],
                                "the side collection")
                assert handle.count() == len(side)

    def run(self, ops) -> None:
        try:
            for op in ops:
                self.apply(op)
            self.compare(process=False)
        finally:
            with contextlib.suppress(RagdbError):
                self.admin.drop_collection(self.name)
            with contextlib.suppress(RagdbError):
                self.admin.drop_collection(self.side_name)
            for client in (*self.clients.values(), self.admin):
                client.close()
            self.root.close()


@contextlib.contextmanager
def server(folder: Path) -> Iterator[tuple[str, str]]:
    """(url, path): a ``ragdb serve --collections`` of a new file in ``folder``, with the
    administrator's token and a reader token each for ``["a"]`` and ``["b", "c"]``."""
    path = folder / "kb.db"
    ragdb.open(path).close()
    tokens = folder / "tokens.json"
    tokens.write_text(json.dumps({token: {"principals": name.split(","), "write": False}
                                  for name, token in TOKENS.items()}))
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"RAGDB_API_TOKEN": ADMIN, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    with serving(str(path), folder, "--collections", "--tokens", str(tokens), env=env) as url:
        yield url, str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with server(tmp_path_factory.mktemp("remote")) as both:
        yield both


_names = iter(range(1, 1 << 30))

bad_calls = st.tuples(st.just("bad_call"), st.integers(0, 200), sources, records)
remote_step = st.one_of(step, bad_calls, bad_calls, bad_calls)
remote_histories = st.lists(remote_step, min_size=3, max_size=30)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=remote_histories, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]),
       keep_versions=st.booleans(), public_unlabeled=st.booleans(), whole_vocabulary=st.booleans())
def test_random_histories_through_a_server(served, ops, chunker, keep_versions, public_unlabeled, whole_vocabulary):
    """After any history of writes through a server's client (and of optimizes, rollbacks and
    writes through the library beside it), every caller reads through the server what the
    library reads with its principals, the library what a fresh build holds, and every bad
    call raises the library's error through the client too."""
    note(f"chunker={chunker!r}, keep_versions={keep_versions}, public_unlabeled={public_unlabeled}, "
         f"whole_vocabulary={whole_vocabulary}\nops={ops!r}")
    url, path = served
    with small_segments(whole_vocabulary):
        RemoteRun(url, path, f"r{next(_names)}", chunker, keep_versions, public_unlabeled).run(ops)

