"""A command of ``ebpo`` (``ebpo.settings.command``): its parser is built only when it runs, so
``ebpo --help`` imports no transformers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_ebpo_help_imports_no_transformers():
    """The generated parsers import transformers (HfArgumentParser): they are built only when their command
    runs, so listing the commands stays fast."""
    code = "import sys; from ebpo.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
    code += "print('transformers' in sys.modules)"
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": src}
    )
    assert "simulate" in out.stdout and out.stdout.strip().endswith("False")
