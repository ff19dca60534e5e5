"""Tests of ``ebpo.annotate``, one module per module of the package."""
