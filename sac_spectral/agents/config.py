"""The configuration of an RL run (``python -m sac_spectral.train``): the agents' shared options
(:class:`SACConfig`; each agent's own section is registered with it) plus the env, the schedule of steps, evaluations, resets, heavy priming, diagnostics and the run's
own settings. Defaults are exactly ``run_configs/default.yaml``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sac_spectral.agents.base import AGENTS, agent_choices, agent_class, agent_sections
from sac_spectral.agents.heads import HEAD_OPTIONS, HEADS, PROJECTIONS, support_bounds
from sac_spectral.agents.probes import DiagnosticsConfig
from sac_spectral.core.config import ConfigError, at_least, check, flatten, option, section, to_dict
from sac_spectral.core.device import check_device
from sac_spectral.core.nets import ACTIVATIONS, INITS
from sac_spectral.core.precision import BF16_FLAGS, PRECISIONS, cpu_bf16
from sac_spectral.core.residual import ARCHS
from sac_spectral.envs.make import reward_bound
from sac_spectral.envs.tasks import MAX_STAGES, Task, TaskError, TaskSequence, parse_tasks
from sac_spectral.regularizers import validate_specs

DEFAULT_REGULARIZERS = [{"name": "spectral", "coef": 1e-4, "k": 2}]


RESET_CHOICES = ("all", "last_layers")
#: what a compiled CPU program's matrix products run on (:mod:`sac_spectral.core.onednn`)
COMPILE_PRODUCTS = ("onednn", "aten")


MAX_SEED = 2**31 - 1  # env seeds go through numpy's and MuJoCo's 32-bit seeding


def owed(step: int, random_steps: int, replay_ratio: float) -> int:
    """Updates the replay ratio owes after ``step`` env steps, ``random_steps`` of them warm-up."""
    return math.floor(max(0, step - random_steps) * replay_ratio + 1e-9)


@lru_cache(maxsize=8)
def rewarm_totals(random_steps: int, replay_ratio: float, steps_per_task: int, stages: int) -> tuple[int, ...]:
    """``totals[k]``: the updates :func:`owed` counts in the warm-ups of stages 1 … k of a sequence
    whose switches clear the buffer (which those stages do not run)."""
    window, totals = min(random_steps, steps_per_task), [0]
    for k in range(1, stages):
        start = k * steps_per_task
        totals.append(totals[-1] + owed(start + window, random_steps, replay_ratio) - owed(start, random_steps, replay_ratio))
    return tuple(totals)


@dataclass
class NetConfig:
    """Architecture, optimizer and regularizers of one network."""

    arch: str = option("mlp", f"network: {' | '.join(ARCHS)} (bronet, simba: residual LayerNorm nets; hidden = [width] * (blocks + 1))")
    hidden: list[int] = option([256, 256], "hidden layer widths")
    activation: str = option("relu", f"hidden activation: {', '.join(ACTIVATIONS)}")
    layer_norm: bool = option(False, "LayerNorm after each hidden linear layer")
    init: str = option("orthogonal", "orthogonal (rl_with_resets: gain √2 and zero bias; an actor's log-std head gain 1) or torch (nn.Linear default)")
    lr: float = option(3e-4, "Adam learning rate")
    weight_decay: float = option(0.0, "decoupled weight decay (AdamW); 0 = plain Adam")
    regularizers: list[dict[str, Any]] = option([], "regularizers, e.g. [{name: spectral, coef: 1e-4}]")

    def validate(self) -> None:
        check(len(self.hidden) > 0 and all(h > 0 for h in self.hidden), "hidden", f"widths must be positive, got {self.hidden}")
        check(self.arch in ARCHS, "arch", f"'{self.arch}' is not one of {', '.join(ARCHS)}")
        check(self.arch == "mlp" or len(set(self.hidden)) == 1, "hidden",
              f"{self.arch} needs equal widths (the embedding's, then one per residual block), got {self.hidden}")
        check(self.arch == "mlp" or ACTIVATIONS[self.activation][1] == 1, "activation",
              f"{self.arch} keeps the stream's width; '{self.activation}' changes it")
        check(self.activation in ACTIVATIONS, "activation", f"'{self.activation}' is not one of {', '.join(ACTIVATIONS)}")
        check(self.init in INITS, "init", f"'{self.init}' is not one of {', '.join(INITS)}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        at_least(self, 0, "weight_decay")
        validate_specs(self.regularizers, "regularizers")


@dataclass
class ActorConfig(NetConfig):
    log_std_min: float = option(-10.0, "lower bound of the policy's log standard deviation")
    log_std_max: float = option(2.0, "upper bound of the policy's log standard deviation")

    def validate(self) -> None:
        super().validate()
        check(self.log_std_min < self.log_std_max, "log_std_min", f"must be < log_std_max ({self.log_std_max}), got {self.log_std_min}")


@dataclass
class CriticConfig(NetConfig):
    num_critics: int = option(2, "Q-networks in the ensemble (min over them in targets)")
    head: str = option("scalar", f"the critic's output: {' | '.join(HEADS)} (docs/agents.md: critic heads)")
    num_atoms: int = option(101, "head=categorical: atoms of the support")
    v_min: float | None = option(None, "head=categorical: the support's lowest atom (v_min and v_max not given: "
                                       "-/+ r_max/(1-gamma), r_max = action_repeat for DMC, whose rewards lie in "
                                       "[0, 1])")
    v_max: float | None = option(None, "head=categorical: the support's highest atom")
    projection: str = option("two_hot", "head=categorical: the target's projection onto the support: "
                                        f"{' | '.join(PROJECTIONS)}")
    sigma: float = option(0.75, "head=categorical, projection=hl_gauss: the Gaussian's std in bin widths")
    num_quantiles: int = option(25, "head=quantile: quantiles per critic")
    drop_top: int = option(0, "head=quantile: TQC's truncation: the top drop_top x num_critics atoms of the pooled "
                              "target are dropped (0 = none)")

    def validate(self) -> None:
        super().validate()
        at_least(self, 1, "num_critics", "num_quantiles")
        check(self.head in HEADS, "head", f"'{self.head}' is not one of {', '.join(HEADS)}")
        defaults = type(self)()
        for head, keys in HEAD_OPTIONS.items():
            changed = next((k for k in keys if getattr(self, k) != getattr(defaults, k)), None)
            check(head == self.head or changed is None, changed or "head",
                  f"is an option of head={head}; this critic's head is {self.head}")
        check(self.num_atoms >= 2, "num_atoms", f"must be >= 2 (a support needs two atoms), got {self.num_atoms}")
        check(self.v_min is None or self.v_max is None or self.v_min < self.v_max, "v_min",
              f"must be < v_max ({self.v_max}), got {self.v_min}")
        check((self.v_min is None) == (self.v_max is None), "v_min",
              "give v_min and v_max together, or neither (derived from the env's reward range)")
        check(self.projection in PROJECTIONS, "projection",
              f"'{self.projection}' is not one of {', '.join(PROJECTIONS)}")
        check(self.sigma > 0, "sigma", f"must be > 0, got {self.sigma}")
        check(0 <= self.drop_top < self.num_quantiles, "drop_top",
              f"must lie in [0, num_quantiles) ({self.num_quantiles}): the pooled target keeps "
              f"(num_quantiles - drop_top) x num_critics atoms, got {self.drop_top}")


@dataclass
class SACConfig:
    gamma: float = option(0.99, "discount")
    tau: float = option(0.005, "Polyak rate of the target critics (every update)")
    precision: str = option("fp32", "fp32, or bf16 matmuls on bf16 weight copies (fp32 master weights, optimizer state, losses, targets)")
    compile: bool = option(False, "torch.compile the whole update: each network's loss, gradient and Adam step as one program (CUDA graphs on GPU)")
    compile_products: str = option("onednn", "with compile=true on a CPU: the programs' matrix products as oneDNN batched matmuls (onednn: about twice MKL's speed on AMD CPUs) or as ATen's bmm (aten: MKL on x86)")
    compile_block: int = option(1, "with compile=true: run the updates of one train_steps call (an env step's replay_ratio updates, heavy priming's) this many per program call (one program of that many updates; its first compile takes minutes); 1: one call per update")
    actor: ActorConfig = section(ActorConfig)
    critic: CriticConfig = section(CriticConfig)

    @classmethod
    def registered_sections(cls) -> dict[str, tuple[type, str]]:
        """Each registered agent's own options (SAC's ``alpha``, TD3's ``td3``, …)."""
        return agent_sections()

    def __post_init__(self) -> None:
        for key, (tp, _) in self.registered_sections().items():
            if key not in self.__dict__:
                setattr(self, key, tp())

    def validate(self) -> None:
        check(0 <= self.gamma <= 1, "gamma", f"must be in [0, 1], got {self.gamma}")
        check(0 < self.tau <= 1, "tau", f"must be in (0, 1], got {self.tau}")
        check(self.compile_block >= 1, "compile_block", f"must be an integer >= 1, got {self.compile_block}")
        check(self.compile_products in COMPILE_PRODUCTS, "compile_products",
              f"'{self.compile_products}' is not one of {', '.join(COMPILE_PRODUCTS)}")
        check(self.precision in PRECISIONS, "precision", f"'{self.precision}' is not one of {', '.join(PRECISIONS)}")


@dataclass
class ResetConfig:
    every: int = option(0, "reset the agent every N env steps, after that step's evaluation (0 = never; Nikishin et al. 2022: 200000)")
    at: list[int] = option([], "also reset at these env steps, e.g. [100] with priming.transitions=100: once, right after priming")
    what: str = option("all", f"what a reset re-draws: {' | '.join(RESET_CHOICES)}")
    last_layers: int = option(1, "number of final levels re-drawn by what=last_layers (1 = the output heads)")

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

    buffer: str = option("keep", f"the replay buffer: {' | '.join(SWITCH_BUFFER)} (after a clear, the stage warms up as the run began: random_steps uniform actions, then updates)")
    reset: str = option("none", "re-draw the networks: none | all | last:<k> (the last k levels, as resets.last_layers counts)")
    optimizer: str = option("keep", f"the optimizers' moments: {' | '.join(SWITCH_OPTIMIZER)}")

    def layers(self) -> int | None | bool:
        """The levels a switch re-draws (``None``: all), or False for none."""
        return False if self.reset == "none" else None if self.reset == "all" else int(self.reset.split(":")[1])

    def validate(self) -> None:
        check(self.buffer in SWITCH_BUFFER, "buffer", f"'{self.buffer}' is not one of {', '.join(SWITCH_BUFFER)}")
        check(self.optimizer in SWITCH_OPTIMIZER, "optimizer", f"'{self.optimizer}' is not one of {', '.join(SWITCH_OPTIMIZER)}")
        last = self.reset.split(":")
        check(self.reset in ("none", "all") or (len(last) == 2 and last[0] == "last" and last[1].isdigit() and int(last[1]) >= 1),
              "reset", f"'{self.reset}' is not one of none, all, last:<k> (k >= 1)")


@dataclass
class TrainConfig(SACConfig):
    agent: str = option("sac", agent_choices)
    env: str = option("dmc:cheetah-run", "environment: dmc:<domain>-<task>, dm_control/<domain>-<task>-v0 or a gymnasium id")
    seed: int = option(0, "random seed (seed i of a multi-seed run uses seed + i)")
    num_seeds: int = option(1, "independent agents trained together as members of batched networks")
    total_steps: int = option(100_000, "env steps: actions of the agent (each advances the simulator action_repeat times); "
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
    tasks: list[dict[str, Any]] = option([], "continual RL: the stages' tasks in order, e.g. [{env: dmc:walker-walk}, "
                                                 "{env: dmc:walker-run, dynamics: {friction: 0.5}, permute_obs: true}] "
                                                 "(docs/continual_rl.md); [] = one task, env")
    steps_per_task: int = option(0, "with tasks: env steps per stage (total_steps becomes stages x steps_per_task)")
    cycles: int = option(1, "with tasks: how many times the sequence runs (raise it on --resume to extend the run)")
    on_switch: SwitchConfig = section(SwitchConfig, "with tasks: what a task switch does to the buffer, networks and optimizers")
    resets: ResetConfig = section(ResetConfig)
    priming: PrimingConfig = section(PrimingConfig, "heavy priming: many updates on the first transitions")
    diagnostics: DiagnosticsConfig = section(DiagnosticsConfig, "gradient-rank, spectra, feature and dormant diagnostics")
    actor: ActorConfig = section(lambda: ActorConfig(regularizers=list(DEFAULT_REGULARIZERS)), "policy network")
    critic: CriticConfig = section(lambda: CriticConfig(regularizers=list(DEFAULT_REGULARIZERS)), "Q-networks")

    def validate(self) -> None:
        super().validate()
        self._resolve_tasks()
        self._resolve_support()
        at_least(self, 1, "num_seeds", "total_steps", "batch_size", "buffer_size", "action_repeat", "eval_episodes", "log_every")
        at_least(self, 0, "random_steps", "eval_every", "video_every", "checkpoint_every", "threads")
        check(not self.video_every or (self.eval_every and self.video_every % self.eval_every == 0), "video_every",
              f"must be a multiple of eval_every ({self.eval_every}) or 0, got {self.video_every}")
        check(self.replay_ratio > 0, "replay_ratio", f"must be > 0 (updates per env step), got {self.replay_ratio}")
        check(0 <= self.seed and self.seed + self.num_seeds <= MAX_SEED + 1, "seed",
              f"seeds must lie in [0, {MAX_SEED}]; got seed={self.seed} with num_seeds={self.num_seeds}")
        check(self.run_dir is None or bool(self.run_dir.strip()), "run_dir",
              "empty; give a directory, or leave run_dir out for runs/<name>__<time>")
        check(
            self.priming.transitions <= min(self.buffer_size, self.total_steps), "priming.transitions",
            f"must be <= buffer_size ({self.buffer_size}) and total_steps ({self.total_steps}), got {self.priming.transitions}",
        )
        check_device(self.device)
        check(self.precision != "bf16" or not self.device.startswith("cpu") or cpu_bf16() is not False, "precision",
              f"bf16: this CPU has no native bf16 matmuls ({' or '.join(BF16_FLAGS)} among its flags), so bf16 would "
              "run emulated, slower than fp32; use precision=fp32")
        agent = agent_class(self.agent)
        check(not self.compile or agent.compiles, "compile",
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
                raise ConfigError(f"{key}.{changed} is an option of agent{'s' * (len(owners) > 1)} {', '.join(owners)}; "
                                  f"this run's agent is {self.agent}")

    def _resolve_support(self) -> None:
        """A categorical head without ``v_min``/``v_max``: ``±R/(1 − γ)`` with ``R`` the largest reward
        of an env step over the run's envs (:func:`~sac_spectral.envs.make.reward_bound` × ``action_repeat``)."""
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
            check(self.cycles == 1, "cycles", f"only a task sequence (tasks) repeats; leave it at 1 (got {self.cycles})")
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

    def sequence(self) -> TaskSequence:
        """The run's stages: its ``tasks`` × ``cycles``, or its one env for all ``total_steps``."""
        if not self.tasks:
            return TaskSequence([Task(self.env, self.env)], self.total_steps)
        return TaskSequence(parse_tasks(self.tasks, self.env), self.steps_per_task, self.cycles)

    def _rewarms(self) -> bool:
        """Whether a sequence's later stages warm up again (a switch clears the buffer)."""
        return bool(self.tasks) and self.on_switch.buffer == "clear"

    def warmup_end(self, stage: int) -> int:
        """The env step up to which stage ``stage`` acts uniformly at random without updates:
        ``random_steps`` into the run, and into each stage that starts from a cleared buffer."""
        return stage * self.steps_per_task * (stage > 0 and self._rewarms()) + self.random_steps

    def updates_by(self, step: int) -> int:
        """Updates the replay ratio owes after ``step`` env steps (priming updates are extra), less
        those of the warm-ups of a sequence's stages after a cleared buffer."""
        done = owed(step, self.random_steps, self.replay_ratio)
        if not self._rewarms() or step <= self.steps_per_task:
            return done
        stage = min((step - 1) // self.steps_per_task, len(self.tasks) * self.cycles - 1)  # the stage step acts in
        start, window = stage * self.steps_per_task, min(self.random_steps, self.steps_per_task)
        earlier = rewarm_totals(self.random_steps, self.replay_ratio, self.steps_per_task, len(self.tasks) * self.cycles)[stage - 1]
        return done - earlier - owed(min(step, start + window), self.random_steps, self.replay_ratio) + owed(
            start, self.random_steps, self.replay_ratio)

    def updates_after(self, step: int) -> int:
        """The updates done after ``step`` env steps: :meth:`updates_by`'s and, from
        ``priming.transitions`` on, priming's."""
        return self.updates_by(step) + self.priming.updates * (step >= self.priming.transitions)

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
    if cfg.priming.updates:
        tag += "+primed"
    return f"{tag}+resets" if cfg.resets.every or cfg.resets.at else tag
