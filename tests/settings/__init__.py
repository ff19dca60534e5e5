"""Tests of ``ebpo.settings``, one module per module of the package."""
