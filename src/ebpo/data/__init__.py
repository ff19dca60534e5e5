"""Data: the record type, loaders, samplers and dynamic sampling."""

from ebpo.data.records import Record

__all__ = ["Record"]
