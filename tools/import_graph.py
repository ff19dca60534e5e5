"""The import graph of ``src/ebpo``: circles between modules, and arrows from a lower layer to a higher one.

    python tools/import_graph.py           # the problems, one a line; exit 1 when there is one
    python tools/import_graph.py --edges   # also every arrow between two parts, with the modules behind it

Every ``import`` statement counts wherever it stands (module top, inside a function, under
``TYPE_CHECKING``): an import made late is still a dependency. Names imported by string
(``importlib.import_module``) are not seen.

A part is a top-level package or module of ``ebpo`` (``ebpo.trainer``, ``ebpo.welford``; ``ebpo`` itself is
the package's ``__init__``). :data:`LAYERS` orders the parts from the bottom up: a part may import only parts
of lower layers. The command lines (``ebpo/cli.py`` and every ``ebpo/<part>/cli.py``) form the top layer,
above every package, whichever package holds them: a command line assembles the library, and nothing in the
library imports it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "console"),  # ConfigError, first_line; the console a command sets up, --debug: no ebpo imports
    (
        "registry",
        "welford",
        "persist",
        "tables",
        "stats",
    ),  # persist: atomic writes, journals, manifests, locks
    (
        "run_directory",
    ),  # one training run's folder, built on persist: the trackers, models and trainer read it
    ("plugins",),  # a user's code, imported before any name is looked up
    ("settings",),  # settings from YAML, overrides and flags; every command's start (plugins first)
    ("advantages", "losses"),  # the algorithm's math: estimators and policy losses
    ("ebpo",),  # the package's public entry points (get_estimator, get_policy_loss)
    ("testing",),  # check_estimator: the estimators' contract, for an author's own
    ("data",),  # records, loaders, samplers
    ("tasks",),  # generated tasks (arith)
    ("rewards",),  # verifiable rewards
    ("generation",),  # sampling from a model
    ("logprobs",),  # token log-probs of sampled responses: the reference and its fast paths
    ("eval",),  # metrics and the evaluation harness
    ("models",),  # the base models: recipes, SFT, build, names, their grid (measured with eval's metrics)
    ("annotate",),  # dataset annotation
    ("simulate",),  # ebpo simulate: the estimators' Monte Carlo study and the staleness study of the prior
    ("trackers",),  # metrics.jsonl and the experiment trackers, for the trainer and ebpo diagnose
    ("trainer",),  # the reference trainer
    (
        "diagnostics",
    ),  # ebpo diagnose: the estimators' gradients on a model, through the trainer's log-prob pass
    ("integrations",),  # verl and TRL adapters
    ("cli",),  # every command line
)
"""The parts of ``ebpo`` from the bottom up; parts in one layer must not import each other."""


def module_name(path: Path, src: Path = SRC) -> str:
    """``src/ebpo/eval/metrics.py`` -> ``ebpo.eval.metrics``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """The part a module belongs to (see the module docstring)."""
    names = module.split(".")
    if names[-1] == "cli":
        return "cli"
    return names[1] if len(names) > 1 else names[0]


def imports(path: Path, module: str, modules: Iterable[str]) -> set[str]:
    """The ``ebpo`` modules that the file at ``path`` (module ``module``) imports, each named by the longest
    known module its import statement names (``from ebpo.models import sft`` -> ``ebpo.models.sft``)."""
    known = set(modules)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from package import submodule`` imports the submodule; any other name comes from ``base``
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def module_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the ebpo modules it imports, for every ``.py`` file under ``src/ebpo``."""
    files = {module_name(path, src): path for path in sorted((src / "ebpo").rglob("*.py"))}
    return {module: imports(path, module, files) for module, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def part_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(importing part, imported part) -> the (module, module) arrows behind it, between distinct parts."""
    edges: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for module, targets in graph.items():
        for target in sorted(targets):
            if part_of(module) != part_of(target):
                edges[(part_of(module), part_of(target))].append((module, target))
    return dict(sorted(edges.items()))


def layer_problems(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """One line per part missing from ``layers`` and per arrow that does not go down a layer."""
    rank = {part: i for i, layer in enumerate(layers) for part in layer}
    problems = [
        f"{part} is in no layer: add it to LAYERS in tools/import_graph.py"
        for part in sorted({part_of(module) for module in graph} - set(rank))
    ]
    for (source, target), arrows in part_edges(graph).items():
        if source in rank and target in rank and rank[target] >= rank[source]:
            where = "the same layer" if rank[target] == rank[source] else "a higher layer"
            modules = ", ".join(f"{a} -> {b}" for a, b in arrows)
            problems.append(f"{source} imports {target}, {where} ({modules})")
    return problems


def main(argv: list[str] | None = None, src: Path = SRC) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--edges", action="store_true", help="also print every arrow between two parts")
    args = parser.parse_args(argv)
    graph = module_graph(src)
    if args.edges:
        for (source, target), arrows in part_edges(graph).items():
            print(f"{source} -> {target}: " + ", ".join(f"{a} -> {b}" for a, b in arrows))
    problems = [f"circle: {' <-> '.join(c)}" for c in circles(graph)] + layer_problems(graph)
    for line in problems:
        print(line)
    if not problems:
        print(f"{len(graph)} modules: no circle, every arrow goes down a layer")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
