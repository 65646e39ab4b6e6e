"""The base of every recipe section: unknown keys and loose types are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)
