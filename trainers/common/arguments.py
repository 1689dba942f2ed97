"""Configs that parse themselves: command-line flags and YAML recipes from the config dataclasses.

Every field of a config dataclass (:class:`~trainers.common.config.TrainerConfig`, ``MAGRPOConfig``,
``MAPPOConfig``) is a flag ``--field-name`` whose help is the field's ``metadata["help"]``; a recipe
is a YAML file of field values. One set of values is built from, in order of precedence::

    the field's default  <  the recipe (--config FILE.yaml)  <  flags  <  --set key=value

Values are coerced to the field's type wherever they come from: ``1e-5`` (a string to PyYAML) and
``"2"`` become a float and an int, ``"jsonl,tensorboard"`` a tuple, ``"null"`` None where the field
allows it. A value that does not fit is one ``ValueError`` line naming the field, the value and the
type expected (``MAGRPOConfig.max_steps expects an integer, got 'two'``). A script reads its config
and its own flags with one parser::

    parser = config_parser(MAGRPOConfig, "Train a team.", recipe="examples/configs/magrpo_debate.yaml")
    parser.add_argument("--samples", type=int, default=4)      # the script's own flags
    config, args = parse_config(parser, MAGRPOConfig)           # args: the script's own flags only

Nothing here imports torch: a command line checks its config before the trainer loads.
"""
from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import difflib
import functools
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

NULL_WORDS = ("null", "none", "~")
TRUE_WORDS = ("true", "yes", "on", "1")
FALSE_WORDS = ("false", "no", "off", "0")
FIELD_DEST = "config field "      # namespace key prefix of the config fields' flags
_NOUNS = {int: ("an integer", "integers"), float: ("a number", "numbers"), str: ("a string", "strings"),
          bool: ("true or false", "booleans")}


@functools.cache
def config_fields(config_cls: type) -> dict[str, tuple[Any, dataclasses.Field]]:
    """``{name: (type, field)}`` of a config dataclass's init fields, string annotations resolved."""
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        raise TypeError(f"expected a dataclass type, got {config_cls!r}")
    hints = typing.get_type_hints(config_cls)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(config_cls) if f.init}


def field_default(field: dataclasses.Field) -> Any:
    """The value a dataclass field takes when it is not given."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ValueError(f"field {field.name!r} has no default")


def describe(kind: Any) -> str:
    """A type in words: ``"an integer"``, ``"a list of strings"``, ``"a number or null"``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [describe(a) for a in args if a is not type(None)]
        return " or ".join(options + (["null"] if type(None) in args else []))
    if origin is typing.Literal:
        return f"one of {args}"
    if origin in (tuple, list, collections.abc.Sequence):
        item = args[0] if args else Any
        return f"a list of {_NOUNS.get(item, (None, 'values'))[1]}"
    if origin in (dict, collections.abc.Mapping):
        key, value = args or (Any, Any)
        return f"a mapping of {_NOUNS.get(key, (None, 'keys'))[1]} to {_NOUNS.get(value, (None, 'values'))[1]}"
    if kind in _NOUNS:
        return _NOUNS[kind][0]
    return getattr(kind, "__name__", str(kind))


def coerce(config_cls: type, name: str, value: Any) -> Any:
    """``value`` (from YAML or a command-line string) as field ``name`` of ``config_cls`` holds it.

    ``ValueError`` naming the field, the value and the type expected when it does not fit.
    """
    fields = config_fields(config_cls)
    if name not in fields:
        raise ValueError(unknown_fields_message(config_cls, [name]))
    kind = fields[name][0]
    try:
        return coerce_to(kind, value)
    except (TypeError, ValueError, yaml.YAMLError):
        raise ValueError(f"{config_cls.__name__}.{name} expects {describe(kind)}, got {value!r}") from None


def coerce_to(kind: Any, value: Any) -> Any:
    """``value`` converted to type ``kind``; ``TypeError``/``ValueError`` when it cannot be."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or isinstance(value, str) and value.strip().lower() in NULL_WORDS):
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return coerce_to(option, value)
            except (TypeError, ValueError, yaml.YAMLError):
                continue
        raise ValueError(f"{value!r} is none of {args}")
    if origin is typing.Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and value == str(choice)):
                return choice
        raise ValueError(f"{value!r} is not one of {args}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return value.strip().lower() in TRUE_WORDS
        raise ValueError(f"{value!r} is not true or false")
    if kind is int:
        if isinstance(value, bool):
            raise TypeError("a boolean is not an integer")
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, (int, str)):
            return int(value)
        raise TypeError(f"{value!r} is not an integer")
    if kind is float:
        if isinstance(value, bool):
            raise TypeError("a boolean is not a number")
        if isinstance(value, (int, float, str)):
            return float(value)        # YAML 1.1 reads 1e-5 (no dot) as a string
        raise TypeError(f"{value!r} is not a number")
    if kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)          # YAML `output_dir: 2024`
        raise TypeError(f"{value!r} is not a string")
    if origin in (tuple, list, collections.abc.Sequence):
        if isinstance(value, str):     # "a,b" or "[a, b]"
            text = value.strip()
            value = yaml.safe_load(text) if text.startswith("[") else [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{value!r} is not a list")
        if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):      # tuple[int, str]
            if len(value) != len(args):
                raise ValueError(f"{value!r} does not have {len(args)} items")
            return tuple(coerce_to(a, v) for a, v in zip(args, value))
        items = [coerce_to(args[0] if args else Any, v) for v in value]
        return tuple(items) if origin is tuple else items
    if origin in (dict, collections.abc.Mapping):
        if isinstance(value, str):     # "{agent_0: 1e-4}"
            value = yaml.safe_load(value)
        if not isinstance(value, Mapping):
            raise TypeError(f"{value!r} is not a mapping")
        key_kind, value_kind = args or (Any, Any)
        return {coerce_to(key_kind, k): coerce_to(value_kind, v) for k, v in value.items()}
    if isinstance(kind, type) and isinstance(value, kind):
        return value
    raise TypeError(f"cannot convert {value!r} to {kind!r}")


def unknown_fields_message(config_cls: type, unknown: Sequence[str]) -> str:
    """One line: the unknown field names, and the nearest real ones or else every valid field."""
    names = sorted(config_fields(config_cls))
    near = sorted({m for u in unknown for m in difflib.get_close_matches(u, names, n=1)})
    hint = f"did you mean {', '.join(repr(m) for m in near)}?" if near else f"valid fields: {names}"
    return f"unknown {config_cls.__name__} field(s) {sorted(unknown)}; {hint}"


def config_values(config_cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` checked against the config's field names and coerced to each field's type."""
    unknown = [name for name in values if name not in config_fields(config_cls)]
    if unknown:
        raise ValueError(unknown_fields_message(config_cls, unknown))
    return {name: coerce(config_cls, name, value) for name, value in values.items()}


def build_config(config_cls: type, values: Mapping[str, Any]) -> Any:
    """The config from ``values`` (field names, values coerced); its ``__post_init__`` checks the rest."""
    return config_cls(**config_values(config_cls, values))


def read_recipe(path: str | Path) -> dict[str, Any]:
    """The field values of a YAML recipe file (a mapping; not yet coerced)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist; pass a YAML file of config fields")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"config file {str(path)!r} is not valid YAML{line}: {getattr(err, 'problem', err)}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of field names to values, "
                         f"got {type(loaded).__name__}")
    return loaded


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``["learning_rate=1e-5", "max_steps=2"]`` -> ``{"learning_rate": "1e-5", "max_steps": "2"}`` (coerced later)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = value
    return out


def format_value(value: Any) -> str:
    """A value as it is written on the command line (``jsonl,tensorboard``, ``{agent_0: 0.1}``, ``None``)."""
    if isinstance(value, (tuple, list)):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def flag_type(config_cls: type, name: str) -> Any:
    """The ``type=`` of an argparse flag for a field: the field's coercion, errors as argparse usage errors."""
    def convert(text: str) -> Any:
        try:
            return coerce(config_cls, name, text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = name
    return convert


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type, *,
                         defaults: Mapping[str, Any] | None = None,
                         flags: Mapping[str, Sequence[str]] | None = None,
                         exclude: Sequence[str] = ()) -> argparse._ArgumentGroup:
    """One flag per field of ``config_cls`` (``--max-steps``), in a group named after the class.

    ``defaults``: the values ``--help`` shows where they differ from the fields' (a recipe's);
    ``flags``: other option strings for some fields (``{"max_steps": ["--max-steps", "--steps"]}``);
    ``exclude``: fields without a flag. A flag that is not given leaves no attribute on the namespace,
    so :func:`config_from_args` can tell it from one given at its default; one that is given is stored
    apart from the script's own flags (under ``FIELD_DEST + name``), so a script may have a flag of its own
    named like a field.
    """
    fields = config_fields(config_cls)
    flags, defaults = dict(flags or {}), dict(defaults or {})
    unknown = [name for name in [*flags, *exclude] if name not in fields]
    if unknown:
        raise ValueError(unknown_fields_message(config_cls, unknown))
    group = parser.add_argument_group(f"{config_cls.__name__} fields",
                                      "Each flag sets the config field of its name, over the --config file's value.")
    for name, (kind, field) in fields.items():
        if name in exclude:
            continue
        default = defaults[name] if name in defaults else field_default(field)
        help_text = str(field.metadata.get("help", "")).replace("%", "%%")
        options: dict[str, Any] = {"dest": FIELD_DEST + name, "default": argparse.SUPPRESS,
                                   "type": flag_type(config_cls, name),
                                   "metavar": metavar(kind),
                                   "help": f"{help_text} (default: {format_value(default).replace('%', '%%')})"}
        if kind is bool:
            options.update(nargs="?", const=True)
        group.add_argument(*(flags.get(name) or [f"--{name.replace('_', '-')}"]), **options)
    return group


def metavar(kind: Any) -> str:
    """The placeholder of a field's flag in ``--help`` (``INT``, ``FLOAT``, ``A,B``, ``{K: V}``)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return metavar(next(a for a in args if a is not type(None)))
    if origin in (tuple, list, collections.abc.Sequence):
        return "A,B"
    if origin in (dict, collections.abc.Mapping):
        return "{K: V}"
    if kind is bool:
        return "BOOL"
    return getattr(kind, "__name__", "VALUE").upper()


def config_from_args(config_cls: type, args: argparse.Namespace, *, recipe: str | Path | None = None,
                     overrides: Mapping[str, Any] | None = None) -> Any:
    """The config of a parsed command line: the recipe's values, then the flags given, then ``overrides``.

    The config fields are removed from ``args``, which keeps the script's own flags.
    """
    values = dict(read_recipe(recipe)) if recipe else {}
    for name in config_fields(config_cls):
        if FIELD_DEST + name in vars(args):
            values[name] = vars(args).pop(FIELD_DEST + name)
    values.update(overrides or {})
    return build_config(config_cls, values)


def config_parser(config_cls: type, description: str | None = None, *, recipe: str | Path | None = None,
                  flags: Mapping[str, Sequence[str]] | None = None,
                  exclude: Sequence[str] = ()) -> argparse.ArgumentParser:
    """An argument parser with ``--config FILE.yaml`` (default: ``recipe``) and one flag per config field.

    The script adds its own flags to it and reads both with :func:`parse_config`.
    """
    shown = config_values(config_cls, read_recipe(recipe)) if recipe else {}
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False,
                                     usage="%(prog)s [--config FILE.yaml] [--FIELD VALUE ...] [options]")
    parser.add_argument("--config", default=str(recipe) if recipe else None, metavar="FILE.yaml",
                        help=f"recipe: a YAML file of {config_cls.__name__} fields, below the flags in precedence "
                             f"(default: {shown_path(recipe) if recipe else None})")
    add_config_arguments(parser, config_cls, defaults=shown, flags=flags, exclude=exclude)
    return parser


def shown_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it is below it (as a user would type it)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def parse_config(parser: argparse.ArgumentParser, config_cls: type,
                 argv: Sequence[str] | None = None) -> tuple[Any, argparse.Namespace]:
    """``(config, args)`` from a :func:`config_parser` parser: a bad value is a usage error (exit status 2)."""
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    recipe = vars(args).pop("config", None)
    try:
        return config_from_args(config_cls, args, recipe=recipe), args
    except ValueError as err:
        parser.error(str(err))


__all__ = ["add_config_arguments", "build_config", "coerce", "config_fields", "config_from_args", "config_parser",
           "config_values", "describe", "parse_config", "parse_overrides", "read_recipe"]
