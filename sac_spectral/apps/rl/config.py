"""The configuration of an RL run (``python -m sac_spectral.train``): the agents' shared options
(:class:`~sac_spectral.agents.config.SACConfig`; each agent's own section is registered with it)
plus the env, the schedule of steps, evaluations, resets, heavy priming, diagnostics and the run's
own settings. Defaults are exactly ``run_configs/default.yaml``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sac_spectral.agents.base import AGENTS, agent_choices, agent_class, reserve_run_keys
from sac_spectral.agents.config import ActorConfig, CriticConfig, SACConfig
from sac_spectral.agents.heads import support_bounds
from sac_spectral.agents.probes import DiagnosticsConfig
from sac_spectral.agents.reward_scale import REWARD_SCALES, RewardScale, make_reward_scale
from sac_spectral.core.config import ConfigError, at_least, check, flatten, option, section, to_dict
from sac_spectral.core.device import check_device
from sac_spectral.core.precision import BF16_FLAGS, cpu_bf16
from sac_spectral.envs.make import reward_bound
from sac_spectral.envs.tasks import MAX_STAGES, Task, TaskError, TaskSequence, parse_tasks

RESET_CHOICES = ("all", "last_layers")
RESET_NETWORKS = ("actor", "critic")
MAX_SEED = 2**31 - 1  # env seeds go through numpy's and MuJoCo's 32-bit seeding


def check_networks(networks: list[str]) -> None:
    """Refuse a ``networks`` list of a reset that names a network twice or one no agent trains."""
    bad = [n for n in networks if n not in RESET_NETWORKS]
    check(not bad, "networks", f"{', '.join(map(repr, bad))} is not one of {', '.join(RESET_NETWORKS)}")
    check(len(set(networks)) == len(networks), "networks", f"names a network twice: {networks}")


@dataclass
class ResetConfig:
    every: int = option(0,
                        "reset the agent every N env steps, after that step's evaluation (0 = never; Nikishin et al. "
                        "2022: 200000)")
    at: list[int] = option([],
                           "also reset at these env steps, e.g. [100] with priming.transitions=100: once, right after "
                           "priming")
    what: str = option("all", f"what a reset re-draws: {' | '.join(RESET_CHOICES)}")
    last_layers: int = option(1, "number of final levels re-drawn by what=last_layers (1 = the output heads)")
    networks: list[str] = option([], f"the networks a reset re-draws, some of {', '.join(RESET_NETWORKS)} "
                                     "([] = every trained network)")

    def due(self, step: int) -> bool:
        """Whether env step ``step`` (≥ 1) is a reset step."""
        return bool(self.every) and step % self.every == 0 or step in self.at

    def layers(self) -> int | None:
        """The levels a reset re-draws, counted as :func:`~sac_spectral.core.layers.layer_tail` counts
        them (``None``: all of them, the full reset)."""
        return None if self.what == "all" else self.last_layers

    def validate(self) -> None:
        at_least(self, 0, "every")
        check(all(isinstance(s, int) and s >= 1 for s in self.at), "at", f"must be env steps >= 1, got {self.at}")
        check(self.what in RESET_CHOICES, "what", f"'{self.what}' is not one of {', '.join(RESET_CHOICES)}")
        at_least(self, 1, "last_layers")
        check_networks(self.networks)


@dataclass
class PrimingConfig:
    transitions: int = option(0, "heavy priming (Nikishin et al. 2022 §3): after this many env steps (0 = off) …")
    updates: int = option(0, "… run this many updates on the transitions collected so far, then train as usual")

    def validate(self) -> None:
        check(self.transitions >= 0, "transitions", f"must be >= 0 (0 = no priming), got {self.transitions}")
        at_least(self, 0, "updates")
        check(self.updates == 0 or self.transitions >= 1, "transitions", "must be >= 1 when priming.updates > 0")


SWITCH_BUFFER = ("keep", "clear")
SWITCH_OPTIMIZER = ("keep", "reset")


@dataclass
class SwitchConfig:
    """What happens to the agent at a task switch (after the ended stage's evaluations)."""

    buffer: str = option("keep",
                         f"the replay buffer: {' | '.join(SWITCH_BUFFER)} (after a clear, the stage warms up as the "
                         "run began: random_steps uniform actions, then updates)")
    reset: str = option("none",
                        "re-draw the networks: none | all | last:<k> (the last k levels, as resets.last_layers counts)")
    optimizer: str = option("keep", f"the optimizers' moments: {' | '.join(SWITCH_OPTIMIZER)}")
    networks: list[str] = option([], f"the networks a reset re-draws, some of {', '.join(RESET_NETWORKS)} "
                                     "([] = every trained network)")

    def layers(self) -> int | None | bool:
        """The levels a switch re-draws (``None``: all), or False for none."""
        return False if self.reset == "none" else None if self.reset == "all" else int(self.reset.split(":")[1])

    def validate(self) -> None:
        check(self.buffer in SWITCH_BUFFER, "buffer", f"'{self.buffer}' is not one of {', '.join(SWITCH_BUFFER)}")
        check(self.optimizer in SWITCH_OPTIMIZER, "optimizer",
              f"'{self.optimizer}' is not one of {', '.join(SWITCH_OPTIMIZER)}")
        last = self.reset.split(":")
        check(self.reset in ("none", "all")
              or (len(last) == 2 and last[0] == "last" and last[1].isdigit() and int(last[1]) >= 1),
              "reset", f"'{self.reset}' is not one of none, all, last:<k> (k >= 1)")
        check_networks(self.networks)


@dataclass
class TrainConfig(SACConfig):
    agent: str = option("sac", agent_choices)
    env: str = option("dmc:cheetah-run",
                      "environment: dmc:<domain>-<task>, dm_control/<domain>-<task>-v0 or a gymnasium id")
    seed: int = option(0, "random seed (seed i of a multi-seed run uses seed + i)")
    num_seeds: int = option(1, "independent agents trained together as members of batched networks")
    total_steps: int = option(100_000,
                              "env steps: actions of the agent (each advances the simulator action_repeat times); "
                                          "with tasks: tasks x cycles x steps_per_task (cycles lengthens a sequence)")
    replay_ratio: float = option(1.0, "gradient updates per env step (0.5 = one update every 2 steps)")
    batch_size: int = option(256, "transitions per gradient update")
    buffer_size: int = option(1_000_000, "replay capacity per seed")
    random_steps: int = option(10_000, "uniform-random warm-up steps before the policy acts and updates start")
    action_repeat: int = option(1, "simulator steps per env step (the action is repeated, rewards summed)")
    eval_every: int = option(10_000, "evaluate every N env steps (0 = only at the end)")
    eval_episodes: int = option(10, "episodes per evaluation")
    video_every: int = option(0, "record seed 0's first evaluation episode as a video every N env steps, "
                                 "into videos/ and TensorBoard (a multiple of eval_every; 0 = off)")
    log_every: int = option(1_000, "write training metrics every N env steps")
    checkpoint_every: int = option(25_000, "checkpoint every N env steps (0 = only at the end)")
    run_dir: str | None = option(None, "run directory (default: runs/<env>__<tag>__s<seed>__<time>)")
    device: str = option("cpu", "torch device: cpu, cuda, cuda:<i>")
    threads: int = option(0, "torch CPU threads (0 = the cores other processes leave idle, re-chosen every 10 s)")
    progress: bool = option(True, "show a progress bar")
    reward_scale: str = option("none", f"{' | '.join(REWARD_SCALES)}: simbav2 divides the rewards of every replay "
                                       "batch by the running scale of the discounted return (SimbaV2); stored, "
                                       "logged and evaluated returns stay unscaled")
    reward_scale_g_max: float = option(5.0, "reward_scale=simbav2: the divisor is at least max|G| / this, so scaled "
                                            "returns stay within ±this (the paper's G_max)")
    tasks: list[dict[str, Any]] = option([], "continual RL: the stages' tasks in order, e.g. [{env: dmc:walker-walk}, "
                                                 "{env: dmc:walker-run, dynamics: {friction: 0.5}, permute_obs: true}] "
                                                 "(docs/continual_rl.md); [] = one task, env")
    steps_per_task: int = option(0, "with tasks: env steps per stage (total_steps becomes stages x steps_per_task)")
    cycles: int = option(1, "with tasks: how many times the sequence runs (raise it on --resume to extend the run)")
    on_switch: SwitchConfig = section(SwitchConfig,
                                      "with tasks: what a task switch does to the buffer, networks and optimizers")
    resets: ResetConfig = section(ResetConfig)
    priming: PrimingConfig = section(PrimingConfig, "heavy priming: many updates on the first transitions")
    diagnostics: DiagnosticsConfig = section(DiagnosticsConfig,
                                             "gradient-rank, spectra, feature and dormant diagnostics")
    actor: ActorConfig = section(ActorConfig, "policy network")
    critic: CriticConfig = section(CriticConfig, "Q-networks")

    def validate(self) -> None:
        super().validate()
        self._resolve_tasks()
        self._resolve_support()
        at_least(self, 1, "num_seeds", "total_steps", "batch_size", "buffer_size", "action_repeat", "eval_episodes",
                 "log_every")
        at_least(self, 0, "random_steps", "eval_every", "video_every", "checkpoint_every", "threads")
        check(not self.video_every or (self.eval_every and self.video_every % self.eval_every == 0), "video_every",
              f"must be a multiple of eval_every ({self.eval_every}) or 0, got {self.video_every}")
        check(self.replay_ratio > 0, "replay_ratio", f"must be > 0 (updates per env step), got {self.replay_ratio}")
        check(self.reward_scale in REWARD_SCALES, "reward_scale",
              f"'{self.reward_scale}' is not one of {', '.join(REWARD_SCALES)}")
        check(self.reward_scale_g_max > 0, "reward_scale_g_max", f"must be > 0, got {self.reward_scale_g_max}")
        check(0 <= self.seed and self.seed + self.num_seeds <= MAX_SEED + 1, "seed",
              f"seeds must lie in [0, {MAX_SEED}]; got seed={self.seed} with num_seeds={self.num_seeds}")
        check(self.run_dir is None or bool(self.run_dir.strip()), "run_dir",
              "empty; give a directory, or leave run_dir out for runs/<name>__<time>")
        check(
            self.priming.transitions <= min(self.buffer_size, self.total_steps), "priming.transitions",
            f"must be <= buffer_size ({self.buffer_size}) and total_steps ({self.total_steps}), got "
            f"{self.priming.transitions}",
        )
        check_device(self.device)
        check(self.precision != "bf16" or not self.device.startswith("cpu") or cpu_bf16() is not False, "precision",
              f"bf16: this CPU has no native bf16 matmuls ({' or '.join(BF16_FLAGS)} among its flags), so bf16 would "
              "run emulated, slower than fp32; use precision=fp32")
        agent = agent_class(self.agent)
        check(self.compile is not True or agent.compiles, "compile",
              f"agent '{self.agent}' has no compiled update; use compile=false (agents with one: "
              f"{', '.join(n for n, a in sorted(AGENTS.items()) if a.compiles)})")
        self._check_unused_sections(agent.sections)
        agent.check_config(self)

    def _check_unused_sections(self, used: Sequence[str]) -> None:
        """Refuse an option of a section this run's agent does not read, set away from its default
        (it would be thrown away); a saved config holds every section at its defaults."""
        for key, (tp, _) in self.registered_sections().items():
            if key in used:
                continue
            given, default = flatten(to_dict(getattr(self, key))), flatten(to_dict(tp()))
            changed = next((k for k, v in given.items() if v != default.get(k)), None)
            if changed is not None:
                owners = [name for name, cls in AGENTS.items() if key in cls.sections]
                raise ConfigError(f"{key}.{changed} is an option of agent{'s' * (len(owners) > 1)} "
                                  f"{', '.join(owners)}; "
                                  f"this run's agent is {self.agent}")

    def _resolve_support(self) -> None:
        """A categorical head without ``v_min``/``v_max``: ``±R/(1 − γ)`` with ``R`` the largest reward of
        an env step over the run's envs (:func:`~sac_spectral.envs.make.reward_bound` × ``action_repeat``)."""
        c = self.critic
        if c.head != "categorical" or c.v_min is not None:
            return
        envs = [t["env"] for t in self.tasks] or [self.env]
        bounds = {env: reward_bound(env) for env in envs}
        unknown = next((env for env, bound in bounds.items() if bound is None), None)
        check(unknown is None, "critic.v_min", f"the reward range of {unknown} is unknown: give critic.v_min and "
              "critic.v_max (derived only for DMC tasks, whose rewards lie in [0, 1])")
        check(self.gamma < 1, "critic.v_min", "gamma = 1 bounds no return: give critic.v_min and critic.v_max")
        c.v_min, c.v_max = support_bounds(self.action_repeat * max(bounds.values()), self.gamma)

    def _resolve_tasks(self) -> None:
        """With ``tasks``: each task's env and name written out, ``env`` the first task's and
        ``total_steps`` the sequence's length."""
        if not self.tasks:
            check(self.cycles == 1, "cycles",
                  f"only a task sequence (tasks) repeats; leave it at 1 (got {self.cycles})")
            return
        at_least(self, 1, "steps_per_task", "cycles")
        stages = len(self.tasks) * self.cycles
        check(stages <= MAX_STAGES, "cycles", f"{len(self.tasks)} task(s) x {self.cycles} cycles = {stages} stages; "
              f"at most {MAX_STAGES} (each switch evaluates every task): lengthen steps_per_task instead")
        try:
            tasks = parse_tasks(self.tasks, self.env)
        except TaskError as err:
            raise ConfigError(str(err)) from None
        self.tasks = [{**raw, "env": t.env, "name": t.name} for raw, t in zip(self.tasks, tasks)]
        self.env, self.total_steps = tasks[0].env, len(tasks) * self.cycles * self.steps_per_task

    def reward_scaling(self) -> RewardScale | None:
        """A fresh reward scale of this run's ``reward_scale`` (``None`` for ``none``)."""
        return make_reward_scale(self.reward_scale, self.num_seeds, self.gamma, self.reward_scale_g_max)

    def sequence(self) -> TaskSequence:
        """The run's stages: its ``tasks`` × ``cycles``, or its one env for all ``total_steps``; with
        its schedule of warm-ups and updates (a switch that clears the buffer warms up again)."""
        schedule = {"random_steps": self.random_steps, "replay_ratio": self.replay_ratio}
        if not self.tasks:
            return TaskSequence([Task(self.env, self.env)], self.total_steps, **schedule)
        return TaskSequence(parse_tasks(self.tasks, self.env), self.steps_per_task, self.cycles, **schedule,
                            rewarm=self.on_switch.buffer == "clear")

    def updates_after(self, step: int) -> int:
        """The updates done after ``step`` env steps: the replay ratio's
        (:meth:`TaskSequence.updates_by`) and, from ``priming.transitions`` on, priming's."""
        return self.sequence().updates_by(step) + self.priming.updates * (step >= self.priming.transitions)

    @property
    def total_updates(self) -> int:
        """Every update of the run: the replay ratio's over ``total_steps`` plus priming's."""
        return self.updates_after(self.total_steps)


def seed_label(seeds: Sequence[int]) -> str:
    """``s3`` for one seed, ``s0-2`` for seeds 0, 1, 2."""
    return f"s{seeds[0]}" if len(seeds) == 1 else f"s{seeds[0]}-{seeds[-1]}"


def run_tag(cfg: TrainConfig) -> str:
    names = [r["name"] for r in cfg.critic.regularizers + cfg.actor.regularizers]
    tag = "+".join(dict.fromkeys(names)) or cfg.agent
    if names and cfg.agent != "sac":
        tag = f"{cfg.agent}+{tag}"
    archs = dict.fromkeys(arch for arch in (cfg.critic.arch, cfg.actor.arch) if arch != "mlp")
    if archs:
        tag += "+" + "+".join(archs)
    if cfg.critic.head != "scalar":
        tag += f"+{cfg.critic.head}"
    if cfg.reward_scale != "none":
        tag += f"+{cfg.reward_scale}_rewards"
    if cfg.priming.updates:
        tag += "+primed"
    return f"{tag}+resets" if cfg.resets.every or cfg.resets.at else tag


reserve_run_keys(f.name for f in dataclasses.fields(TrainConfig))
