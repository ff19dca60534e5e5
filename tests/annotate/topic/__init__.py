"""Tests of ``ebpo.annotate.topic``, one module per module of the package."""
