"""SimbaV2: the network against its equations written out from the paper (float64, one member at a
time), its members independent, its weight rows on the unit sphere after every step (eager and
compiled, and compiled equal to eager), the reward scale against a direct computation, and a run
with both that resumes exactly, evaluates in the env's reward units, loads and is diagnosed."""

import csv
import math

import numpy as np
import pytest
import torch

from sac_spectral.agents import SAC, ReplayBuffer
from sac_spectral.agents.reward_scale import RewardScale
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.apps.rl.diagnose import load_run
from sac_spectral.apps.rl.policy import load_policy, play_episodes
from sac_spectral.core.config import ConfigError, merge_sources
from sac_spectral.core.hyperspherical import HypersphericalNet, SphereLinear
from sac_spectral.core.layers import layer_views
from sac_spectral.core.residual import make_network
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import Spectral
from test_engine import _assert_equal, _train
from test_train import FAST, _assert_same_state, _params, run

IN, W, BLOCKS = 6, 16, 2


def _net(members=3, blocks=BLOCKS, out=(2, 3)):
    gens = [torch.Generator().manual_seed(10 + m) for m in range(members)]
    return make_network("simbav2", members, IN, [W] * (blocks + 1), out, generators=gens)


def _n(v):
    return v / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp_min(1e-8)


def _reference(net, m, x):
    """Member ``m`` of ``net`` from the paper's equations, in float64: RSNorm, shift (c = 3) and
    l2-normalize, embed ``n(s ⊙ W x)``; LERP blocks ``n(h + α ⊙ (n(W₂ ReLU(s ⊙ W₁ h)) − h))``;
    heads ``W₂(s ⊙ W₁ h) + b``. Feature scalers have init = scale (their stored value is the
    scaler); α is stored at 1/√W and used times (1/(L+1)) / (1/√W)."""
    p = {k: v[m].double() for k, v in net.state_dict().items()}
    alpha = math.sqrt(W) / (BLOCKS + 1)
    x = (x.double() - p["input_norm.mean"]) / torch.sqrt(p["input_norm.var"] + 1e-8)
    x = _n(torch.cat([x, torch.full((x.shape[0], 1), 3.0, dtype=torch.float64)], dim=1))
    h = _n((x @ p["embed.weight"].T) * p["embed_scaler.weight"])
    for i in range(BLOCKS):
        b = f"blocks.{i}."
        u = torch.relu((h @ p[b + "linear_in.weight"].T) * p[b + "scaler.weight"])
        h = _n(h + alpha * p[b + "alpha.weight"] * (_n(u @ p[b + "linear_out.weight"].T) - h))
    heads = [{k: p[f"heads.{j}.{k}"] for k in ("linear_in.weight", "scaler.weight", "linear_out.weight",
                                                 "linear_out.bias")} for j in range(2)]
    return [((h @ q["linear_in.weight"].T) * q["scaler.weight"]) @ q["linear_out.weight"].T + q["linear_out.bias"]
            for q in heads]


def test_each_member_is_the_papers_network():
    net = _net()
    with torch.no_grad():  # scalers, α, biases and rows away from their initial values; statistics seen
        for p in net.parameters():
            p.mul_(1 + 0.3 * torch.rand_like(p)).add_(0.05 * torch.randn_like(p))
        net.project()
        net.observe(3 + 2 * torch.randn(3, 50, IN))
    x = torch.randn(3, 8, IN)
    out = net(x)
    worst = max((ours[m].double() - ref).abs().max().item()
                for m in range(3) for ours, ref in zip(out, _reference(net, m, x[m])))
    assert worst < 1e-5
    assert net.blocks[0]["linear_in"].weight.shape == (3, 4 * W, W) and net.embed.weight.shape == (3, W, IN + 1)


def test_scalers_start_at_the_papers_values_through_the_init_scale_reparameterization():
    net = _net()
    assert torch.allclose(net.embed_scaler.weight, torch.full((3, W), math.sqrt(2 / W)))
    assert torch.allclose(net.blocks[0]["scaler"].weight, torch.full((3, 4 * W), math.sqrt(2 / (4 * W))))
    alpha = net.blocks[1]["alpha"]
    assert torch.allclose(alpha.weight, torch.full((3, W), 1 / math.sqrt(W)))
    h = torch.ones(3, 1, W)
    assert torch.allclose(alpha(h), torch.full((3, 1, W), 1 / (BLOCKS + 1)))  # α = 1/(L+1) at init
    # Adam moves the stored value by ~lr: the used α moves (α_init/α_scale)·lr = √W/(L+1)·lr
    alpha(h).sum().backward()
    assert torch.allclose(alpha.weight.grad, torch.full((3, W), math.sqrt(W) / (BLOCKS + 1)))


def test_member_i_is_the_single_network_of_its_generator():
    batched = _net()
    single = make_network("simbav2", 1, IN, [W] * 3, (2, 3), generators=[torch.Generator().manual_seed(11)])
    obs = 2 + torch.randn(5, IN)
    for net in (batched, single):
        net.observe(obs.expand(net.members, -1, -1))
    for b, s in zip(batched(obs), single(obs)):
        assert torch.allclose(b[1], s[0], rtol=0, atol=1e-6)
    for name, p in single.named_parameters():
        assert torch.equal(dict(batched.named_parameters())[name][1], p[0]), name


def test_rows_start_on_the_sphere_and_views_regularizers_and_resets_see_every_layer():
    net = _net()
    spheres = [m for m in net.modules() if isinstance(m, SphereLinear)]
    assert len(spheres) == 1 + 2 * BLOCKS + 2 * 2
    assert all(torch.allclose(s.weight.norm(dim=-1), torch.ones(3, s.out_features)) for s in spheres)
    kinds = [v.kind for v in layer_views(net)]
    assert kinds.count("linear") == len(spheres) and kinds.count("norm") == 1 + 2 * BLOCKS + 2
    assert Spectral(net, coef=1.0).penalty().requires_grad
    assert set(map(id, net.tail(1))) == {id(m) for head in net.heads for m in head.values()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    net.reset_parameters([torch.Generator().manual_seed(99 + m) for m in range(3)])
    assert all(torch.allclose(s.weight.norm(dim=-1), torch.ones(3, s.out_features)) for s in spheres)
    assert torch.allclose(net.embed_scaler.weight, torch.full((3, W), math.sqrt(2 / W)))


def _simbav2_config(**kw) -> TrainConfig:
    cfg = TrainConfig(**kw)
    for net in (cfg.actor, cfg.critic):
        net.arch, net.hidden, net.regularizers = "simbav2", [16, 16], [{"name": "spectral"}]
    return cfg


def _row_norm_error(agent) -> float:
    return max((m.weight.norm(dim=-1) - 1).abs().max().item()
               for net in agent.nets().values() for m in net.modules() if isinstance(m, SphereLinear))


def test_every_weight_row_is_back_on_the_sphere_after_each_step(monkeypatch):
    buf = ReplayBuffer(64, 5, 2, 2)
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        buf.add(torch.randn(2, 5, generator=g), torch.rand(2, 2, generator=g) * 2 - 1, torch.randn(2, generator=g),
                torch.randn(2, 5, generator=g), torch.zeros(2))
    agent = SAC(5, 2, _simbav2_config(), SeedStreams([0, 1]))
    assert isinstance(agent.critic, HypersphericalNet) and isinstance(agent.actor, HypersphericalNet)
    agent.train_steps(buf, 3, 16)
    assert _row_norm_error(agent) < 1e-6
    monkeypatch.setattr(HypersphericalNet, "project", lambda self: None)  # without it, Adam moves rows off it
    agent.train_steps(buf, 3, 16)
    assert _row_norm_error(agent) > 1e-4


@pytest.mark.slow
@pytest.mark.usefixtures("float64")
def test_compiled_simbav2_equals_eager_and_keeps_its_rows_on_the_sphere():
    """SAC with SimbaV2 actor and critic and the paper's spectral regularizers: the projection is
    inside the compiled program, and compiled updates equal eager ones."""
    eager, eager_infos, _ = _train(SAC, _simbav2_config(), calls=2, count=2)
    comp, comp_infos, _ = _train(SAC, _simbav2_config(compile=True), calls=2, count=2)
    _assert_equal(comp, eager, comp_infos, eager_infos)
    assert _row_norm_error(comp) < 1e-12


def test_reward_scale_against_the_direct_computation():
    gamma, g_max, steps = 0.9, 2.0, 200
    rng = np.random.default_rng(0)
    rewards = rng.normal(1.0, 3.0, (steps, 2))
    ends = rng.random((steps, 2)) < 0.05
    scale = RewardScale(2, gamma, g_max)
    returns = np.zeros((0, 2))
    g = np.zeros(2)
    for t in range(steps):
        g = gamma * (1 - ends[t]) * g + rewards[t]
        returns = np.vstack([returns, g])
        scale.observe(rewards[t], ends[t])
        direct = np.maximum(np.sqrt(returns.var(axis=0) + 1e-8), np.abs(returns).max(axis=0) / g_max)
        assert np.allclose(scale.divisor().numpy(), direct, rtol=1e-12, atol=0)
    assert np.allclose(scale.scale(torch.tensor([[2.0], [3.0]])).squeeze(1).numpy(), [2, 3] / direct, rtol=1e-6)


def test_the_buffer_stores_raw_rewards_and_hands_out_scaled_ones_and_keeps_the_statistics():
    buf = ReplayBuffer(8, 1, 1, 2, reward_scale=RewardScale(2, 0.99))
    for t in range(5):
        buf.add(np.zeros((2, 1)), np.zeros((2, 1)), np.array([1.0, 10.0 * t]), np.zeros((2, 1)), np.zeros(2))
    idx = torch.arange(5).expand(2, 5)
    assert torch.equal(buf.storage["reward"][:, :5], torch.tensor([[1.0] * 5, [0, 10, 20, 30, 40]]))
    scaled = buf.gather(idx)["reward"]
    assert torch.allclose(scaled * buf.reward_scale.divisor().float().unsqueeze(1), buf.storage["reward"][:, :5])
    other = ReplayBuffer(8, 1, 1, 2, reward_scale=RewardScale(2, 0.99))
    other.load_state_dict(buf.state_dict())
    assert torch.equal(other.gather(idx)["reward"], scaled)
    with pytest.raises(ValueError, match="reward-scale statistics"):
        ReplayBuffer(8, 1, 1, 2).load_state_dict(buf.state_dict())


@pytest.mark.parametrize("overrides, fragment", [
    ({"critic": {"arch": "simbav2", "hidden": [8, 8], "layer_norm": True}}, "layer_norm: true contradicts"),
    ({"actor": {"arch": "simbav2", "hidden": [8, 8], "regularizers": [{"name": "nap"}]}}, "nap rescales weights"),
    ({"reward_scale": "popart"}, "'popart' is not one of none, simbav2"),
    ({"reward_scale": "simbav2", "reward_scale_g_max": 0}, "reward_scale_g_max: must be > 0"),
])
def test_contradictions_are_refused_in_one_line(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        merge_sources(TrainConfig, overrides)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_a_simbav2_run_resumes_exactly_evaluates_unscaled_loads_and_is_diagnosed(tmp_path):
    """Two seeds on cartpole-balance at action repeat 4 (250-step episodes), replay ratio 2:
    stopped at step 300 and resumed to 600 (across episode ends before and after), it equals the
    straight run; the loaded policy replays the recorded evaluation returns in the env's units;
    diagnose's buffer scales the rewards as the run's last updates did."""
    args = FAST + ["env=dmc:cartpole-balance", "action_repeat=4", "num_seeds=2", "replay_ratio=2", "random_steps=100",
                   "eval_every=300", "actor.arch=simbav2", "critic.arch=simbav2", "actor.hidden=[16,16]",
                   "critic.hidden=[16,16]", "reward_scale=simbav2", "actor.regularizers=[]", "critic.regularizers=[]",
                   "threads=1"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(args + ["total_steps=600", f"run_dir={straight}"]) == 0
    assert run(args + ["total_steps=300", f"run_dir={split}"]) == 0
    assert run(["--resume", split, "total_steps=600"]) == 0
    a, b = _params(straight), _params(split)
    assert a["step"] == b["step"] == 600 and a["buffer"]["reward_scale"]["count"] == 600
    _assert_same_state(a, b)
    rows = [r for r in csv.DictReader((straight / "evals.csv").open()) if int(r["step"]) == 600]
    for index in (0, 1):
        policy = load_policy(straight, seed_index=index)
        returns = play_episodes(policy, policy.recorded.reset_seeds(policy.seed))
        assert float(np.mean(returns)) == policy.recorded.mean_return == float(rows[index]["return"]) > 50
    _, agent, buffer, _ = load_run(straight)
    saved = RewardScale(2, 0.99)
    saved.load_state_dict(a["buffer"]["reward_scale"])
    assert isinstance(agent.actor, HypersphericalNet) and saved.divisor().min() > 1
    idx = torch.arange(10).expand(2, 10)
    raw = a["buffer"]["data"]["reward"][:, :10].double()
    assert torch.allclose(buffer.gather(idx)["reward"].double(), raw / saved.divisor().unsqueeze(1), rtol=1e-6)
