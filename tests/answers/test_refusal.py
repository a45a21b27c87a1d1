"""Refusal by default (issue 14): ``Hit.confidence``, the confidence floor of prompts and
answers, its calibration and storage, and ``ask`` failing at once without a chat endpoint.

Small corpora written here (CMake/npm notes in English, operations/HR notes in Chinese);
nothing from ../shared.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.index import confidence
from ragdb.index.confidence import DEFAULT_MIN_CONFIDENCE
from ragdb.errors import InvalidInput, LLMError
from ragdb.answers.evaluation import calibrate_refusal, load_questions
from ragdb.answers.llm import ChatClient
from ragdb.answers.prompt import REFUSAL, build_prompt, choose_threshold, dedupe_hits, select_evidence
from ragdb.index.scoring import BM25_B, BM25_K1, bm25_idf
from ragdb.types import Hit

from cli_helpers import out_json, run

ROOT = Path(__file__).resolve().parents[2]

EN_DOCS = {
    "cmake/shared-libraries.md": "Building a shared library with CMake: call add_library(name SHARED sources...) and "
    "set CMAKE_POSITION_INDEPENDENT_CODE. Install it with install(TARGETS name LIBRARY DESTINATION lib).",
    "cmake/variables.md": "CMake variables are case sensitive. By convention cache variables use capital letters, "
    "for example CMAKE_BUILD_TYPE; set them with -D on the command line.",
    "cmake/generators.md": "A CMake generator writes the native build files: Ninja, Unix Makefiles or a Visual "
    "Studio solution. Choose one with cmake -G when you configure the build directory.",
    "cmake/find-package.md": "find_package(OpenSSL REQUIRED) locates an installed package through its config file "
    "or a Find module and defines imported targets such as OpenSSL::SSL to link against.",
    "cmake/testing.md": "enable_testing() and add_test() register tests; run them with ctest in the build "
    "directory. ctest --output-on-failure prints the output of failing tests.",
    "cmake/presets.md": "CMakePresets.json stores configure and build presets: the generator, the binary directory "
    "and cache variables, shared by everyone who builds the project.",
    "npm/publish.md": "To publish a package to the npm registry, log in with npm login, bump the version with npm "
    "version patch, then run npm publish. Scoped packages need --access public the first time.",
    "npm/install.md": "npm install adds the dependencies listed in package.json to node_modules and writes "
    "package-lock.json. Package names must be lowercase: capital letters are not allowed.",
    "npm/scripts.md": "The scripts field of package.json defines commands such as test or build; run them with "
    "npm run <name>. npm test and npm start need no run.",
    "npm/audit.md": "npm audit reports known vulnerabilities in the dependency tree; npm audit fix upgrades the "
    "affected packages to patched versions within the allowed semver ranges.",
    "npm/workspaces.md": "Workspaces manage several packages in one repository: list their folders in the "
    "workspaces field of the root package.json, and npm install links them together.",
    "npm/cache.md": "npm keeps downloaded tarballs in its cache folder. npm cache verify checks it; npm cache "
    "clean --force empties it when installs fail with integrity errors.",
}
#: (question, the source that answers it)
EN_ON = [("How do I publish a package to the npm registry?", "npm/publish.md"),
         ("How do I build a shared library with CMake?", "cmake/shared-libraries.md"),
         ("How do I run the tests with ctest?", "cmake/testing.md"),
         ("What does npm audit fix do?", "npm/audit.md")]
# the first one matches the stem 'capit' (from "capital letters") in two chunks: hits, but weak ones
EN_OFF = ["What is the capital of Mongolia?", "Who painted the Mona Lisa?", "How tall is Mount Everest?",
          "What is the recipe for a margherita pizza?"]

ZH_DOCS = {
    "ops/backup.md": "数据库每天凌晨两点自动备份，备份文件保存在对象存储中，保留三十天。恢复时先停止写入，再从最近的备份还原。",
    "ops/monitor.md": "监控系统每分钟采集一次服务器的 CPU、内存和磁盘使用率，超过阈值时通过短信和邮件告警。",
    "ops/deploy.md": "新版本先发布到预发环境，测试通过后在晚上十点以后灰度发布到生产环境，每批百分之十的服务器。",
    "ops/oncall.md": "值班工程师需要在五分钟内响应告警，无法处理时升级给二线负责人，并在事后写故障复盘报告。",
    "hr/leave.md": "员工每年有十五天带薪年假，请假需要提前三天在系统中提交申请，由直属经理审批。",
    "hr/remote.md": "试用期员工不能远程办公；转正后每周最多可以远程办公两天，需要提前告知团队。",
    "hr/expense.md": "出差的交通和住宿费用凭发票报销，报销单需要在出差结束后三十天内提交给财务部门。",
    "it/password.md": "公司邮箱的密码每九十天必须修改一次，新密码至少十二位，并且不能与最近五次的密码相同。",
    "it/vpn.md": "在家办公时需要先连接公司 VPN，再访问内部系统。VPN 客户端可以从内网门户下载。",
    "it/laptop.md": "笔记本电脑出现故障时，在服务台提交工单，IT 部门会在两个工作日内提供备用电脑。",
}
ZH_ON = [("数据库备份保存在哪里？", "ops/backup.md"), ("试用期员工可以远程办公吗？", "hr/remote.md"),
         ("出差费用怎么报销？", "hr/expense.md"), ("新版本怎么发布？", "ops/deploy.md")]
ZH_OFF = ["蒙古的首都是哪里？", "《红楼梦》的作者是谁？", "珠穆朗玛峰有多高？", "红烧肉怎么做？"]


def _fill(db, docs):
    for source, text in docs.items():
        db.add(text, source=source, chunker="none")
    return db


@pytest.fixture
def en_db():
    with ragdb.open(":memory:") as db:
        yield _fill(db, EN_DOCS)


@pytest.fixture
def zh_db():
    with ragdb.open(":memory:") as db:
        yield _fill(db, ZH_DOCS)


@pytest.fixture
def kb(tmp_path):
    """The English notes in a database file, for the CLI and for settings."""
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        _fill(db, EN_DOCS)
    return path


@pytest.fixture
def no_llm_env(monkeypatch):
    for name in ("RAGDB_LLM_BASE_URL", "OPENAI_BASE_URL", "RAGDB_LLM_MODEL", "RAGDB_LLM_API_KEY", "OPENAI_API_KEY",
                 "RAGDB_DATABASE"):
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------- the score


def brute_confidences(analyzer, docs, query, k1=BM25_K1, b=BM25_B):
    """source -> BM25 over the query's maximum, from the texts alone (no index). A text's
    length is its terms less the compound whole forms overlapping a part (analyzer version 2:
    ``CMAKE_BUILD_TYPE`` is one word of length 3, not 4)."""
    analyzed = {s: analyzer.term_counts(t) for s, t in docs.items()}
    counts = {s: Counter(c) for s, c in analyzed.items()}
    lengths = {s: sum(c.values()) - getattr(c, "overlaps", 0) for s, c in analyzed.items()}
    n = len(docs)
    avgdl = sum(lengths.values()) / n
    terms = list(dict.fromkeys(analyzer.terms(query)))
    idf = {t: bm25_idf(n, sum(1 for c in counts.values() if t in c)) for t in terms}
    bound = sum(idf.values())
    out = {}
    for s, c in counts.items():
        norm = k1 * (1 - b + b * lengths[s] / avgdl)
        out[s] = sum(idf[t] * c[t] / (c[t] + norm) for t in terms if t in c) / bound
    return out


@pytest.mark.parametrize("scorer", ["bm25", "tfidf"])
@pytest.mark.parametrize("question", [q for q, _ in EN_ON] + EN_OFF[:1])
def test_confidence_is_bm25_over_the_querys_maximum(en_db, scorer, question):
    """Every hit's confidence is its chunk's BM25 score divided by the highest score any chunk
    could reach (every distinct query term, those the collection lacks at df 0), for both
    lexical scorers, computed here from the texts alone."""
    expected = brute_confidences(en_db.analyzer, EN_DOCS, question)
    hits = en_db.search(question, k=12, scorer=scorer)
    assert hits
    for h in hits:
        assert 0.0 <= h.confidence <= 1.0
        assert h.confidence == pytest.approx(expected[h.source], rel=1e-9, abs=1e-12)


def test_a_term_the_collection_lacks_lowers_confidence(en_db):
    """'mongolia' is in no chunk: it weighs the most in the maximum, so the chunks matching
    'capital' alone keep a low confidence (the case the issue was filed for)."""
    without = {h.source: h.confidence for h in en_db.search("capital", k=5)}
    with_absent = {h.source: h.confidence for h in en_db.search("capital Mongolia", k=5)}
    assert with_absent.keys() == without.keys() == {"cmake/variables.md", "npm/install.md"}
    for source, c in with_absent.items():
        assert c < without[source] / 2
    assert max(with_absent.values()) < DEFAULT_MIN_CONFIDENCE


def test_chinese_corpus_confidences(zh_db):
    """CJK text (unigrams + bigrams): the answering chunk of an on-topic question clears the
    default floor; off-topic questions match stray characters only and stay far below it."""
    for question, source in ZH_ON:
        hits = zh_db.search(question, k=3)
        assert hits[0].source == source
        assert hits[0].confidence >= DEFAULT_MIN_CONFIDENCE, question
        expected = brute_confidences(zh_db.analyzer, ZH_DOCS, question)
        assert hits[0].confidence == pytest.approx(expected[source], rel=1e-9)
    for question in ZH_OFF:
        assert all(h.confidence < DEFAULT_MIN_CONFIDENCE / 2 for h in zh_db.search(question, k=8)), question


def test_vector_and_hybrid_hits_carry_the_lexical_confidence_of_their_chunk():
    """A vector or hybrid hit's confidence is the lexical support of the same chunk: equal to
    the BM25 search's confidence for a chunk that matches words, 0 for one that matches none."""
    with ragdb.open(":memory:", embedder="hash") as db:
        _fill(db, EN_DOCS)
        for question in [q for q, _ in EN_ON] + EN_OFF[:1]:
            lexical = {h.chunk_id: h.confidence for h in db.search(question, k=len(EN_DOCS))}
            for scorer in ("vector", "hybrid"):
                hits = db.search(question, k=5, scorer=scorer)
                assert hits
                for h in hits:
                    assert h.confidence == pytest.approx(lexical.get(h.chunk_id, 0.0), rel=1e-9, abs=1e-12)


def test_reranked_hits_keep_their_confidence(en_db):
    class Reverse:
        def rerank(self, query, hits, top_n=None):
            from dataclasses import replace

            return [replace(h, score=float(i)) for i, h in enumerate(hits)]

    question = EN_ON[0][0]
    plain = {h.chunk_id: h.confidence for h in en_db.search(question, k=5)}
    reranked = en_db.search(question, k=5, reranker=Reverse())
    assert reranked and all(h.confidence == plain[h.chunk_id] for h in reranked)


WORDS = ["pump", "valve", "start", "stop", "pressure", "water", "oil", "filter", "motor", "alarm", "水泵", "阀门"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12), min_size=1, max_size=8),
       query=st.lists(st.sampled_from(WORDS + ["absent", "缺席"]), min_size=1, max_size=5),
       deleted=st.sets(st.integers(0, 7), max_size=3))
def test_confidence_property(docs, query, deleted):
    """On random collections and queries: confidences are in [0, 1], equal the brute-force
    formula, agree between BM25 and TF-IDF for the same chunk, and after deletes equal a fresh
    build of the surviving documents (document frequencies are live)."""
    texts = {f"d{i}": " ".join(words) for i, words in enumerate(docs)}
    q = " ".join(query)
    with ragdb.open(":memory:") as db:
        _fill(db, texts)
        for i in sorted(deleted):
            if f"d{i}" in texts and len(texts) > 1:
                db.delete(source=f"d{i}")
                del texts[f"d{i}"]
        expected = brute_confidences(db.analyzer, texts, q)
        bm25 = {h.source: h.confidence for h in db.search(q, k=10)}
        tfidf = {h.source: h.confidence for h in db.search(q, k=10, scorer="tfidf")}
        with ragdb.open(":memory:") as fresh:
            _fill(fresh, texts)
            rebuilt = {h.source: h.confidence for h in fresh.search(q, k=10)}
    for s, c in bm25.items():
        assert 0.0 <= c <= 1.0
        assert c == pytest.approx(expected[s], rel=1e-9, abs=1e-12)
        assert c == pytest.approx(rebuilt[s], rel=1e-12, abs=1e-15)
    for s in bm25.keys() & tfidf.keys():
        assert tfidf[s] == pytest.approx(bm25[s], rel=1e-9, abs=1e-12)
    assert bm25.keys() == rebuilt.keys()


def test_chunk_bm25_with_no_terms_or_chunks_is_zero(en_db):
    # the helper behind non-BM25 confidences, at its edges
    assert len(confidence.chunk_bm25(en_db._index, [], [1, 2], 1.2, 0.6)) == 2
    assert confidence.from_scores([1.0, 2.0], 0.0) == [0.0, 0.0]
    assert confidence.from_scores([5.0, 1.0], 2.0) == [1.0, 0.5]


# --------------------------------------------------------------------------- the floor in prompts


def test_prompt_refuses_off_topic_and_answers_on_topic_by_default(en_db, zh_db):
    for db, on, off in ((en_db, EN_ON, EN_OFF), (zh_db, ZH_ON, ZH_OFF)):
        floor = db.min_confidence  # the one the database measured on itself (issue 30)
        assert floor == db.self_calibration().floor
        for question, source in on:
            p = db.build_prompt(question)
            assert not p.refused and p.sources[0].source == source, question
            assert all(h.confidence >= floor for h in p.sources)
            assert p.min_confidence == floor and p.confidence == p.sources[0].confidence
        for question in off:
            p = db.build_prompt(question)
            assert p.refused and p.sources == (), question
            assert p.min_confidence == floor
    # the case: weak hits exist, yet the prompt is refused and says how weak
    hits = en_db.search("What is the capital of Mongolia?", k=8)
    assert len(hits) == 2
    p = en_db.build_prompt("What is the capital of Mongolia?")
    assert p.refused and p.confidence == max(h.confidence for h in hits) < p.min_confidence


def test_min_confidence_zero_turns_refusal_off_and_min_score_overrides(en_db):
    question = "What is the capital of Mongolia?"
    off = en_db.build_prompt(question, min_confidence=0)
    assert not off.refused and len(off.sources) == 2 and off.min_confidence == 0.0
    # a raw min_score is an explicit rule of its own: no confidence floor is added to it
    by_score = en_db.build_prompt(question, min_score=0.1)
    assert not by_score.refused and by_score.min_confidence == 0.0
    assert en_db.build_prompt(question, min_score=100.0).refused
    # both given: both apply
    assert en_db.build_prompt(question, min_score=0.1, min_confidence=0.2).refused
    # an explicit floor refuses an on-topic question too
    assert en_db.build_prompt(EN_ON[0][0], min_confidence=0.99).refused


def test_pure_functions_apply_the_floor_only_to_hits_that_carry_a_confidence():
    def hit(text, score, conf=None, start=0):
        return Hit(score=score, chunk_id=start, doc_id=1, source="s", version=None, timestamp=None, text=text,
                   start=start, end=start + len(text), ordinal=0, confidence=conf)

    made = [hit("hand made", 1.0)]
    assert not build_prompt("q?", made).refused  # no confidence: not judged by the default floor
    weak = [hit("weak", 5.0, 0.05)]
    p = build_prompt("q?", weak)
    assert p.refused and p.confidence == 0.05 and p.min_confidence == DEFAULT_MIN_CONFIDENCE
    assert not build_prompt("q?", weak, min_confidence=0).refused
    assert not build_prompt("q?", weak, min_score=1.0).refused
    mixed = [hit("a", 3.0, 0.5), hit("b", 2.0, 0.1, 10), hit("c", 1.0, None, 20)]
    assert [h.text for h in select_evidence(mixed, min_confidence=0.3)] == ["a", "c"]
    assert [h.text for h in select_evidence(mixed)] == ["a", "b", "c"]
    # merged overlapping windows keep the better confidence
    left, right = hit("abcdef", 1.0, 0.2, 0), hit("defgh", 2.0, 0.7, 3)
    (merged,) = dedupe_hits([left, right])
    assert merged.text == "abcdefgh" and merged.confidence == 0.7


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.2", True])
def test_bad_min_confidence_is_refused(en_db, bad):
    with pytest.raises(InvalidInput, match="min_confidence"):
        en_db.build_prompt("q?", min_confidence=bad)
    with pytest.raises(InvalidInput, match="min_confidence"):
        build_prompt("q?", [], min_confidence=bad)
    with pytest.raises(InvalidInput, match="min_confidence"):
        en_db.set_min_confidence(bad)
    assert en_db.min_confidence == en_db.self_calibration().floor


def test_stored_floor_is_the_default_of_every_connection(kb):
    with ragdb.open(kb) as a, ragdb.open(kb) as b:
        question = EN_ON[0][0]
        assert not b.build_prompt(question).refused
        a.set_min_confidence(0.9)
        assert a.settings["min_confidence"] == 0.9
        assert b.min_confidence == 0.9 and b.build_prompt(question).refused  # the other connection sees it
        assert not b.build_prompt(question, min_confidence=0.1).refused   # an explicit floor wins
        assert not b.build_prompt(question, min_score=0.5).refused        # so does a raw min_score
        a.set_min_confidence(0)
        assert b.min_confidence == 0.0 and not b.build_prompt(EN_OFF[0]).refused
        a.set_min_confidence(None)  # back to the default
        assert b.min_confidence == b.self_calibration().floor and b.build_prompt(EN_OFF[0]).refused
        with pytest.raises(InvalidInput, match="transaction"), a.transaction():
            a.set_min_confidence(0.5)
        assert a.min_confidence == a.self_calibration().floor
    with ragdb.open(kb) as again:
        assert again.min_confidence == again.self_calibration().floor


def test_effective_min_confidence_rules():
    eff = confidence.effective_min_confidence
    assert eff(None) == DEFAULT_MIN_CONFIDENCE
    assert eff(None, stored=0.4) == 0.4
    assert eff(None, min_score=1.0, stored=0.4) == 0.0
    assert eff(0.3, min_score=1.0, stored=0.4) == 0.3
    assert eff(0, stored=0.4) == 0.0
    with pytest.raises(ragdb.errors.StorageError, match="min_confidence"):
        confidence.stored_min_confidence({"min_confidence": "high"}, "kb.db")
    assert confidence.stored_min_confidence({}) is None


# --------------------------------------------------------------------------- ask


def _reply(text):
    return {"choices": [{"message": {"role": "assistant", "content": text}}]}


def test_ask_refuses_off_topic_without_a_request(en_db, httpserver):
    """A real loopback server: the off-topic question sends it nothing; the on-topic one does."""
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(
        _reply("Run npm publish after npm login [1]."))
    client = ChatClient(base_url=httpserver.url_for("/v1"), model="m", api_key="")
    for question in EN_OFF:
        answer = en_db.ask(question, llm=client)
        assert answer.refused and answer.text == REFUSAL["en"] and answer.hits == ()
        assert answer.prompt.refused
    assert httpserver.log == []
    answer = en_db.ask(EN_ON[0][0], llm=client)
    assert not answer.refused and answer.citations.cited == (1,)
    (request, _), = httpserver.log
    assert "npm/publish.md" in request.get_json()["messages"][-1]["content"]


def test_ask_streaming_refusal_sends_nothing(zh_db, httpserver):
    client = ChatClient(base_url=httpserver.url_for("/v1"), model="m", api_key="")
    got = []
    answer = zh_db.ask(ZH_OFF[0], llm=client, on_text=got.append)
    assert answer.refused and got == [REFUSAL["zh"]] and httpserver.log == []


def test_cli_prompt_and_ask_refuse_with_status_3(runner, kb, httpserver, no_llm_env):
    result = run(runner, "-d", kb, "prompt", "What is the capital of Mongolia?", ok=False)
    assert result.exit_code == 3
    assert "refused: the best evidence has confidence" in result.stderr and "below min_confidence" in result.stderr
    data = out_json(run(runner, "-d", kb, "prompt", "What is the capital of Mongolia?", "--json", ok=False))
    assert data["refused"] and data["sources"] == [] and data["confidence"] < data["min_confidence"]
    data = out_json(run(runner, "-d", kb, "prompt", "What is the capital of Mongolia?", "--json",
                        "--min-confidence", "0"))
    assert not data["refused"] and all("confidence" in s for s in data["sources"])
    assert run(runner, "-d", kb, "prompt", EN_ON[0][0]).exit_code == 0

    url = httpserver.url_for("/v1")
    result = run(runner, "-d", kb, "ask", "What is the capital of Mongolia?", "--base-url", url, ok=False)
    assert result.exit_code == 3 and result.stdout.strip() == REFUSAL["en"]
    assert "refused without calling the model" in result.stderr
    assert httpserver.log == []
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(_reply(REFUSAL["en"]))
    result = run(runner, "-d", kb, "ask", "What is the capital of Mongolia?", "--base-url", url,
                 "--min-confidence", "0", "--json", ok=False)
    # the floor off: the model is asked, and its own refusal is a refusal too (status 3, said so)
    assert result.exit_code == 3 and len(httpserver.log) == 1
    assert out_json(result)["refused"] and out_json(result)["model_called"] is True
    assert "the model answered" in result.stderr
    assert run(runner, "-d", kb, "prompt", "q", "--min-confidence", "2", ok=False).exit_code == 2


# --------------------------------------------------------------------------- no endpoint, no key


NAMES = ("RAGDB_LLM_BASE_URL", "RAGDB_LLM_API_KEY", "OPENAI_API_KEY", "--base-url")


def test_chat_client_without_endpoint_or_key_fails_in_the_constructor(no_llm_env, monkeypatch):
    """Fast by construction: the constructor raises, so no request can have been made (and
    the HTTP layer would fail the test if one were)."""
    import httpx

    def no_network(*_a, **_k):
        raise AssertionError("no request may be attempted")

    monkeypatch.setattr(httpx.Client, "send", no_network)
    with pytest.raises(LLMError) as info:
        ChatClient()
    message = str(info.value)
    assert "no chat endpoint is configured" in message
    assert all(name in message for name in NAMES)
    with pytest.raises(LLMError, match="OpenAI's API needs an API key"):
        ChatClient(base_url="https://api.openai.com/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    with pytest.raises(LLMError, match="RAGDB_LLM_BASE_URL"):
        ChatClient()
    monkeypatch.delenv("OPENAI_BASE_URL")
    # an endpoint without a key (a local server) or OpenAI with one is configuration enough
    assert ChatClient(base_url="http://127.0.0.1:9/v1").base_url == "http://127.0.0.1:9/v1"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0000")
    assert ChatClient().base_url == "https://api.openai.com/v1"


def test_database_ask_without_endpoint_fails_before_searching(en_db, no_llm_env, monkeypatch):
    searched = []
    monkeypatch.setattr(en_db, "search", lambda *a, **k: searched.append(a) or [])
    with pytest.raises(LLMError, match="RAGDB_LLM_BASE_URL"):
        en_db.ask(EN_ON[0][0])
    assert searched == []


def test_cli_ask_without_endpoint_fails_at_once(runner, tmp_path, no_llm_env):
    # the database does not even exist: the endpoint is checked before anything else
    result = run(runner, "-d", tmp_path / "missing.db", "ask", "How do I publish?", ok=False)
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert all(name in result.stderr for name in NAMES)


# --------------------------------------------------------------------------- calibration


def _beir(tmp_path, docs, on, off):
    corpus, queries, qrels, off_file = (tmp_path / n for n in ("corpus.jsonl", "queries.jsonl", "qrels.tsv",
                                                               "off.txt"))
    corpus.write_text("".join(json.dumps({"_id": s, "title": "", "text": t}, ensure_ascii=False) + "\n"
                              for s, t in docs.items()), encoding="utf-8")
    queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": q}, ensure_ascii=False) + "\n"
                               for i, (q, _s) in enumerate(on)), encoding="utf-8")
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\t{s}\t1\n" for i, (_q, s) in enumerate(on)),
                     encoding="utf-8")
    off_file.write_text("# questions the notes cannot answer\n" + "\n".join(off) + "\n\n", encoding="utf-8")
    return corpus, queries, qrels, off_file


def test_calibrate_refusal_separates_judged_from_off_topic(en_db):
    queries = {f"q{i}": q for i, (q, _s) in enumerate(EN_ON)}
    qrels = {f"q{i}": {s: 1} for i, (_q, s) in enumerate(EN_ON)}
    report = calibrate_refusal(en_db, queries, qrels, EN_OFF, k=8)
    on = [max(h.confidence for h in en_db.search(q, k=8)) for q, _ in EN_ON]
    off = [max((h.confidence for h in en_db.search(q, k=8)), default=0.0) for q in EN_OFF]
    assert max(off) < report.threshold <= min(on)
    assert (report.true_positives, report.false_negatives, report.true_negatives, report.false_positives) == \
        (len(EN_ON), 0, len(EN_OFF), 0)
    # choose_threshold on confidences directly gives the same floor
    assert choose_threshold([(c, True) for c in on] + [(c, False) for c in off]).threshold == report.threshold
    # with no question to refuse, the floor refuses none of the judged ones: their lowest confidence
    assert calibrate_refusal(en_db, queries, qrels, k=8).threshold == min(on)
    with pytest.raises(InvalidInput, match="judged"):
        calibrate_refusal(en_db, queries, {}, EN_OFF)


def test_load_questions(tmp_path):
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text('{"_id": "1", "text": "one?"}\n\n{"_id": "2", "text": "two?", "answers": []}\n')
    assert load_questions(jsonl) == ["one?", "two?"]
    txt = tmp_path / "q.txt"
    txt.write_text("# comment\none?\n\n  two?  \n", encoding="utf-8")
    assert load_questions(txt) == ["one?", "two?"]
    with pytest.raises(InvalidInput, match="cannot read"):
        load_questions(tmp_path / "nothing.txt")
    (tmp_path / "bad.jsonl").write_text('{"_id": "1"}\n')
    with pytest.raises(InvalidInput, match="bad.jsonl:1"):
        load_questions(tmp_path / "bad.jsonl")


def test_eval_calibrate_stores_the_floor(runner, kb, tmp_path, no_llm_env):
    corpus, queries, qrels, off = _beir(tmp_path, EN_DOCS, EN_ON, EN_OFF)
    files = ("--corpus", corpus, "--queries", queries, "--qrels", qrels)
    data = out_json(run(runner, "-d", kb, "eval", *files, "-k", "8", "--calibrate", "--off-topic", off, "--json"))
    cal = data["calibration"]
    assert cal["database"] == str(kb) and cal["previous"] is None
    assert (cal["judged_queries"], cal["judged_refused"]) == (len(EN_ON), 0)
    assert (cal["off_topic_questions"], cal["off_topic_refused"]) == (len(EN_OFF), len(EN_OFF))
    with ragdb.open(kb) as db:
        assert db.min_confidence == cal["min_confidence"] == db.settings["min_confidence"]
        on = min(max(h.confidence for h in db.search(q, k=8)) for q, _ in EN_ON)
    assert cal["min_confidence"] <= on
    shown = out_json(run(runner, "-d", kb, "config", "min_confidence", "--json"))
    assert shown == {"setting": "min_confidence", "value": cal["min_confidence"]}
    assert run(runner, "-d", kb, "prompt", EN_OFF[0], ok=False).exit_code == 3
    assert run(runner, "-d", kb, "prompt", EN_ON[1][0]).exit_code == 0
    # the table, and without --off-topic: a note that nothing to refuse was tried
    table = run(runner, "-d", kb, "eval", *files, "--calibrate")
    assert "min_confidence" in table.stdout and "off-topic refused" in table.stdout
    assert "no --off-topic questions" in table.stderr
    # usage errors
    assert run(runner, "eval", *files, "--calibrate", ok=False).exit_code == 2  # no database to store in
    assert run(runner, "eval", *files, "--off-topic", off, ok=False).exit_code == 2  # --off-topic alone
    missing = run(runner, "-d", tmp_path / "none.db", "eval", *files, "--calibrate", ok=False)
    assert missing.exit_code == 1 and "no such database" in missing.stderr


def test_eval_calibrate_chinese(runner, tmp_path, no_llm_env):
    path = tmp_path / "zh.db"
    with ragdb.open(path) as db:
        _fill(db, ZH_DOCS)
    corpus, queries, qrels, off = _beir(tmp_path, ZH_DOCS, ZH_ON, ZH_OFF)
    data = out_json(run(runner, "-d", path, "eval", "--corpus", corpus, "--queries", queries, "--qrels", qrels,
                        "--calibrate", "--off-topic", off, "--json"))
    assert data["calibration"]["judged_refused"] == 0
    assert data["calibration"]["off_topic_refused"] == len(ZH_OFF)


# --------------------------------------------------------------------------- ragdb config min_confidence


def test_config_min_confidence(runner, kb):
    listing = out_json(run(runner, "-d", kb, "config", "--json"))
    assert listing["min_confidence"] is None
    assert "default (the floor the database measures on itself" in run(runner, "-d", kb, "config", "min_confidence").stdout
    changed = out_json(run(runner, "-d", kb, "config", "min_confidence", "0.35", "--json"))
    assert changed == {"setting": "min_confidence", "old": None, "value": 0.35, "changed": True}
    with ragdb.open(kb) as db:
        assert db.min_confidence == 0.35
    assert "0.35 -> default" in run(runner, "-d", kb, "config", "min_confidence", "default").stdout
    with ragdb.open(kb) as db:
        assert db.min_confidence == db.self_calibration().floor
    for bad in ("high", "1.5", "2", "nan"):
        result = run(runner, "-d", kb, "config", "min_confidence", bad, ok=False)
        assert result.exit_code == 2 and "min_confidence" in result.stderr


# --------------------------------------------------------------------------- the benchmark's questions


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_off_topic_question_files(lang):
    """benchmarks/data/offtopic-*.jsonl: at least 50 distinct questions each, in their language."""
    questions = load_questions(ROOT / "benchmarks" / "data" / f"offtopic-{lang}.jsonl")
    assert len(questions) >= 50 and len(set(questions)) == len(questions)
    has_cjk = [any("\u4e00" <= ch <= "\u9fff" for ch in q) for q in questions]
    assert all(has_cjk) if lang == "zh" else not any(has_cjk)
    assert all(q and q.strip() == q for q in questions)


# --------------------------------------------------------------------------- arbitrary values


ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.just(10 ** 400), st.just(-(10 ** 400)), st.floats(),
    st.text(max_size=5), st.binary(max_size=5), st.lists(st.floats(0, 1), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.builds(object),
)


class _Echo:
    def complete(self, messages):
        return "Answer [1]."


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ANY_VALUE)
def test_any_min_confidence_gives_a_result_or_a_ragdb_error(en_db, value):
    calls = (lambda: en_db.build_prompt(EN_ON[0][0], min_confidence=value),
             lambda: en_db.ask(EN_ON[0][0], llm=_Echo(), min_confidence=value),
             lambda: build_prompt("q?", en_db.search(EN_ON[0][0]), min_confidence=value),
             lambda: select_evidence(en_db.search(EN_ON[0][0]), min_confidence=value),
             lambda: en_db.set_min_confidence(value))
    for call in calls:
        try:
            call()
        except ragdb.RagdbError:
            pass
    stored = en_db.settings.get("min_confidence")
    assert stored is None or 0.0 <= stored <= 1.0  # only a valid floor is ever stored
    en_db.set_min_confidence(None)


@pytest.mark.filterwarnings("error")  # numpy's overflow over a tiny bound is no warning either
@given(st.lists(st.floats(0.0, 50.0, allow_nan=False), max_size=60), st.floats(0.0, 40.0, allow_nan=False))
@example(scores=[50.0] * 16, bound=5e-324)
def test_confidences_from_scores_are_python_floats_of_the_one_formula(scores, bound):
    """from_scores switches to numpy from 16 scores; both ways give the same Python floats
    (JSON output needs Python floats), from a list or an array."""
    import numpy as np

    from ragdb.index.confidence import from_scores

    want = [min(1.0, max(0.0, s / bound)) for s in scores] if bound > 0 else [0.0] * len(scores)
    for given_ in (scores, np.array(scores, dtype=np.float64)):
        got = from_scores(given_, bound)
        assert got == want
        assert all(type(c) is float for c in got)
