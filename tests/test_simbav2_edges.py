"""SimbaV2 where something other than the optimizer writes the weights: after every intervention
that writes them (shrink & perturb, ReDo, CBP, the reset regularizer, plasticity injection) and
after the engine's resets (``resets.*``, ``on_switch.reset: all | last:k``) every weight row is back
on the unit sphere, eager and compiled alike, and bf16 copies follow what the intervention left;
the reward scale's running return restarts where a task switch cuts the episodes."""

import pytest
import torch

from sac_spectral.agents import SAC, ReplayBuffer
from sac_spectral.agents.reward_scale import RewardScale
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.config import from_dict
from sac_spectral.core.hyperspherical import SphereLinear
from sac_spectral.core.seeding import SeedStreams
from test_engine import _assert_equal, _buffer, _train

#: each intervention that writes weights, acting at update 2
INTERVENTIONS = {
    "shrink_perturb": {"shrink": 0.1, "sigma": 0.1, "every": 2},
    "redo": {"tau": 0.9, "every": 2},
    "cbp": {"replacement_rate": 0.5, "maturity_threshold": 1},
    "reset": {"every": 2, "last": 1},
    "plasticity_injection": {"at_step": 2, "levels": 1},
}


def _agent(arch: str, regularizers: list, precision: str = "fp32") -> SAC:
    cfg = from_dict(TrainConfig, {"precision": precision, "compile": False,
                                  "critic": {"hidden": [16, 16], "arch": arch, "regularizers": regularizers},
                                  "actor": {"hidden": [16, 16], "arch": arch, "regularizers": regularizers}})
    return SAC(5, 2, cfg, SeedStreams([0, 1]))


def _row_norm_error(nets) -> float:
    return max((m.weight.norm(dim=-1) - 1).abs().max().item()
               for net in nets for m in net.modules() if isinstance(m, SphereLinear))


def _stale_copies(agent: SAC) -> list[int]:
    """The places of the bf16 copies of the trained networks that differ from their masters."""
    return [i for name in agent.trained for i, (master, copy) in
            enumerate(zip(agent.precision.copies[name].masters, agent.precision.copies[name].copies))
            if not torch.equal(master.detach().to(torch.bfloat16), copy)]


@pytest.mark.usefixtures("bf16_configs")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(INTERVENTIONS))
def test_rows_are_back_on_the_sphere_after_each_intervention(name, precision):
    """Two updates, the second with the intervention on actor and critic: every row has norm 1
    within 1e-6 (shrink & perturb left them 0.19 off, ReDo 0.56); bf16 copies equal their masters."""
    agent = _agent("simbav2", [{"name": name, **INTERVENTIONS[name]}], precision)
    agent.train_steps(_buffer(2), 2, 16)
    assert _row_norm_error(agent.nets().values()) < 1e-6
    if precision == "bf16":
        assert _stale_copies(agent) == []


@pytest.mark.usefixtures("bf16_configs")
@pytest.mark.parametrize("arch", ["mlp", "simbav2"])
def test_bf16_copies_follow_what_an_intervention_wrote(arch):
    """The next update's forward uses the weights shrink & perturb left, not the optimizer's (the
    copies were re-cast before the intervention ran)."""
    agent = _agent(arch, [{"name": "shrink_perturb", "shrink": 0.5, "sigma": 0.0, "every": 1}], "bf16")
    agent.train_steps(_buffer(2), 1, 16)
    assert _stale_copies(agent) == []


@pytest.mark.parametrize("last", [None, 1])
def test_a_reset_leaves_rows_on_the_sphere_and_targets_equal_to_them(last):
    """``agent.reset`` (``resets.*`` and ``on_switch.reset``: all, or the last level) after rows
    moved: the rows are on the sphere and the reset levels' targets equal them."""
    agent = _agent("simbav2", [])
    agent.train_steps(_buffer(2), 2, 16)
    with torch.no_grad():
        for p in agent.critic.parameters():
            p.mul_(1.5)
    agent.reset(last)
    assert _row_norm_error([agent.actor]) < 1e-6 and _row_norm_error(agent.critic.tail(last)) < 1e-6
    for ours, theirs in zip(agent.critic.tail(last), agent.target_critic.tail(last)):
        for p, q in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(p, q)


@pytest.mark.slow
@pytest.mark.usefixtures("float64")
def test_compiled_equals_eager_with_interventions_on_simbav2():
    """Shrink & perturb and ReDo on SimbaV2's critic: a compiled program ends at each intervening
    step, the engine projects after it as eager does, and the networks equal eager's."""
    regs = [{"name": "shrink_perturb", "shrink": 0.1, "sigma": 0.1, "every": 2}, {"name": "redo", "every": 3}]

    def config(compiled: bool) -> TrainConfig:
        cfg = TrainConfig(compile=compiled)
        for net in (cfg.actor, cfg.critic):
            net.arch, net.hidden, net.regularizers = "simbav2", [16, 16], []
        cfg.critic.regularizers = regs
        return cfg

    eager, eager_infos, _ = _train(SAC, config(False), calls=2, count=3)
    comp, comp_infos, _ = _train(SAC, config(True), calls=2, count=3)
    _assert_equal(comp, eager, comp_infos, eager_infos)
    assert _row_norm_error(comp.nets().values()) < 1e-12


def test_episodes_cut_at_a_switch_restart_the_running_return_and_a_cleared_buffer_its_statistics():
    """``end_episodes`` (every task switch) zeroes ``G`` only, so the next step's ``G`` is its reward;
    ``clear`` (``on_switch.buffer: clear``) forgets the statistics too, as at a run's start."""
    buf = ReplayBuffer(8, 1, 1, 2, reward_scale=RewardScale(2, 0.9))
    for r in (1.0, 2.0, 3.0):
        buf.add(torch.zeros(2, 1), torch.zeros(2, 1), torch.full((2,), r), torch.zeros(2, 1), torch.zeros(2))
    buf.end_episodes()
    buf.add(torch.zeros(2, 1), torch.zeros(2, 1), torch.full((2,), 5.0), torch.zeros(2, 1), torch.zeros(2))
    state, returns = buf.reward_scale.state, torch.tensor([1.0, 2.9, 5.61, 5.0], dtype=torch.float64)  # 5, not 10.049
    assert torch.equal(state["G"], torch.full((2,), 5.0, dtype=torch.float64)) and state["count"] == 4
    torch.testing.assert_close(state["g_abs_max"], torch.full((2,), 5.61, dtype=torch.float64))
    torch.testing.assert_close(state["m2"] / state["count"], returns.var(unbiased=False).expand(2))
    buf.clear()
    fresh = RewardScale(2, 0.9)
    assert all(torch.equal(v, fresh.state[k]) for k, v in buf.reward_scale.state.items())
    ReplayBuffer(8, 1, 1, 2).end_episodes()  # without a reward scale: nothing to do

