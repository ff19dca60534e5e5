"""Helpers shared by several test modules (``from helpers.trainer import tiny_config``); test modules never
import each other. ``tests/`` is on ``sys.path`` because ``tests/conftest.py`` sits there."""
