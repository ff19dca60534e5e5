"""The ``ebpo`` command line's top level: a closed standard output ends a command with one line, not a traceback."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from ebpo import cli


def _run_with_stdout_reader_gone(args: list[str]) -> subprocess.CompletedProcess:
    # the pipe's read end is closed before the child starts: its first write to stdout fails with EPIPE
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "ebpo.cli", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


def test_a_closed_stdout_stops_the_command_with_one_line():
    proc = _run_with_stdout_reader_gone(["train", "--help-config"])
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ebpo: standard output was closed (its reader exited); stopped"
    ]


@pytest.mark.parametrize("reader_open", [True, False])
def test_stdout_closed_tells_a_gone_reader_from_an_open_one(reader_open):
    read_end, write_end = os.pipe()
    if not reader_open:
        os.close(read_end)
    code = "import sys; from ebpo.cli import _stdout_closed; sys.stderr.write(str(_stdout_closed()))"
    proc = subprocess.run(
        [sys.executable, "-c", code], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
    )
    os.close(write_end)
    if reader_open:
        os.close(read_end)
    assert proc.stderr == str(not reader_open)


def test_a_broken_pipe_elsewhere_is_not_taken_for_a_closed_stdout(monkeypatch):
    # stdout is fine (pytest's capture): a BrokenPipeError from another pipe is a fault and propagates
    def fails(args):
        raise BrokenPipeError("a worker's pipe")

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(command="fake", func=fails)

    monkeypatch.setattr(cli, "build_parser", Parser)
    with pytest.raises(BrokenPipeError, match="a worker's pipe"):
        cli.main(["fake"])
