"""How soon a run says what it is: seconds from the command to its first line of output.

    python -m benchmarks.first_line [--repeats 5] [train overrides …]

Starts ``python -m sac_spectral.train`` (the embedded default, in a temporary run directory,
``progress=false``, plus the overrides) ``--repeats`` times, one after another, reads each
process's first line of output, then stops it. Prints each time, their median and the line
itself. Run it on an otherwise idle machine: the time is mostly imports (torch, gymnasium).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def first_line(overrides: list[str]) -> tuple[float, str]:
    """Seconds from starting one run to its first line of output, and that line."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "sac_spectral.train", f"run_dir={Path(tmp) / 'run'}", "progress=false",
                   *overrides]
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            return time.perf_counter() - start, line.strip()
        finally:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs started, one after another (default 5)")
    args, overrides = p.parse_known_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    results = [first_line(overrides) for _ in range(args.repeats)]
    times = [t for t, _ in results]
    print(f"first line after: {', '.join(f'{t:.2f}' for t in times)} s; median {statistics.median(times):.2f} s")
    print(f"the line: {results[-1][1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
