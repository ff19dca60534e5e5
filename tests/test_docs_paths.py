"""Committed pages name no folder of the machine that made them: every command they print runs in any checkout.

A page (``docs/**/*.md``, ``README.md``, ``CHANGELOG.md``, and the CSV, JSON and scripts under ``docs/`` that
carry commands) may name paths relative to the repository, placeholders for the reader's own folders
(``<runs-dir>``) and the defaults the project documents (:data:`ALLOWED`); a home or root folder, a work tree,
a cache or a temporary folder of one machine fails, naming the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

MACHINE_PATH = re.compile(
    r"(?<![\w.$/-])"  # the start of a path, not a folder inside another path or URL (src/tmp/, host.com/home/)
    r"(?:"
    r"/(?:root|tmp|work|workspace|scratch)(?![\w.-])"  # root's home, temporary folders, work trees
    r"|/(?:home|Users)/[\w.-]+"  # a user's home (Linux, macOS)
    r"|/var/(?:tmp|folders)(?![\w.-])|/private/var(?![\w.-])"  # temporary folders (Linux, macOS)
    r"|~[\w.-]*/"  # a home folder written with ~ (~/..., ~user/...)
    r"|\$HOME\b|\$\{HOME\}"
    r")[^\s,;\"'`()<>|\]]*"
)
"""An absolute path of one machine: the match runs to the end of the path (a space, or a character that ends a
path in a table, a CSV row or a command: , ; quotes ( ) < > | ])."""

ALLOWED = (
    "/tmp/ebpo-gpu-site",  # `make gpu-check` installs the GPU wheels there (Makefile, docs/benchmarks.md)
    "~/.cache/ebpo",  # $EBPO_CACHE's default: base-model builds and the evaluation cache (docs/base_model.md)
    "~/.cache/huggingface",  # where `datasets` caches a hub dataset by default (docs/evaluation.md)
)
"""Folders the project itself documents as defaults: the same on every machine that uses them."""


def committed_pages(repo: Path = REPO) -> list[Path]:
    """The pages the test reads: every markdown file under ``docs/``, README.md, CHANGELOG.md, and the
    generated CSV and JSON files and scripts under ``docs/`` (results pages keep their commands there too)."""
    docs = repo / "docs"
    pages = [repo / "README.md", repo / "CHANGELOG.md"]
    pages += sorted(p for suffix in ("md", "csv", "json", "py") for p in docs.rglob(f"*.{suffix}"))
    return [p for p in pages if p.is_file()]


def machine_paths(path: Path, root: Path = REPO) -> list[str]:
    """``file:line: path`` for every path of one machine in ``path`` that :data:`ALLOWED` does not cover."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for match in MACHINE_PATH.finditer(line):
            text = match.group().rstrip(".:")
            if not any(text == allowed or text.startswith(allowed + "/") for allowed in ALLOWED):
                found.append(f"{path.relative_to(root)}:{number}: {text}")
    return found


def test_no_committed_page_names_a_folder_of_the_machine_that_made_it():
    pages = committed_pages()
    assert len(pages) > 50  # the results pages are read, not an empty glob
    found = [hit for page in pages for hit in machine_paths(page)]
    shown = found[:40] + ([f"... and {len(found) - 40} more"] if len(found) > 40 else [])
    assert not found, (
        "paths of one machine in committed pages (write them relative to the repository, or as a placeholder "
        "such as <runs-dir>; a default the project documents goes in ALLOWED with its reason):\n"
        + "\n".join(shown)
    )


@pytest.mark.parametrize(
    "line, hit",
    [
        ("Runs produced by: `python -m benchmarks.learning --runs-dir /work/wt/s36/runs/x --tag t`", "/work/wt/s36/runs/x"),
        ("--model-path /root/.cache/ebpo/base_models/arith-27a158bfe1ad`", "/root/.cache/ebpo/base_models/arith-27a158bfe1ad"),
        ("| 2 | 0.1 |\nwrote /work/wt/s32-diagnose/docs/results/diagnose/diagnose_grid.png", "/work/wt/s32-diagnose/docs/results/diagnose/diagnose_grid.png"),
        ("python -m benchmarks.learning --results-dir /tmp/pytest-7/results", "/tmp/pytest-7/results"),
        ("see /home/alice/ebpo/runs/x.", "/home/alice/ebpo/runs/x"),
        ("cache at ~/.cache/torch/hub", "~/.cache/torch/hub"),
        ("cd ~/ebpo && make", "~/ebpo"),
        ("`$HOME/runs`", "$HOME/runs"),
        ("/Users/bob/Library/x", "/Users/bob/Library/x"),
    ],
)  # fmt: skip
def test_the_scanner_names_the_file_and_line_of_a_machine_path(tmp_path, line, hit):
    page = tmp_path / "docs" / "results" / "page.md"
    page.parent.mkdir(parents=True)
    page.write_text("# A page\n\nclean text, `runs/bench_learning/x` and `<runs-dir>`\n" + line + "\n")
    assert page in committed_pages(tmp_path)
    number = 4 + line.count("\n")
    assert machine_paths(page, tmp_path) == [f"docs/results/page.md:{number}: {hit}"]


def test_the_scanner_passes_relative_paths_placeholders_urls_and_the_documented_defaults(tmp_path):
    page = tmp_path / "README.md"
    page.write_text(
        "python -m benchmarks.learning --runs-dir runs/bench_learning/defaults --results-dir <results-dir>\n"
        "make gpu-check installs into /tmp/ebpo-gpu-site, then PYTHONPATH=src:/tmp/ebpo-gpu-site python3 x\n"
        "--model-path ~/.cache/ebpo/base_models/arith-30e4105233de (`~/.cache/huggingface/datasets`)\n"
        "https://example.com/home/user/tmp/x and src/ebpo/work/tmp/ and docs/results/superseded/root/\n"
        "cannot write /mnt/small/run/checkpoints/last; /proc/sys/kernel/sched_autogroup_enabled\n"
    )
    assert machine_paths(page, tmp_path) == []
    # the allow-list is exact: a neighbour of an allowed folder is not allowed
    page.write_text("/tmp/ebpo-gpu-site-old and ~/.cache/ebpo-other/x\n")
    assert machine_paths(page, tmp_path) == [
        "README.md:1: /tmp/ebpo-gpu-site-old",
        "README.md:1: ~/.cache/ebpo-other/x",
    ]
