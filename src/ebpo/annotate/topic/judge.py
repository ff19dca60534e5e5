"""The ``judge`` topic backend: an LLM judge behind any OpenAI-compatible ``/v1/chat/completions`` endpoint
(``httpx`` on an asyncio event loop; a wall-clock timeout per request; every transport failure (5xx, 429,
timeouts, refused or dropped connections, bad status lines, truncated or undecodable bodies) retried with
exponential backoff, then reported for its row; a JSONL cache keyed by the hash of (model, prompt), appended as
each answer arrives; answers that are not one of the nine labels are re-asked a bounded number of times, then
reported as ``None`` with the reason in ``failures``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ebpo.annotate.topic.labels import LABEL_DESCRIPTIONS, TOPICS, normalize_label, strip_instruction
from ebpo.persist import Journal

if TYPE_CHECKING:  # imported where a request is made: `ebpo --help` stays fast
    import httpx

logger = logging.getLogger(__name__)


JUDGE_SYSTEM_PROMPT = (
    "You classify math problems into exactly one topic. The topics are:\n"
    + "\n".join(f"{i + 1}. {t}: {' '.join(LABEL_DESCRIPTIONS[t])}" for i, t in enumerate(TOPICS))
    + "\nAnswer with the topic name only, exactly as written above, and nothing else."
)
JUDGE_REASK = (
    "That is not one of the nine topics. Reply with exactly one of: " + "; ".join(TOPICS) + ". Nothing else."
)


@dataclass
class JudgeConfig:
    """Settings of the LLM-judge backend; each field is a flag of ``ebpo annotate topic``."""

    _argument_group_name = "judge backend (OpenAI-compatible /v1/chat/completions)"

    base_url: str | None = field(
        default=None,
        metadata={"help": "endpoint root or its /v1, e.g. https://api.openai.com/v1 (env OPENAI_BASE_URL)"},
    )
    model: str | None = field(
        default=None,
        metadata={
            "help": "judge model name sent in each request, e.g. gpt-4.1 as in the paper (env OPENAI_MODEL)",
            "aliases": ["--judge-model"],
        },
    )
    api_key: str | None = field(
        default=None,
        metadata={
            "help": "sent as Authorization: Bearer (env OPENAI_API_KEY; prefer the env variable); may be empty "
            "for local servers"
        },
    )
    cache_path: str | Path | None = field(
        default=None,
        metadata={
            "help": "JSONL answer cache, one {key, label} per line, appended as each label arrives; none: no "
            "cache (ebpo annotate topic: OUTPUT.judge_cache.jsonl)",
            "aliases": ["--cache"],
        },
    )
    concurrency: int = field(default=8, metadata={"help": "requests in flight at once"})
    batch_size: int = field(
        default=64,
        metadata={
            "help": "problems started at a time; the next batch starts when this one is done",
            "aliases": ["--judge-batch-size"],
        },
    )
    max_retries: int = field(
        default=5,
        metadata={
            "help": "extra tries of one request after a transport failure: a 5xx or 429, a timeout, a refused "
            "or dropped connection, a bad status line, a truncated, non-UTF-8 or malformed body"
        },
    )
    backoff_s: float = field(
        default=1.0,
        metadata={"help": "first retry delay in seconds; doubles each retry", "aliases": ["--backoff"]},
    )
    timeout_s: float = field(
        default=60.0,
        metadata={
            "help": "wall-clock limit of one request in seconds (connect, send, status, headers and the whole "
            "body)",
            "aliases": ["--timeout"],
        },
    )
    max_reasks: int = field(
        default=2,
        metadata={
            "help": "times an answer that is not a valid label is re-asked before giving up on the problem"
        },
    )
    temperature: float = field(
        default=0.0,
        metadata={"help": "sampling temperature of the judge (0: deterministic where the server allows)"},
    )

    def __post_init__(self) -> None:
        self.base_url = self.base_url or os.environ.get("OPENAI_BASE_URL")
        self.model = self.model or os.environ.get("OPENAI_MODEL")
        self.api_key = self.api_key if self.api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        if not self.base_url:
            raise ValueError("judge backend: no endpoint; pass --base-url or set OPENAI_BASE_URL")
        if not self.model:
            raise ValueError("judge backend: no model; pass --judge-model or set OPENAI_MODEL")
        if self.concurrency < 1 or self.batch_size < 1 or self.max_retries < 0 or self.max_reasks < 0:
            raise ValueError(
                "judge backend: concurrency and batch_size must be >= 1, retries and re-asks >= 0"
            )
        if not 0 < self.timeout_s < math.inf or not 0 <= self.backoff_s < math.inf:
            raise ValueError(
                f"judge backend: --timeout must be a finite number > 0 and --backoff one >= 0, got "
                f"{self.timeout_s} and {self.backoff_s}"
            )
        url = urllib.parse.urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(
                f"judge backend: --base-url {self.base_url!r} is not an http(s) URL with a host, e.g. "
                f"https://api.openai.com/v1"
            )

    @property
    def endpoint(self) -> str:
        if self.base_url is None:  # set in __post_init__; None only if cleared afterwards
            raise ValueError("judge backend: no endpoint; pass --base-url or set OPENAI_BASE_URL")
        base = self.base_url.rstrip("/")
        if base.endswith("/chat/completions"):
            return base
        if not base.endswith("/v1"):
            base += "/v1"
        return base + "/chat/completions"


class JudgeError(RuntimeError):
    """A request that failed for good (a 4xx other than 429, or the retries used up)."""


class _Retryable(Exception):
    """One failed try that is worth another (a transport failure or a 5xx / 429)."""


# h11's words for the two ways a server can break the HTTP exchange itself, and the short name a row's failure
# gives each (any other transport failure is named by its httpx class: ConnectError, ReadError, ...)
_PROTOCOL_FAILURES = {
    "illegal status line": "BadStatusLine",
    "peer closed connection without sending complete message body": "IncompleteRead",
}


def _transport_failure(err: httpx.TransportError) -> str:
    """One line for a failed try: what kind of failure, then httpx's text."""
    text = str(err)
    kind = next((name for start, name in _PROTOCOL_FAILURES.items() if text.startswith(start)), None)
    return f"{kind or type(err).__name__}: {text}".rstrip(": ")


def _proxy_problem(endpoint: str) -> str | None:
    """The error of a proxy variable that applies to ``endpoint`` but names no host (httpx would try to reach
    the empty host and fail with a resolver error), else ``None``."""
    url = urllib.parse.urlsplit(endpoint)
    proxies = urllib.request.getproxies()
    scheme = url.scheme if proxies.get(url.scheme) else "all"
    proxy = proxies.get(scheme)
    if not proxy or urllib.request.proxy_bypass(url.hostname or ""):
        return None
    if urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}").hostname:
        return None
    return f"the {scheme}_proxy environment variable ({proxy}) names no host; fix or unset it"


def _run(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine`` on a new event loop; called from inside a running loop (a notebook), on a worker
    thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coroutine)
        return
    with ThreadPoolExecutor(max_workers=1) as worker:
        worker.submit(asyncio.run, coroutine).result()


class JudgeTopicClassifier:
    """An LLM judge over an OpenAI-compatible chat endpoint (the paper used GPT-4.1).

    ``label(texts)`` returns one label or ``None`` per text; for each ``None``, ``failures[text_hash]``
    says why (the last invalid answer, or the transport error after the retries). ``stats`` counts
    requests, retries, re-asks and cache hits.

    Requests go through an ``httpx.AsyncClient`` (proxy variables and certificate settings of the
    environment honoured), ``concurrency`` of them in flight on one event loop. Each has ``timeout_s`` of wall
    clock in all (``asyncio.timeout`` around connect, send, headers and body), however slowly the server
    trickles bytes; httpx's own timeouts are per read and would not catch that. Each request opens its own
    connection, so a connection the server closed after its last answer is never reused and counted as a
    failed try. Ctrl-C cancels every request in flight.
    """

    def __init__(self, config: JudgeConfig | None = None, **overrides: Any) -> None:
        self.config = config if config is not None else JudgeConfig(**overrides)
        self.failures: dict[str, str] = {}
        self.stats = {"requests": 0, "retries": 0, "reasks": 0, "cache_hits": 0, "invalid": 0}
        self._cache: dict[str, str] = {}
        self._journal = (
            Journal(self.config.cache_path, kind="a cached label")
            if self.config.cache_path is not None
            else None
        )
        if self._journal is not None and self._journal.exists():
            self._load_cache(self._journal)

    def _load_cache(self, journal: Journal) -> None:
        """Read the cache, whose one writer this is: a torn last line (a kill mid-append) is cut off the file;
        other unreadable lines are skipped with a warning (their problems are asked again)."""
        self._cache.update(journal.read(_cached_label, skip_bad=True, repair=True))
        if journal.skipped:
            logger.warning(
                "%s: skipped %d unreadable line(s) (first: line %d); those problems will be asked again",
                journal.path,
                len(journal.skipped),
                journal.skipped[0],
            )

    def cache_key(self, text: str) -> str:
        """sha256 of (model, system prompt, problem): a changed prompt or model is a cache miss."""
        payload = json.dumps([self.config.model, JUDGE_SYSTEM_PROMPT, strip_instruction(text)])
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    async def _request(self, client: httpx.AsyncClient, body: dict[str, Any]) -> str:
        """One POST within ``timeout_s`` of wall clock: returns the answer text, or raises :class:`_Retryable`
        or :class:`JudgeError`."""
        import httpx

        cfg = self.config
        try:
            async with asyncio.timeout(cfg.timeout_s):
                response = await client.post(cfg.endpoint, json=body)
        except TimeoutError as err:
            raise _Retryable(f"timed out after {cfg.timeout_s:g} s") from err
        except httpx.TransportError as err:
            raise _Retryable(_transport_failure(err)) from err
        status = response.status_code
        if status >= 500 or status == 429:
            raise _Retryable(f"HTTP {status}")
        if status >= 300:
            raise JudgeError(f"HTTP {status} from {cfg.endpoint}")
        payload = response.content
        try:
            reply = json.loads(payload.decode("utf-8"))
            return str(reply["choices"][0]["message"]["content"] or "")
        except UnicodeDecodeError as err:
            raise _Retryable(f"response body is not valid UTF-8 ({err.reason} at byte {err.start})") from err
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise _Retryable(f"malformed response ({type(err).__name__}: {err}): {payload[:80]!r}") from err

    async def _post(self, client: httpx.AsyncClient, messages: list[dict[str, str]]) -> str:
        """One chat completion, retried ``max_retries`` times with exponential backoff after any transport
        failure, 5xx or 429; other 4xx fail at once."""
        cfg = self.config
        body = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature}
        proxy_problem = _proxy_problem(cfg.endpoint)
        delay = cfg.backoff_s
        for attempt in range(cfg.max_retries + 1):
            self.stats["requests"] += 1
            if proxy_problem is not None:
                raise JudgeError(proxy_problem)
            try:
                return await self._request(client, body)
            except _Retryable as err:
                reason = f"{err} from {cfg.endpoint}"
            if attempt == cfg.max_retries:
                raise JudgeError(f"{reason} (gave up after {cfg.max_retries + 1} tries)")
            self.stats["retries"] += 1
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def _ask(self, client: httpx.AsyncClient, text: str) -> tuple[str | None, str]:
        """Ask until a valid label or ``max_reasks`` re-asks are spent; returns (label, last answer)."""
        messages = [
            {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
            {"role": "user", "content": strip_instruction(text)},
        ]
        answer = ""
        for turn in range(self.config.max_reasks + 1):
            answer = await self._post(client, messages)
            label = normalize_label(answer)
            if label is not None:
                return label, answer
            self.stats["invalid"] += 1
            if turn < self.config.max_reasks:
                self.stats["reasks"] += 1
            messages = messages + [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": JUDGE_REASK},
            ]
        return None, answer

    async def _label_uncached(
        self, client: httpx.AsyncClient, slots: asyncio.Semaphore, key: str, text: str
    ) -> tuple[str, str | None]:
        """(key, label) of one problem; ``None`` with the reason in ``failures`` when it gets none."""
        async with slots:
            try:
                label, answer = await self._ask(client, text)
            except JudgeError as err:
                self.failures[key] = str(err)
                return key, None
        if label is None:
            self.failures[key] = (
                f"no valid label after {self.config.max_reasks + 1} answers; last: {answer!r}"
            )
        return key, label

    async def _label_all(
        self, text_of: dict[str, str], rows_of: dict[str, int], progress: Callable[[int], None] | None
    ) -> None:
        """Ask for every key of ``text_of``, ``batch_size`` problems at a time, ``concurrency`` in flight;
        each valid label goes to the cache as it arrives."""
        import httpx

        cfg = self.config
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        slots = asyncio.Semaphore(cfg.concurrency)
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=0)
        keys = list(text_of)
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=None) as client:
            for start in range(0, len(keys), cfg.batch_size):
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(self._label_uncached(client, slots, key, text_of[key]))
                        for key in keys[start : start + cfg.batch_size]
                    ]
                    for finished in asyncio.as_completed(tasks):
                        key, label = await finished
                        if label is not None:
                            self._cache[key] = label
                            self._append_cache({key: label})
                        if progress is not None:
                            progress(rows_of[key])

    def label(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> list[str | None]:
        """Labels in input order; cached problems cost no request; each new valid label is appended to the
        cache as soon as it arrives, so an interrupted run keeps every answer it received. On Ctrl-C the
        requests in flight are cancelled and ``KeyboardInterrupt`` propagates."""
        keys = [self.cache_key(t) for t in texts]
        out: list[str | None] = [self._cache.get(k) for k in keys]
        todo = [i for i, lab in enumerate(out) if lab is None]
        self.stats["cache_hits"] += len(texts) - len(todo)
        if progress is not None and len(texts) > len(todo):
            progress(len(texts) - len(todo))
        rows_of: dict[str, int] = {}
        for i in todo:
            rows_of[keys[i]] = rows_of.get(keys[i], 0) + 1
        if rows_of:
            _run(self._label_all({keys[i]: texts[i] for i in todo}, rows_of, progress))
        return [self._cache.get(k) for k in keys]

    @property
    def num_cached(self) -> int:
        """Labels held in the cache (read at start or received since)."""
        return len(self._cache)

    def _append_cache(self, new: dict[str, str]) -> None:
        """Append labels to the cache file, one line each (on a fresh line, whatever the file ends with)."""
        if self._journal is not None:
            self._journal.append({"key": key, "label": label} for key, label in new.items())


def _cached_label(row: dict[str, Any]) -> tuple[str, str]:
    """(key, label) of a cache line; ValueError for a line that is not one."""
    key, label = row["key"], row["label"]
    if not isinstance(key, str) or label not in TOPICS:
        raise ValueError(f"not a key and one of the nine labels: {row}")
    return key, label
