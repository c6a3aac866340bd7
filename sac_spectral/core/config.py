"""Typed run configuration: dataclasses, YAML files, dotted ``key=value`` overrides, validation.

Every runner describes its configuration as nested dataclasses. :func:`load_config` merges the
dataclass defaults, an optional YAML file and ``key=value`` overrides (dotted keys reach nested
fields, values are parsed as YAML), then converts the result into the dataclasses while checking
every key and type. Problems raise :class:`ConfigError` with a one-line message that names the
key and the valid choices.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import reprlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 safe loader that also reads ``1e-4`` (no dot) as a float, as YAML 1.2 does, and
    refuses a mapping that repeats a key (YAML forbids it; PyYAML would keep the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_document(self, node: yaml.Node) -> Any:
        """Refuse a document whose aliases expand to more than :data:`MAX_ALIASED_VALUES` values
        (a few hundred bytes of nested aliases can stand for billions) or refer to themselves."""
        added = _aliased_values(node)
        if added > MAX_ALIASED_VALUES:
            raise yaml.constructor.ConstructorError(
                None, None, f"its aliases (*name) would add {added} values; at most {MAX_ALIASED_VALUES} "
                "may be added", node.start_mark)
        return super().construct_document(node)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

#: values that aliases (``*name``) may add to a YAML document when expanded
MAX_ALIASED_VALUES = 10_000


def _aliased_values(root: yaml.Node) -> int:
    """Values that aliases add to the document ``root`` when expanded: every node counted once per
    path that reaches it, minus the distinct nodes. A node that contains itself raises."""
    size: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        if children_done:
            size[key] = 1 + sum(size[id(c)] for c in children)
            continue
        if key in size:
            continue
        if key in entered:
            raise yaml.constructor.ConstructorError(None, None, "an alias (*name) refers to the value that holds it",
                                                    node.start_mark)
        entered.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)
    return size[id(root)] - len(size)


def yaml_load(text: str) -> Any:
    """Parse YAML with :class:`_Loader`; aliases that expand too far and nesting too deep for the
    parser are YAML errors."""
    try:
        return yaml.load(text, Loader=_Loader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


class ConfigError(ValueError):
    """Invalid configuration: a one-line message naming the key and what is allowed."""


def one_line(err: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, without torch's advice to load unsafely."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: characters of a value shown in an error message
SHOWN_CHARS = 80
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, SHOWN_CHARS, SHOWN_CHARS, SHOWN_CHARS


def shown(value: Any) -> str:
    """``repr(value)`` cut to :data:`SHOWN_CHARS` characters, without formatting more of a big
    (or alias-shared) value than it shows."""
    text = _REPR.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check(condition: bool, key: str, message: str) -> None:
    """Raise :class:`ConfigError` for ``key`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


def at_least(obj: Any, minimum: int, *keys: str) -> None:
    """``check`` that each attribute ``key`` of ``obj`` is ``>= minimum`` (``key: must be >= 1, got 0``)."""
    for key in keys:
        value = getattr(obj, key)
        check(value >= minimum, key, f"must be >= {minimum}, got {value}")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    if tp is type(None):
        return "null"
    if tp is bool:
        return "true | false"
    return getattr(tp, "__name__", str(tp))


def _coerce_union(value: Any, tp: Any, key: str) -> Any:
    """``value`` as the first member type of union ``tp`` that takes it (``None`` for an optional)."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is type(None):
            continue
        try:
            return coerce(value, arg, key)
        except ConfigError:
            continue
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {shown(value)}")


def _to_int(value: Any, key: str) -> int:
    """An integer from an int, an integral float or a numeric string (``1e6``, ``1_000``); never a bool."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            as_float = float(value.replace("_", ""))
        except ValueError:
            as_float = math.nan
        if as_float.is_integer():
            return int(as_float)
    raise ConfigError(f"{key}: expected an integer, got {shown(value)}")


def _to_float(value: Any, key: str) -> float:
    """A finite number from an int, a float or a numeric string; never a bool."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise ConfigError(f"{key}: expected a number, got {shown(value)}")
    if not math.isfinite(number):
        raise ConfigError(f"{key}: must be a finite number, got {shown(value)}")
    return number


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML-parsed ``value`` into type ``tp`` or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {shown(value)}")
        return from_dict(tp, value, prefix=f"{key}.")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {shown(value)} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin in (Union, types.UnionType):
        return _coerce_union(value, tp, key)
    if origin in (list, Sequence):
        (item_tp,) = typing.get_args(tp) or (Any,)
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ConfigError(f"{key}: expected a list ({_type_name(tp)}), got {shown(value)}")
        return [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {shown(value)}")
        return dict(value)
    if tp is int:
        return _to_int(value, key)
    if tp is float:
        return _to_float(value, key)
    if tp is bool or tp is str:
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{key}: expected {'true or false' if tp is bool else 'a string'}, got {shown(value)}")
    raise ConfigError(f"{key}: unsupported config type {_type_name(tp)}")


def registered_sections(cls: type) -> Mapping[str, tuple[type, str]]:
    """Sections registered with config class ``cls`` at run time, ``{key: (section class, help)}``
    (its ``registered_sections()``: for RL configs, each agent's own options). An instance holds
    each as an attribute, built by :func:`from_dict`, written by :func:`to_dict`, listed by
    :func:`describe`."""
    get = getattr(cls, "registered_sections", None)
    return get() if get is not None else {}


def _keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] + list(registered_sections(cls))


def _unknown_key(cls: type, key: str, prefix: str) -> ConfigError:
    names = _keys(cls)
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    where = f"under '{prefix[:-1]}'" if prefix else "at the top level"
    return ConfigError(
        f"unknown config key '{prefix}{key}'{hint}; valid keys {where}: {', '.join(names)}"
    )


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, checking every key and type."""
    hints = typing.get_type_hints(cls)
    extra = registered_sections(cls)
    names = set(_keys(cls))
    for key in data:
        if key not in names:
            raise _unknown_key(cls, str(key), prefix)
    kwargs = {k: coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items() if k not in extra}
    obj = cls(**kwargs)
    for k, (tp, _) in extra.items():
        if k in data:
            setattr(obj, k, coerce(data[k], tp, f"{prefix}{k}"))
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as err:
            raise ConfigError(f"{prefix}{err}") from None
    return obj


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass (YAML-serializable), its registered sections last."""
    out = dataclasses.asdict(cfg)
    for key in registered_sections(type(cfg)):
        out[key] = dataclasses.asdict(getattr(cfg, key))
    return out


def check_section(cls: type, key: str) -> None:
    """Refuse a section class that a config could not hold under ``key``: not a dataclass, an option
    without a default, an option of a type :func:`coerce` cannot parse, or defaults that YAML cannot
    write or that its own ``validate()`` rejects. A one-line :class:`ConfigError` naming the option."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"{key}: the options must be a dataclass, got {shown(cls)}")
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{key}.{missing[0]}: has no default; every option needs one")
    data = to_dict(cls())
    try:
        yaml.safe_dump(data)
    except yaml.YAMLError as err:
        raise ConfigError(f"{key}: its defaults cannot be written as YAML ({one_line(err)})") from None
    from_dict(cls, data, prefix=f"{key}.")


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into its key path and YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value (e.g. seed=3)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override '{text}': value is not valid YAML ({_yaml_problem(err)})") from None
    return key.split("."), value


def _nest(path: list[str], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path):
        out = {part: out}
    return out


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: what is wrong and where."""
    if isinstance(err, yaml.MarkedYAMLError):
        where = f" (line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1})" if err.problem_mark else ""
        return f"{err.problem or err.context}{where}"
    return " ".join(str(err).split())


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, raising ConfigError for a missing, unreadable, binary or non-mapping file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file '{path}' is a directory, not a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file '{path}' is not a text (UTF-8) file") from None
    except OSError as err:
        raise ConfigError(f"config file '{path}' cannot be read: {err.strerror}") from None
    try:
        data = yaml_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file '{path}' is not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys, not {type(data).__name__}")
    return data


def merge_sources(
    cls: type[T], file_data: Mapping[str, Any] | None, overrides: Sequence[str] = ()
) -> T:
    """Defaults ← YAML mapping ← ``key=value`` overrides, converted into ``cls``."""
    data = _deep_merge(to_dict(cls()), file_data or {})
    for text in overrides:
        path, value = parse_override(text)
        data = _deep_merge(data, _nest(path, value))
    return from_dict(cls, data)


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Load ``cls`` from an optional YAML file plus dotted overrides."""
    return merge_sources(cls, read_yaml(path) if path is not None else None, overrides)


def describe(cls: type, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, Any, str]]:
    """Flattened ``(key, type, default, help)`` rows for ``--help``."""
    rows: list[tuple[str, str, Any, str]] = []
    hints = typing.get_type_hints(cls)
    defaults = cls() if defaults is None else defaults
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, prefix=f"{prefix}{f.name}.", defaults=value))
        else:
            doc = f.metadata.get("help", "")
            rows.append((f"{prefix}{f.name}", _type_name(tp), value, doc() if callable(doc) else doc))
    for key, (tp, _) in registered_sections(cls).items():
        rows.extend(describe(tp, prefix=f"{prefix}{key}.", defaults=getattr(defaults, key)))
    return rows


def help_text(cls: type) -> str:
    """Human-readable table of every key with its type, default and meaning."""
    rows = describe(cls)
    width = max(len(r[0]) for r in rows)
    lines = []
    for key, tp, default, doc in rows:
        shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        lines.append(f"  {key:<{width}}  {doc} [{tp}; default: {shown}]")
    return "\n".join(lines)


def option(default: Any, help: str | Callable[[], str]) -> Any:
    """Dataclass field with a default (copied if mutable) and a help string (or a function that
    writes it when ``--help`` asks, for choices known only then)."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def section(cls: type, help: str = "") -> Any:
    """Dataclass field holding a nested config section."""
    return dataclasses.field(default_factory=cls, metadata={"help": help})
