"""``status.json`` of a sweep: every trial's state, error line, run directory and command."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from sac_spectral.core.config import one_line
from sac_spectral.runs.checkpoint import write_json
from sac_spectral.studies.spec import LOGS, STATUS, Sweep
from sac_spectral.studies.trial import trial_state


def read_status(root: Path) -> dict[str, Any]:
    """The ``status.json`` a sweep in ``root`` wrote before: {} if there is none, or if it is damaged
    (then, with a note, every trial's state is rebuilt from its run directory; failures are retried)."""
    path = root / STATUS
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        problem = None if isinstance(data, dict) else f"it holds {type(data).__name__}, not an object"
        trials = data.get("trials", {}) if problem is None else {}
        if problem is None and not (isinstance(trials, dict) and all(isinstance(e, dict) for e in trials.values())):
            problem = "its 'trials' is not an object of trial objects"
    except (ValueError, UnicodeDecodeError) as err:
        problem = f"it does not parse ({one_line(err)})"
    if problem is None:
        return data
    print(f"note: {path} is damaged: {problem}; the trials' states are rebuilt from their run directories",
          file=sys.stderr)
    return {}


class Status:
    """``status.json``: every trial's state (pending / running / done / failed), error line, run
    directory and command; written atomically by the sweep process whenever something changes."""

    def __init__(self, sweep: Sweep, root: Path, previous: Mapping[str, Any]) -> None:
        self.root, self.sweep = root, sweep
        old = previous.get("trials", {})
        self.trials: dict[str, dict[str, Any]] = {}
        for t in sweep.trials:
            entry = {"status": "pending", "method": t.method, "task": t.point, "seeds": t.seeds, "run_dir": t.id,
                     "log": f"{LOGS}/{t.id}.log", "command": None, "error": None, "exit_code": None, "wall_s": None,
                     "host": None, "node": None}
            prev = old.get(t.id, {})
            entry.update({k: prev[k] for k in ("command", "error", "exit_code", "wall_s", "host", "node") if k in prev})
            state = trial_state(root / t.id)
            entry["status"] = "done" if state == "done" else "failed" if prev.get("status") == "failed" else "pending"
            self.trials[t.id] = entry

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("done", "running", "pending", "failed"), 0)
        for entry in self.trials.values():
            out[entry["status"]] += 1
        return out

    def set(self, tid: str, **values: Any) -> None:
        self.trials[tid].update(values)

    def write(self) -> None:
        write_json(self.root / STATUS, {
            "sweep": self.sweep.cfg.name, "kind": self.sweep.cfg.kind,
            "updated": datetime.now().isoformat(timespec="seconds"),
            "counts": self.counts(), "trials": self.trials,
        })
