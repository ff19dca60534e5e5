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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpo.console import show_traceback
from ebpo.settings import add_command, dataclass_parser, from_args

SCHEMA_HELP = (
    "read the input with this ebpo.data.loaders schema (shared, math500, olympiadbench, dapo_math_17k, "
    "records, ...) and write our record format, ready for `ebpo train`; default: keep the file's own columns"
)


@dataclass
class DifficultyCommand:
    """The files and display of ``ebpo annotate difficulty`` (its sampling settings are ``DifficultyConfig``'s)."""

    input: str = field(metadata={"help": "JSONL or Parquet with a prompt/problem and an answer column"})
    output: str = field(metadata={"help": "new JSONL or Parquet file (input columns + difficulty)"})
    schema: str | None = field(default=None, metadata={"help": SCHEMA_HELP})
    no_progress: bool = field(default=False, metadata={"help": "hide the progress bar"})


@dataclass
class TopicCommand:
    """The files and backend of ``ebpo annotate topic`` (the judge's settings are ``JudgeConfig``'s)."""

    input: str | None = field(
        default=None, metadata={"help": "JSONL or Parquet with a prompt/problem column"}
    )
    output: str | None = field(
        default=None, metadata={"help": "new JSONL or Parquet file (input columns + topic)"}
    )
    schema: str | None = field(default=None, metadata={"help": SCHEMA_HELP})
    backend: str = field(
        default="keyword",
        metadata={
            "help": "labeller: keyword (rules), embedding (MiniLM, offline) or judge (an LLM over HTTP)"
        },
    )
    relabel: bool = field(
        default=False, metadata={"help": "relabel rows that already have a topic (default: keep them)"}
    )
    evaluate: str | None = field(
        default=None,
        metadata={
            "help": "instead of labelling, print the backend's agreement with a hand-labelled sample "
            "(e.g. data/topic_labels_hand.jsonl)",
            "metavar": "HAND_JSONL",
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "for --evaluate: read the evaluation sets from DIR/<name>.jsonl (default: $EBPO_DATA_DIR if "
            "set, else their Hugging Face hub copies, as ebpo eval does)",
            "metavar": "DIR",
        },
    )
    embedding_model: str | None = field(
        default=None,
        metadata={
            "help": "embedding backend: sentence-transformers directory (default: bundled all-MiniLM-L6-v2)"
        },
    )
    device: str = field(default="cpu", metadata={"help": "embedding backend: torch device of the model"})


def add_parser(subparsers: Any) -> None:
    """Add ``annotate`` with its two subcommands ``difficulty`` and ``topic``."""
    parser = subparsers.add_parser(
        "annotate",
        help="add a difficulty (pass rate) or topic column to a dataset, for clustered sampling",
        description="Annotate a JSONL/Parquet dataset for the topic and difficulty samplers (docs/design.md §4).",
    )
    sub = parser.add_subparsers(dest="annotate_command", metavar="KIND")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    add_command(
        sub,
        "difficulty",
        help="pass rate of a model over k samples per prompt, written as a 'difficulty' column",
        parser=_difficulty_parser,
        run=run_difficulty,
    )
    add_command(
        sub,
        "topic",
        help="one of the paper's nine topics per prompt (LLM judge, MiniLM embedding, or keyword rules)",
        parser=_topic_parser,
        run=run_topic,
    )


def _difficulty_parser(prog: str) -> argparse.ArgumentParser:
    from ebpo.annotate.difficulty import DifficultyConfig

    description = (
        "difficulty = (# correct of k samples at temperature T) / k; resumable (see docs/annotate.md)."
    )
    return dataclass_parser(
        prog, description, [DifficultyCommand, DifficultyConfig], negatable=["chat_template"]
    )


def _topic_parser(prog: str) -> argparse.ArgumentParser:
    from ebpo.annotate.topic import JudgeConfig

    description = "Label each prompt with one of the nine topics of the paper (docs/design.md §4)."
    return dataclass_parser(prog, description, [TopicCommand, JudgeConfig])


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split("\n")).strip() or type(err).__name__


def _check_paths(args: argparse.Namespace) -> None:
    """Fail before any model or backend loads: the input must exist and differ from the output."""
    if args.input and not Path(args.input).is_file():
        raise FileNotFoundError(f"--input {args.input}: no such file")
    if args.input and args.output and Path(args.output).resolve() == Path(args.input).resolve():
        raise ValueError(f"--output {args.output} would overwrite the input; pick a new file")
    model = getattr(args, "model", None)
    if model and not Path(model).expanduser().exists() and not _hub_name(model):
        raise FileNotFoundError(
            f"--model {model} does not exist; give a model directory or a Hugging Face hub name (org/name)"
        )


def _hub_name(name: str) -> bool:
    """Whether ``name`` can be a Hugging Face hub repository (``name`` or ``org/name``), not only a local path."""
    import re

    return re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) is not None and not name.startswith((".", "-"))


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
        show_traceback(err)
        print(f"ebpo annotate difficulty: error: {_one_line(err)}", file=sys.stderr)
        return 2


def _run_difficulty(args: argparse.Namespace) -> int:
    from ebpo.annotate.difficulty import DifficultyConfig, annotate_difficulty

    cfg = from_args(DifficultyConfig, args)
    rows = annotate_difficulty(
        args.input, args.output, cfg, progress=not args.no_progress, schema=args.schema
    )
    mean = sum(r["difficulty"] for r in rows) / max(1, len(rows))
    print(f"wrote {len(rows)} rows to {args.output} (mean pass rate {mean:.3f})")
    return 0


def _backend_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.backend == "judge":
        from ebpo.annotate.topic import JudgeConfig

        cache = args.cache_path or (f"{args.output}.judge_cache.jsonl" if args.output else None)
        return {"config": from_args(JudgeConfig, args, cache_path=cache)}
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
        show_traceback(err)
        print(f"ebpo annotate topic: error: {_one_line(err)}", file=sys.stderr)
        return 2


def _run_topic(args: argparse.Namespace, state: dict[str, Any]) -> int:
    from tqdm.auto import tqdm

    from ebpo.annotate import load_input, row_id, row_prompt, write_output
    from ebpo.annotate.topic import TOPICS, JudgeTopicClassifier, get_topic_backend
    from ebpo.data.prompts import prompt_text

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
