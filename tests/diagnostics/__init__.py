"""Tests of ``ebpo.diagnostics``, one module per module of the package."""
