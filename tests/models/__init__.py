"""Tests of ``ebpo.models``, one module per module of the package."""
