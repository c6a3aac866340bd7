"""A sweep file → its trials: the sweep's config classes, YAML parsing with the base config read
and overrides dotted, the grid × seed expansion, trial ids (run directories in the sweep), and the
file names of a sweep directory. No torch: the report reads sweeps with these names."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sac_spectral.core.config import (
    ConfigError,
    at_least,
    check,
    flatten,
    merge_sources,
    option,
    read_yaml,
    section,
    to_dict,
)
from sac_spectral.runs.kinds import get_kind, kind_names, unknown_kind

SWEEP_FILE, BASE_FILE, STATUS, LOGS, LOCK = "sweep.yaml", "base.yaml", "status.json", "logs", ".sweep.lock"
RESERVED = ("seed", "num_seeds", "run_dir", "threads", "progress")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
#: a grid point's folder in a trial id (``dmc-cheetah-run``, ``critic.lr=0.001``)
COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")


@dataclass
class Resources:
    cpu: int = option(1, "CPU cores per trial; the trial runs with threads=cpu")
    gpu: float = option(0.0, "GPUs per trial (a fraction shares one GPU); the base config sets device: cuda")

    def validate(self) -> None:
        check(self.cpu >= 1, "cpu", f"must be an integer >= 1, got {self.cpu}")
        at_least(self, 0, "gpu")


@dataclass
class SweepConfig:
    kind: str = option("train",
                       "the run kind of every trial, a registered runner: train | continual | one a package registers")
    name: str | None = option(None, "the sweep's folder under --out (default: the sweep file's name)")
    base: Any = option({}, "run config shared by all trials: a YAML file, or keys with an optional 'config: FILE'")
    methods: dict[str, Any] = option({}, "named override sets (dotted keys), e.g. {sac: {critic.regularizers: []}}")
    grid: dict[str, Any] = option({}, "lists of values of run keys, e.g. {env: [dmc:cheetah-run]}; "
                                      "every combination is run")
    seeds: list[int] = option([0], "seeds of every method and grid point")
    seeds_per_trial: int = option(1,
                                  "consecutive seeds one trial trains together as num_seeds members (kinds that train "
                                  "members: train)")
    resources_per_trial: Resources = section(Resources, "what Ray reserves for one trial")
    task_keys: list[str] | None = option(None,
                                         "run keys that name a task in reports (default: the kind's: env | "
                                         "dataset.name, stream.kind)")

    def validate(self) -> None:
        check(self.kind in kind_names(), "kind", unknown_kind(self.kind))
        check(self.name is None or bool(NAME.match(self.name)), "name", f"'{self.name}' must be a plain folder name")
        check(isinstance(self.base, (str, dict)), "base",
              f"expected a file name or a mapping of run keys, got {self.base!r}")
        check(bool(self.methods), "methods", "give at least one named override set, e.g. {spectral: {}}")
        for name, overrides in self.methods.items():
            check(bool(NAME.match(str(name))), "methods", f"'{name}' must be a plain name (letters, digits, _ . + -)")
            check(overrides is None or isinstance(overrides, dict), f"methods.{name}",
                  f"expected a mapping of run keys, got {overrides!r}")
        for key, values in self.grid.items():
            check(isinstance(values, list) and len(values) > 0, f"grid.{key}",
                  f"expected a non-empty list of values, got {values!r}")
        check(len(self.seeds) > 0 and len(set(self.seeds)) == len(self.seeds), "seeds",
              f"expected distinct seeds, got {self.seeds}")
        at_least(self, 1, "seeds_per_trial")
        check(self.seeds_per_trial == 1 or get_kind(self.kind).members, "seeds_per_trial",
              f"{self.kind} runs train one seed each; use 1")


@dataclass
class Trial:
    """One run of the sweep: its name (the run directory's path in the sweep), what it overrides."""

    id: str
    method: str
    point: dict[str, Any]
    seeds: list[int]
    overrides: list[str]


@dataclass
class Sweep:
    """A resolved sweep file: the shared base config and every trial."""

    cfg: SweepConfig
    base: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    task_keys: list[str]
    trials: list[Trial] = field(default_factory=list)

    def resolved(self) -> dict[str, Any]:
        """What ``sweep.yaml`` holds: the file with its base read and every override dotted."""
        out = to_dict(self.cfg)
        out.update(base=self.base, methods=self.methods, task_keys=self.task_keys)
        return out


# --------------------------------------------------------------------------------------- sweep file
def _dump(value: Any) -> str:
    """A value as the runners' ``key=value`` command line parses it back."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """``b`` merged into ``a``, recursively for mappings in both."""
    out = dict(a)
    for key, value in b.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _nest(data: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys → nested mappings (``{'a.b': 1, 'a': {'c': 2}}`` → ``{'a': {'b': 1, 'c': 2}}``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        value = _nest(value) if isinstance(value, Mapping) else value
        for part in reversed(str(key).split(".")):
            value = {part: value}
        out = _merge(out, value)
    return out


def _slug(value: Any) -> str:
    text = value if isinstance(value, str) else _dump(value)
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "-", text.replace(":", "-")).strip("-") or "-"


def _seed_label(seeds: Sequence[int]) -> str:
    return f"s{seeds[0]}" if len(seeds) == 1 else f"s{seeds[0]}-{seeds[-1]}"


def _check_reserved(keys: Sequence[str], where: str) -> None:
    for key in keys:
        check(key.split(".")[0] not in RESERVED, where,
              f"'{key}' is set by the sweep for every trial (seeds: and resources_per_trial: choose it)")


def load_sweep(path: str, overrides: Sequence[str]) -> Sweep:
    """Read, validate and expand a sweep file into its trials."""
    data = read_yaml(path)
    if isinstance(data.get("base"), str):
        data["base"] = {"config": data["base"]}
    cfg = merge_sources(SweepConfig, data, overrides)
    if cfg.name is None:
        cfg.name = Path(path).stem if Path(path).name != SWEEP_FILE else Path(path).resolve().parent.name
        check(bool(NAME.match(cfg.name)), "name", f"'{cfg.name}' (from the sweep file's name) is not a plain folder "
              "name (letters, digits, _ . + -, not starting with . or -); give name=")
    raw_base = dict(cfg.base) if isinstance(cfg.base, dict) else {"config": cfg.base}
    base_file = raw_base.pop("config", None)
    _check_reserved(list(flatten(_nest(raw_base))), "base")
    # A full run config as base (e.g. run_configs/continual_default.yaml) names a seed, run_dir, …:
    # every trial sets its own, so the file's are dropped.
    from_file = _nest(read_yaml(base_file)) if base_file is not None else {}
    base = _merge({k: v for k, v in from_file.items() if k not in RESERVED}, _nest(raw_base))
    methods = {str(m): flatten(_nest(o or {})) for m, o in cfg.methods.items()}
    for name, keys in methods.items():
        _check_reserved(list(keys), f"methods.{name}")
    _check_reserved(list(cfg.grid), "grid")
    task_keys = cfg.task_keys if cfg.task_keys is not None else list(get_kind(cfg.kind).task_keys)
    sweep = Sweep(cfg, base, methods, list(task_keys))
    chunks: list[list[int]] = []
    for i in range(0, len(cfg.seeds), cfg.seeds_per_trial):
        chunk = list(cfg.seeds[i:i + cfg.seeds_per_trial])
        check(chunk == list(range(chunk[0], chunk[0] + len(chunk))), "seeds",
              f"seeds packed into one trial must be consecutive (num_seeds trains seed, seed + 1, …), got {chunk}")
        chunks.append(chunk)
    grid_keys = list(cfg.grid)
    seen: dict[str, Trial] = {}
    for method, keys in methods.items():
        for values in itertools.product(*(cfg.grid[k] for k in grid_keys)):
            point = dict(zip(grid_keys, values))
            parts = [_slug(v) if k == "env" else f"{k}={_slug(v)}" for k, v in point.items()]
            for chunk in chunks:
                tid = "/".join([method, *parts, _seed_label(chunk)])
                for part in parts:
                    check(bool(COMPONENT.match(part)), "grid", f"the value in '{part}' cannot name a folder of the "
                          "trial's run directory (use letters, digits, _ . = + -, not starting with . or -)")
                check(tid not in seen, "grid",
                      f"two trials would share the run directory '{tid}'; make the values distinct")
                over = [f"{k}={_dump(v)}" for k, v in {**keys, **point}.items()] + [f"seed={chunk[0]}"]
                if len(chunk) > 1:
                    over.append(f"num_seeds={len(chunk)}")
                seen[tid] = Trial(tid, method, point, chunk, over)
    sweep.trials = list(seen.values())
    return sweep


def check_compatible(sweep: Sweep, saved: Mapping[str, Any], where: Path) -> None:
    """A sweep directory holds one study: its kind, base, seed packing and the override sets of its
    existing methods must not change (new methods, grid values and seeds may be added)."""
    new = sweep.resolved()
    for key in ("kind", "base", "seeds_per_trial"):
        if saved.get(key) != new[key]:
            raise ConfigError(f"{where} holds a sweep with a different '{key}'; give this one another name= or --out")
    for method, keys in new["methods"].items():
        old = (saved.get("methods") or {}).get(method)
        if old is not None and old != keys:
            raise ConfigError(f"{where} holds a sweep whose method '{method}' has other overrides; rename the method "
                              "or the sweep")


def runner_config(kind: str) -> type:
    """The run config class of a sweep's runner (imported here only: it brings torch)."""
    return get_kind(kind).load("config")


def invalid_trials(sweep: Sweep) -> dict[str, str]:
    """``{trial: error line}`` of the trials whose run config does not validate, checked here with
    the runner's own config classes. The device is checked where the trial runs (a CPU-only head
    node may drive GPU trials), so it is set to cpu for this check."""
    cls = runner_config(sweep.cfg.kind)
    errors = {}
    for t in sweep.trials:
        try:
            merge_sources(cls, sweep.base, [*t.overrides, "device=cpu"])
        except ConfigError as err:
            errors[t.id] = f"error: {err}"
    return errors
