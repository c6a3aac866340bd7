"""The update engine: compiled updates, one call each or in blocks, equal eager ones for every
intervention, because one loop sequences both (an intervention's ``after_step`` before the step's
``after()``, such as the Polyak step of the targets)."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import named_noise
from sac_spectral.agents import REDQ, SAC, TD3, ReplayBuffer
from sac_spectral.agents.steps import BATCH, draw_shapes, intervenes
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.seeding import SeedStreams

INTERVENTIONS = {
    "none": None,
    "reset": {"name": "reset", "every": 2},
    "shrink_perturb": {"name": "shrink_perturb", "shrink": 0.5, "sigma": 1e-2, "every": 2},
    "redo": {"name": "redo", "tau": 0.5, "every": 2},
    "cbp": {"name": "cbp", "replacement_rate": 0.3, "maturity_threshold": 1},
    "nap": {"name": "nap"},
    "plasticity_injection": {"name": "plasticity_injection", "at_step": 3},
}
#: the bound the comparisons hold (parameters, targets, Adam state, metrics). In float64, so that
#: the last-bit differences of inductor's kernels from ATen's (tanh, exp: 1 ulp) stay far below it:
#: in float32, Adam turns them into lr-sized steps wherever a gradient is as small as its rounding.
ATOL = 1e-6


def _buffer(seeds: int, obs: int = 5, act: int = 2, n: int = 64) -> ReplayBuffer:
    g = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(n, obs, act, seeds)
    for _ in range(n):
        buf.add(torch.randn(seeds, obs, generator=g), torch.rand(seeds, act, generator=g) * 2 - 1,
                torch.randn(seeds, generator=g), torch.randn(seeds, obs, generator=g), torch.zeros(seeds))
    return buf


def _config(agent: str, intervention: str, **kw) -> TrainConfig:
    cfg = TrainConfig(agent=agent, **kw)
    cfg.critic.num_critics, cfg.redq.policy_delay = (4, 2) if agent == "redq" else (2, 20)
    spec = INTERVENTIONS[intervention]
    for net in (cfg.actor, cfg.critic):
        net.hidden = [16, 16]
        net.layer_norm = intervention == "nap"
        net.regularizers = [{"name": "spectral", "coef": 1e-2}] + ([dict(spec)] if spec else [])
    return cfg


def _train(cls: type, cfg: TrainConfig, calls: int = 3, count: int = 3):
    """``calls`` calls of ``train_steps(buf, count, 16)`` on two seeds (the first with a
    ``before_last`` hook); the metrics of every call, the update numbers each intervention's
    ``after_step`` saw and those the hook saw."""
    agent = cls(5, 2, cfg, SeedStreams([0, 1]))
    seen: dict[str, list[int]] = {}
    for net, t in agent.trained.items():
        for reg in filter(intervenes, t.regularizers):
            key, original = f"{net}/{reg.name}", reg.after_step
            seen[key] = []
            reg.after_step = lambda u, key=key, original=original: (seen[key].append(u), original(u))[1]
    buf = _buffer(2)
    hooks: list[int] = []
    infos = [agent.train_steps(buf, count, 16, before_last=lambda: hooks.append(agent.num_updates))]
    infos += [agent.train_steps(buf, count, 16) for _ in range(calls - 1)]
    seen["before_last"] = hooks
    return agent, infos, seen


def _assert_equal(comp, eager, comp_infos, eager_infos) -> None:
    for (name, p), q in zip(comp.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}")
    for net, t in eager.trained.items():
        mine = comp.trained[net].optimizer
        for p, q in zip((p for g in mine.param_groups for p in g["params"]),
                        (q for g in t.optimizer.param_groups for q in g["params"])):
            assert mine.state[p].keys() == t.optimizer.state[q].keys()
            for key in mine.state[p]:
                torch.testing.assert_close(mine.state[p][key], t.optimizer.state[q][key], rtol=0, atol=ATOL)
    for mine, ref in zip(comp_infos, eager_infos, strict=True):
        assert mine.keys() == ref.keys()
        for key in ref:
            torch.testing.assert_close(mine[key], ref[key], rtol=1e-5, atol=1e-5)
    assert comp.metrics().keys() == eager.metrics().keys()
    for key, value in eager.metrics().items():
        torch.testing.assert_close(comp.metrics()[key], value, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize(("cls", "intervention"), [(cls, i) for cls in (SAC, TD3) for i in INTERVENTIONS]
                         + [(REDQ, "none"), (REDQ, "shrink_perturb")], ids=lambda v: getattr(v, "name", v))
def test_compiled_and_blocks_equal_eager_for_every_intervention(cls, intervention):
    """SAC and TD3 (and REDQ: 4 critics, a random 2 in the target) with a spectral penalty and an
    intervention on actor and critic: compiled
    updates in blocks of 3 (where nothing intervenes; one program call per update otherwise)
    equal eager ones on every parameter and target, Adam state, every call's metrics and the
    regularizers' state, and every ``after_step`` sees the same update numbers."""
    name = cls.name
    eager, eager_infos, eager_seen = _train(cls, _config(name, intervention))
    comp, comp_infos, comp_seen = _train(cls, _config(name, intervention, compile=True, compile_block=3))
    assert comp.num_updates == eager.num_updates == 9
    assert comp_seen.pop("before_last") == eager_seen.pop("before_last") == [2]
    assert comp_seen == eager_seen
    for key, seen in eager_seen.items():  # after the network's own steps (TD3's, REDQ's actor: delayed)
        assert seen == [u for u in range(1, 10) if key.split("/")[0] in {step.net for step in eager.steps(u)}]
    assert comp._block_size(3) == (3 if intervention == "none" else 1)
    _assert_equal(comp, eager, comp_infos, eager_infos)
    if intervention == "none":
        return
    resumed = cls(5, 2, _config(name, intervention), SeedStreams([0, 1]))
    resumed.load_full_state_dict(copy.deepcopy(comp.full_state_dict()))  # as a checkpoint file: no shared tensors
    g = torch.Generator().manual_seed(1)
    batch = {k: v.transpose(0, 1)[0] for k, v in _buffer(2).gather(torch.randint(64, (2, 1, 16), generator=g)).items()}
    noise = named_noise(eager, torch.randn(3, 2, 16, 2, generator=g))
    _assert_equal(resumed, eager, [resumed.update(batch, noise)], [eager.update(batch, noise)])


HEAD_CASES = {
    "sac-categorical-hl_gauss": (SAC, {"head": "categorical", "num_atoms": 11, "v_min": -3.0, "v_max": 3.0,
                                       "projection": "hl_gauss"}),
    "td3-quantile-drop_top": (TD3, {"head": "quantile", "num_quantiles": 5, "drop_top": 1}),
    "redq-categorical-two_hot": (REDQ, {"head": "categorical", "num_atoms": 11, "v_min": -3.0, "v_max": 3.0}),
}


@pytest.mark.slow
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("case", list(HEAD_CASES))
def test_compiled_and_blocks_equal_eager_for_the_distributional_heads(case):
    """A categorical head (HL-Gauss or two-hot projection) and a quantile head (TQC's truncation) with
    the spectral penalty: compiled updates in blocks of 3 equal eager ones on every parameter and
    target, Adam state and every call's metrics."""
    cls, head = HEAD_CASES[case]

    def config(**kw) -> TrainConfig:
        cfg = _config(cls.name, "none", **kw)
        for key, value in head.items():
            setattr(cfg.critic, key, value)
        return cfg

    eager, eager_infos, _ = _train(cls, config())
    comp, comp_infos, _ = _train(cls, config(compile=True, compile_block=3))
    assert comp._block_size(3) == 3
    _assert_equal(comp, eager, comp_infos, eager_infos)


SPECTRAL_OPTIONS = {
    "init-k1": {"target": "init", "k": 1.0},
    "no-bias-hidden": {"bias": False, "layers": "hidden", "target": "init"},
}


@pytest.mark.slow
@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("options", list(SPECTRAL_OPTIONS), ids=str)
def test_compiled_equals_eager_for_the_spectral_options(options):
    """The spectral regularizer's ``target``, ``bias``, ``k`` and ``layers`` options on SAC's actor
    and critics: compiled updates in blocks of 3 equal eager ones, and the recorded targets are in
    the regularizers' state, which a resumed agent continues from."""
    def config(**kw) -> TrainConfig:
        cfg = _config("sac", "none", **kw)
        for net in (cfg.actor, cfg.critic):
            net.regularizers = [{"name": "spectral", "coef": 1e-2, **SPECTRAL_OPTIONS[options]}]
        return cfg

    eager, eager_infos, _ = _train(SAC, config())
    comp, comp_infos, _ = _train(SAC, config(compile=True, compile_block=3))
    _assert_equal(comp, eager, comp_infos, eager_infos)
    assert all("sigma0" in t.regularizers[0].state_dict() for t in eager.trained.values())
    resumed = SAC(5, 2, config(), SeedStreams([0, 1]))
    resumed.load_full_state_dict(copy.deepcopy(comp.full_state_dict()))
    g = torch.Generator().manual_seed(1)
    batch = {k: v.transpose(0, 1)[0] for k, v in _buffer(2).gather(torch.randint(64, (2, 1, 16), generator=g)).items()}
    noise = named_noise(eager, torch.randn(3, 2, 16, 2, generator=g))
    _assert_equal(resumed, eager, [resumed.update(batch, noise)], [eager.update(batch, noise)])


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_an_agent_state_of_the_earlier_layout_loads_and_trains_on_as_it_did(name):
    """``data/agent_state_v1.pt``: SAC's and TD3's state in the layout before the engine (one key per
    network's optimizer and regularizers, TD3's last actor loss apart; 8-8 networks, a spectral
    penalty and shrink & perturb on the critic, the paper's spectral penalty on the actor, after 3
    updates), the batch and noise of a 4th
    update and what that update gave then. Loaded now, the same update gives the same networks."""
    saved = torch.load(Path(__file__).parent / "data" / "agent_state_v1.pt", weights_only=False)[name]
    cfg = TrainConfig(agent=name)
    cfg.actor.hidden = cfg.critic.hidden = [8, 8]
    cfg.critic.regularizers = [{"name": "spectral", "coef": 1e-2}, {"name": "shrink_perturb", "every": 2}]
    cfg.actor.regularizers = [{"name": "spectral"}]
    agent = {"sac": SAC, "td3": TD3}[name](3, 1, cfg, SeedStreams([0]))
    agent.load_full_state_dict(saved["state"])
    assert agent.num_updates == 3
    info = agent.update(saved["batch"], named_noise(agent, saved["noise"]))
    for key, value in saved["after"].items():
        torch.testing.assert_close(agent.state_dict()[key], value, rtol=0, atol=1e-7)
    for key, value in saved["info"].items():  # float32 losses: a few ulps apart across CPUs' vector widths
        torch.testing.assert_close(info[key], value, rtol=1e-6, atol=1e-6)


def test_an_update_draws_its_names_from_each_seeds_stream_in_the_declared_order():
    """REDQ declares ``next_action`` and ``action`` per example and ``subset`` (one normal per critic):
    the updates of a call draw them from each seed's ``sample`` stream, update after update and name
    after name, so seed 7 of a two-seed agent draws what an agent of seed 7 alone draws."""
    cfg = _config("redq", "none")
    pair, alone = REDQ(5, 2, cfg, SeedStreams([3, 7])), REDQ(5, 2, cfg, SeedStreams([7]))
    assert pair.draws == {"next_action": (BATCH, 2), "action": (BATCH, 2), "subset": (4,)}
    noise = pair.draw_noise(3, 16)
    assert {k: tuple(v.shape) for k, v in noise.items()} == {"next_action": (3, 2, 16, 2), "action": (3, 2, 16, 2),
                                                             "subset": (3, 2, 4)}
    flat = torch.randn(3, 2 * 16 * 2 + 4, generator=SeedStreams([7])["sample"][0])
    for name, start, end in (("next_action", 0, 32), ("action", 32, 64), ("subset", 64, 68)):
        assert torch.equal(noise[name][:, 1].flatten(1), flat[:, start:end])
    assert all(torch.equal(noise[k][:, 1], v[:, 0]) for k, v in alone.draw_noise(3, 16).items())
    with pytest.raises(ValueError, match="the batch axis can only be the first"):
        draw_shapes({"mask": (3, BATCH)}, 16)


@pytest.mark.slow
@pytest.mark.usefixtures("float64")
def test_compiled_residual_networks_with_the_spectral_penalty_equal_eager():
    """TD3 with a SimBa actor and a BroNet critic under the paper's spectral regularizers (their
    LayerNorm gains pulled toward 1, the residual streams' weights toward σ_max 1): compiled, with
    compile_block=2, equals eager. Inductor's CPU outer-loop fusion crashed compiling these."""
    def config(**kw) -> TrainConfig:
        cfg = TrainConfig(agent="td3", **kw)
        cfg.actor.arch, cfg.critic.arch = "simba", "bronet"
        cfg.actor.hidden = cfg.critic.hidden = [16, 16]
        cfg.actor.regularizers = [{"name": "spectral"}]
        cfg.critic.regularizers = [{"name": "spectral"}]
        return cfg

    eager, eager_infos, _ = _train(TD3, config(), calls=2, count=2)
    comp, comp_infos, _ = _train(TD3, config(compile=True, compile_block=2), calls=2, count=2)
    _assert_equal(comp, eager, comp_infos, eager_infos)


def test_the_compiled_backend_imports_inductor_without_torchs_deprecation_warnings():
    """Inductor's passes import ``torch.utils.mkldnn``, whose TorchScript classes warn 14 times
    (torch 2.13): a compiled run's first program does not print them, even with every warning on."""
    code = "import sac_spectral.agents.compiled as c; c._import_inductor(); import torch.utils.mkldnn"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, check=True)
    assert "script_method" not in proc.stderr, proc.stderr
