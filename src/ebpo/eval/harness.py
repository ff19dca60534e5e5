"""The evaluation harness: sample n responses per problem, score them, summarise (docs/design.md §5).

```python
from ebpo.eval import SamplingConfig, evaluate
result = evaluate("path/to/model", records, "math", SamplingConfig(n=32, temperature=0.6, top_p=0.95))
result.summary["pass@1"], result.metrics(prefix="eval/aime24/")
```

- Responses come from :func:`ebpo.generation.sample` (KV cache, batched), or from any ``generate_fn``
  callable ``(prompts, n, seeds) -> list[list[str]] | Rollouts`` with one seed per prompt (tests script
  one; other engines plug in).
- Each problem's n responses are drawn from its own generator, seeded ``problem_seed(seed, id)``
  (``generation.sample(generators=...)``), so they do not depend on which problems share its batch.
  Problems are sampled in fixed chunks of ``max(1, batch_size // n)`` consecutive records of the *full*
  list; ``limit`` only says which problems are reported (the chunk holding the last one is sampled whole),
  so a chunk's batch is the same with any ``limit`` and on a resume, and responses are bit-identical. A
  different ``batch_size`` changes only the float rounding of the batched forward pass (bit-identical in
  our CPU tests; rare flipped tokens are possible on GPUs), and it is part of the cache key.
- With ``cache_path`` each finished problem is appended as one line (:class:`ProblemScores`) of a journal
  (:class:`ebpo.persist.Journal`) after its chunk is scored; a rerun reads the file, skips the problems it
  holds and samples only chunks with missing problems, so an interrupted evaluation resumes where it
  stopped. A torn last line (a kill mid-write) is dropped, with a warning, and its problem redone.
- Scoring: reward > 0 is correct; final answers for maj@k come from the reward's ``extract`` and are
  clustered with its ``equivalent_batch`` / ``equivalent`` (plain string equality when it has neither).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ebpo.data.prompts import ChatTemplateSetting, PromptFormat, prompt_text
from ebpo.data.records import Record
from ebpo.eval.metrics import ProblemScores, score_problem, summarize
from ebpo.persist import Journal, write_text_atomic

__all__ = [
    "EvalResult",
    "SamplingConfig",
    "SamplingOptions",
    "cache_file",
    "evaluate",
    "load_model",
    "model_fingerprint",
    "model_generate_fn",
    "problem_seed",
]

# bump when the cache line format or the sampling scheme changes: old cache files are then ignored
# (2: one generator per problem instead of one per chunk)
CACHE_FORMAT = 2

GenerateFn = Callable[[list[str], int, list[int]], Any]


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling settings ``ebpo eval`` takes as flags as they are (:class:`SamplingConfig` adds the two it
    decides per benchmark and model)."""

    _argument_group_name = "sampling"

    n: int = field(
        default=32, metadata={"help": "samples per problem; Pass@1 averages over them (the paper: 32)"}
    )
    temperature: float = field(default=0.6, metadata={"help": "sampling temperature, 0 = greedy"})
    top_p: float = field(default=0.95, metadata={"help": "nucleus sampling mass in (0, 1]"})
    seed: int = field(
        default=0,
        metadata={"help": "sampling seed; a problem's generator is seeded problem_seed(seed, id)"},
    )
    batch_size: int = field(
        default=64,
        metadata={"help": "sequences decoded together; max(1, batch_size // n) problems per batch"},
    )


@dataclass(frozen=True)
class SamplingConfig(SamplingOptions):
    """How responses are sampled for evaluation (every field is part of the cache key)."""

    max_new_tokens: int = field(default=4096, metadata={"help": "longest response in tokens (EOS included)"})
    chat_template: ChatTemplateSetting = field(
        default="auto",
        metadata={
            "help": "render prompts with the tokenizer's chat template (ebpo.data.prompts.PromptFormat, as "
            "ebpo train's data.chat_template): auto = when the tokenizer has one | on | off"
        },
    )

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingConfig.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("SamplingConfig.max_new_tokens and batch_size must be >= 1")

    @property
    def problems_per_chunk(self) -> int:
        return max(1, self.batch_size // self.n)


def problem_seed(seed: int, problem_id: str) -> int:
    """Seed of one problem's generator: the first 8 bytes of SHA-256 over ``"{seed}/{problem_id}"``, as a
    63-bit integer (independent streams per problem, stable under reordering, limiting and batching)."""
    digest = hashlib.sha256(f"{seed}/{problem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# --- models --------------------------------------------------------------------------------------------


def model_fingerprint(path: str | Path) -> str:
    """12 hex digits over the names, sizes and modification times of a model directory's files, so a
    checkpoint rewritten in place gets a new cache key."""
    root = Path(path)
    entries = sorted(
        (p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    )
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:12]


def load_model(path: str | Path, *, device: str | None = None, dtype: str = "auto"):
    """``(model, tokenizer)`` from a Hugging Face directory: eval mode, left padding, on ``device``
    (default: CUDA if available). ``dtype``: ``auto`` (bfloat16 on CUDA, float32 on CPU), ``float32``,
    ``bfloat16`` or ``float16``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.generation import in_kernel_gqa

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    elif dtype in dtypes:
        torch_dtype = dtypes[dtype]
    else:
        raise ValueError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(dtypes)}")
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"model directory {path} not found (give a local Hugging Face model directory)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        # transformers wraps PreTrainedModel.to in functools.wraps: mypy sees an unbound _Wrapped (self first)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()  # type: ignore[arg-type]
    except Exception as err:  # noqa: BLE001 - a damaged file raises OSError, safetensors' or JSON errors
        from ebpo.errors import ConfigError, first_line

        raise ConfigError(f"cannot load a causal LM from {path}: {first_line(err)}") from err
    tokenizer.padding_side = "left"
    in_kernel_gqa(model)  # sampling without gradient: same numbers, less copying
    return model, tokenizer


def model_generate_fn(model, tokenizer, sampling: SamplingConfig) -> GenerateFn:
    """``(prompts, n, seeds) -> Rollouts`` through :func:`ebpo.generation.sample`, prompt b's rows drawn
    from a generator seeded ``seeds[b]`` (on the model's device). The prompts are texts from
    :func:`evaluate` (``PromptFormat.texts``), tokenized as ``sampling.chat_template`` says
    (``PromptFormat.encode``: ``ebpo train`` reads the same ids)."""
    import torch

    from ebpo.generation import sample

    device = next(model.parameters()).device
    prompt_format = PromptFormat.resolve(tokenizer, sampling.chat_template, option="chat_template")

    def generate(prompts: list[str], n: int, seeds: list[int]):
        generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]
        return sample(
            model,
            tokenizer,
            prompt_format.encode(prompts),
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=sampling.max_new_tokens,
            generators=generators,
            batch_size=sampling.batch_size,
        )

    return generate


# --- the cache -----------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-80:] or "model"


def cache_file(
    cache_dir: str | Path, model_name: str, benchmark: str, sampling: SamplingConfig, **key: Any
) -> Path:
    """``<cache_dir>/<model>/<benchmark>-<hash>.jsonl``; the hash covers the model name, the benchmark, every
    sampling setting and ``key`` (e.g. the reward and the model fingerprint). A ``.meta.json`` beside it
    records what the hash covers."""
    material = {
        "format": CACHE_FORMAT,
        "model": model_name,
        "benchmark": benchmark,
        "sampling": asdict(sampling),
        **key,
    }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:12]
    path = Path(cache_dir) / _slug(model_name) / f"{_slug(benchmark)}-{digest}.jsonl"
    meta = path.with_suffix(".meta.json")
    if not meta.exists():
        write_text_atomic(meta, json.dumps(material, indent=2, sort_keys=True, default=str) + "\n")
    return path


def _cache_journal(path: Path) -> Journal:
    """The cache as a journal: one finished problem a line (:class:`ProblemScores`)."""
    return Journal(path, kind="a cached problem", fix="delete the file to redo")


# --- evaluate ------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    """Per-problem scores (in record order) and their summary (:func:`ebpo.eval.metrics.summarize`)."""

    problems: list[ProblemScores]
    summary: dict[str, float]
    cache_path: Path | None = None
    num_cached: int = 0  # problems read from the cache rather than sampled in this call

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """The summary with ``prefix`` on every key (e.g. ``eval/pass@1``, ``eval/maj@16``)."""
        return {f"{prefix}{key}": value for key, value in self.summary.items()}


def _as_texts(output: Any, num_prompts: int, n: int) -> tuple[list[list[str]], list | None, list | None]:
    """Normalise a generate_fn result to per-prompt text lists (+ lengths, truncated when known)."""
    if hasattr(output, "texts") and hasattr(output, "lengths"):  # ebpo.generation.Rollouts
        texts, lengths, truncated = output.texts, output.lengths.tolist(), output.truncated.tolist()
        if len(texts) != num_prompts * n:
            raise ValueError(f"generate_fn returned {len(texts)} responses for {num_prompts} prompts x n={n}")
        rows = [slice(i * n, (i + 1) * n) for i in range(num_prompts)]
        return [texts[r] for r in rows], [lengths[r] for r in rows], [truncated[r] for r in rows]
    groups = [list(group) for group in output]
    if len(groups) != num_prompts or any(len(g) != n for g in groups):
        shape = [len(g) for g in groups]
        raise ValueError(f"generate_fn must return {num_prompts} lists of n={n} strings, got lengths {shape}")
    return groups, None, None


def _scorer(reward: Any) -> tuple[Callable[[str], str | None], dict[str, Any]]:
    """The reward's answer extractor (as str) and its equivalence callables for maj@k."""
    extract = getattr(reward, "extract", None)

    def extract_str(text: str) -> str | None:
        if extract is None:
            return text.strip() or None
        answer = extract(text)
        return None if answer is None else str(answer)

    equivalence: dict[str, Any] = {}
    if getattr(reward, "equivalent_batch", None) is not None:
        equivalence["equivalent_batch"] = reward.equivalent_batch
    elif getattr(reward, "equivalent", None) is not None:
        equivalence["equivalent"] = reward.equivalent
    else:
        equivalence["equivalent"] = lambda gold, pred: gold == pred
    return extract_str, equivalence


def _renderer(tokenizer: Any, setting: str) -> Callable[[list[Record]], list[str]]:
    """The prompt texts a chunk's records give (``PromptFormat.texts``); without a tokenizer (a
    ``generate_fn`` alone) there is no template, so ``auto`` reads the raw prompts and ``on`` is an error."""
    if tokenizer is not None:
        return PromptFormat.resolve(tokenizer, setting, option="SamplingConfig.chat_template").texts
    if setting == "on":
        raise ValueError(
            "SamplingConfig.chat_template=on needs a tokenizer (pass tokenizer= or a model path)"
        )
    return lambda chunk_records: [prompt_text(rec) for rec in chunk_records]


def evaluate(
    model_or_path: Any,
    records: Sequence[Record],
    reward: Any,
    sampling: SamplingConfig | None = None,
    *,
    tokenizer: Any = None,
    generate_fn: GenerateFn | None = None,
    ks: Sequence[int] = (1,),
    maj_ks: Sequence[int] = (),
    maj_mode: str = "subsets",
    limit: int | None = None,
    cache_path: str | Path | None = None,
    keep_texts: bool = False,
    progress: bool = False,
    device: str | None = None,
    dtype: str = "auto",
) -> EvalResult:
    """Sample ``sampling.n`` responses per record, score them with ``reward``, summarise.

    Args:
        model_or_path: a loaded causal LM (then pass ``tokenizer``) or a model directory; ignored when
            ``generate_fn`` is given (pass ``None``).
        records: the problems (``prompt``, ``answer``, ``id`` unique).
        reward: a reward name for :func:`ebpo.rewards.get_reward` or a reward object
            (``batch(completions, answers)``; optional ``extract``, ``equivalent_batch``/``equivalent``).
        sampling: :class:`SamplingConfig` (default ``SamplingConfig()``).
        generate_fn: ``(prompts, n, seeds) -> list[list[str]] | Rollouts`` instead of the model; ``seeds``
            holds one seed per prompt, and a prompt's responses should depend on its seed alone.
        ks / maj_ks: the k of pass@k / maj@k to report (k above n is skipped, with a warning).
        maj_mode: ``"subsets"`` or ``"first"`` (:func:`ebpo.eval.metrics.maj_at_k`).
        limit: report only the first ``limit`` records (the chunk holding the last one is sampled whole,
            and cached, so that responses do not depend on ``limit``).
        cache_path: JSONL file of finished problems (see the module docstring; :func:`cache_file`).
        keep_texts: store each response's text in the results (and cache).
        progress: show a tqdm bar.
    """
    sampling = sampling or SamplingConfig()
    records = list(records)
    all_ids = [str(rec.id) for rec in records]
    if len(set(all_ids)) != len(all_ids):
        dup = next(i for i, count in Counter(all_ids).items() if count > 1)
        raise ValueError(f"record ids must be unique; {dup!r} repeats")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    ids = all_ids[: limit if limit is not None else None]
    if isinstance(reward, str):
        from ebpo.rewards import get_reward

        reward = get_reward(reward)
    if generate_fn is None:
        if model_or_path is None:
            raise ValueError("evaluate needs a model (or a model path) or a generate_fn")
        if isinstance(model_or_path, str | Path):
            model, tokenizer = load_model(model_or_path, device=device, dtype=dtype)
        else:
            if tokenizer is None:
                raise ValueError("evaluate: pass tokenizer= with a loaded model")
            model = model_or_path
        generate_fn = model_generate_fn(model, tokenizer, sampling)

    render = _renderer(tokenizer, sampling.chat_template)

    cache = _cache_journal(Path(cache_path)) if cache_path is not None else None
    # the one writer of this cache: a torn last line is cut off before the first append
    done = {p.id: p for p in cache.read(ProblemScores.from_dict, repair=True)} if cache is not None else {}
    num_cached = sum(i in done for i in ids)
    reported = set(ids)
    extract, equivalence = _scorer(reward)
    per_chunk = sampling.problems_per_chunk
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(ids), initial=num_cached, desc="eval", unit="problem", dynamic_ncols=True)
    # chunks are cut from the full list, so the chunk of the last reported problem is the same batch
    # with any limit; its problems beyond the limit are sampled and cached too
    for start in range(0, len(ids), per_chunk):
        chunk_records = records[start : start + per_chunk]
        if all(str(rec.id) in done for rec in chunk_records):
            continue
        seeds = [problem_seed(sampling.seed, str(rec.id)) for rec in chunk_records]
        output = generate_fn(render(chunk_records), sampling.n, seeds)
        texts, lengths, truncated = _as_texts(output, len(chunk_records), sampling.n)
        flat_texts = [t for group in texts for t in group]
        flat_answers = [rec.answer for rec in chunk_records for _ in range(sampling.n)]
        flat_rewards = [float(r) for r in reward.batch(flat_texts, flat_answers)]
        finished = []
        for i, rec in enumerate(chunk_records):
            if str(rec.id) in done:  # already cached from an earlier run: keep the cached line
                continue
            extra: dict[str, Any] = {}
            if lengths is not None and truncated is not None:  # both known (Rollouts) or neither
                extra = {
                    "lengths": [int(x) for x in lengths[i]],
                    "truncated": [bool(x) for x in truncated[i]],
                }
            if keep_texts:
                extra["texts"] = texts[i]
            finished.append(
                score_problem(
                    str(rec.id),
                    flat_rewards[i * sampling.n : (i + 1) * sampling.n],
                    [extract(t) for t in texts[i]],
                    **equivalence,
                    **extra,
                )
            )
        if cache is not None:
            cache.append(p.to_dict() for p in finished)
        done.update((p.id, p) for p in finished)
        if bar is not None:
            bar.update(sum(p.id in reported for p in finished))
    if bar is not None:
        bar.close()
    problems = [done[i] for i in ids]
    summary = (
        summarize(problems, ks=ks, maj_ks=maj_ks, maj_mode=maj_mode, seed=sampling.seed) if problems else {}
    )
    cache_file_path = cache.path if cache is not None else None
    return EvalResult(problems=problems, summary=summary, cache_path=cache_file_path, num_cached=num_cached)


def records_digest(records: Sequence[Any]) -> str:
    """12 hex digits over every record's id, prompt and answer: a changed data file gets a new cache."""
    import hashlib

    payload = json.dumps([[str(r.id), r.prompt, r.answer] for r in records])
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


class LazyModel:
    """Loads a model on the first chunk that needs sampling, so a run answered fully from the cache never
    loads it; ``generate_fn(sampling)`` gives the harness's ``(prompts, n, seeds)`` callable."""

    def __init__(self, path: Path, tokenizer: Any, *, device: str | None, dtype: str):
        self.path, self.tokenizer, self.device, self.dtype = path, tokenizer, device, dtype
        self.model = None

    def generate_fn(self, sampling: Any):
        from ebpo.eval.harness import load_model, model_generate_fn

        def generate(prompts: list[str], n: int, seeds: list[int]):
            if self.model is None:
                self.model, _ = load_model(self.path, device=self.device, dtype=self.dtype)
            return model_generate_fn(self.model, self.tokenizer, sampling)(prompts, n, seeds)

        return generate
