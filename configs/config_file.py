"""A run's settings from a file (`smrc.py --config FILE`): YAML, or JSON (so a run's own config.json can be
passed back). The file is a mapping of Config fields, nested as in config.json (`grpo: {lr: 1.0e-6}`); each
key and value is checked against the field's type before anything runs, and a bad one is one `error:` line
naming the file and the key (a range, such as lr > 0, is the preflight's, as for a flag).

- `read_settings(path)`: the mapping in the file (a config.json's `resolved` record dropped).
- `check_settings(cls, values, path)`: every key names a field of the dataclass `cls` (nested dataclasses
  recursively) and every value is of its field's kind: a Literal's choices, bool, int, float (an int too),
  str, a tuple as a list, None where the field allows it.
- `fill_dataclass(obj, values)`: a saved smrc_config.json / config.json back into a Config (unknown keys are
  returned; a value of the wrong kind is a ValueError).
"""
import dataclasses
import difflib
import json
import re
import types
import typing
from pathlib import Path

import yaml


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads 1e-6 as a string; here any decimal number in exponent form is a float, as in JSON."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?$"
               r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN)$"),
    list("-+0123456789."))


def _bad(path: str, message: str) -> SystemExit:
    return SystemExit(f"error: --config {path}: {message}")


def read_settings(path: str) -> dict:
    """The settings of a YAML or JSON file (by its suffix: .json is JSON, anything else YAML)."""
    p = Path(path)
    if not p.is_file():
        raise _bad(path, "no such file")
    kind = "JSON" if p.suffix == ".json" else "YAML"
    try:
        text = p.read_text(encoding="utf-8")
        values = json.loads(text) if kind == "JSON" else yaml.load(text, Loader=_Loader)
    except (OSError, ValueError, yaml.YAMLError) as e:  # decoding errors are ValueErrors
        raise _bad(path, f"not valid {kind} ({(str(e).splitlines() or [type(e).__name__])[0]})") from None
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise _bad(path, f"holds a {type(values).__name__}, not a mapping of settings")
    values.pop("resolved", None)  # a run's config.json: its record of what the flags resolved to
    return values


def _kind_ok(hint, value) -> bool:
    """Whether `value` (from YAML/JSON) can be a field of type `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_kind_ok(a, value) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_kind_ok(args[0], v) for v in value)
    return False


def _kind_text(hint) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(hint)))
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def check_settings(cls, values: dict, path: str, where: str = "") -> None:
    """Every key of `values` names a field of `cls` and holds a value of its kind; else one error line."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in values.items():
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {where}{near[0]}?" if near else ""
            raise _bad(path, f"{where}{key} is not a setting{hint}")
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                raise _bad(path, f"{where}{key} is {value!r}; it holds settings ({where}{key}.FIELD: value)")
            check_settings(kind, value, path, f"{where}{key}.")
        elif not _kind_ok(kind, value):
            raise _bad(path, f"{where}{key} is {value!r}, which is not {_kind_text(kind)}")


def fill_dataclass(obj, values: dict, where: str = "") -> list[str]:
    """Overwrite obj's fields from a JSON dict (nested dataclasses recursively, lists back to tuples where the
    default is a tuple). Returns the keys that match no field, so the caller can report them (never dropped
    silently)."""
    names = {f.name for f in dataclasses.fields(obj)}
    unknown = [f"{where}{k}" for k in values if k not in names]
    for name in names & set(values):
        cur, v = getattr(obj, name), values[name]
        if isinstance(cur, str) and isinstance(v, bool):  # a switch that became auto / on / off
            v = "on" if v else "off"
        if not _same_kind(cur, v):
            raise ValueError(f"{where}{name} is {v!r}, where a {type(cur).__name__} belongs")
        if dataclasses.is_dataclass(cur):
            unknown += fill_dataclass(cur, v, f"{where}{name}.")
        else:
            setattr(obj, name, tuple(v) if isinstance(cur, tuple) else v)
    return unknown


def _same_kind(cur, v) -> bool:
    """Whether a JSON value can stand for a field whose current value is `cur` (None: a field left open)."""
    if cur is None:
        return True
    if dataclasses.is_dataclass(cur):
        return isinstance(v, dict)
    if isinstance(cur, bool) or isinstance(v, bool):
        return isinstance(cur, bool) and isinstance(v, bool)
    if isinstance(cur, (int, float)):
        return isinstance(v, (int, float))
    if isinstance(cur, (tuple, list)):
        return isinstance(v, list)
    return isinstance(v, type(cur))
