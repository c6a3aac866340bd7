import math

import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from agents import SAC, ReplayBuffer, SACConfig, tanh_gaussian
from sac_spectral.seeding import SeedStreams


def small_cfg(**kw) -> SACConfig:
    cfg = SACConfig()
    cfg.actor.hidden = [16, 16]
    cfg.critic.hidden = [16, 16]
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def make_agent(seeds=(0,), cfg=None) -> SAC:
    return SAC(5, 2, cfg or small_cfg(), SeedStreams(list(seeds)))


def random_batch(n=1, b=8, obs=5, act=2, gen=None):
    g = gen or torch.Generator().manual_seed(0)
    return {
        "obs": torch.randn(n, b, obs, generator=g),
        "action": torch.rand(n, b, act, generator=g) * 2 - 1,
        "reward": torch.randn(n, b, generator=g),
        "next_obs": torch.randn(n, b, obs, generator=g),
        "terminated": torch.zeros(n, b),
    }


def test_tanh_gaussian_log_prob_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=g, dtype=torch.float64)
    log_std = torch.randn(64, 3, generator=g, dtype=torch.float64) * 0.5
    noise = torch.randn(64, 3, generator=g, dtype=torch.float64)
    action, logp = tanh_gaussian(mean, log_std, noise)
    ref = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(cache_size=1)])
    u = mean + log_std.exp() * noise
    torch.testing.assert_close(action, torch.tanh(u))
    torch.testing.assert_close(logp, ref.log_prob(torch.tanh(u)).sum(-1), rtol=1e-7, atol=1e-7)


def test_tanh_gaussian_is_stable_when_saturated():
    action, logp = tanh_gaussian(torch.full((1, 2), 30.0), torch.zeros(1, 2), torch.zeros(1, 2))
    assert torch.isfinite(logp).all() and torch.all(action == 1.0)


def _manual_q(net, x):
    """Independent forward of member-batched MLP: loop over members with plain matmuls."""
    outs = []
    for m in range(net.members):
        h = x
        for i, layer in enumerate(net.layers):
            h = h @ layer.weight[m] + layer.bias[m, 0]
            if i < len(net.layers) - 1:
                h = torch.relu(h)
        outs.append(h.squeeze(-1))
    return torch.stack(outs)


def test_critic_target_bootstraps_through_truncation_but_not_termination():
    agent = make_agent()
    batch = random_batch(b=6)
    batch["terminated"] = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0, 1.0]])
    noise = torch.randn(1, 6, 2, generator=torch.Generator().manual_seed(3))
    target = agent.critic_target(batch, noise)
    with torch.no_grad():
        a, logp = agent.policy(batch["next_obs"], noise)
        x = torch.cat([batch["next_obs"][0], a[0]], -1)
        min_q = _manual_q(agent.target_critic, x).amin(0)
        soft = min_q - agent.log_alpha.exp() * logp[0]
    done = batch["terminated"][0].bool()
    torch.testing.assert_close(target[0][done], batch["reward"][0][done])
    torch.testing.assert_close(target[0][~done], batch["reward"][0][~done] + 0.99 * soft[~done])


def test_polyak_update_of_target_critic():
    agent = make_agent()
    old_target = [p.clone() for p in agent.target_critic.parameters()]
    agent.update(random_batch(), torch.randn(2, 1, 8, 2))
    for t, o, new in zip(agent.target_critic.parameters(), old_target, agent.critic.parameters()):
        torch.testing.assert_close(t, o + 0.005 * (new - o))


def test_actor_loss_builds_no_critic_weight_gradients():
    agent = make_agent()
    batch = random_batch()
    a, _ = agent.policy(batch["obs"], torch.randn(1, 8, 2))
    agent.q_values(agent.critic, batch["obs"], a, detach=True).sum().backward()
    assert all(p.grad is None for p in agent.critic.parameters())
    assert all(p.grad is not None for p in agent.actor.parameters())


def test_temperature_moves_toward_target_entropy():
    cfg = small_cfg()
    cfg.alpha.target_entropy_scale = 0.5
    agent = make_agent(cfg=cfg)
    assert agent.target_entropy == -1.0
    before = agent.log_alpha.item()
    agent.update(random_batch(), torch.randn(2, 1, 8, 2))
    entropy = agent.metrics()["entropy"].item()
    assert math.copysign(1, agent.log_alpha.item() - before) == math.copysign(1, agent.target_entropy - entropy)


def test_reset_all_redraws_everything_and_clears_optimizers():
    agent = make_agent()
    for _ in range(3):
        agent.update(random_batch(), torch.randn(2, 1, 8, 2))
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    agent.reset("all")
    for k, v in agent.state_dict().items():
        if "bias" not in k:
            assert not torch.equal(v, before[k]), k
    assert all(len(o.state) == 0 for o in (agent.actor_opt, agent.critic_opt, agent.alpha_opt))
    for t, c in zip(agent.target_critic.parameters(), agent.critic.parameters()):
        assert torch.equal(t, c)
    assert agent.log_alpha.item() == 0.0


def test_reset_last_layers_keeps_the_rest():
    agent = make_agent()
    agent.update(random_batch(), torch.randn(2, 1, 8, 2))
    w0 = agent.critic.layers[0].weight.clone()
    w_last = agent.critic.layers[-1].weight.clone()
    agent.reset("last_layers", 1)
    assert torch.equal(agent.critic.layers[0].weight, w0)
    assert not torch.equal(agent.critic.layers[-1].weight, w_last)
    assert agent.critic.layers[-1].weight not in agent.critic_opt.state
    assert agent.critic.layers[0].weight in agent.critic_opt.state
    assert torch.equal(agent.target_critic.layers[-1].weight, agent.critic.layers[-1].weight)


def test_seed_in_a_multi_seed_agent_matches_single_seed_agent():
    multi, single = make_agent(seeds=(4, 5)), make_agent(seeds=(5,))
    buf_m, buf_s = ReplayBuffer(64, 5, 2, 2), ReplayBuffer(64, 5, 2, 1)
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        row = [torch.randn(2, 5, generator=g), torch.rand(2, 2, generator=g), torch.randn(2, generator=g),
               torch.randn(2, 5, generator=g), torch.zeros(2)]
        buf_m.add(*row)
        buf_s.add(*(r[1:] for r in row))
    multi.train_steps(buf_m, 5, 16)
    single.train_steps(buf_s, 5, 16)
    for pm, ps in zip(multi.actor.parameters(), single.actor.parameters()):
        torch.testing.assert_close(pm[1:], ps, rtol=1e-5, atol=1e-6)
    for pm, ps in zip(multi.critic.parameters(), single.critic.parameters()):
        torch.testing.assert_close(pm[2:], ps, rtol=1e-5, atol=1e-6)
