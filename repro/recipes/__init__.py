"""Load, override, check and write recipes. The committed recipes live beside this file as YAML."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from repro import PACKAGE_DIR
from repro.recipes.schema import Recipe
from repro.errors import RecipeError
from repro.owned import write_atomic

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


class _RecipeLoader(yaml.SafeLoader):
    """YAML as a person reads it: ``1e-6`` is a number (PyYAML's YAML 1.1 rules need ``1.0e-6``)."""


_RecipeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def read_yaml(text: str):
    return yaml.load(text, Loader=_RecipeLoader)  # a SafeLoader: builds plain data only


def load_recipe(name_or_path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (),
                steps: int | None = None) -> Recipe:
    """Parse and validate a recipe; ``overrides`` are ``dotted.field=value`` strings (value parsed as YAML);
    ``steps`` (a command's --steps, a notebook's parameter) overrides ``steps`` when given."""
    path = recipe_file(name_or_path)
    try:
        data = read_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of sections, got {type(data).__name__}")
    overrides = list(overrides) + ([f"steps={steps}"] if steps is not None else [])
    applied = {}
    for override in overrides:
        applied[apply_override(data, override)] = override
    return validate_recipe(data, source=str(path), overrides=applied)


def validate_recipe(data: dict, source: str = "<recipe>", overrides: dict[str, str] | None = None) -> Recipe:
    """``overrides``: dotted field -> the override that set it, so an error there names the override."""
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        lines = format_errors(err)
        overrides = overrides or {}
        fields = _error_fields(lines)
        if overrides and all(f in overrides for f in fields):  # the overrides alone are at fault
            where = "override " + ", ".join(sorted({repr(overrides[f]) for f in fields})) + f" (on {source})"
        elif overrides:  # the file, or the file and the overrides together
            where = f"{source} with override " + ", ".join(repr(o) for o in overrides.values())
        else:
            where = source
        raise RecipeError(f"{where}: invalid recipe\n" + "\n".join(lines)) from None


def _error_fields(lines: list[str]) -> list[str]:
    return [line.strip().split(":", 1)[0] for line in lines]


def format_errors(err: ValidationError) -> list[str]:
    """One line per problem, each starting with the dotted field path."""
    lines = []
    for item in err.errors():
        field = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (not in the recipe schema)" + _nearest_fields(item["loc"])
        elif "input" in item and item["type"].endswith("_type"):
            message += f" (got {type(item['input']).__name__} {item['input']!r})"
        lines.extend(f"  {field}: {m}" if field else f"  {m}" for m in message.splitlines())
    return lines


def _nearest_fields(loc: tuple) -> str:
    """'; did you mean lr?' from the schema section that holds the unknown key."""
    import difflib

    model = Recipe
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        model = getattr(field, "annotation", None) if field else None
        if not (isinstance(model, type) and hasattr(model, "model_fields")):
            return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else f"; valid keys: {', '.join(model.model_fields)}"


def apply_override(data: dict, override: str) -> str:
    """Set ``dotted.field=value`` in ``data`` (the value read as YAML, ``1e-6`` a number); returns the field."""
    if "=" not in override:
        raise RecipeError(f"override {override!r}: expected dotted.field=value")
    dotted, raw = override.split("=", 1)
    keys = dotted.strip().split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise RecipeError(f"override {override!r}: {key} is not a section")
    try:
        node[keys[-1]] = read_yaml(raw)
    except yaml.YAMLError as err:
        raise RecipeError(f"override {override!r}: the value is not valid YAML ({err.problem})") from None
    return ".".join(keys)


def dump_recipe(recipe: Recipe, path: str | os.PathLike) -> Path:
    """Write the fully resolved recipe (every default spelled out) atomically, never through a link."""
    return write_atomic(Path(path), yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))


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
