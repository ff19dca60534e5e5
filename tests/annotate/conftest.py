"""Fixtures of the annotators' tests: a scripted OpenAI-style judge server (``helpers.topic``)."""

from __future__ import annotations

import pytest

from helpers.topic import fake_judge_server, raw_judges


@pytest.fixture
def judge_server():
    yield from fake_judge_server()


@pytest.fixture
def raw_judge():
    yield from raw_judges()
