"""Tests of ``ebpo.models.recipes``, one module per module of the package."""
