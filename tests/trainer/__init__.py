"""Tests of ``ebpo.trainer``, one module per module of the package."""
