"""``ebpo.console``: the library logs under the ``ebpo`` logger, a command's console shows its messages as the
text alone on the stream they belong to, and ``--debug`` / ``EBPO_DEBUG=1`` adds the traceback behind a
one-line error. (Every test starts with the console set up: tests/conftest.py.)"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap

import pytest

from ebpo import console
from ebpo.cli import main
from ebpo.trackers.runs import TrackerRuns
from ebpo.trainer.interrupt import stop_at_step_boundary
from helpers.base_model import TINY_COMMAND

STOP_LINE = "Ctrl-C (SIGINT): stopping after this step, with a checkpoint (Ctrl-C again to stop now)"


class Tracker:
    """A tracker that only says where its run is."""

    name = "fake"

    def describe(self) -> str:
        return "fake: run at https://tracker.example/run/7"


class Collect(logging.Handler):
    """A user's own handler: keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def first_signal_warning() -> None:
    """The trainer's real warning on the first Ctrl-C of a run (its stop waits for the step to end)."""
    with stop_at_step_boundary() as request:
        signal.raise_signal(signal.SIGINT)
    assert request.signum == signal.SIGINT


BASE_MODEL = TINY_COMMAND


@pytest.fixture
def embedded():
    """ebpo inside a user's program: no console set up, Python's own logging defaults."""
    console.teardown()
    yield
    console.teardown()


def test_a_library_warning_reaches_a_users_handler_and_their_level_silences_it(embedded, capsys):
    handler = Collect()
    logging.getLogger().addHandler(handler)
    try:
        first_signal_warning()
        TrackerRuns().add(Tracker(), "note:")  # information: hidden at Python's default level
        warnings = [r for r in handler.records if r.name.startswith("ebpo.")]
        assert [(r.name, r.levelno, r.getMessage()) for r in warnings] == [
            ("ebpo.trainer.interrupt", logging.WARNING, "\n" + STOP_LINE)
        ]
        assert capsys.readouterr() == ("", "")  # the library printed nothing itself

        logging.getLogger("ebpo").setLevel(logging.ERROR)
        first_signal_warning()
        assert [r for r in handler.records if r.name.startswith("ebpo.")] == warnings
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger("ebpo").setLevel(logging.NOTSET)


def test_without_any_handler_python_shows_the_warning_alone_on_stderr_and_hides_information(tmp_path):
    # a fresh interpreter, as a user's script: logging.lastResort, nothing configured
    script = textwrap.dedent(
        """
        import signal
        from ebpo.trackers.runs import TrackerRuns
        from ebpo.trainer.interrupt import stop_at_step_boundary

        class Tracker:
            name = "fake"
            def describe(self):
                return "fake: run at https://tracker.example/run/7"

        TrackerRuns().add(Tracker())
        with stop_at_step_boundary():
            signal.raise_signal(signal.SIGINT)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", f"\n{STOP_LINE}\n")


def test_the_console_shows_each_message_as_its_text_alone_on_its_stream(capsys):
    console.setup()  # a second time (the suite set it up): still one line each
    TrackerRuns().add(Tracker(), "note:")
    first_signal_warning()
    out, err = capsys.readouterr()
    assert out == "note: fake: run at https://tracker.example/run/7\n"
    assert err == f"\n{STOP_LINE}\n"


def test_ebpo_base_model_prints_its_build_lines_on_stdout_as_before(tmp_path, capsys):
    argv = [*BASE_MODEL, "--cache-dir", str(tmp_path)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    path = lines[-1]
    assert lines[0].startswith("building the ") and lines[0].endswith(
        f", 3 SFT steps, one thread) into {path}"
    )
    assert any(line.startswith("built in ") and line.endswith(f": {path}") for line in lines)
    assert "building the" not in err and "built in" not in err

    assert main(argv) == 0  # built now: one line says so, on stdout, then the path
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"reusing the base model built in {path} (--force rebuilds)" and lines[-1] == path
    assert "reusing" not in err


def test_the_console_of_repeated_setups_shows_one_line(capsys):
    for _ in range(3):
        console.setup()
    TrackerRuns().add(Tracker())
    assert capsys.readouterr().out.splitlines() == ["fake: run at https://tracker.example/run/7"]
    handlers = [h for h in logging.getLogger("ebpo").handlers if type(h).__module__ == "ebpo.console"]
    assert len(handlers) == 2 and logging.getLogger("ebpo").propagate is False


TRAIN_ERROR = [
    "train",
    "algorithm.estimator=nope",  # a set-up ValueError (ConfigError) raised from a ValueError
]


def test_a_set_up_error_is_one_line_by_default(monkeypatch, capsys):
    monkeypatch.delenv(console.DEBUG_ENV, raising=False)
    assert main(TRAIN_ERROR) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "ebpo train: error: algorithm.estimator: unknown advantage estimator 'nope'; valid choices: "
        + err.split("valid choices: ", 1)[1].rstrip("\n")
    ]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, env",
    [
        (["--debug", *TRAIN_ERROR], None),
        ([TRAIN_ERROR[0], "--debug", *TRAIN_ERROR[1:]], None),  # after the command's name
        (TRAIN_ERROR, "1"),
    ],
    ids=["--debug", "train --debug", "EBPO_DEBUG=1"],
)
def test_debug_shows_the_traceback_before_the_same_line_and_exit_code(argv, env, monkeypatch, capsys):
    monkeypatch.delenv(console.DEBUG_ENV, raising=False)
    assert main(TRAIN_ERROR) == 2
    one_line = capsys.readouterr().err
    if env is not None:
        monkeypatch.setenv(console.DEBUG_ENV, env)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("Traceback (most recent call last):\n")
    assert err.endswith(one_line)  # the one line, unchanged, last
    trace = err[: -len(one_line)]
    # the whole chain: the check's own ValueError (hidden by `raise ... from None`) and the ConfigError
    assert "ValueError: unknown advantage estimator 'nope'" in trace
    assert "ebpo.errors.ConfigError: algorithm.estimator: unknown advantage estimator 'nope'" in trace
    assert 'trainer/setup.py", line' in trace


def test_debug_lasts_one_command_in_process(monkeypatch, capsys):
    monkeypatch.delenv(console.DEBUG_ENV, raising=False)
    assert main(["--debug", *TRAIN_ERROR]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert main(TRAIN_ERROR) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_debug_env_values(monkeypatch):
    console.set_debug(False)
    for value, on in (("", False), ("0", False), ("1", True), ("yes", True)):
        monkeypatch.setenv(console.DEBUG_ENV, value)
        assert console.debug_on() is on
    monkeypatch.delenv(console.DEBUG_ENV)
    assert console.debug_on() is False
    console.set_debug(True)
    assert console.debug_on() is True


def test_a_plugin_that_fails_shows_its_own_traceback_with_debug(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(console.DEBUG_ENV, raising=False)
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("x = 1\nundefined_name\n")
    assert main(["train", "--plugins", str(bad)]) == 2
    one_line = capsys.readouterr().err
    assert one_line.count("\n") == 1 and "NameError" in one_line
    assert main(["train", "--debug", "--plugins", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.endswith(one_line) and err.startswith("Traceback (most recent call last):\n")
    assert f'File "{bad}", line 2' in err  # the plugin's own line, behind PluginError's `from None`
