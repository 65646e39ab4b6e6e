"""docs/fidelity.md held against the recipes: each row that names a recipe field states the value the committed
recipes resolve to, a row whose AMD value is a literal is `same` exactly when the AMD recipe equals it, and every
field of the schema is either a row or listed as not a setting of the run. A changed recipe value fails here until
the table says so."""

from __future__ import annotations

import re

import pytest
import yaml
from pydantic import BaseModel

from repro import REPO_DIR
from repro.recipes import load_recipe

DOC = REPO_DIR / "docs" / "fidelity.md"
LITERAL = re.compile(r"^`([^`]*)`$")
FIELD = re.compile(r"^`([a-z_][a-z0-9_.]*)`$")
STATUSES = {"same", "departs", "tiny", "n/a"}


def leaf_fields(model: BaseModel, prefix: str = "") -> dict[str, object]:
    out = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out.update(leaf_fields(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


def setting_rows() -> list[dict[str, str]]:
    """The rows of every table whose header starts with `| setting |` (8 columns)."""
    rows, in_table = [], False
    for line in DOC.read_text().splitlines():
        if line.startswith("| setting |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if in_table and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == 8, f"docs/fidelity.md: a row needs 8 cells: {line}"
            rows.append(dict(zip(("setting", "amd", "where", "field", "recipe", "tiny", "status", "note"), cells)))
    return rows


def not_settings() -> list[str]:
    text = DOC.read_text()
    section = text.split("## Fields that are not settings of the run", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"`([a-z_][a-z0-9_.]*)`", section)


def literal(cell: str):
    match = LITERAL.match(cell)
    return (True, yaml.safe_load(match.group(1))) if match else (False, None)


@pytest.fixture(scope="module")
def recipes():
    return leaf_fields(load_recipe("amd-dsv4-flash-mi308x")), leaf_fields(load_recipe("tiny-cpu"))


def disagreements(amd: dict, tiny: dict) -> tuple[list[str], int]:
    """Where the table and the recipes' values disagree, and how many rows named a field."""
    problems, checked = [], 0
    for row in setting_rows():
        if row["status"] not in STATUSES:
            problems.append(f"{row['setting']}: status {row['status']!r}")
        field = FIELD.match(row["field"])
        if not field:
            if row["field"] != "—":
                problems.append(f"{row['setting']}: field cell {row['field']!r}")
            continue
        name = field.group(1)
        if name not in amd:
            problems.append(f"{row['setting']}: {name} is not a recipe field")
            continue
        for column, recipe, values in (("recipe", "amd-dsv4-flash-mi308x", amd), ("tiny", "tiny-cpu", tiny)):
            is_literal, value = literal(row[column])
            if not is_literal or value != values[name]:
                problems.append(f"{name}: docs/fidelity.md says {row[column]}, {recipe} resolves to {values[name]!r}")
        stated, amd_value = literal(row["amd"])
        if stated and (row["status"] == "same") != (amd_value == amd[name]):
            problems.append(f"{name}: AMD ran {amd_value!r}, the AMD recipe has {amd[name]!r}, "
                            f"but the row says {row['status']}")
        checked += 1
    return problems, checked


def test_each_row_states_the_recipes_values(recipes):
    problems, checked = disagreements(*recipes)
    assert not problems
    assert len(setting_rows()) >= 70 and checked >= 60


def test_every_schema_field_is_a_row_or_named_as_no_setting(recipes):
    amd, _ = recipes
    in_table = [FIELD.match(r["field"]).group(1) for r in setting_rows() if FIELD.match(r["field"])]
    listed = not_settings()
    assert len(in_table) == len(set(in_table)), "a field has two rows"
    assert not set(in_table) & set(listed), f"in the table and listed as no setting: {set(in_table) & set(listed)}"
    missing = set(amd) - set(in_table) - set(listed)
    assert not missing, f"docs/fidelity.md does not say where AMD sets: {sorted(missing)}"
    assert not set(listed) - set(amd), f"not recipe fields: {sorted(set(listed) - set(amd))}"


def test_a_changed_recipe_value_fails_the_table(recipes):
    """The guard works: the same table against a recipe with dual-clip on names that field, twice (the value
    differs from the row's, and AMD's value no longer equals the recipe's although the row says same)."""
    _, tiny = recipes
    changed = leaf_fields(load_recipe("amd-dsv4-flash-mi308x", ["algorithm.clip_ratio_c=3.0"]))
    problems, _ = disagreements(changed, tiny)
    assert problems == ["algorithm.clip_ratio_c: docs/fidelity.md says `null`, amd-dsv4-flash-mi308x resolves to 3.0",
                        "algorithm.clip_ratio_c: AMD ran None, the AMD recipe has 3.0, but the row says same"]
