"""The import graph of ``src/ebpo`` (``tools/import_graph.py``): no circle between modules, and every arrow
between two parts goes down a layer (welford -> advantages / losses -> ... -> trainer -> integrations ->
command lines)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "import_graph.py"
_spec = importlib.util.spec_from_file_location("import_graph", TOOL)
assert _spec is not None and _spec.loader is not None
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)


def test_no_circle_between_modules():
    assert import_graph.circles(import_graph.module_graph()) == []


def test_every_arrow_between_parts_goes_down_a_layer():
    assert import_graph.layer_problems(import_graph.module_graph()) == []


def test_every_part_of_the_package_has_a_layer():
    parts = {import_graph.part_of(module) for module in import_graph.module_graph()}
    layered = {part for layer in import_graph.LAYERS for part in layer}
    assert parts == layered  # no part without a layer, no layer entry for a part that is gone


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "ebpo" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_sees_late_relative_and_type_checking_imports(tmp_path):
    """A small tree with one of each problem: the circle a.py <-> b.py inside ``trainer`` (b imports a only
    for type checking), ``welford`` importing ``trainer`` inside a function (a higher layer), ``advantages``
    importing ``losses`` (the same layer), a part in no layer; a command line may import anything."""
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "welford.py": "def f():\n    from ebpo.trainer import a\n",
            "advantages.py": "import ebpo.losses\n",
            "losses.py": "",
            "extra.py": "",
            "trainer/__init__.py": "",
            "trainer/a.py": "from . import b\n",
            "trainer/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ebpo.trainer.a import X\n",
            "trainer/cli.py": "from ebpo import welford\nfrom ebpo.trainer import a\n",
        },
    )
    graph = import_graph.module_graph(src)
    assert graph["ebpo.trainer.cli"] == {"ebpo.welford", "ebpo.trainer.a"}  # submodules, not the package
    assert import_graph.circles(graph) == [["ebpo.trainer.a", "ebpo.trainer.b"]]
    layers = (("welford",), ("advantages", "losses"), ("ebpo",), ("trainer",), ("cli",))
    assert import_graph.layer_problems(graph, layers) == [
        "extra is in no layer: add it to LAYERS in tools/import_graph.py",
        "advantages imports losses, the same layer (ebpo.advantages -> ebpo.losses)",
        "welford imports trainer, a higher layer (ebpo.welford -> ebpo.trainer.a)",
    ]


def test_the_script_prints_each_problem_and_exits_1(tmp_path, capsys):
    src = _tree(tmp_path, {"__init__.py": "", "welford.py": "import ebpo.registry\n", "registry.py": ""})
    assert import_graph.main([], src) == 1
    assert (
        capsys.readouterr().out
        == "welford imports registry, the same layer (ebpo.welford -> ebpo.registry)\n"
    )
    (src / "ebpo" / "welford.py").write_text("")
    assert import_graph.main(["--edges"], src) == 0
    assert capsys.readouterr().out == "3 modules: no circle, every arrow goes down a layer\n"
