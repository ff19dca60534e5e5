"""Tests of ``ebpo.trackers``, one module per module of the package."""
