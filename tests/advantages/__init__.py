"""Tests of ``ebpo.advantages``, one module per module of the package."""
