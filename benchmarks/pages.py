"""Paths as a committed page prints them: true in any checkout and on any machine.

A results page keeps the commands that produced it; a command records the paths its user typed, absolute ones
included, which hold on one machine only. :func:`portable_path` and :func:`portable_command` write them so that
any checkout can run them: relative to the repository, or as a placeholder for the reader's own folder.
``tests/test_docs_paths.py`` checks the committed pages. Imported by the learning benchmark's report and by the
scripts that write pages (``gpu_check.py``, ``throughput.py``, ``docs/results/defaults/claims.py``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def portable_path(path: str, option: str = "") -> str:
    """A path as a page prints it, true in any checkout and on any machine: relative to the repository when it
    lies inside it; a model shipped in the package (``src/ebpo/models/<name>``) of another checkout under that
    name; a folder of the base-model cache (``$EBPO_CACHE``) under the cache's documented default,
    ``~/.cache/ebpo`` (``ebpo base-model`` builds a recipe there, its key in the folder's name); any other
    absolute path (or one from ``~``) as the placeholder ``<option>`` (``<runs-dir>``; ``<path>`` without an
    option), the reader's own folder. A relative path or a name (a hub id) is kept as given."""
    if not path.startswith(("/", "~")):
        return path
    from ebpo.models.build import cache_root

    p = Path(path).expanduser()
    for root, shown in ((REPO, ""), (cache_root(), "~/.cache/ebpo/")):
        try:
            return shown + p.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    if p.parts[-4:-1] == ("src", "ebpo", "models"):
        return "/".join(p.parts[-4:])
    return f"<{option.lstrip('-') or 'path'}>"


def portable_command(command: str) -> str:
    """``command`` with every absolute path of its words written by :func:`portable_path`: an option's value
    (``--runs-dir /x`` or ``--runs-dir=/x``) becomes ``<runs-dir>`` unless it lies in the repository or the
    base-model cache, a ``key=/x`` setting ``<key>``, any other word ``<path>``."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: not a command line a benchmark recorded; left as it is
        return command
    out = []
    for i, word in enumerate(words):
        option = words[i - 1] if i and words[i - 1].startswith("--") and "=" not in words[i - 1] else ""
        key, equals, value = word.partition("=")
        if equals and value.startswith(("/", "~")):
            shown = f"{key}={portable_path(value, key.lstrip('-'))}"
        else:
            shown = portable_path(word, option)
        out.append(_quote(shown) if shown == word or "<" not in shown else shown)  # a placeholder unquoted
    return " ".join(out)


def _quote(word: str) -> str:
    """``shlex.quote``, but a leading ``~/`` stays outside the quotes, where a shell expands it."""
    return "~/" + shlex.quote(word[2:]) if word.startswith("~/") else shlex.quote(word)
