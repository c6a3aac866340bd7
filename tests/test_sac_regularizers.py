"""Regularizers inside the SAC agent, and the optimizer/architecture options of each network."""

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import named_noise
from sac_spectral.agents import SAC, ReplayBuffer, SACConfig
from sac_spectral.apps.rl.train import TrainConfig
from sac_spectral.core.config import load_config
from sac_spectral.core.nets import ACTIVATIONS, BatchedMLP
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import REGISTRY

ROOT = Path(__file__).resolve().parents[1]


def small_cfg() -> SACConfig:
    cfg = SACConfig()
    cfg.actor.hidden = [16, 16]
    cfg.critic.hidden = [16, 16]
    return cfg


def random_batch(n=1, b=8, gen=None):
    g = gen or torch.Generator().manual_seed(0)
    return {
        "obs": torch.randn(n, b, 5, generator=g),
        "action": torch.rand(n, b, 2, generator=g) * 2 - 1,
        "reward": torch.randn(n, b, generator=g),
        "next_obs": torch.randn(n, b, 5, generator=g),
        "terminated": torch.zeros(n, b),
    }


def test_weight_decay_is_decoupled_adamw():
    """AdamW: θ ← θ(1 − lr·λ) − lr·adam_step; the Adam step is the same as without decay."""
    plain_cfg, wd_cfg = small_cfg(), small_cfg()
    wd_cfg.critic.weight_decay = wd_cfg.actor.weight_decay = 0.1
    plain, decayed = SAC(5, 2, plain_cfg, SeedStreams([0])), SAC(5, 2, wd_cfg, SeedStreams([0]))
    assert isinstance(decayed.trained["critic"].optimizer,
                      torch.optim.AdamW) and not isinstance(plain.trained["critic"].optimizer, torch.optim.AdamW)
    assert decayed.trained["actor"].optimizer.param_groups[0]["weight_decay"] == 0.1
    before = [p.detach().clone() for p in plain.critic.parameters()]
    noise = torch.randn(2, 1, 8, 2, generator=torch.Generator().manual_seed(1))
    plain.update(random_batch(), named_noise(plain, noise))
    decayed.update(random_batch(), named_noise(decayed, noise))
    lr = plain_cfg.critic.lr
    for p0, a, b in zip(before, plain.critic.parameters(), decayed.critic.parameters()):
        torch.testing.assert_close(b - a, -lr * 0.1 * p0, rtol=0, atol=1e-7)  # fp32 rounding of b, a ≈ 5e-8


_REFERENCE_ACTIVATIONS = {
    "relu": nn.ReLU(), "tanh": nn.Tanh(), "elu": nn.ELU(), "gelu": nn.GELU(), "silu": nn.SiLU(),
    "leaky_relu": nn.LeakyReLU(), "crelu": lambda h: torch.cat([nn.ReLU()(h), nn.ReLU()(-h)], dim=-1),
}


def test_every_activation_has_a_reference():
    assert set(_REFERENCE_ACTIVATIONS) == set(ACTIVATIONS)


@pytest.mark.parametrize("layer_norm", [False, True], ids=["plain", "layer_norm"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_mlp_forward_matches_a_per_member_torch_reference(activation, layer_norm):
    net = BatchedMLP(2, 5, [8, 6], 3, activation=activation, layer_norm=layer_norm, init="torch")
    if layer_norm:
        with torch.no_grad():
            for ln in net.norms:
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.normal_()
    x = torch.randn(2, 4, 5)
    act = _REFERENCE_ACTIVATIONS[activation]
    for m in range(2):
        h = x[m]
        for i, layer in enumerate(net.layers):
            h = F.linear(h, layer.weight[m], layer.bias[m])
            if layer_norm:
                norm = nn.LayerNorm(h.shape[-1])
                norm.load_state_dict({"weight": net.norms[i].weight[m], "bias": net.norms[i].bias[m]})
                h = norm(h)
            h = act(h)
        h = F.linear(h, net.heads[0].weight[m], net.heads[0].bias[m])
        torch.testing.assert_close(net(x)[m], h)


def test_sac_trains_with_layer_norm_and_crelu():
    cfg = small_cfg()
    cfg.critic.layer_norm, cfg.critic.activation, cfg.actor.activation = True, "crelu", "tanh"
    agent = SAC(5, 2, cfg, SeedStreams([0]))
    assert agent.critic.layers[1].in_features == 32 and len(agent.critic.norms) == 2
    for _ in range(3):
        agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    assert all(torch.isfinite(v).all() for v in agent.metrics().values())


INTERVENTIONS = [
    {"name": "redo", "tau": 0.5, "every": 2},
    {"name": "shrink_perturb", "shrink": 0.1, "sigma": 0.1, "every": 3},
    {"name": "reset", "every": 4, "last": 1},
    {"name": "l2_init", "coef": 1e-2},
]


def _filled(n_seeds):
    buf = ReplayBuffer(64, 5, 2, n_seeds)
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        row = [torch.randn(2, 5, generator=g), torch.rand(2, 2, generator=g), torch.randn(2, generator=g),
               torch.randn(2, 5, generator=g), torch.zeros(2)]
        buf.add(*(r[2 - n_seeds:] for r in row))
    return buf


def test_seed_of_a_multi_seed_agent_matches_single_seed_agent_with_every_intervention():
    cfg = small_cfg()
    cfg.critic.regularizers = copy.deepcopy(INTERVENTIONS)
    cfg.actor.regularizers = copy.deepcopy(INTERVENTIONS[:2])
    multi, single = SAC(5, 2, cfg, SeedStreams([4, 5])), SAC(5, 2, cfg, SeedStreams([5]))
    multi.train_steps(_filled(2), 8, 16)
    single.train_steps(_filled(1), 8, 16)
    for pm, ps in zip(multi.actor.parameters(), single.actor.parameters()):
        torch.testing.assert_close(pm[1:], ps, rtol=1e-5, atol=1e-6)
    for pm, ps in zip(multi.critic.parameters(), single.critic.parameters()):
        torch.testing.assert_close(pm[2:], ps, rtol=1e-5, atol=1e-6)
    assert single.metrics()["reg/critic/reset/resets"].item() == 2.0
    assert single.metrics()["reg/critic/redo/recycled"].sum() > 0


def test_regularizer_metrics_are_logged_per_seed_under_their_network_and_name():
    cfg = small_cfg()
    cfg.critic.regularizers = [{"name": name} for name in sorted(REGISTRY)]
    cfg.critic.layer_norm = True  # nap needs it
    cfg.actor.regularizers = [{"name": "spectral", "mode": "all"}, {"name": "parseval"}]
    agent = SAC(5, 2, cfg, SeedStreams([0, 1, 2]))
    agent.update(random_batch(n=3), named_noise(agent, torch.randn(2, 3, 8, 2)))
    metrics = agent.metrics()
    for name in REGISTRY:
        keys = [k for k in metrics if k.startswith(f"reg/critic/{name}/")]
        assert keys, name
        assert all(metrics[k].shape in ((3,), ()) for k in keys)
    assert metrics["reg/actor/spectral/layer0/sigma_max"].shape == (3,)
    assert {"reg/critic/redo/dormant_fraction", "reg/critic/l2_init/distance_to_init",
            "reg/critic/spectral/penalty", "reg/actor/parseval/penalty"} <= set(metrics)


def test_the_critics_probe_is_the_current_batch_as_critic_input():
    cfg = small_cfg()
    cfg.critic.regularizers = [{"name": "redo", "every": 1}]
    agent = SAC(5, 2, cfg, SeedStreams([0, 1]))
    batch = random_batch(n=2)
    agent.update(batch, named_noise(agent, torch.randn(2, 2, 8, 2)))
    probe = agent.trained["critic"].regularizers[0].probe()
    assert probe.shape == (4, 8, 7)
    torch.testing.assert_close(probe[3], torch.cat([batch["obs"][1], batch["action"][1]], -1))


def test_full_reset_draws_the_initializer_from_the_continuing_init_stream():
    streams = SeedStreams([3])
    agent = SAC(5, 2, small_cfg(), streams)
    agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    gen = torch.Generator()
    gen.set_state(streams["init"][0].get_state())
    agent.reset()
    gain = math.sqrt(2)
    actor = BatchedMLP(1, 5, [16, 16], (2, 2), out_gains=(gain, 1.0), generators=[gen])
    critic = BatchedMLP(2, 7, [16, 16], 1, out_gains=gain, generators=[gen, gen])
    for got, ref in zip(list(agent.actor.parameters()) + list(agent.critic.parameters()),
                        list(actor.parameters()) + list(critic.parameters())):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("path", sorted((ROOT / "run_configs").glob("primacy_bias_*.yaml")), ids=lambda p: p.stem)
def test_every_primacy_bias_config_builds_its_agent(path):
    cfg = load_config(TrainConfig, path)
    agent = SAC(17, 6, cfg, SeedStreams([0]))
    assert [r.name for r in agent.trained["critic"].regularizers] == [r["name"] for r in cfg.critic.regularizers]
