"""The base of every recipe section (unknown keys and loose types are errors), and the types of the fields that name a
row of a backend table."""

from __future__ import annotations

from typing import Annotated, Any, Callable, TypeAlias

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema

from repro.recipes.backends import ENGINES, ROLLOUTS, TRAINERS


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


def _row_of(table: dict[str, Any], table_name: str) -> Callable[[str], str]:
    """The check of a field that names a row of ``table``: the table is the one list of the names, so adding a
    backend or an engine is its row, with no second list in the schema."""

    def check(name: str) -> str:
        if name not in table:
            raise ValueError(f"Input should be {' or '.join(repr(row) for row in table)} "
                             f"(the rows of repro.recipes.backends.{table_name}), got {name!r}")
        return name

    return check


def _enum(table: dict[str, Any]) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "enum": list(table)})


EngineName: TypeAlias = Annotated[str, AfterValidator(_row_of(ENGINES, "ENGINES")), _enum(ENGINES)]
TrainerName: TypeAlias = Annotated[str, AfterValidator(_row_of(TRAINERS, "TRAINERS")), _enum(TRAINERS)]
RolloutName: TypeAlias = Annotated[str, AfterValidator(_row_of(ROLLOUTS, "ROLLOUTS")), _enum(ROLLOUTS)]
