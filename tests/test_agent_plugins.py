"""An agent from the user's own installed package (entry-point group ``sac_spectral.agents``), with
options of its own, as a user writes it: ``train agent=<name>``, its section in ``--help``,
``--resume``, ``play``, ``diagnose`` and ``load_policy`` all work on it with no import line in the
package; a broken agent plug-in costs one warning line, and an error only where it is asked for."""

import json
import sys

import pytest

from sac_spectral.agents import SAC, TD3, base
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.config import ConfigError, help_text, load_config, merge_sources, to_dict
from test_plugins import install, run

#: a user's agent: SAC whose temperature stays at its own option's value
AGENT = '''
import dataclasses

from sac_spectral.agents import SAC, register_agent
from sac_spectral.core.config import option


@dataclasses.dataclass
class FixedOptions:
    alpha: float = option(0.05, "the fixed temperature")


@register_agent("fixed_sac", config=FixedOptions)
class FixedSAC(SAC):
    def __init__(self, obs_dim, act_dim, cfg, streams, device="cpu"):
        cfg.alpha.learn, cfg.alpha.init = False, cfg.fixed_sac.alpha
        super().__init__(obs_dim, act_dim, cfg, streams, device)
'''
SMALL = ["env=dmc:cartpole-balance", "random_steps=60", "total_steps=100", "eval_every=50", "eval_episodes=1",
         "batch_size=16", "actor.hidden=[16, 16]", "critic.hidden=[16, 16]", "threads=1", "progress=false"]


@pytest.fixture
def plugins(tmp_path):
    points = "[sac_spectral.agents]\nfixed_sac = my_agents:FixedSAC\nbroken = not_there:Agent\n"
    return install(tmp_path / "plugins", "myagents", points, {"my_agents": AGENT})


@pytest.mark.slow
def test_an_installed_agent_trains_resumes_plays_and_is_diagnosed(plugins, tmp_path):
    help_text = run(plugins, tmp_path, "sac_spectral.train", "--help")
    assert "fixed_sac.alpha" in help_text.stdout and "the fixed temperature" in help_text.stdout
    rd = tmp_path / "run"
    done = run(plugins, tmp_path, "sac_spectral.train", "agent=fixed_sac", "fixed_sac.alpha=0.2", *SMALL,
               f"run_dir={rd}")
    assert done.returncode == 0, done.stderr
    assert "warning: sac_spectral.agents: 'broken' skipped" in done.stderr and done.stderr.count("warning:") == 1
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["steps"] == 100
    resumed = run(plugins, tmp_path, "sac_spectral.train", "--resume", str(rd), "total_steps=120")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((rd / "summary.json").read_text())["steps"] == 120
    played = run(plugins, tmp_path, "sac_spectral.play", str(rd), "--episodes", "1")
    assert played.returncode == 0 and "return" in played.stdout, played.stderr
    diagnosed = run(plugins, tmp_path, "sac_spectral.diagnose", str(rd))
    assert diagnosed.returncode == 0 and "grad_rank/critic/erank" in diagnosed.stdout, diagnosed.stderr
    loaded = run(plugins, tmp_path, "sac_spectral.play", str(rd), "--episodes", "1", "--stochastic")
    assert loaded.returncode == 0, loaded.stderr


def test_asking_for_a_broken_agent_is_one_line_that_says_why(plugins, tmp_path):
    done = run(plugins, tmp_path, "sac_spectral.train", "agent=broken", *SMALL, f"run_dir={tmp_path / 'x'}")
    assert done.returncode == 2 and not (tmp_path / "x").exists()
    last = done.stderr.strip().splitlines()[-1]
    assert "agent: 'broken' is unavailable" in last and "ModuleNotFoundError" in last


@pytest.fixture
def discover(tmp_path, monkeypatch):
    """``discover(package, entry_points, modules)``: install a package of agent plug-ins and discover
    the agents in this process; the registries and the imported modules are restored after."""
    agents, sections, imported = dict(base.AGENTS), dict(base.SECTIONS), set(sys.modules)
    monkeypatch.setattr(base, "_broken", None)

    def go(package: str, points: str, modules: dict[str, str]) -> dict[str, str]:
        install(tmp_path / package, package, f"[sac_spectral.agents]\n{points}", modules)
        monkeypatch.syspath_prepend(str(tmp_path / package))
        return base.discover_agents()

    yield go
    for registry, saved in ((base.AGENTS, agents), (base.SECTIONS, sections)):
        registry.clear()
        registry.update(saved)
    for name in set(sys.modules) - imported:
        del sys.modules[name]


#: a plug-in that names its agents like the built-ins
SAC_NAMED = """
from sac_spectral.agents import SAC, register_agent


@register_agent("sac")
class MySAC(SAC):
    pass
"""


def test_a_plugin_named_like_a_built_in_is_ignored_and_the_built_in_stays(discover, capsys):
    broken = discover("sac_named", "sac = sac_named:MySAC\ntd3 = sac_named:MySAC\n", {"sac_named": SAC_NAMED})
    assert broken == {} and base.AGENTS["sac"] is SAC and base.AGENTS["td3"] is TD3
    assert "sac_named" not in sys.modules  # never imported
    assert load_config(TrainConfig, overrides=["agent=sac"]).agent == "sac"
    assert base.agent_class("td3") is TD3
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 2, warnings
    for name, cls in (("sac", "sac_spectral.agents.sac:SAC"), ("td3", "sac_spectral.agents.td3:TD3")):
        line = next(line for line in warnings if f"'{name}' of" in line)
        assert line.startswith("warning: sac_spectral.agents: ") and "(package sac_named 0.1)" in line
        assert f"the built-in {cls} keeps that name" in line, line


#: a plug-in package of agents whose options no run config could hold, each as ``name: (options, why)``
BAD_OPTIONS = {
    "critic_opts": ("section='critic'", "config section 'critic' would replace the run config's key 'critic'"),
    "env_opts": ("section='env'", "config section 'env' would replace the run config's key 'env'"),
    "alpha_opts": ("section='alpha'", "config section 'alpha' is already registered (AlphaConfig)"),
    "no_default": ("", "no_default.rate: has no default"),
    "pair": ("", "pair.shape: unsupported config type tuple[int, int]"),
    "picky": ("", "picky.rate: must be > 1, got 0.5"),
}
BAD_AGENTS = """
import dataclasses

from sac_spectral.agents import SAC, register_agent
from sac_spectral.core.config import check, option


@dataclasses.dataclass
class Options:
    rate: float = option(0.5, "a rate")


@dataclasses.dataclass
class NoDefault:
    rate: float


@dataclasses.dataclass
class Pair:
    shape: tuple[int, int] = (1, 2)


@dataclasses.dataclass
class Picky:
    rate: float = 0.5

    def validate(self):
        check(self.rate > 1, "rate", f"must be > 1, got {self.rate}")


OPTIONS = {"critic_opts": Options, "env_opts": Options, "alpha_opts": Options, "no_default": NoDefault,
           "pair": Pair, "picky": Picky}
"""


def test_a_plugins_bad_options_cost_only_that_plugin(discover, capsys):
    """Options under a run key or another section, without a default, of a type the config cannot
    parse, or whose defaults their own validate() rejects: one warning each, naming the package;
    every other run (the built-ins', a good plug-in's) loads, and --help lists them."""
    modules = {f"bad_{name}": f"{BAD_AGENTS}\n@register_agent({name!r}, config=OPTIONS[{name!r}], {section})\n"
               f"class Agent(SAC):\n    pass\n" for name, (section, _) in BAD_OPTIONS.items()}
    points = "".join(f"{name} = bad_{name}:Agent\n" for name in BAD_OPTIONS)
    broken = discover("badopts", f"{points}fixed_sac = my_agents:FixedSAC\n", {**modules, "my_agents": AGENT})
    assert set(broken) == set(BAD_OPTIONS)
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == len(BAD_OPTIONS), warnings
    for name, (_, why) in BAD_OPTIONS.items():
        line = next(line for line in warnings if f"'{name}' skipped" in line)
        assert f"bad_{name}:Agent (package badopts 0.1) is broken" in line and why in line, line
    cfg = load_config(TrainConfig)
    assert cfg.critic.num_critics == 2 and cfg.env == "dmc:cheetah-run" and cfg.alpha.init == 1.0
    assert load_config(TrainConfig, overrides=["agent=fixed_sac", "fixed_sac.alpha=0.2"]).fixed_sac.alpha == 0.2
    listed = help_text(TrainConfig)
    assert "fixed_sac.alpha" in listed and "a rate" not in listed and ".shape" not in listed and "picky" not in listed


@pytest.mark.parametrize("overrides, error", [
    (["td3.policy_delay=3"], "td3.policy_delay is an option of agent td3; this run's agent is sac"),
    (["fixed_sac.alpha=0.1"], "fixed_sac.alpha is an option of agent fixed_sac; this run's agent is sac"),
    (["agent=td3", "alpha.init=0.5"],
     "alpha.init is an option of agents sac, crossq, droq, redq, fixed_sac; this run's agent is td3"),
    (["agent=crossq", "redq.num_min=3"], "redq.num_min is an option of agent redq; this run's agent is crossq"),
], ids=["td3", "plugin", "sac", "redq"])
def test_an_option_of_an_agent_the_run_does_not_use_is_refused(discover, overrides, error):
    discover("myagents", "fixed_sac = my_agents:FixedSAC\n", {"my_agents": AGENT})
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, overrides=overrides)
    assert str(err.value) == error


def test_the_options_an_agent_reads_and_every_agents_defaults_are_accepted(discover):
    """An agent reads its own section and those of the agents it extends; a saved config holds every
    section, at its defaults where the agent does not read it."""
    discover("myagents", "fixed_sac = my_agents:FixedSAC\n", {"my_agents": AGENT})
    assert base.AGENTS["redq"].sections == ("alpha", "redq")
    assert base.AGENTS["fixed_sac"].sections == ("alpha", "fixed_sac")
    assert load_config(TrainConfig, overrides=["agent=redq", "alpha.init=0.5", "redq.num_min=1"]).redq.num_min == 1
    assert load_config(TrainConfig,
                       overrides=["agent=fixed_sac", "alpha.lr=1e-3", "fixed_sac.alpha=0.1"]).alpha.lr == 1e-3
    assert load_config(TrainConfig, overrides=["td3.policy_delay=2"]).agent == "sac"  # the default: nothing lost
    for agent in ("sac", "td3", "redq", "crossq", "fixed_sac"):
        saved = to_dict(load_config(TrainConfig, overrides=[f"agent={agent}"]))
        assert {"alpha", "td3", "redq", "crossq", "fixed_sac"} <= set(saved)
        assert merge_sources(TrainConfig, saved).agent == agent


def test_help_lists_the_built_in_agents_and_the_installed_plugins(discover):
    discover("myagents", "fixed_sac = my_agents:FixedSAC\nbroken = not_there:Agent\n", {"my_agents": AGENT})
    line = next(line for line in help_text(TrainConfig).splitlines() if line.split()[0] == "agent")
    assert "the agent: sac, crossq, droq, redq, td3 (built in); plug-ins: fixed_sac [str; default: sac]" in line, line


#: a user's agent that draws from torch's global generator, as a user's first dropout agent does
GLOBAL_DRAWS = '''
import torch

from sac_spectral.agents import SAC, register_agent


@register_agent("jitter_sac")
class JitterSAC(SAC):
    def train_steps(self, *args, **kw):
        out = super().train_steps(*args, **kw)
        with torch.no_grad():
            for p in self.actor.parameters():
                p.add_(1e-3 * torch.randn_like(p))
        return out
'''


def _actor(run_dir):
    import torch

    from sac_spectral.runs.checkpoint import load_checkpoint
    from sac_spectral.runs.layout import CHECKPOINT

    modules = load_checkpoint(run_dir / CHECKPOINT)["agent"]["modules"]
    return {k: v for k, v in modules.items() if k.startswith("actor")}, torch


@pytest.mark.slow
def test_an_agent_drawing_from_the_global_generator_is_reproducible_and_resumable(tmp_path):
    """The run seeds torch's global generator from its seed and a checkpoint restores it: two
    identical runs of an agent that draws from it train alike, and a resumed run equals the straight
    one."""
    plugins = install(tmp_path / "plugins", "jitter", "[sac_spectral.agents]\njitter_sac = jitter_agents:JitterSAC\n",
                      {"jitter_agents": GLOBAL_DRAWS})
    args = ["agent=jitter_sac", *[a for a in SMALL if not a.startswith("total_steps")]]
    dirs = {name: tmp_path / name for name in ("a", "b", "split")}
    for name in ("a", "b"):
        assert run(plugins, tmp_path, "sac_spectral.train", *args, "total_steps=120",
                   f"run_dir={dirs[name]}").returncode == 0
    split = run(plugins, tmp_path, "sac_spectral.train", *args, "total_steps=90", f"run_dir={dirs['split']}")
    assert split.returncode == 0, split.stderr
    resumed = run(plugins, tmp_path, "sac_spectral.train", "--resume", str(dirs["split"]), "total_steps=120")
    assert resumed.returncode == 0, resumed.stderr
    (a, torch), (b, _), (c, _) = (_actor(dirs[n]) for n in ("a", "b", "split"))
    for key in a:
        assert torch.equal(a[key], b[key]), key
        assert torch.equal(a[key], c[key]), key
