"""``python -m benchmarks.learning`` (or ``python benchmarks/learning``) from the repository root."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a directory: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.learning.cli import main  # noqa: E402

sys.exit(main())
