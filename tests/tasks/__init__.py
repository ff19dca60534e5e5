"""Tests of ``ebpo.tasks``, one module per module of the package."""
