"""``python -m sac_spectral.diagnose RUN_DIR [--batch-size N] [--tau T] [--q-scale EPISODES] [--json FILE]
[--plot FILE]``

Loads a run's ``checkpoints/latest.pt`` with the config recorded in it (``config.yaml`` for older
checkpoints), rebuilds the saved agent and replay buffer (no environment is created) and prints the diagnostics of the
saved actor and critics on a probe batch from the saved buffer: per-example gradient rank of their losses, weight
spectra per layer, feature rank and dormant units. Values are per seed (critics averaged within a seed).
``--q-scale EPISODES`` also plays that many evaluation episodes per seed (envs made as the run's
evaluation makes them) and compares the critics' mean Q of the actions taken with the discounted
Monte-Carlo return of the same states (``q_scale/…``).
``--plot`` draws the singular values in the format the file's extension names (needs matplotlib,
an optional dependency). Runs of ``python -m sac_spectral.continual`` log the same diagnostics to
TensorBoard instead.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sac_spectral.agents import Agent, ReplayBuffer, build_agent
from sac_spectral.agents.probes import agent_diagnostics, probe_batch
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.apps.rl.kind import KIND
from sac_spectral.apps.rl.policy import load_policy
from sac_spectral.apps.rl.run import check_format
from sac_spectral.apps.rl.value_scale import agent_q_scale
from sac_spectral.core.config import ConfigError, merge_sources, one_line, read_yaml
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.core.threads import check_threads
from sac_spectral.diagnostics import Report
from sac_spectral.runs.checkpoint import (
    CheckpointError,
    load_checkpoint,
    replaceable,
    write_json,
)
from sac_spectral.runs.kinds import run_kind
from sac_spectral.runs.layout import CHECKPOINT, CONFIG_FILE


def load_run(run_dir: Path) -> tuple[TrainConfig, Agent, ReplayBuffer, int]:
    """The run's config (as its checkpoint recorded it), its agent and replay buffer as saved, and
    the update count."""
    if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / CHECKPOINT).is_file():
        raise ConfigError(f"'{run_dir}' is not a run directory: expected {run_dir / CONFIG_FILE} and "
                          f"{run_dir / CHECKPOINT}")
    data = read_yaml(run_dir / CONFIG_FILE)
    state = load_checkpoint(run_dir / CHECKPOINT)
    saved = state.get("config")
    if run_kind(saved if isinstance(saved, dict) else data, state) != KIND.name:
        raise ConfigError(f"'{run_dir}' is a run of python -m sac_spectral.continual; diagnose reads RL runs of "
                          "python -m sac_spectral.train (a continual run logs these diagnostics to TensorBoard at "
                          "every task end, and every diagnostics_every iterations)")
    source = run_dir / (CHECKPOINT if isinstance(saved, dict) else CONFIG_FILE)
    try:
        # measured on the CPU, in fp32 (as training measures them): a bf16 run loads on a CPU without bf16
        cfg = merge_sources(TrainConfig,
                            {**(saved if isinstance(saved, dict) else data), "device": "cpu", "precision": "fp32"})
    except ConfigError as err:
        raise ConfigError(f"the config in {source}: {err}") from None
    cfg.device = "cpu"
    try:
        check_format(state)
        data = state["buffer"]["data"]
        obs_dim, act_dim = data["obs"].shape[-1], data["action"].shape[-1]
        seeds = [cfg.seed + i for i in range(cfg.num_seeds)]
        agent = build_agent(obs_dim, act_dim, cfg, SeedStreams(seeds))
        agent.load_full_state_dict(state["agent"])
        size = int(state["buffer"]["size"])
    except ConfigError:
        raise
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError, AttributeError) as err:
        raise CheckpointError(f"checkpoint {run_dir / CHECKPOINT} does not hold an RL run of this config "
                              f"({type(err).__name__}: {one_line(err, 160)})") from None
    if size == 0:
        raise ConfigError(f"the replay buffer saved in '{run_dir}' is empty; nothing to probe")
    # just large enough for the saved transitions; the rewards scaled as the run's last updates saw them
    buffer = ReplayBuffer(size, obs_dim, act_dim, cfg.num_seeds, reward_scale=cfg.reward_scaling())
    buffer.load_state_dict({**state["buffer"], "capacity": size, "ptr": 0})
    return cfg, agent, buffer, agent.num_updates


def _writable_file(option: str, path: str) -> Path:
    """``path`` for an output file, checked before any work: its folder exists and is writable."""
    p = Path(path)
    folder = p.parent
    if p.is_dir():
        raise ConfigError(f"{option} {path}: is a directory; give a file name")
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: folder {folder} does not exist (or is not a directory)")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{option} {path}: folder {folder} is not writable")
    replaceable(p)
    return p


def check_plot_format(path: Path) -> None:
    """``--plot FILE``: matplotlib is installed and writes the format the extension names."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed (pip install matplotlib)") from None
    formats = FigureCanvasBase.get_supported_filetypes()
    fmt = path.suffix[1:].lower()
    if fmt not in formats:
        problem = f"format '{fmt}' is not supported" if fmt else "no file extension to tell the format"
        raise ConfigError(f"--plot {path}: {problem}; valid extensions: {', '.join(sorted(formats))}")


def per_seed(agent: Agent, reports: dict[str, Report]) -> dict[str, list[float]]:
    """Tag → one value per seed."""
    return {
        tag: agent.per_seed(net, value).reshape(-1).tolist()
        for net, rep in reports.items()
        for tag, value in rep.scalars.items()
    }


def format_table(values: dict[str, list[float]]) -> str:
    width = max(len(tag) for tag in values)
    return "\n".join(f"  {tag:<{width}}  " + "  ".join(f"{v:10.4g}" for v in vals) for tag,
                     vals in sorted(values.items()))


def plot(reports: dict[str, Report], path: Path) -> None:
    """Gradient and weight singular values (first member of each net) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 2, figsize=(10, 4 * len(reports)), squeeze=False)
    for row, (net, rep) in enumerate(reports.items()):
        grad = rep.histograms[f"spectra/{net}/grad"][0]
        axes[row][0].semilogy((grad / grad[0]).tolist())
        axes[row][0].set(title=f"{net}: per-example gradient matrix", xlabel="index", ylabel="σ_i / σ_1")
        for tag, sigma in rep.histograms.items():
            if tag != f"spectra/{net}/grad":
                axes[row][1].plot(sigma[0].tolist(), marker=".", label=tag.rsplit("/", 1)[1])
        axes[row][1].set(title=f"{net}: weight singular values", xlabel="index", ylabel="σ_i")
        axes[row][1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def q_scale_values(run_dir: Path, cfg: TrainConfig, agent: Agent, buffer: ReplayBuffer,
                   episodes: int) -> dict[str, list[float]]:
    """:func:`~sac_spectral.apps.rl.value_scale.agent_q_scale` over ``episodes`` deterministic episodes
    per seed, on evaluation envs made as the run's evaluation makes them (Q in reward units by the
    saved buffer's reward scale)."""
    envs = [load_policy(run_dir, i).make_env() for i in range(cfg.num_seeds)]
    try:
        return agent_q_scale(agent, envs, [cfg.seed + i for i in range(cfg.num_seeds)], "q_scale", episodes, cfg.gamma,
                             buffer.reward_scale)
    finally:
        for env in envs:
            env.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sac_spectral.diagnose",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by python -m sac_spectral.train")
    parser.add_argument("--batch-size", type=int, help="probe transitions (default: the run's diagnostics.batch_size)")
    parser.add_argument("--tau", type=float, help="dormant threshold (default: the run's diagnostics.tau)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads, at most the cores this process may use (default 1)")
    parser.add_argument("--q-scale", type=int, metavar="EPISODES", default=0,
                        help="also play EPISODES evaluation episodes per seed and compare the critics' mean Q with "
                        "the discounted Monte-Carlo return of the same states (default 0: not)")
    parser.add_argument("--json", metavar="FILE", help="also write the values as JSON")
    parser.add_argument("--plot", metavar="FILE",
                        help="also draw the singular values to FILE, in the format its extension "
                        "names (.png, .pdf, .svg, …; needs matplotlib)")
    args = parser.parse_args(argv)
    check_threads(args.threads, "--threads", allow_auto=False)
    if args.batch_size is not None and args.batch_size < 2:
        raise ConfigError(f"--batch-size: must be >= 2 (rows of the per-example gradient matrix), "
                          f"got {args.batch_size}")
    if args.q_scale < 0:
        raise ConfigError(f"--q-scale: must be >= 0 episodes, got {args.q_scale}")
    if args.tau is not None and not (math.isfinite(args.tau) and args.tau >= 0):
        raise ConfigError(f"--tau: must be a finite number >= 0, got {args.tau}")
    outputs = {opt: _writable_file(opt, path) for opt, path in (("--json", args.json), ("--plot", args.plot)) if path}
    if "--plot" in outputs:
        check_plot_format(outputs["--plot"])
    torch.set_num_threads(args.threads)
    cfg, agent, buffer, updates = load_run(Path(args.run_dir))
    dcfg = cfg.diagnostics
    overrides: dict[str, Any] = {"batch_size": args.batch_size, "tau": args.tau}
    for key, value in overrides.items():
        if value is not None:
            setattr(dcfg, key, value)
    dcfg.validate()
    seeds = [cfg.seed + i for i in range(cfg.num_seeds)]
    batch, noise = probe_batch(agent, buffer, dcfg.batch_size, seeds, updates)
    reports = agent_diagnostics(agent, batch, noise, dcfg)
    values = per_seed(agent, reports)
    if args.q_scale:
        values.update(q_scale_values(Path(args.run_dir), cfg, agent, buffer, args.q_scale))
    print(f"{args.run_dir}: {updates} updates, probe batch of {batch['obs'].shape[1]} transitions, "
          f"dormant τ = {dcfg.tau}; one column per seed ({', '.join(map(str, seeds))})")
    print(format_table(values))
    if "--json" in outputs:
        write_json(outputs["--json"],
                   {"run_dir": str(args.run_dir), "updates": updates, "seeds": seeds, "values": values})
    if "--plot" in outputs:
        plot(reports, outputs["--plot"])
        print(f"plot written to {args.plot}")
    return 0
