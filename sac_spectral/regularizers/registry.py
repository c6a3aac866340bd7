"""Name → regularizer class, and building lists of regularizers from config entries."""

from __future__ import annotations

import difflib
import inspect
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from torch import nn

from sac_spectral.core.config import ConfigError, coerce
from sac_spectral.regularizers.base import Regularizer

REGISTRY: dict[str, type[Regularizer]] = {}
R = TypeVar("R", bound=type[Regularizer])


def register(cls: R) -> R:
    """Class decorator adding a regularizer to :data:`REGISTRY` under ``cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"regularizer name '{cls.name}' is empty or already registered")
    REGISTRY[cls.name] = cls
    return cls


def hyperparameters(cls: type[Regularizer]) -> list[str]:
    """Keyword arguments a regularizer accepts besides the module."""
    params = list(inspect.signature(cls.__init__).parameters.values())[2:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _lookup(spec: Mapping[str, Any], key: str) -> tuple[type[Regularizer], dict[str, Any]]:
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"{key}: each regularizer is a mapping with a 'name', e.g. {{name: spectral, coef: 1e-3}}")
    name = spec["name"]
    if name not in REGISTRY:
        close = difflib.get_close_matches(str(name), list(REGISTRY), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{key}: unknown regularizer '{name}'{hint}; valid: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    valid = hyperparameters(cls)
    hints = typing.get_type_hints(cls.__init__)
    kwargs = {}
    for k, v in spec.items():
        if k == "name":
            continue
        if k not in valid:
            raise ConfigError(f"{key}: regularizer '{name}' has no option '{k}'; valid: {', '.join(valid)}")
        kwargs[k] = coerce(v, hints[k], f"{key}.{k}") if k in hints else v
    return cls, kwargs


def acts_at(spec: Mapping[str, Any]) -> int | None:
    """The update at which the one-off intervention of config entry ``spec`` acts (its ``at_step``,
    given or its default); ``None`` for every other regularizer."""
    cls = REGISTRY.get(spec.get("name"))
    if cls is None or "at_step" not in hyperparameters(cls):
        return None
    return int(spec.get("at_step", inspect.signature(cls.__init__).parameters["at_step"].default))


def parameter_copies(specs: Sequence[Mapping[str, Any]]) -> int:
    """Copies of a network's parameters that the regularizers of config entries ``specs`` keep."""
    return sum(REGISTRY[s["name"]].parameter_copies for s in specs if s.get("name") in REGISTRY)


def _lookup_all(specs: Sequence[Mapping[str, Any]], key: str) -> list[tuple[type[Regularizer], dict[str, Any]]]:
    """Each entry's class and options; a ``one_per_network`` method listed twice is a ConfigError."""
    found = [_lookup(spec, f"{key}[{i}]") for i, spec in enumerate(specs)]
    names = [cls.name for cls, _ in found]
    for cls, _ in found:
        if cls.one_per_network and names.count(cls.name) > 1:
            where = ", ".join(f"[{i}]" for i, n in enumerate(names) if n == cls.name)
            raise ConfigError(f"{key}: '{cls.name}' is listed {names.count(cls.name)} times ({where}); a network "
                              "takes one (a second would undo the first)")
    return found


def validate_specs(specs: Sequence[Mapping[str, Any]], key: str) -> None:
    """Check names and option names of config entries, and that a one-per-network method is listed
    once, without building anything."""
    _lookup_all(specs, key)


def build_regularizers(module: nn.Module, specs: Sequence[Mapping[str, Any]],
                       key: str = "regularizers") -> list[Regularizer]:
    """Build one regularizer per config entry on ``module``; bad values raise ConfigError."""
    out = []
    for i, (cls, kwargs) in enumerate(_lookup_all(specs, key)):
        try:
            out.append(cls(module, **kwargs))
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{key}[{i}] ({cls.name}): {err}") from None
    return out
