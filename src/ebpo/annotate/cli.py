"""``ebpo annotate``: add a ``difficulty`` or ``topic`` column to a JSONL / Parquet dataset.

    ebpo annotate difficulty --input train.jsonl --output train.diff.jsonl --model PATH --reward math
    ebpo annotate topic --input train.jsonl --output train.topic.jsonl --backend judge --judge-model gpt-4.1
    ebpo annotate topic --evaluate data/topic_labels_hand.jsonl --backend keyword

See ``docs/annotate.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Add ``annotate`` with its two subcommands ``difficulty`` and ``topic``."""
    parser = subparsers.add_parser(
        "annotate",
        help="add a difficulty (pass rate) or topic column to a dataset, for clustered sampling",
        description="Annotate a JSONL/Parquet dataset for the topic and difficulty samplers (docs/design.md §4).",
    )
    sub = parser.add_subparsers(dest="annotate_command", metavar="KIND")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    _add_difficulty(sub)
    _add_topic(sub)


def _add_difficulty(sub: Any) -> None:
    from ebpo.annotate.difficulty import DifficultyConfig

    d = DifficultyConfig(model="")
    p = sub.add_parser(
        "difficulty",
        help="pass rate of a model over k samples per prompt, written as a 'difficulty' column",
        description="difficulty = (# correct of k samples at temperature T) / k; resumable (see docs/annotate.md).",
    )
    p.add_argument(
        "--input", required=True, help="JSONL or Parquet with a prompt/problem and an answer column"
    )
    p.add_argument("--output", required=True, help="new JSONL or Parquet file (input columns + difficulty)")
    p.add_argument(
        "--schema",
        default=None,
        help="read the input with this ebpo.data.loaders schema (shared, math500, olympiadbench, dapo_math_17k, "
        "records, ...) and write our record format, ready for `ebpo train`; default: keep the file's own columns",
    )
    p.add_argument("--model", required=True, help="Hugging Face model directory or name (the base model)")
    p.add_argument("--reward", default=d.reward, help=f"reward name from ebpo.rewards (default {d.reward})")
    p.add_argument("--k", type=int, default=d.k, help=f"samples per prompt (default {d.k}, as in the paper)")
    p.add_argument(
        "--temperature",
        type=float,
        default=d.temperature,
        help=f"sampling temperature (default {d.temperature})",
    )
    p.add_argument(
        "--top-p", type=float, default=d.top_p, help=f"nucleus sampling mass (default {d.top_p}: off)"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=d.max_new_tokens,
        help=f"longest response (default {d.max_new_tokens})",
    )
    p.add_argument(
        "--prompts-per-call",
        type=int,
        default=d.prompts_per_call,
        help=f"prompts sampled together, k rows each (default {d.prompts_per_call}); keep it fixed across a resume",
    )
    p.add_argument("--seed", type=int, default=d.seed, help=f"sampling seed (default {d.seed})")
    p.add_argument(
        "--threshold",
        type=float,
        default=d.threshold,
        help=f"reward above this counts as correct (default {d.threshold})",
    )
    p.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply the tokenizer's chat template (default: when the tokenizer has one)",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument(
        "--dtype", default=d.dtype, help=f"model dtype: auto, float32, bfloat16, float16 (default {d.dtype})"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run_difficulty)


def _add_topic(sub: Any) -> None:
    from ebpo.annotate.topic import JudgeConfig, list_topic_backends

    j = JudgeConfig.__dataclass_fields__
    p = sub.add_parser(
        "topic",
        help="one of the paper's nine topics per prompt (LLM judge, MiniLM embedding, or keyword rules)",
        description="Label each prompt with one of the nine topics of the paper (docs/design.md §4).",
    )
    p.add_argument("--input", help="JSONL or Parquet with a prompt/problem column")
    p.add_argument("--output", help="new JSONL or Parquet file (input columns + topic)")
    p.add_argument(
        "--schema",
        default=None,
        help="read the input with this ebpo.data.loaders schema (shared, math500, olympiadbench, dapo_math_17k, "
        "records, ...) and write our record format, ready for `ebpo train`; default: keep the file's own columns",
    )
    p.add_argument(
        "--backend", default="keyword", choices=list_topic_backends(), help="labeller (default keyword)"
    )
    p.add_argument(
        "--relabel", action="store_true", help="relabel rows that already have a topic (default: keep them)"
    )
    p.add_argument(
        "--evaluate",
        metavar="HAND_JSONL",
        help="instead of labelling, print the backend's agreement with a hand-labelled sample "
        "(e.g. data/topic_labels_hand.jsonl)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="for --evaluate: read the evaluation sets from DIR/<name>.jsonl (default: $EBPO_DATA_DIR if set, "
        "else their Hugging Face hub copies, as ebpo eval does)",
    )
    g = p.add_argument_group("judge backend (OpenAI-compatible /v1/chat/completions)")
    g.add_argument(
        "--base-url", default=None, help="endpoint root, e.g. https://api.openai.com/v1 (env OPENAI_BASE_URL)"
    )
    g.add_argument(
        "--judge-model", default=None, help="model name, e.g. gpt-4.1 as in the paper (env OPENAI_MODEL)"
    )
    g.add_argument("--api-key", default=None, help="bearer key (env OPENAI_API_KEY; prefer the env variable)")
    g.add_argument("--cache", default=None, help="JSONL answer cache (default: OUTPUT.judge_cache.jsonl)")
    g.add_argument(
        "--concurrency", type=int, default=j["concurrency"].default, help="requests in flight (default 8)"
    )
    g.add_argument(
        "--judge-batch-size",
        type=int,
        default=j["batch_size"].default,
        help="problems per batch; cache written after each (default 64)",
    )
    g.add_argument(
        "--max-retries",
        type=int,
        default=j["max_retries"].default,
        help="retries on 5xx/429/timeouts, exponential backoff (default 5)",
    )
    g.add_argument(
        "--backoff",
        type=float,
        default=j["backoff_s"].default,
        help="first retry delay in seconds, doubling (default 1.0)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=j["timeout_s"].default,
        help="per-request timeout in seconds (default 60)",
    )
    g.add_argument(
        "--max-reasks",
        type=int,
        default=j["max_reasks"].default,
        help="re-asks after an invalid label (default 2)",
    )
    e = p.add_argument_group("embedding backend")
    e.add_argument(
        "--embedding-model",
        default=None,
        help="sentence-transformers directory (default: bundled all-MiniLM-L6-v2)",
    )
    e.add_argument("--device", default="cpu", help="torch device for the embedding model (default cpu)")
    p.set_defaults(func=run_topic)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split("\n")).strip() or type(err).__name__


def _check_paths(args: argparse.Namespace) -> None:
    """Fail before any model or backend loads: the input must exist and differ from the output."""
    if args.input and not Path(args.input).is_file():
        raise FileNotFoundError(f"--input {args.input}: no such file")
    if args.input and args.output and Path(args.output).resolve() == Path(args.input).resolve():
        raise ValueError(f"--output {args.output} would overwrite the input; pick a new file")


def run_difficulty(args: argparse.Namespace) -> int:
    """``ebpo annotate difficulty``: exit 0; 2 with one line on stderr after a bad flag or file; 130 after
    Ctrl-C (the finished prompts stay in the partial file, and the message says how to resume)."""
    try:
        _check_paths(args)
        return _run_difficulty(args)
    except KeyboardInterrupt:
        from ebpo.annotate.difficulty import partial_path

        part = partial_path(args.output)
        done = len(part.read_bytes().splitlines()) if part.is_file() else 0
        print(
            f"ebpo annotate difficulty: interrupted; {done} finished prompts are saved in {part}; run the "
            f"same command again (same --prompts-per-call and --seed) to resume",
            file=sys.stderr,
        )
        return 130
    except (ValueError, OSError, ImportError) as err:  # messages name the flag, file or row and the fix
        print(f"ebpo annotate difficulty: {_one_line(err)}", file=sys.stderr)
        return 2


def _run_difficulty(args: argparse.Namespace) -> int:
    from ebpo.annotate.difficulty import DifficultyConfig, annotate_difficulty

    cfg = DifficultyConfig(
        model=args.model,
        reward=args.reward,
        k=args.k,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        prompts_per_call=args.prompts_per_call,
        seed=args.seed,
        threshold=args.threshold,
        chat_template=args.chat_template,
        device=args.device,
        dtype=args.dtype,
    )
    rows = annotate_difficulty(
        args.input, args.output, cfg, progress=not args.no_progress, schema=args.schema
    )
    mean = sum(r["difficulty"] for r in rows) / max(1, len(rows))
    print(f"wrote {len(rows)} rows to {args.output} (mean pass rate {mean:.3f})")
    return 0


def _backend_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.backend == "judge":
        cache = args.cache or (f"{args.output}.judge_cache.jsonl" if args.output else None)
        return {
            "base_url": args.base_url,
            "model": args.judge_model,
            "api_key": args.api_key,
            "cache_path": cache,
            "concurrency": args.concurrency,
            "batch_size": args.judge_batch_size,
            "max_retries": args.max_retries,
            "backoff_s": args.backoff,
            "timeout_s": args.timeout,
            "max_reasks": args.max_reasks,
        }
    if args.backend == "embedding":
        return {"model_path": args.embedding_model, "device": args.device}
    return {}


def _evaluate(args: argparse.Namespace, backend: Any) -> int:
    from ebpo.annotate.topic import agreement, load_hand_labels

    rows = load_hand_labels(args.evaluate, args.data_dir)
    predicted = backend.label([row["problem"] for row in rows])
    report = agreement(predicted, [row["label"] for row in rows])
    print(f"{args.backend}: accuracy {report['accuracy']:.3f} on {report['n']} hand-labelled problems")
    for split in sorted({row["split"] for row in rows} - {""}):
        idx = [i for i, row in enumerate(rows) if row["split"] == split]
        part = agreement([predicted[i] for i in idx], [rows[i]["label"] for i in idx])
        print(f"  split {split}: accuracy {part['accuracy']:.3f} on {part['n']}")
    for gold, (correct, n) in sorted(report["per_label"].items()):
        print(f"  {gold}: {correct}/{n}  predicted as {report['confusion'][gold]}")
    return 0


def run_topic(args: argparse.Namespace) -> int:
    """``ebpo annotate topic``: exit 0; 1 when some rows got no label (listed on stderr); 2 with one line
    on stderr after a bad flag, file or row; 130 after Ctrl-C (the judge's answers so far stay in its cache,
    and the message says how to resume)."""
    state: dict[str, Any] = {}
    try:
        return _run_topic(args, state)
    except KeyboardInterrupt:
        backend = state.get("backend")
        cache = getattr(getattr(backend, "config", None), "cache_path", None)
        if backend is not None and cache is not None:
            kept = (
                f"{backend.num_cached} labels are saved in {cache}; run the same command again to resume "
                f"(cached problems cost no request)"
            )
        else:
            kept = "nothing was written; run the command again"
        print(f"ebpo annotate topic: interrupted; {kept}", file=sys.stderr)
        return 130
    except (ValueError, OSError, ImportError) as err:  # messages name the flag, file or row and the fix
        print(f"ebpo annotate topic: {_one_line(err)}", file=sys.stderr)
        return 2


def _run_topic(args: argparse.Namespace, state: dict[str, Any]) -> int:
    from tqdm.auto import tqdm

    from ebpo.annotate import load_input, prompt_text, row_id, row_prompt, write_output
    from ebpo.annotate.topic import TOPICS, JudgeTopicClassifier, get_topic_backend

    if not args.evaluate:
        if not args.input or not args.output:
            raise ValueError("--input and --output are required (or --evaluate HAND_JSONL)")
        _check_paths(args)
    backend = state["backend"] = get_topic_backend(args.backend, **_backend_options(args))
    if args.evaluate:
        return _evaluate(args, backend)
    rows = load_input(args.input, args.schema)
    todo = [i for i, row in enumerate(rows) if args.relabel or row.get("topic") not in TOPICS]
    texts = [prompt_text(row_prompt(rows[i], i, args.input)) for i in todo]
    with tqdm(total=len(texts), desc=f"topic ({args.backend})", unit="prompt") as bar:
        if isinstance(backend, JudgeTopicClassifier):  # the judge reports each label as it arrives
            labels = backend.label(texts, progress=bar.update)
        else:
            labels = backend.label(texts)
            bar.update(len(texts))
    out = [dict(row) for row in rows]
    failed = []
    for i, label in zip(todo, labels):
        out[i]["topic"] = label
        if label is None:
            failed.append(i)
    write_output(args.output, out, args.schema)
    counts: dict[str, int] = {}
    for row in out:
        counts[str(row.get("topic"))] = counts.get(str(row.get("topic")), 0) + 1
    print(f"wrote {len(out)} rows to {args.output}; labelled {len(todo)}; topics: {json.dumps(counts)}")
    if failed:
        reasons = getattr(backend, "failures", {})
        keys = (
            {i: backend.cache_key(texts[todo.index(i)]) for i in failed}
            if hasattr(backend, "cache_key")
            else {}
        )
        print(f"{len(failed)} rows got no valid label (topic = null):", file=sys.stderr)
        for i in failed[:20]:
            print(f"  {row_id(rows[i], i)}: {reasons.get(keys.get(i), 'no label')}", file=sys.stderr)
        return 1
    return 0
