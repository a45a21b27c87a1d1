"""Access labels fail closed on every read path (property test against a brute-force oracle).

The rule (README, "Access labels"): a document with labels is visible only to a
caller holding one of them, or to everyone when one is ``ragdb.PUBLIC``; a
document without labels is public when ``public_unlabeled`` is on; a kept older
version also needs its latest version to be visible. Omitted ``principals`` is an
anonymous caller; ``ragdb.ALL`` sees everything.
"""

from __future__ import annotations

import io
import subprocess
import sys

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.files import transfer
from ragdb.errors import DocumentNotFound, InvalidInput



def run_cli(args, check=True):
    """``ragdb ARGS`` in a real subprocess."""
    p = subprocess.run([sys.executable, "-m", "ragdb.cli", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p

LABELS = ["a", "b", "c", ragdb.PUBLIC]
WORDS = ["apple", "banana", "cherry", "delta", "echo", "fox"]


def visible(acl: tuple[str, ...], principals, public_unlabeled: bool) -> bool:
    if principals is ragdb.ALL:
        return True
    held = set(principals or ())
    if not acl:
        return public_unlabeled
    return ragdb.PUBLIC in acl or bool(held & set(acl))


class EchoLLM:
    """An LLM that answers with every source it was given (so ask's sources are what it saw)."""

    name = "echo"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def complete(self, messages, **_):
        self.seen.append(messages[-1]["content"] if isinstance(messages[-1], dict) else str(messages[-1]))
        return "The sources say so [1]."


docs_strategy = st.lists(
    st.tuples(st.sampled_from(["s0", "s1", "s2", "s3", "s4", "s5"]),
              st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
              st.one_of(st.none(), st.lists(st.sampled_from(LABELS), max_size=2))),
    min_size=1, max_size=10)
principals_strategy = st.one_of(st.none(), st.just(ragdb.ALL), st.lists(st.sampled_from(["a", "b", "c", "z"]),
                                                                        max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=docs_strategy, principals=principals_strategy, public_unlabeled=st.booleans(),
       keep_versions=st.booleans())
def test_no_read_path_leaks(tmp_path_factory, docs, principals, public_unlabeled, keep_versions, each_kernel):
    path = tmp_path_factory.mktemp("acl") / "kb.db"
    with ragdb.open(path, public_unlabeled=public_unlabeled, keep_versions=keep_versions,
                    embedder="hash:16") as db:
        model: dict[str, tuple[str, ...]] = {}  # source -> the labels its latest version must have
        for source, words, acl in docs:
            db.add(" ".join(words), source=source, acl=acl)
            # acl=None keeps the replaced version's labels (an edit never opens a document)
            model[source] = model.get(source, ()) if acl is None else tuple(sorted(set(acl)))
        every = db.documents(versions="all", principals=ragdb.ALL)
        latest_acl = {d.source: d.acl for d in every if d.latest}
        assert latest_acl == model

        def ok(doc_id: int) -> bool:
            d = next(x for x in every if x.id == doc_id)
            return visible(d.acl, principals, public_unlabeled) and (
                d.latest or visible(latest_acl[d.source], principals, public_unlabeled))

        allowed = {d.id for d in every if ok(d.id)}
        kw = {} if principals is None else {"principals": principals}
        query = " ".join(WORDS)
        for scorer in ("bm25", "tfidf", "vector", "hybrid"):
            for versions in ("latest", "all"):
                hits = db.search(query, k=50, scorer=scorer, versions=versions, collapse=False, **kw)
                assert {h.doc_id for h in hits} <= allowed, (scorer, versions)
                expected = {d.id for d in every if d.id in allowed and (versions == "all" or d.latest)}
                if scorer in ("bm25", "tfidf"):  # every document matches the query
                    assert {h.doc_id for h in hits} == expected, (scorer, versions)
        # min_confidence=0: every visible document is evidence here (the refusal floor,
        # tested in test_refusal.py, would drop one-word documents against this long query)
        prompt = db.build_prompt(query, k=50, min_confidence=0, **kw)
        assert {h.doc_id for h in prompt.sources} <= allowed
        assert prompt.refused == (not any(d.latest and d.id in allowed for d in every))
        llm = EchoLLM()
        answer = db.ask(query, llm, k=50, min_confidence=0, **kw)
        assert {h.doc_id for h in answer.hits} <= allowed
        if not answer.hits:
            assert llm.seen == []  # refused without calling the model
        for versions in ("latest", "all"):
            listed = {d.id for d in db.documents(versions=versions, **kw)}
            assert listed == {d.id for d in every if d.id in allowed and (versions == "all" or d.latest)}
        exported = list(db.records(**kw))
        assert len(exported) == len(allowed)
        buf = io.BytesIO()
        report = transfer.export_jsonl(db, buf, **kw)
        assert report.documents == len(allowed) and report.hidden == len(every) - len(allowed)
        assert {orjson.loads(line)["source"] for line in buf.getvalue().splitlines()} == \
            {d.source for d in every if d.id in allowed}
        for d in every:
            if d.id in allowed:
                assert db.get(d.id, **kw).id == d.id
            else:
                with pytest.raises(DocumentNotFound, match=f"no document with id {d.id}$"):
                    db.get(d.id, **kw)
            if d.latest:
                if d.id in allowed:
                    assert db.get(source=d.source, **kw).id == d.id
                else:
                    with pytest.raises(DocumentNotFound):
                        db.get(source=d.source, **kw)


def test_anonymous_default_on_a_database_without_labels_sees_everything(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        assert db.settings["public_unlabeled"] is True
        db.add("apples are red", source="a")
        db.add("apples are green", source="b")
        assert {h.source for h in db.search("apples")} == {"a", "b"}
        assert len(db.documents()) == 2


def test_labelled_chunks_never_reach_an_anonymous_prompt(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add("The salary table for 2026 lists every salary.", source="hr/salaries.md", acl=["hr"])
        db.add("The cafeteria opens at nine.", source="pub/cafe.md")
        db.add("Salary questions go to the HR office.", source="pub/hr.md", acl=[ragdb.PUBLIC])
        assert {h.source for h in db.search("salary")} == {"pub/hr.md"}
        assert {h.source for h in db.search("salary", principals=["hr"])} == {"hr/salaries.md", "pub/hr.md"}
        assert {h.source for h in db.search("salary", principals=ragdb.ALL)} == {"hr/salaries.md", "pub/hr.md"}
        prompt = db.build_prompt("salary table")
        assert "salary table for 2026" not in prompt.text
        with pytest.raises(DocumentNotFound):
            db.get(source="hr/salaries.md")
        assert db.get(source="hr/salaries.md", principals=["hr"]).acl == ("hr",)


def test_public_unlabeled_off_hides_unlabeled_from_anonymous_but_not_public_label(tmp_path):
    with ragdb.open(tmp_path / "kb.db", public_unlabeled=False) as db:
        db.add("apples one", source="plain")
        db.add("apples two", source="open", acl=[ragdb.PUBLIC])
        db.add("apples three", source="team", acl=["t"])
        assert [h.source for h in db.search("apples")] == ["open"]
        assert {h.source for h in db.search("apples", principals=["t"])} == {"open", "team"}
        assert {h.source for h in db.search("apples", principals=ragdb.ALL)} == {"plain", "open", "team"}
        db.set_public_unlabeled(True)
        assert {h.source for h in db.search("apples")} == {"plain", "open"}


def test_the_public_label_is_not_a_principal(db):
    with pytest.raises(InvalidInput, match="public label"):
        db.search("x", principals=["*"])
    with pytest.raises(InvalidInput, match="one string"):
        db.search("x", principals="a")


def test_old_database_keeps_its_setting(tmp_path):
    path = tmp_path / "old.db"
    with ragdb.open(path, public_unlabeled=False) as db:
        db.add("apples", source="a")
    with ragdb.open(path) as db:  # reopening never changes the access setting
        assert db.settings["public_unlabeled"] is False
        assert db.search("apples") == []
        assert [h.source for h in db.search("apples", principals=ragdb.ALL)] == ["a"]


def test_labels_added_later_take_effect_for_open_readers(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as writer, ragdb.open(path) as reader:
        writer.add("apples", source="a")
        assert [h.source for h in reader.search("apples")] == ["a"]  # no labels: the fast path
        writer.add("apples and pears", source="b", acl=["x"])
        assert [h.source for h in reader.search("apples")] == ["a"]
        doc = writer.get(source="a")
        writer.update(doc.id, acl=["x"])
        assert reader.search("apples") == []
        assert len(reader.search("apples", principals=["x"])) == 2


def test_cli_reads_are_anonymous_unless_told(tmp_path):
    path = str(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        db.add("secret apples", source="secret.md", acl=["staff"])
        db.add("public apples", source="public.md")
    out = run_cli(["-d", path, "search", "apples", "--json"])
    assert [h["source"] for h in orjson.loads(out.stdout)] == ["public.md"]
    out = run_cli(["-d", path, "search", "apples", "--json", "--principal", "staff"])
    assert {h["source"] for h in orjson.loads(out.stdout)} == {"public.md", "secret.md"}
    out = run_cli(["-d", path, "search", "apples", "--json", "--all-principals"])
    assert {h["source"] for h in orjson.loads(out.stdout)} == {"public.md", "secret.md"}
    out = run_cli(["-d", path, "search", "apples", "--principal", "staff", "--all-principals"], check=False)
    assert out.returncode == 2 and "--all-principals" in out.stderr
    out = run_cli(["-d", path, "list", "--json"])
    assert [d["source"] for d in orjson.loads(out.stdout)] == ["public.md"]
    out = run_cli(["-d", path, "show", "secret.md"], check=False)
    assert out.returncode == 1 and "no document with source 'secret.md'" in out.stderr
    out = run_cli(["-d", path, "show", "secret.md", "--all-principals", "--json"])
    assert orjson.loads(out.stdout)["acl"] == ["staff"]
    out = run_cli(["-d", path, "prompt", "apples"])
    assert "secret apples" not in out.stdout and "public apples" in out.stdout
    dump = tmp_path / "dump.jsonl"
    out = run_cli(["-d", path, "export", str(dump)])
    assert "1 stored document not exported" in out.stderr
    assert [orjson.loads(x)["source"] for x in dump.read_bytes().splitlines()] == ["public.md"]
    out = run_cli(["-d", path, "export", str(dump), "--all-principals"])
    assert "not exported" not in out.stderr and len(dump.read_bytes().splitlines()) == 2


def test_replacing_without_labels_keeps_them(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add("salary table v1", source="hr.md", acl=["hr"])
        assert db.add("salary table v2", source="hr.md").acl == ("hr",)  # acl=None: kept
        assert db.search("salary") == []
        report = db.add_many([{"text": "salary table v2", "source": "hr.md"}])
        assert report.unchanged == (report[0].id,)  # same text, labels kept: nothing to write
        assert db.add("salary table v3", source="hr.md", acl=[]).acl == ()  # explicit: removed
        assert [h.source for h in db.search("salary")] == ["hr.md"]


@pytest.mark.parametrize("bad", ["", 0, False, b"", {}, "hr"])
def test_an_acl_that_is_not_a_list_is_refused_even_when_falsy(tmp_path, bad):
    """``acl=""`` (or 0, False, b"", {}) once passed as "no labels": a labelled document
    updated with one became public. Refused like any other acl that is not a list."""
    with ragdb.open(tmp_path / "kb.db") as db:
        doc = db.add("salary table", source="hr.md", acl=["hr"])
        with pytest.raises(InvalidInput, match="acl must be a list"):
            db.update(doc.id, acl=bad)
        with pytest.raises(InvalidInput, match="acl must be a list"):
            db.add("salary table v2", source="hr.md", acl=bad)
        with pytest.raises(InvalidInput, match="acl must be a list"):
            db.add_many([{"text": "salary table v2", "source": "hr.md", "acl": bad}])
        assert db.get(doc.id, principals=ragdb.ALL).acl == ("hr",)
        assert db.search("salary") == [] and db.count() == 0 and db.check() == []


def test_sync_of_an_edited_labelled_file_keeps_its_labels(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "pay.md").write_text("# Pay\n\nThe salary bands of 2026.\n")
    (folder / "open.md").write_text("---\nacl: [board]\n---\n# Board\n\nThe salary of the board.\n")
    path = str(tmp_path / "kb.db")
    subprocess.run([sys.executable, "-m", "ragdb.cli", "-d", path, "sync", "docs", "--acl", "hr"],
                   cwd=tmp_path, check=True, capture_output=True)
    (folder / "pay.md").write_text("# Pay\n\nThe salary bands of 2027.\n")
    (folder / "open.md").write_text("---\nacl: [audit]\n---\n# Board\n\nThe salary of the board, again.\n")
    subprocess.run([sys.executable, "-m", "ragdb.cli", "-d", path, "sync", "docs"],
                   cwd=tmp_path, check=True, capture_output=True)
    with ragdb.open(path) as db:
        assert db.search("salary") == []  # the edit did not make anything public
        assert db.get(source="docs/pay.md", principals=ragdb.ALL).acl == ("hr",)
        assert db.get(source="docs/open.md", principals=ragdb.ALL).acl == ("audit",)  # the file says so
        assert "2027" in db.get(source="docs/pay.md", principals=["hr"]).text


def test_relabelling_a_source_relabels_its_history(tmp_path):
    with ragdb.open(tmp_path / "kb.db", keep_versions=True) as db:
        db.add("plan alpha draft", source="plan.md")
        v2 = db.add("plan alpha final", source="plan.md")
        db.update(v2.id, acl=["hr"])
        assert db.search("plan", versions="all") == []
        assert {d.acl for d in db.documents(versions="all", principals=ragdb.ALL)} == {("hr",)}
        db.delete(v2.id)  # the older version becomes the latest: still not public
        assert db.search("plan") == [] and db.documents() == []
        assert [h.text for h in db.search("plan", principals=["hr"])] == ["plan alpha draft"]
        assert db.check() == []


def test_count_follows_the_access_rule(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add("a", source="a")
        db.add("b", source="b", acl=["x"])
        db.add("c", source="c", acl=["y"], metadata={"k": 1})
        assert db.count() == 1 and db.count(principals=["x"]) == 2 and db.count(principals=ragdb.ALL) == 3
        assert db.count(filter={"k": 1}, principals=ragdb.ALL) == 1 and db.count(filter={"k": 1}) == 0


def test_empty_cli_results_say_what_access_hid(tmp_path):
    path = str(tmp_path / "old.db")
    with ragdb.open(path, public_unlabeled=False) as db:  # an old file: the former default, off
        db.add("apples and pears", source="fruit.md")
    p = run_cli(["-d", path, "search", "apples"])
    assert p.stdout.strip() == "no hits"
    assert "1 document is hidden from this caller by access labels" in p.stderr
    assert "'ragdb config public_unlabeled true'" in p.stderr
    p = run_cli(["-d", path, "list"])
    assert p.stdout.strip() == "no documents" and "1 document is hidden" in p.stderr
    p = run_cli(["-d", path, "prompt", "apples"], check=False)
    assert p.returncode == 3 and "1 document is hidden" in p.stderr
    p = run_cli(["-d", path, "search", "apples", "--all-principals"])
    assert "fruit.md" in p.stdout and "hidden" not in p.stderr
    p = run_cli(["-d", path, "search", "bananas"])  # nothing matches for anyone: still honest
    assert "1 document is hidden" in p.stderr


@pytest.mark.parametrize("query", ["refund zyxword", '"refund" zyxword', "refund title:policy zyxword",
                                   "refund OR zyxword", "refund zyxword^2"])
def test_confidence_does_not_tell_whether_hidden_documents_hold_a_word(tmp_path, query):
    """The confidence ceiling used the whole collection's document frequencies, so for the
    same visible hit a word only hidden documents hold gave 0.26 and an absent word 0.22
    (issue 32, item 6; issue 30, item 6): a term no chunk the caller may see holds counts
    like one the collection lacks, on every path (search, prompt refusal)."""
    with ragdb.open(tmp_path / "kb.db", chunker="none") as db:
        db.add("refund policy for customers", source="pub.md", title="Refund policy")
        db.add("the zyxword secret plan", source="hid.md", acl=["staff"])
        for i in range(20):
            db.add(f"filler document number {i} about weather", source=f"f{i}.md")
        absent = query.replace("zyxword", "qqqabsent")
        hidden_hits, absent_hits = db.search(query), db.search(absent)
        assert [h.source for h in hidden_hits] == [h.source for h in absent_hits] == ["pub.md"]
        assert [h.confidence for h in hidden_hits] == [h.confidence for h in absent_hits]
        a, b = db.build_prompt(query), db.build_prompt(absent)
        assert (a.refused, [s.source for s in a.sources]) == (b.refused, [s.source for s in b.sources])
        staff = db.search("zyxword", principals=["staff"])  # who may see the word: it is evidence there
        assert [h.source for h in staff] == ["hid.md"] and staff[0].confidence > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "delete", "flush"]), st.integers(0, 5),
                              st.lists(st.sampled_from(WORDS), min_size=1, max_size=4)), min_size=1, max_size=12),
       query=st.lists(st.sampled_from(WORDS + ["absentword"]), min_size=1, max_size=3))
@example(ops=[("add", 5, ["fox"]), ("add", 1, ["apple"])], query=["apple", "fox"])  # a word only hidden chunks hold
@example(ops=[("add", 1, ["apple", "fox"]), ("flush", 0, ["apple"]), ("delete", 1, ["apple"]), ("add", 2, ["apple"])],
         query=["apple", "fox"])  # a word only a deleted flushed chunk held
def test_plain_searches_skip_the_visibility_check_with_the_same_confidences(tmp_path_factory, monkeypatch, ops, query):
    """A search without conditions sees every latest chunk, so it takes a term with a live df
    above 0 as visible without looking (``Index.is_latest_mask``): after any adds, deletes and
    flushes, in this handle and a fresh one, its confidences equal those of the full check."""
    from ragdb.index import inverted

    path = tmp_path_factory.mktemp("latest") / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        for op, n, words in ops:
            if op == "add":
                db.add(" ".join(words), source=f"s{n}.md", acl=["staff"] if n == 5 else None)
            elif op == "delete":
                db.delete(source=f"s{n}.md")
            else:
                db.optimize(vacuum=False)

        def confidences(handle):
            return [(h.source, h.score, h.confidence) for h in handle.search(" ".join(query), k=10)]

        for handle in (db, ragdb.open(path)):
            shortcut = confidences(handle)
            with monkeypatch.context() as m:
                m.setattr(inverted.Index, "is_latest_mask", lambda self, mask: False)
                checked = confidences(handle)
            assert shortcut == checked
            if handle is not db:
                handle.close()


def _observed(db, query, **kw):
    """What a caller is told about ``query``: hits, scores, confidences, the plan, facets."""
    out = []
    for scorer in ("bm25", "tfidf"):
        hits = db.search(query, scorer=scorer, syntax="query", **kw)
        out.append([(h.source, round(h.score, 12), round(h.confidence, 12)) for h in hits])
    plan = db.query_plan(query, syntax="query", **kw)
    out.append((plan.terms, plan.unknown, plan.weights, dict(plan.expansions), plan.filters, plan.suggestions))
    out.append(db.facets("source", query, **kw).total)
    prompt = db.build_prompt(query, syntax="query", **kw)
    out.append((prompt.refused, prompt.confidence))
    return out


@pytest.mark.parametrize("query", [
    "pump zanzibar",  # a plain word only the hidden document holds
    "title:zanzibar pump",  # in a field: the hidden document's title
    "zanzibar pump",
    "pump -zanzibar",  # excluded
    "pump NOT zanzibar",
    '"zanzibar merger" pump',
    "zanzib* pump",
    "zanzibaq~ pump",
    "pump title:(zanzibar OR manual)",
])
def test_a_caller_cannot_tell_which_word_a_hidden_document_holds(tmp_path, query):
    """Two databases alike but for one word of a hidden document (its title and text): the
    caller who may not see it is told the same in both, on every path. Before, a word only
    the hidden document's title held was a field unit (the plan's weights, a confidence), an
    excluded word it held was not 'unknown' (a confidence), and TF-IDF normalised the query
    over it (the scores)."""
    seen = []
    for secret in ("zanzibar", "quokkaly"):
        with ragdb.open(tmp_path / f"{secret}.db", chunker="none") as db:
            db.add("The pump manual covers valve checks.", source="pub/pump.md", title="Pump manual")
            db.add("Canteen opens at noon.", source="pub/canteen.md")
            db.add(f"Salaries rise after the {secret} merger.", source="hr/pay.md", acl=["hr"],
                   title=f"The {secret} merger")
            seen.append(_observed(db, query))
            # who may see the document is told about it
            assert any(h.source == "hr/pay.md" for h in db.search(query.replace("zanzibar", secret).replace(
                "zanzibaq", secret[:-1] + "q").replace("zanzib*", secret[:6] + "*").replace("-", "").replace(
                "NOT ", ""), principals=["hr"], syntax="query")) or "title:(" in query
    assert seen[0] == seen[1]


def test_hidden_terms_neither_crowd_a_visible_one_out_of_a_prefix_nor_order_its_expansions(tmp_path):
    """A prefix took the 1,024 most frequent vocabulary terms (every document's) before it
    dropped those no visible chunk holds, so 1,100 hidden words starting 'zz' left a
    caller's 'zz*' without its one visible word; and the expansions were ordered by
    frequency over every document."""
    import itertools
    import string

    words = ["zz" + "".join(p) for p in itertools.product(string.ascii_lowercase, repeat=3)][:1100]
    with ragdb.open(tmp_path / "kb.db", chunker="none") as db:
        db.add("The zzvisible widget and the valvz and valvy are documented here.", source="pub/a.md")
        db.add("Another valvy check.", source="pub/b.md")
        db.add_many([{"text": " ".join(words[i:i + 50]), "source": f"hr/{i}-{j}.md", "acl": ["hr"]}
                     for i in range(0, 1100, 50) for j in range(2)])
        db.add_many([{"text": f"valvz note {i}", "source": f"hr/v{i}.md", "acl": ["hr"]} for i in range(5)])
        for handle_flushed in (False, True):
            if handle_flushed:
                db.optimize()
            assert [h.source for h in db.search("zz*", syntax="query")] == ["pub/a.md"]
            assert db.query_plan("zz*", syntax="query").expansions == {"zz*": ("zzvisibl",)}
            # visible counts: valvy in 2 visible chunks, valvz in 1 (and in 5 hidden ones)
            assert db.query_plan("valv*", syntax="query").expansions["valv*"][:2] == ("valvi", "valvz")
            assert db.query_plan("valvx~", syntax="query").expansions["valvx~"] == ("valvi", "valvz")
            assert len(db.query_plan("zz*", syntax="query", principals=["hr"]).expansions["zz*"]) == 64


@pytest.mark.parametrize("flush_first", [False, True])
def test_prefix_expansions_are_the_most_frequent_whatever_was_flushed(tmp_path, flush_first):
    """Terms not yet flushed have a stored df of 0, and a prefix took the first 64 terms by
    stored df: a word new in five chunks lost its place to 100 words of one chunk each until
    an optimize, so the same documents searched differently before and after it."""
    import itertools
    import string

    words = ["zz" + "".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)][:100]
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add_many([{"text": f"note {w} here", "source": f"a{i}"} for i, w in enumerate(words)])
        if flush_first:
            db.optimize()
        db.add_many([{"text": f"zzzzq shows up {i}", "source": f"b{i}"} for i in range(5)])
        before = db.query_plan("zz*", syntax="query").expansions["zz*"]
        hits = [(h.source, h.score) for h in db.search("zz*", syntax="query", k=200)]
        db.optimize()
        assert db.query_plan("zz*", syntax="query").expansions["zz*"] == before
        assert before[0] == "zzzzq" and len(before) == 64
        assert [(h.source, h.score) for h in db.search("zz*", syntax="query", k=200)] == hits


def test_a_metadata_key_only_hidden_documents_have_is_no_field_to_the_caller(tmp_path):
    """'salary:yes' was a filter when a hidden document had the key 'salary' and words
    otherwise: the caller's hits, facets and plan told whether a hidden document used it."""
    seen = []
    for key in ("salary", "bonus"):
        with ragdb.open(tmp_path / f"{key}.db") as db:
            db.add("The pump manual: salary review, yes.", source="pub/pump.md")
            db.add("Board minutes on pumps.", source="hr/board.md", acl=["hr"], metadata={key: "yes"})
            seen.append(_observed(db, "salary:yes pump"))
            held = db.query_plan("salary:yes pump", principals=["hr"]).filters
            assert held == (("salary:yes",) if key == "salary" else ())  # who may see it: a filter
    assert seen[0] == seen[1]
    assert seen[0][0][0][0] == "pub/pump.md"  # the first scorer's first hit


def test_a_metadata_key_only_older_versions_have_is_a_field_only_in_a_search_of_history(tmp_path):
    with ragdb.open(tmp_path / "kb.db", keep_versions=True) as db:
        db.add("pump notes", source="a.md", metadata={"team": "ops"})
        db.add("pump notes, revised", source="a.md")
        assert db.query_plan("pump team:ops").filters == ()  # the latest version has no such key
        assert [h.text for h in db.search("pump team:ops")] == ["pump notes, revised"]
        assert db.query_plan("pump team:ops", versions="all").filters == ("team:ops",)
        assert [h.text for h in db.search("pump team:ops", versions="all")] == ["pump notes"]


def test_the_plans_script_note_comes_from_the_chunks_the_caller_may_see(tmp_path):
    """The note 'the question is in Chinese ... the knowledge base holds almost none' was
    decided from a sample of every chunk: whether the hidden documents were Chinese showed."""
    seen = []
    for label, text in (("en", "Salary plan {} raises pay by five percent in May."),
                        ("zh", "薪资调整方案第{}版：五月起上调百分之五。")):
        with ragdb.open(tmp_path / f"{label}.db") as db:
            for i in range(5):
                db.add(f"Pump manual {i}: check the pressure valve weekly.", source=f"pub/{i}.md")
                db.add(text.format(i), source=f"hr/{i}.md", acl=["hr"])
            seen.append(db.query_plan("什么是检索增强生成").notes)
            assert bool(db.query_plan("什么是检索增强生成", principals=["hr"]).notes) == (label == "en")
    assert seen[0] == seen[1] and "holds almost none" in seen[0][0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "delete", "flush"]), st.integers(0, 12),
                              st.lists(st.integers(0, 159), min_size=1, max_size=4), st.integers(1, 12)),
                    min_size=1, max_size=20),
       tail_read=st.sampled_from([0, 3, 4096]), principals=st.sampled_from([None, ["hr"]]))
def test_prefix_expansions_equal_a_fresh_optimized_builds_whatever_the_tail(tmp_path_factory, monkeypatch, ops,
                                                                            tail_read, principals):
    """The n most frequent expansions of a prefix, read a page of the vocabulary at a time
    (pages of 16 n terms by stored df; unflushed terms read by id), equal those of a fresh
    build flushed whole, after any adds, deletes and flushes: here with n = 4, so pages of
    64 of 160 terms, 150 of them flushed in 1 to 5 chunks each and the adds' copies making
    unflushed terms more frequent."""
    from ragdb.engine import search
    from ragdb.query import language

    monkeypatch.setattr(language, "MAX_EXPANSIONS", 4)
    monkeypatch.setattr(search, "TAIL_TERMS_READ", tail_read)
    folder = tmp_path_factory.mktemp("pfx")
    docs: dict[str, tuple[str, list[str] | None]] = {f"f{w}-{c}.md": (f"zz{w:03d}", None)
                                                     for w in range(10, 160) for c in range(w % 5 + 1)}
    with ragdb.open(folder / "inc.db", chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, (t, _a) in docs.items()])
        db.optimize(vacuum=False)
        for op, n, words, copies in ops:
            if op == "add":
                text, acl = " ".join(f"zz{w % 40:03d}" for w in words), (["hr"] if n % 3 == 0 else None)
                batch = {f"s{n}-{c}.md": (text, acl) for c in range(copies)}
                db.add_many([{"text": t, "source": s, "acl": a} for s, (t, a) in batch.items()])
                docs.update(batch)
            elif op == "delete":
                db.delete(source=f"s{n}-*", glob=True)
                docs = {s: v for s, v in docs.items() if not s.startswith(f"s{n}-")}
            else:
                db.optimize(vacuum=False)
        with ragdb.open(folder / "fresh.db", chunker="none") as fresh:
            fresh.add_many([{"text": t, "source": s, "acl": a} for s, (t, a) in docs.items()])
            fresh.optimize(vacuum=False)
            for handle in (db, ragdb.open(folder / "inc.db")):
                assert handle.query_plan("zz*", principals=principals).expansions == \
                    fresh.query_plan("zz*", principals=principals).expansions
                if handle is not db:
                    handle.close()
