"""Turn ebpo records into verl's RL parquet files (train + validation) for the paper's runs.

    python examples/verl/prepare_data.py \
        --train data/dapo17k_annotated.jsonl --train-schema records \
        --val math500 aime24 --out data/verl

``--train`` is anything ``ebpo.data.loaders.read_records`` reads (JSONL / Parquet / ``hf://...``) under
``--train-schema``; for EBPO-topic / EBPO-diff use the records written by ``ebpo annotate topic`` /
``ebpo annotate difficulty`` (schema ``records``), which carry ``topic`` / ``difficulty``. ``--val`` names
evaluation sets (``ebpo.data.loaders.BENCHMARKS``), loaded as ``ebpo eval`` loads them: their Hugging Face hub
copies, or our JSON Lines files in ``$EBPO_DATA_DIR``. Rows get ``data_source`` ``math_dapo`` by default, so
verl's built-in ``default_compute_score`` scores them with the DAPO math verifier.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--train", required=True, help="training records: a JSONL / Parquet file or hf://owner/name"
    )
    parser.add_argument(
        "--train-schema", default="records", help="loader schema of --train (default: records)"
    )
    parser.add_argument(
        "--val", nargs="*", default=["math500"], help="evaluation sets for validation (default: math500)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder for train.parquet / val.parquet"
    )
    parser.add_argument(
        "--data-source", default="math_dapo", help="data_source written on every row (selects verl's scorer)"
    )
    parser.add_argument(
        "--max-train", type=int, default=-1, help="keep only the first N training records (-1: all)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from ebpo.data.loaders import load_records
    from ebpo.eval.benchmarks import load_benchmark
    from ebpo.integrations.verl import write_verl_parquet

    args = build_parser().parse_args(argv)
    train = load_records(args.train, args.train_schema)
    if args.max_train > 0:
        train = train[: args.max_train]
    val = [record for name in args.val for record in load_benchmark(name)]
    write_verl_parquet(train, args.out / "train.parquet", data_source=args.data_source)
    write_verl_parquet(val, args.out / "val.parquet", data_source=args.data_source)
    with_topic = sum(r.topic is not None for r in train)
    with_difficulty = sum(r.difficulty is not None for r in train)
    print(
        f"wrote {len(train)} train rows ({with_topic} with topic, {with_difficulty} with difficulty) and "
        f"{len(val)} val rows to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
