"""The ``ebpo`` command line's top level: a closed standard output ends a command with one line, not a traceback."""

from __future__ import annotations

import argparse
import builtins
import importlib
import os
import signal
import subprocess
import sys
import time

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


def test_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    # the interrupt lands inside the command's first heavy import (torch), before it could catch anything
    def interrupted_import(args):
        raise KeyboardInterrupt

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(command="train", func=interrupted_import)

    monkeypatch.setattr(cli, "build_parser", Parser)
    assert cli.main(["train"]) == 130
    assert capsys.readouterr().err.splitlines() == ["ebpo train: interrupted (Ctrl-C)"]


@pytest.mark.parametrize("after_s", [0.2, 0.8])
def test_ctrl_c_in_the_first_second_of_ebpo_train_is_one_line(tmp_path, after_s):
    # the console script's own code (pyproject's [project.scripts]); SIGINT as a terminal sends it, while
    # the command imports torch and transformers
    code = "from ebpo.cli import run; run()"
    child = subprocess.Popen(
        [sys.executable, "-c", code, "train", "--run-dir", str(tmp_path / "run"), "run.steps=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job ignores it
    )
    time.sleep(after_s)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("ebpo train: interrupted"), err


def test_the_printed_command_is_the_form_that_runs_from_this_shell(tmp_path, monkeypatch):
    from ebpo.settings import command_prefix

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "ebpo").write_text("#!/bin/sh\n")
    (bin_dir / "ebpo").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(bin_dir))  # activated: the PATH finds this environment's ebpo
    assert command_prefix() == "ebpo"
    monkeypatch.setenv("PATH", "/nowhere")  # not activated: its path, relative to where the user stands
    assert command_prefix() == "venv/bin/ebpo"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # outside it: the whole path
    assert command_prefix() == str(bin_dir / "ebpo")
    (bin_dir / "ebpo").unlink()  # no console script (run from a source tree): the module form
    assert command_prefix() == f"{bin_dir / 'python'} -m ebpo.cli"


def test_a_ctrl_c_inside_an_import_is_sent_again_and_raises_outside_one(tmp_path, monkeypatch):
    # torch's C++ calls back into Python while it is imported, where a KeyboardInterrupt aborts the process
    sent = []

    class Timer:
        def __init__(self, delay, function, args):
            sent.append((delay, function, args))

        def start(self):
            pass

    monkeypatch.setattr(cli.threading, "Timer", Timer)
    handler = cli.InterruptOutsideImports()
    (tmp_path / "module_being_imported.py").write_text(
        "import sys\nHANDLER(2, sys._getframe())  # SIGINT, in this module's top-level code\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(builtins, "HANDLER", handler, raising=False)
    importlib.import_module("module_being_imported")  # no KeyboardInterrupt inside the import
    assert sent == [(cli.RESEND_S, os.kill, (os.getpid(), 2))]
    with pytest.raises(KeyboardInterrupt):  # outside an import: raised at once, and the count starts again
        handler(signal.SIGINT, sys._getframe())
    assert len(sent) == 1 and handler.resent == 0
    handler.resent = cli.RESEND_AT_MOST  # an import that outlasts every resend: raised there after all
    sys.modules.pop("module_being_imported")
    with pytest.raises(KeyboardInterrupt):
        importlib.import_module("module_being_imported")


@pytest.fixture
def pythons_sigint():
    """Python's own SIGINT handler for the test, as in a terminal (a suite run as a background job ignores it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_main_puts_pythons_handler_back_and_leaves_an_ignored_sigint_alone(monkeypatch, pythons_sigint):
    seen = []

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(
                command="fake", func=lambda args: seen.append(signal.getsignal(signal.SIGINT))
            )

    monkeypatch.setattr(cli, "build_parser", Parser)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert cli.main(["fake"]) == 0
    assert isinstance(seen[-1], cli.InterruptOutsideImports)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's
    try:
        assert cli.main(["fake"]) == 0
        assert seen[-1] == signal.SIG_IGN and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_main_drops_a_ctrl_c_it_would_send_again_once_it_returns(monkeypatch, pythons_sigint):
    timers = []

    class Timer:
        def __init__(self, delay, function, args):
            self.cancelled = False
            timers.append(self)

        def start(self):
            pass

        def cancel(self):
            self.cancelled = True

    def command(args):  # a Ctrl-C inside an import, just before the command returns
        signal.getsignal(signal.SIGINT)(signal.SIGINT, sys._getframe())
        return 0

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(command="fake", func=command)

    monkeypatch.setattr(cli.threading, "Timer", Timer)
    monkeypatch.setattr(cli, "_importing", lambda frame: True)
    monkeypatch.setattr(cli, "build_parser", Parser)
    assert cli.main(["fake"]) == 0
    assert len(timers) == 1 and timers[0].cancelled


def test_a_ctrl_c_in_an_exit_handler_ends_the_console_script_with_its_code_and_no_traceback():
    # an exit handler that runs long (torch's and the trackers' run after the command returned)
    code = (
        "import atexit, sys, time\n"
        "from ebpo import cli\n"
        "def exiting():\n"
        "    print('exiting', flush=True)\n"
        "    time.sleep(60)\n"
        "def main(argv=None):\n"
        "    atexit.register(exiting)\n"
        "    print('done', flush=True)\n"
        "    return 3\n"
        "cli.main = main\n"
        "cli.run()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background job ignores it
    )
    assert child.stdout is not None
    assert [child.stdout.readline(), child.stdout.readline()] == ["done\n", "exiting\n"]
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 3, err
    assert out == "" and err == ""
