"""Tests of ``ebpo.eval``, one module per module of the package."""
