"""Load, override, check and write recipes. The committed recipes live beside this file as YAML."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from repro import PACKAGE_DIR
from repro.recipes.schema import Recipe
from repro.errors import RecipeError

RECIPE_DIR = Path(__file__).resolve().parent
BUILTIN_PREFIX = "builtin:"


def list_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))


def recipe_file(name_or_path: str | os.PathLike) -> Path:
    """A committed recipe by name (``tiny-cpu``) or any YAML file by path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise RecipeError(f"{candidate}: recipe file not found")
        return candidate
    named = RECIPE_DIR / f"{name_or_path}.yaml"
    if not named.is_file():
        raise RecipeError(f"unknown recipe {str(name_or_path)!r}; committed recipes: {', '.join(list_recipes())}")
    return named


def load_recipe(name_or_path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Parse and validate a recipe; ``overrides`` are ``dotted.field=value`` strings (value parsed as YAML)."""
    path = recipe_file(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of sections, got {type(data).__name__}")
    for override in overrides:
        apply_override(data, override)
    return validate_recipe(data, source=str(path))


def validate_recipe(data: dict, source: str = "<recipe>") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise RecipeError(f"{source}: invalid recipe\n{format_errors(err)}") from None


def format_errors(err: ValidationError) -> str:
    """One line per problem, each starting with the dotted field path."""
    lines = []
    for item in err.errors():
        field = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (not in the recipe schema)"
        elif "input" in item and item["type"].endswith("_type"):
            message += f" (got {type(item['input']).__name__} {item['input']!r})"
        lines.extend(f"  {field}: {m}" if field else f"  {m}" for m in message.splitlines())
    return "\n".join(lines)


def apply_override(data: dict, override: str) -> None:
    if "=" not in override:
        raise RecipeError(f"override {override!r}: expected dotted.field=value")
    dotted, raw = override.split("=", 1)
    keys = dotted.strip().split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise RecipeError(f"override {override!r}: {key} is not a section")
    node[keys[-1]] = yaml.safe_load(raw)


def dump_recipe(recipe: Recipe, path: str | os.PathLike) -> Path:
    """Write the fully resolved recipe (every default spelled out) atomically."""
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    tmp.write_text(yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))
    tmp.replace(final)
    return final


def resolve_path(value: str) -> Path:
    """``builtin:NAME`` is a folder shipped in ``repro/assets``; anything else is a filesystem path."""
    if value.startswith(BUILTIN_PREFIX):
        return PACKAGE_DIR / "assets" / value[len(BUILTIN_PREFIX):]
    return Path(value).expanduser()


def require_paths(recipe: Recipe, fields: tuple[str, ...]) -> dict[str, Path]:
    """Check that the named path fields exist now; the error names each missing field and its value."""
    found, missing = {}, []
    for field in fields:
        value = recipe
        for part in field.split("."):
            value = getattr(value, part)
        if value is None:
            continue
        path = resolve_path(value)
        if path.exists():
            found[field] = path
        else:
            missing.append(f"  {field}: path does not exist: {value}")
    if missing:
        raise RecipeError(f"recipe {recipe.name!r}: missing paths\n" + "\n".join(missing))
    return found
