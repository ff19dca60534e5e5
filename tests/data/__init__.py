"""Tests of ``ebpo.data``, one module per module of the package."""
