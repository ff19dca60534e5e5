"""The LLM judge (``ebpo.annotate.topic.judge``) over real HTTP on loopback: retries, re-asks, its cache, its
settings, transport errors, the wall-clock timeout, proxies."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from ebpo.annotate.topic import JudgeTopicClassifier
from helpers.topic import RawJudge


def test_judge_retries_reasks_reports_and_caches(judge_server, tmp_path):
    judge, url = judge_server
    cache = tmp_path / "cache.jsonl"
    texts = ["FLAKY: two dice are rolled", "BANANA: solve x + 1 = 2", "REASK: a circle", "plain: 2x = 4"]
    clf = JudgeTopicClassifier(
        base_url=url,
        model="judge-1",
        api_key="sk-test",
        cache_path=cache,
        concurrency=3,
        backoff_s=0.01,
        max_reasks=2,
    )
    labels = clf.label(texts)
    assert labels == ["Probability & Statistics", None, "Geometry & Trigonometry", "Algebra & Number Theory"]
    # FLAKY: 500 then success = 2 requests; BANANA: asked + 2 re-asks = 3; REASK: 1 + 1 re-ask; plain: 1
    per_problem = {t: sum(1 for p, *_ in judge.requests if p == t) for t in texts}
    assert per_problem == {texts[0]: 2, texts[1]: 3, texts[2]: 2, texts[3]: 1}
    assert clf.stats["retries"] == 1 and clf.stats["reasks"] == 3 and clf.stats["requests"] == 8
    # a re-ask carries the conversation: system, user, assistant's bad answer, the re-ask
    assert sorted(n for p, n, *_ in judge.requests if p == texts[1]) == [2, 4, 6]
    assert all(auth == "Bearer sk-test" and model == "judge-1" for _, _, auth, model in judge.requests)
    failure = clf.failures[clf.cache_key(texts[1])]
    assert "no valid label after 3 answers" in failure and "Banana" in failure
    # the cache holds the three valid labels; a new classifier answers them with no request
    assert len(cache.read_text().splitlines()) == 3
    before = len(judge.requests)
    again = JudgeTopicClassifier(base_url=url + "/v1", model="judge-1", cache_path=cache, max_reasks=0)
    assert again.label([texts[0], texts[2], texts[3]]) == [labels[0], labels[2], labels[3]]
    assert len(judge.requests) == before and again.stats["cache_hits"] == 3


def test_judge_gives_up_on_4xx_and_after_retries(judge_server, tmp_path):
    judge, url = judge_server
    clf = JudgeTopicClassifier(base_url=url, model="m", cache_path=None, backoff_s=0.0)
    assert clf.label(["NOTFOUND: anything"]) == [None]
    assert len(judge.requests) == 1  # a 404 is not retried
    assert "HTTP 404" in next(iter(clf.failures.values()))
    # nothing listens on a closed port: connection errors are retried max_retries times, then reported
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    down = JudgeTopicClassifier(base_url=dead, model="m", max_retries=2, backoff_s=0.0, timeout_s=2)
    assert down.label(["plain"]) == [None]
    assert down.stats["requests"] == 3 and "gave up after 3 tries" in next(iter(down.failures.values()))


def test_judge_config_rejects_bad_timeouts_and_urls():
    for timeout in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=rf"--timeout .*got {re.escape(str(timeout))} "):
            JudgeTopicClassifier(base_url="http://127.0.0.1:9", model="m", timeout_s=timeout)
    with pytest.raises(ValueError, match="--base-url 'ftp://x'"):
        JudgeTopicClassifier(base_url="ftp://x", model="m")


def test_judge_config_from_env_and_missing(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://example.invalid/v1")
    monkeypatch.setenv("OPENAI_MODEL", "gpt-4.1")
    clf = JudgeTopicClassifier()
    assert clf.config.endpoint == "http://example.invalid/v1/chat/completions"
    monkeypatch.delenv("OPENAI_MODEL")
    with pytest.raises(ValueError, match="OPENAI_MODEL"):
        JudgeTopicClassifier()


def test_judge_transport_errors_are_retried_then_reported_per_row(raw_judge, tmp_path):
    """A non-UTF-8 body, a bad status line or a truncated body is retried, then reported for its own row
    (naming the failure); label() does not raise, and the other rows are labelled and cached."""
    texts = ["BADUTF8: a", "BADSTATUS: b", "TRUNCATED: c", "plain: d", "BADSTATUS: e", "TRUNCATED: f"]
    judge = raw_judge(bad_tries={"BADSTATUS: e": 1, "TRUNCATED: f": 2})  # these two recover
    cache = tmp_path / "cache.jsonl"
    clf = JudgeTopicClassifier(
        base_url=judge.url, model="m", cache_path=cache, max_retries=2, backoff_s=0.0, concurrency=3
    )
    algebra = "Algebra & Number Theory"
    assert clf.label(texts) == [None, None, None, algebra, algebra, algebra]
    failures = {t: clf.failures[clf.cache_key(t)] for t in texts[:3]}
    assert "not valid UTF-8" in failures["BADUTF8: a"]
    assert "BadStatusLine" in failures["BADSTATUS: b"]
    assert "IncompleteRead" in failures["TRUNCATED: c"]
    assert all("gave up after 3 tries" in f for f in failures.values())
    per_problem = {t: judge.requests.count(t) for t in texts}
    assert per_problem == {texts[0]: 3, texts[1]: 3, texts[2]: 3, texts[3]: 1, texts[4]: 2, texts[5]: 3}
    assert clf.stats["retries"] == 2 + 2 + 2 + 1 + 2
    assert sorted(json.loads(line)["label"] for line in cache.read_text().splitlines()) == [algebra] * 3


def test_judge_timeout_is_a_wall_clock_per_request(raw_judge):
    """--timeout bounds the whole request, not each read: a body trickled one byte every 0.2 s (each read
    well under the limit, 17 s in all) is cut at 1 s per try."""
    judge = raw_judge()
    clf = JudgeTopicClassifier(base_url=judge.url, model="m", max_retries=1, backoff_s=0.0, timeout_s=1.0)
    start = time.monotonic()
    assert clf.label(["TRICKLE: slow"]) == [None]
    elapsed = time.monotonic() - start
    # two tries of at most ~1 s each; the trickled body alone takes 17 s per try
    assert elapsed < 6.0, elapsed
    assert judge.requests.count("TRICKLE: slow") == 2
    assert "timed out after 1 s" in next(iter(clf.failures.values()))


def test_judge_cache_torn_line_does_not_poison_the_next_append(raw_judge, tmp_path):
    """A torn last line (a kill mid-append) is cut off on read, so the next append starts a line of its own:
    the new label is kept and every line of the cache parses."""
    judge = raw_judge()
    cache = tmp_path / "cache.jsonl"
    first = JudgeTopicClassifier(base_url=judge.url, model="m", cache_path=cache)
    assert first.label(["plain: one"]) == ["Algebra & Number Theory"]
    with open(cache, "a", encoding="utf-8") as fh:
        fh.write('{"key": "abc", "lab')  # killed mid-append
    with pytest.warns(RuntimeWarning, match=r"cache\.jsonl, line 2: dropped a torn last line"):
        second = JudgeTopicClassifier(base_url=judge.url, model="m", cache_path=cache)
        assert second.label(["plain: two"]) == ["Algebra & Number Theory"]
    assert judge.requests == ["plain: one", "plain: two"]
    lines = cache.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["label"] for line in lines)  # every line parses
    third = JudgeTopicClassifier(base_url=judge.url, model="m", cache_path=cache)
    assert third.label(["plain: one", "plain: two"]) == ["Algebra & Number Theory"] * 2
    assert len(judge.requests) == 2 and third.stats["cache_hits"] == 2


def test_judge_cache_append_starts_on_a_fresh_line(raw_judge, tmp_path):
    """Even when the file is torn after it was read (another writer killed mid-line), an append starts on
    a new line, and unreadable lines are skipped on load with a warning (a cache miss, not an error)."""
    judge = raw_judge()
    cache = tmp_path / "cache.jsonl"
    clf = JudgeTopicClassifier(base_url=judge.url, model="m", cache_path=cache)
    cache.write_bytes(b'{"key": "x", "label": "Linear Algebra"}\n{"key": "torn\xff')
    assert clf.label(["plain: three"]) == ["Algebra & Number Theory"]
    raw = cache.read_bytes().split(b"\n")
    assert raw[1] == b'{"key": "torn\xff' and json.loads(raw[2])["label"] == "Algebra & Number Theory"
    reread = JudgeTopicClassifier(base_url=judge.url, model="m", cache_path=cache)
    assert reread.label(["plain: three"]) == ["Algebra & Number Theory"] and len(judge.requests) == 1


def test_judge_proxy_without_a_host_fails_each_row_naming_the_variable(monkeypatch):
    """A proxy variable with no host (``http_proxy=http://:3128``): each row fails with a message naming the
    variable and the fix, and no request leaves."""
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", "http://:3128")
    clf = JudgeTopicClassifier(base_url="http://judge.invalid/v1", model="m", max_retries=0, backoff_s=0.0)
    assert clf.label(["p", "q"]) == [None, None]
    assert clf.stats["requests"] == 2
    for failure in clf.failures.values():
        assert failure == "the http_proxy environment variable (http://:3128) names no host; fix or unset it"


def test_judge_goes_through_the_proxy_the_environment_names(raw_judge, monkeypatch):
    """``http_proxy`` with credentials: the request goes to the proxy, with the full URL as its target and
    the credentials as Basic proxy authorization; ``no_proxy`` naming the host sends it straight there."""
    heads: list[bytes] = []
    proxy = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = proxy.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            heads.append(data.split(b"\r\n\r\n")[0])
            conn.sendall(RawJudge._ok("Linear Algebra"))

    threading.Thread(target=serve, daemon=True).start()
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://user:secret@127.0.0.1:{proxy.getsockname()[1]}")
    clf = JudgeTopicClassifier(base_url="http://judge.invalid/v1", model="m", max_retries=0)
    assert clf.label(["a matrix"]) == ["Linear Algebra"]
    proxy.close()
    request_line, *header_lines = heads[0].decode().split("\r\n")
    headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in header_lines)}
    assert request_line == "POST http://judge.invalid/v1/chat/completions HTTP/1.1"
    assert headers["proxy-authorization"] == "Basic dXNlcjpzZWNyZXQ="  # base64 of "user:secret"

    judge = raw_judge()  # on 127.0.0.1: excluded from the proxy, answered directly
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    direct = JudgeTopicClassifier(base_url=judge.url, model="m", max_retries=0)
    assert direct.label(["plain: direct"]) == ["Algebra & Number Theory"]
    assert judge.requests == ["plain: direct"]
