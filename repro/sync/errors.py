"""The weight sync's errors, typed by what they name, so a receiver routes them without reading their text."""

from __future__ import annotations

from repro.errors import ReproError


class SyncError(ReproError):
    """A weight-sync bucket is missing, out of order, from another version or sender, or corrupt, or its
    transport failed."""


class BucketError(SyncError):
    """A sync failure whose message already names the version and the bucket it happened in: a receiver's gate
    records it as it is (``repro.sync.apply.apply_stream`` labels every other failure with the bucket)."""
