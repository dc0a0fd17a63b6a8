"""Typed YAML configs, the one reader of train, pretrain and curate: YAML (data, never code) into frozen dataclasses.

``read_config(path, overrides, kind, build)`` reads the file with ``yaml.safe_load`` and applies dotted
``"a.b=value"`` overrides; ``build_config(cls, values)`` turns the plain data into ``cls``, rejecting unknown keys
with a did-you-mean and checking every value against its annotation (bool, int, float, str, Literal, tuples,
dicts, unions, nested dataclasses); ``config_to_dict`` turns a config back into plain data. Each config module
(``train.config``, ``pretrain.config``, ``curate.config``) keeps its dataclasses and cross-field checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = [
    "TEMPLATES",
    "apply_overrides",
    "build_config",
    "config_option",
    "config_path",
    "config_to_dict",
    "did_you_mean",
    "dotted_value",
    "read_config",
    "rebase_paths",
    "templates",
]


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def config_option(key: str, value: Any = None) -> str:
    """A config key as messages name it where configs are written as YAML keys and ``--set`` overrides:
    ``schedule.warmup_steps``, or with its value ``schedule.warmup_steps=500``. A command that takes some keys as
    flags names them its own way (``sapiens2 distill``: ``--steps 100``) through the same signature."""
    if value is None:
        return key
    if isinstance(value, (list, tuple, Mapping)):  # as --set takes it: YAML flow style
        value = yaml.safe_dump(_plain(value), default_flow_style=True, width=1 << 16).strip()
    return f"{key}={value}"


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """``" Did you mean 'x'?"`` for the choice closest to ``name``, or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _type_name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _convert(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``hint`` and normalise it (lists -> tuples, "1e-4" -> float)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise ValueError(f"{where}: null is not allowed, expected {_type_name(hint)}")
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, where)
            except ValueError:
                continue
        raise ValueError(f"{where}: {value!r} is not a valid {_type_name(hint)}")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            hint_text = did_you_mean(str(value), [str(c) for c in choices])
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(repr, choices))}.{hint_text}")
        return value
    if hint is Any:
        return value
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list like [{', '.join(_type_name(a) for a in args)}], got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ValueError(f"{where}: expected {len(args)} values, got {len(value)} ({value!r})")
        return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is dict:
        key_type, value_type = typing.get_args(hint)
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return {
            _convert(k, key_type, f"{where} key"): _convert(v, value_type, f"{where}.{k}") for k, v in value.items()
        }
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected a section (mapping), got {value!r}")
        return build_config(hint, value, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{where}: expected an integer, got {value!r}") from None
        if not number.is_integer():
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return int(number)
    if hint is float:
        # YAML 1.1 reads "1e-4" (no dot) as a string: accept numeric strings.
        if isinstance(value, bool):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a number, got {value!r}") from None
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported annotation {hint!r}")  # a bug in this file, not user input


def build_config(cls: type, values: Mapping[str, Any], where: str = "") -> Any:
    """An instance of the dataclass ``cls`` from plain data: unknown keys fail with a did-you-mean, every value is
    checked against its annotation; ``where`` is the dotted section the values sit in (for messages)."""
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            section = f"section {where!r}" if where else "the top level"
            raise ValueError(
                f"unknown config key {path!r} in {section}.{did_you_mean(str(key), names)} "
                f"Known keys: {', '.join(names)}"
            )
        kwargs[key] = _convert(value, hints[key], path)
    return cls(**kwargs)


def _plain(value: Any) -> Any:
    """Tuples as lists, mappings as dicts, all the way down (what YAML writes)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain YAML/JSON-ready data (tuples as lists) that ``build_config`` turns back into ``config``."""
    return _plain(dataclasses.asdict(config))


def dotted_value(data: Mapping[str, Any], key: str) -> Any:
    """The value at the dotted ``key`` (``schedule.warmup_steps``) of plain config data; None where it is absent."""
    for part in key.split("."):
        data = data.get(part) if isinstance(data, Mapping) else None
    return data


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if not all(parts):
        raise ValueError(f"override key {key!r} is malformed; write e.g. optimizer.lr=1e-4")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"override {key!r}: {part!r} holds a value, not a section")
        node = child
    node[parts[-1]] = value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``"a.b=value"`` overrides to a nested dict (values parsed as YAML scalars/lists); returns a copy."""
    import copy

    result = copy.deepcopy(dict(data))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} has no '='; write e.g. optimizer.lr=1e-4")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as error:
            raise ValueError(f"override {item!r}: the value is not valid YAML ({error})") from None
        _set_dotted(result, key.strip(), value)
    return result


TEMPLATES = Path(__file__).parent / "configs"  # config templates shipped with the package


def templates() -> list[str]:
    """The names of the config templates shipped with the package (``pretrain_tiny.yaml`` ...)."""
    return sorted(path.name for path in TEMPLATES.glob("*.yaml"))


def config_path(path: str | os.PathLike, kind: str = "") -> Path:
    """``path`` if it is a file, else the packaged template of that name (``pretrain_tiny`` or
    ``pretrain_tiny.yaml``, from any folder after ``pip install``); FileNotFoundError naming the templates."""
    path = Path(path)
    if path.is_file():
        return path
    name = path.name if path.suffix in (".yaml", ".yml") else path.name + ".yaml"
    if path.parent in (Path("."), Path("configs")) and (TEMPLATES / name).is_file():
        return TEMPLATES / name
    shipped = ", ".join(templates())
    raise FileNotFoundError(f"{kind + ' ' if kind else ''}config not found: {path} (templates shipped with "
                            f"sapiens2, usable by name from any folder: {shipped})")  # fmt: skip


def _is_local_relative(text: str) -> bool:
    return bool(text) and not os.path.isabs(os.path.expanduser(text)) and "://" not in text


def rebase_paths(data: dict[str, Any], base: Path, paths: Mapping[str, str]) -> dict[str, Any]:
    """The config file's relative paths made relative to its folder ``base``: the one rule of every config.

    ``paths`` maps dotted keys to ``"path"`` (a path or a list of paths, always joined onto ``base``) or
    ``"source"`` (a path, or a name such as a repo id or a size: joined only when that file or folder exists
    there). Absolute paths, ``~/...`` and URLs stay as written; ``--set`` overrides are applied afterwards, so the
    paths typed on the command line stay relative to the working folder.
    """
    import copy

    result = copy.deepcopy(data)
    for key, kind in paths.items():
        *parents, last = key.split(".")
        node = result
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or node.get(last) is None:
            continue

        value = node[last]
        rebased = [_rebased(v, base, kind) for v in value] if isinstance(value, list) else _rebased(value, base, kind)
        node[last] = rebased
    return result


def _rebased(text: Any, base: Path, kind: str) -> Any:
    if not isinstance(text, str) or not _is_local_relative(text):
        return text
    joined = base / text
    return str(joined) if kind == "path" or joined.exists() else text


def read_config(
    path: str | os.PathLike | None,
    overrides: Sequence[str],
    kind: str,
    build: typing.Callable[[dict], Any],
    paths: Mapping[str, str] | None = None,
) -> Any:
    """The one YAML config reader (train, pretrain, curate, distill): the file at ``path`` (None: no file, only
    ``overrides``; a name of a packaged template: that template) with the ``"a.b=value"`` overrides applied,
    turned into a config by ``build``; every problem is a FileNotFoundError or a ValueError naming the file and,
    as ``kind``, what config it should be (a ``messages.Problems`` from ``build``, several problems, keeps one line
    each, each naming the file). The relative paths under the keys of ``paths`` are the file's
    folder's (:func:`rebase_paths`)."""
    data: Any = {}
    if path is not None:
        path = config_path(path, kind)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not valid YAML: {error}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a {kind} config must be a mapping of sections, got {type(data).__name__}")
        data = rebase_paths(data, path.resolve().parent, paths or {})
    try:
        return build(apply_overrides(data, list(overrides)))
    except ValueError as error:  # each line names the file (no file: the keys and flags say where)
        if path is None:
            raise
        if hasattr(error, "prefixed"):  # messages.Problems: one line per problem
            raise error.prefixed(f"{path}: ") from None
        raise ValueError(f"{path}: {error}") from None
