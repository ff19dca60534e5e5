"""Tests for ebpo.tables: the one markdown-table writer, by hand."""

from __future__ import annotations

import pytest

from ebpo.tables import markdown_table


def test_markdown_table_by_hand():
    assert markdown_table(["a", "b"], [["1", "2"], ["x", ""]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n| x |  |"
    assert markdown_table(["only"], []) == "| only |\n|---|"


def test_markdown_table_aligns_each_column_as_asked():
    table = markdown_table(
        ["name", "l", "r", "c"], [["m", "1", "2", "3"]], align=["", "left", "right", "center"]
    )
    assert table.splitlines()[1] == "|---|:---|---:|:---:|"
    with pytest.raises(KeyError):
        markdown_table(["a"], [], align=["middle"])  # type: ignore[list-item]
