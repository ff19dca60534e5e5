"""Tests of ``ebpo.rewards``, one module per module of the package."""
