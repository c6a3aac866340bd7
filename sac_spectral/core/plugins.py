"""Plug-ins: the objects that installed distributions declare in an entry-point group (run kinds,
agents), loaded so that a broken or clashing plug-in costs only itself. Standard library only.

This package's own entry points are the built-ins: they load first and keep their names. Every
plug-in that is skipped gets one ``warning: …`` line on stderr naming its entry point, its package
and why; a lookup of a broken plug-in's name can say why it is unavailable
(:func:`load_entry_points` returns the reasons).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

#: the distribution whose entry points are built in
OWNER = __name__.split(".")[0]
#: characters of an error message kept in a warning or a reason
MESSAGE_CHARS = 200


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Sac-Spectral`` == ``sac_spectral``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def _error(err: BaseException) -> str:
    """``Type: first line of the message``, at most :data:`MESSAGE_CHARS` characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def _package(point: EntryPoint) -> str:
    return point.dist.name if point.dist is not None else "?"


def _builtin(point: EntryPoint) -> bool:
    """Whether ``point`` is declared by this package itself (its distribution, or its modules)."""
    if point.dist is not None:
        return _normal(_package(point)) == _normal(OWNER)
    return point.module.startswith(f"{OWNER}.")


def _origin(point: EntryPoint) -> str:
    """``the built-in sac_spectral.apps.rl.kind:KIND`` or ``the plug-in mod:KIND (package name 0.1)``."""
    if _builtin(point):
        return f"the built-in {point.value}"
    version = point.dist.version if point.dist is not None else "?"
    return f"the plug-in {point.value} (package {_package(point)} {version})"


def load_entry_points(group: str, register: Callable[[str, Any], None],
                      held: Mapping[str, str] | None = None) -> dict[str, str]:
    """Load each entry point of ``group``, built-ins first, and call ``register(name, obj)`` with the
    object it names; ``register`` raises to refuse an object.

    A name belongs to its first holder: ``held`` (names registered before any entry point loads,
    such as the built-ins registered by import, each with who holds it), then the first entry point
    of that name. A later one (a plug-in naming a built-in, or two plug-ins one name) is not
    imported, and one warning line names both. An entry point whose import or ``register`` raises is
    skipped with one warning line. Returns the skipped names, each with a one-line reason (which
    entry point of which package, and its error), for a later lookup of the name to say why it is
    unavailable.
    """
    owners: dict[str, str] = dict(held or {})
    broken: dict[str, str] = {}
    points = sorted(entry_points(group=group), key=lambda p: (not _builtin(p), _normal(_package(p)), p.name))
    for point in points:
        if point.name in owners:
            _warn(f"{group}: '{point.name}' of {_origin(point)} ignored; {owners[point.name]} keeps that name")
            continue
        owners[point.name] = _origin(point)
        try:
            register(point.name, point.load())
        except (Exception, SystemExit) as err:
            broken[point.name] = f"{_origin(point)} is broken: {_error(err)}"
            _warn(f"{group}: '{point.name}' skipped: {broken[point.name]}")
    return broken
