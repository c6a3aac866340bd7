"""What one RL run of ``sac_spectral.train`` holds and saves: its envs, agent, replay buffer,
counters and evaluations, its run directory, and the checkpoint layout (:data:`CHECKPOINT_FORMAT`)
that :func:`check_format` guards for every reader (resume, ``diagnose``, ``load_policy``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from sac_spectral.agents import ReplayBuffer, agent_class, build_agent
from sac_spectral.agents.plasticity import PlasticityProbes
from sac_spectral.apps.rl.compile_choice import program_key, resolve_compile
from sac_spectral.apps.rl.config import TrainConfig, run_tag, seed_label
from sac_spectral.apps.rl.kind import KIND
from sac_spectral.core.config import ConfigError, one_line
from sac_spectral.core.seeding import SeedStreams, derive_seed
from sac_spectral.core.threads import ThreadWatch
from sac_spectral.envs import EnvPool, UnknownEnvError
from sac_spectral.envs.evaluate import eval_env_seed
from sac_spectral.envs.tasks import Stage, TaskError, describe_dynamics, physics_errors, stage_env
from sac_spectral.runs.cli import recorded_config, set_torch_threads
from sac_spectral.runs.layout import SUMMARY
from sac_spectral.runs.logger import RunLogger, state_is_finite, tensor_is_finite
from sac_spectral.runs.memory import check_fits
from sac_spectral.runs.run import Failed, Finished
from sac_spectral.runs.rundir import open_run_dir, reopen_run_dir
from sac_spectral.runs.video import gl_backend, render, use_offscreen_rendering

#: version of the checkpoint layout; 2: members stored like nn.Linear, actor heads, priming
CHECKPOINT_FORMAT = 2


def check_format(state: dict[str, Any]) -> None:
    """``ValueError`` for a checkpoint of another layout (the runners report it in one line)."""
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"its layout is format {state.get('format')!r}, this version reads format {CHECKPOINT_FORMAT} "
            "(format 1 predates the nn.Linear weight layout and the actor's separate heads); start a new run"
        )


def describe(cfg: TrainConfig, seeds: Sequence[int], threads: str) -> str:
    """One line: what a run of ``cfg`` does."""
    regs = {net: "+".join(r["name"] for r in getattr(cfg, net).regularizers) or "none" for net in ("actor", "critic")}
    parts = [
        cfg.agent, cfg.env, f"seed{'s' if len(seeds) > 1 else ''} {seed_label(seeds)[1:]}",
        f"{cfg.total_steps} steps{simulator_steps(cfg.total_steps, cfg.action_repeat)} at replay ratio "
        f"{cfg.replay_ratio:g} after {cfg.random_steps} random",
        f"regularizers actor: {regs['actor']}, critic: {regs['critic']}",
    ]
    if cfg.resets.every:
        parts.append(f"resets ({cfg.resets.what}) every {cfg.resets.every}")
    if cfg.resets.at:
        parts.append(f"resets ({cfg.resets.what}) at {', '.join(map(str, cfg.resets.at))}")
    if cfg.priming.updates:
        parts.append(f"priming {cfg.priming.updates} updates on the first {cfg.priming.transitions} transitions")
    if cfg.tasks:
        seq = cfg.sequence()
        names = ", ".join(t.name for t in seq.tasks)
        parts.append(f"{len(seq)} stages of {seq.steps_per_task} steps: {names}"
                     + (f" × {seq.cycles} cycles" if seq.cycles > 1 else ""))
    parts.append(f"{cfg.device}, {threads}")
    return " | ".join(parts)


def run_seeds(cfg: TrainConfig) -> list[int]:
    """The seeds of a run of ``cfg``, one per member."""
    return [cfg.seed + i for i in range(cfg.num_seeds)]


def simulator_steps(steps: int, action_repeat: int) -> str:
    """`` (N simulator steps at action_repeat k)`` where a step (an action of the agent) advances the
    simulator ``k > 1`` times, else nothing."""
    return f" ({steps * action_repeat} simulator steps at action_repeat {action_repeat})" if action_repeat > 1 else ""


def no_updates(cfg: TrainConfig) -> str | None:
    """The warning for a run of ``cfg`` that does no update (only random warm-up), else None."""
    if cfg.total_updates > 0:
        return None
    why = (f"total_steps={cfg.total_steps} <= random_steps={cfg.random_steps}" if cfg.total_steps <= cfg.random_steps
           else f"total_steps={cfg.total_steps} at replay_ratio={cfg.replay_ratio:g} after "
                f"random_steps={cfg.random_steps}")
    return f"{why}: this run does 0 updates (only random warm-up); lower random_steps to train"


def finished_message(path: Path, step: int, cfg: TrainConfig) -> str | None:
    """The line that says the run of ``cfg`` in ``path`` is done — its checkpoint at ``total_steps``
    and its ``summary.json`` of that step — or None; it names the key that extends the run (a task
    sequence's ``cycles``, else ``total_steps``)."""
    try:
        summary = json.loads((path / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    if step != cfg.total_steps or not isinstance(summary, dict) or summary.get("steps") != step:
        return None
    final = summary.get("final_eval_return")
    result = f" (final eval return {final:.1f})" if isinstance(final, (int, float)) else ""
    key, value = ("cycles", cfg.cycles) if cfg.tasks else ("total_steps", cfg.total_steps)
    return (f"{path} is finished at step {step} of {cfg.total_steps}{result}; nothing changed. "
            f"To extend it: --resume {path} {key}=N with N > {value}")


class RLRun:
    """What one RL run holds — envs, agent, buffer, counters, evaluations — and its run directory
    and checkpoint state (the :class:`~sac_spectral.runs.run.Loop` side that is not the loop)."""

    kind = KIND.name

    def __init__(self, cfg: TrainConfig, threads: str | None = None) -> None:
        limit = torch.get_num_threads()
        self.cfg, self.device = cfg, torch.device(cfg.device)
        self.threads = set_torch_threads(cfg.threads) if threads is None else threads
        self.thread_watch = ThreadWatch(limit) if cfg.threads == 0 and self.device.type == "cpu" else None
        self.seeds = run_seeds(cfg)
        gl_backend()  # a MUJOCO_GL that dm_control cannot import with is one line, not its traceback
        if cfg.video_every:
            use_offscreen_rendering()  # before the first dm_control env is made
        self.sequence, self.step = cfg.sequence(), 0
        self._eval_envs: dict[int, tuple[int, list[gym.Env]]] = {}  # task -> (stage, its envs per seed)
        try:
            self.pool = EnvPool(cfg.env, self.seeds, cfg.action_repeat, envs=self.stage_envs(self.sequence.stage(0)))
            self._check_shapes()
        except (UnknownEnvError, TaskError) as err:
            raise ConfigError(f"{'tasks' if cfg.tasks else 'env'}: {err}") from None
        check_fits(agent_class(cfg.agent).memory_estimate(cfg, self.pool.obs_dim, self.pool.act_dim), self.device,
                   "buffer_size, batch_size, replay_ratio, num_seeds or the hidden widths")
        if cfg.video_every:  # fail now, not at the first video, where the env or OpenGL cannot render
            self.eval_envs[0].reset(seed=eval_env_seed(self.seeds[0]))
            render(self.eval_envs[0])
        self.streams = SeedStreams(self.seeds, self.device)
        # torch's global generator, which the package never draws from (its draws are the streams'),
        # seeded for an agent that does: the same run draws the same, and checkpoints restore it
        torch.manual_seed(derive_seed(cfg.seed, "torch/global"))
        #: what the compiled programs are specialised to (:func:`program_key`)
        self.compile_key = program_key(cfg, self.pool.obs_dim, self.pool.act_dim)
        choice, fallback = resolve_compile(cfg, self.device, self.compile_key)
        if choice is not None:
            print(choice, file=sys.stderr, flush=True)
        #: told at the start of training and recorded in the summary
        self.warnings = [w for w in (fallback, no_updates(cfg)) if w is not None]
        self.warnings += agent_class(cfg.agent).run_warnings(cfg)
        self.agent = build_agent(self.pool.obs_dim, self.pool.act_dim, cfg, self.streams, self.device)
        self.plasticity = PlasticityProbes(self.agent, self.seeds)  # θ₀: before a resume loads its state
        self.buffer = ReplayBuffer(cfg.buffer_size, self.pool.obs_dim, self.pool.act_dim, cfg.num_seeds, self.device,
                                   cfg.reward_scaling())
        self.step = self.primed = self.diagnosed = self.last_reset = 0
        self.switches: list[dict[str, Any]] = []  # per task switch: its step, the stage ended, diagnostics
        self.evals: list[dict[str, Any]] = []
        self.random_return: list[float] | None = None
        self.priming_report: dict[str, dict[str, list[float]]] = {}
        #: the value scale at the end of the run (``diagnostics.q_scale``), per seed
        self.q_scale_end: dict[str, list[float]] | None = None
        self.wall_time = 0.0
        self.last_info: dict[str, torch.Tensor] = {}
        self.update_metrics: dict[str, torch.Tensor] = {}  # of the last update before a log (PlasticityProbes)
        self.run_dir: Path | None = None
        self.logger: RunLogger | None = None
        self.postfix: dict[str, str] = {}
        self.failure: str | None = None  # why the run ended failed (its checkpoint cannot be resumed)

    # ----------------------------------------------------------------------------- stages
    def stage_envs(self, stage: Stage) -> list[gym.Env]:
        """The training envs of ``stage``, one per seed (stage 0's seeded as a plain run's)."""
        return [stage_env(stage, s, s if stage.index == 0 else derive_seed(s, f"stage/{stage.index}/env") % 2**31,
                          self.cfg.action_repeat) for s in self.seeds]

    def stage(self) -> Stage:
        """The stage the agent trains in: at a switch step, the one that just ended."""
        return self.sequence.ending(self.step)

    def warming_up(self, step: int) -> bool:
        """Whether the agent after env step ``step`` has had no update yet in the stage it trains in
        (that stage's warm-up: random actions, the networks as the stage before left them)."""
        start = self.sequence.ending(step).index * self.sequence.steps_per_task
        return self.cfg.updates_after(step) == self.cfg.updates_after(start)

    def eval_envs_of(self, task: int) -> list[gym.Env]:
        """Evaluation envs of task ``task`` as its latest begun stage drew it (its first before)."""
        stage = self.sequence.latest(task, max(self.step - 1, 0))
        if self._eval_envs.get(task, (-1,))[0] != stage.index:
            self._eval_envs[task] = (stage.index,
                                     [stage_env(stage, s, eval_env_seed(s),
                                                self.cfg.action_repeat) for s in self.seeds])
        return self._eval_envs[task][1]

    @contextmanager
    def simulating(self, stage: Stage) -> Iterator[None]:
        """Step envs of ``stage``: a simulator whose state blows up (:func:`physics_errors`) ends the
        run with :class:`Failed`, naming the stage and its dynamics."""
        try:
            yield
        except physics_errors() as err:
            self.failure = (f"the simulator failed in stage {stage.index} (task {stage.spec.name}, dynamics "
                            f"{describe_dynamics(stage.spec.dynamics)}): {one_line(err, 120)}")
            raise Failed(self.failure) from None

    @property
    def eval_envs(self) -> list[gym.Env]:
        """Evaluation envs of the current task."""
        return self.eval_envs_of(self.stage().task)

    def _check_shapes(self) -> None:
        """Every task's envs take the first task's observations and actions (built now: a config
        that cannot run fails before its run directory exists)."""
        for i, task in enumerate(self.sequence.tasks):
            env = self.eval_envs_of(i)[0]
            shapes = (env.observation_space.shape, env.action_space.shape)
            if shapes != ((self.pool.obs_dim,), (self.pool.act_dim,)):
                raise TaskError(f"task {task.name} ({task.env}) has observations {shapes[0]} and actions {shapes[1]}, "
                                "the first "
                                f"task ({self.sequence.tasks[0].env}) ({self.pool.obs_dim},) and "
                                f"({self.pool.act_dim},); "
                                "a sequence's tasks must share their shapes (tasks of one domain)")

    # ----------------------------------------------------------------------------- run directory
    def open_new(self) -> Path:
        slug = self.cfg.env.replace(":", "-").replace("/", "-")
        self.run_dir = open_run_dir(self.cfg, self.kind, f"{slug}__{run_tag(self.cfg)}__{seed_label(self.seeds)}")
        self.logger = RunLogger(self.run_dir, self.cfg.num_seeds)
        return self.run_dir

    def open_resume(self, path: Path) -> None:
        """Load the run in ``path``; a finished one (nothing to do) raises :class:`Finished` before
        anything is written."""
        self.load_state_dict(reopen_run_dir(self.cfg, path))
        self.run_dir = path
        done = finished_message(path, self.step, self.cfg)
        if done is not None:
            raise Finished(done)
        self.logger = RunLogger(path, self.cfg.num_seeds, purge_step=self.step + 1)

    def position(self) -> str:
        if self._priming_due():
            return f"step {self.step} (priming update {self.primed} of {self.cfg.priming.updates})"
        return f"step {self.step}"

    @staticmethod
    def describe_config(cfg: TrainConfig, threads: str) -> str:
        return describe(cfg, run_seeds(cfg), threads)

    def _priming_due(self) -> bool:
        return self.step >= self.cfg.priming.transitions and self.primed < self.cfg.priming.updates

    # ----------------------------------------------------------------------------- state
    _COUNTERS = ("step", "primed", "diagnosed", "last_reset")

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT, "config": recorded_config(self.cfg),
            **{key: getattr(self, key) for key in self._COUNTERS},
            "agent": self.agent.full_state_dict(), "buffer": self.buffer.state_dict(),
            "streams": self.streams.state_dict(), "pool": self.pool.state_dict(), "torch_rng": torch.get_rng_state(),
            "evals": self.evals, "switches": self.switches, "random_return": self.random_return,
            "priming_report": self.priming_report,
            "wall_time": self.wall_time, "failure": self.failure,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_format(state)
        if state.get("failure"):
            raise ConfigError(f"this run ended at step {state['step']} because {state['failure']}; a resume would "
                              "fail the same way: start a new run with milder dynamics")
        step, cfg = int(state["step"]), self.cfg
        if step > cfg.total_steps and cfg.tasks:
            raise ConfigError(f"cycles={cfg.cycles} ends the run at step {cfg.total_steps}, before its current step "
                              f"{step}; "
                              f"give cycles >= {-(-step // (len(cfg.tasks) * cfg.steps_per_task))}")
        if step > cfg.total_steps:
            raise ConfigError(f"total_steps={cfg.total_steps} is below the run's current step {step}; give total_steps "
                              f">= {step}")
        for key in self._COUNTERS:
            setattr(self, key, int(state[key]))
        if self.sequence.stage_at(self.step).index > 0:
            self.pool.replace(self.stage_envs(self.sequence.stage_at(self.step)))
        self.agent.load_full_state_dict(state["agent"])
        self.buffer.load_state_dict(state["buffer"])
        self.streams.load_state_dict(state["streams"])
        if not self.pool.load_state_dict(state["pool"]):
            print("note: this env's state cannot be restored exactly; the resumed run starts a new episode",
                  file=sys.stderr)
        torch.set_rng_state(state["torch_rng"])
        self.evals, self.random_return = list(state["evals"]), state["random_return"]
        self.switches = list(state.get("switches", []))
        self.priming_report, self.wall_time = dict(state["priming_report"]), float(state["wall_time"])

    def finite(self) -> bool:
        """Networks, optimizer state, α and regularizer state are finite (the replay buffer holds
        what the envs returned and is not checked)."""
        return state_is_finite(self.agent.full_state_dict()) and tensor_is_finite(self.agent.metrics())
