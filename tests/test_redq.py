"""REDQ against a reference written from its paper's equations (Chen et al. 2021, Algorithm 1) with
plain tensors, ``torch.distributions`` and ``torch.optim.Adam``: the same parameters, batches and
noise give the same networks after three updates (the actor steps on the second)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from conftest import named_noise, reference_batch
from sac_spectral.agents import AGENTS, REDQ, ReplayBuffer
from sac_spectral.agents.redq import random_subset
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.config import ConfigError, from_dict
from sac_spectral.core.seeding import SeedStreams

OBS, ACT, B, N, M = 5, 2, 16, 10, 2


def _config() -> TrainConfig:
    cfg = TrainConfig(agent="redq")
    cfg.actor.hidden = cfg.critic.hidden = [32, 32]
    cfg.actor.regularizers, cfg.critic.regularizers = [], []
    cfg.critic.num_critics, cfg.redq.num_min, cfg.redq.policy_delay = N, M, 2
    cfg.alpha.target_entropy_scale = 1.0
    return cfg


def _params(net, member, heads):
    layers = list(net.layers) + [net.heads[h] for h in heads]
    return [(lin.weight[member].detach().clone().requires_grad_(), lin.bias[member].detach().clone().requires_grad_())
            for lin in layers]


def _trunk(params, x):
    for w, b in params:
        x = F.relu(x @ w.T + b)
    return x


class Reference:
    """REDQ for one seed: actor (trunk, mean and log-std heads), N critics and their targets, α."""

    def __init__(self, agent: REDQ, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.actor = _params(agent.actor, 0, (0, 1))
        self.critics = [_params(agent.critic, j, (0,)) for j in range(N)]
        self.targets = [[(w.detach().clone(), b.detach().clone()) for w, b in c] for c in self.critics]
        self.log_alpha = torch.tensor(math.log(cfg.alpha.init), requires_grad=True)
        flat = lambda ps: [t for wb in ps for t in wb]  # noqa: E731
        self.actor_opt = torch.optim.Adam(flat(self.actor), lr=cfg.actor.lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha.lr)
        self.critic_opt = torch.optim.Adam([t for c in self.critics for t in flat(c)], lr=cfg.critic.lr)
        self.it = 0

    def q(self, params, s, a):
        h = _trunk(params[:-1], torch.cat([s, a], -1))
        w, b = params[-1]
        return (h @ w.T + b).squeeze(-1)

    def pi(self, s, eps):
        """A reparameterized tanh-Gaussian action and its log-density from torch.distributions."""
        h = _trunk(self.actor[:-2], s)
        mean = h @ self.actor[-2][0].T + self.actor[-2][1]
        raw = h @ self.actor[-1][0].T + self.actor[-1][1]
        lo, hi = self.cfg.actor.log_std_min, self.cfg.actor.log_std_max
        std = (lo + 0.5 * (hi - lo) * (torch.tanh(raw) + 1)).exp()
        u = mean + std * eps
        tanh = TanhTransform(cache_size=1)
        a = tanh(u)  # cached: log_prob inverts it exactly
        return a, TransformedDistribution(Normal(mean, std), [tanh]).log_prob(a).sum(-1)

    def update(self, s, a, r, s2, d, eps):
        alpha = self.log_alpha.detach().exp()
        subset = torch.argsort(eps[2].flatten()[:N])[:M]  # a uniformly random M of the N critics
        with torch.no_grad():
            a2, logp2 = self.pi(s2, eps[0])
            q2 = torch.stack([self.q(self.targets[i], s2, a2) for i in subset.tolist()]).min(dim=0).values
            y = r + self.cfg.gamma * (1 - d) * (q2 - alpha * logp2)
        loss = sum(((self.q(c, s, a) - y) ** 2).mean() for c in self.critics)
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        with torch.no_grad():
            for online, target in zip(self.critics, self.targets):
                for (w, b), (tw, tb) in zip(online, target):
                    tw.lerp_(w, self.cfg.tau)
                    tb.lerp_(b, self.cfg.tau)
        self.it += 1
        if self.it % self.cfg.redq.policy_delay:
            return
        act, logp = self.pi(s, eps[1])
        mean_q = torch.stack([self.q([(w.detach(), b.detach()) for w, b in c], s,
                                     act) for c in self.critics]).mean(dim=0)
        actor_loss = (alpha * logp - mean_q).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()
        entropy = -logp.detach().mean()
        alpha_loss = self.log_alpha.exp() * (entropy + self.cfg.alpha.target_entropy_scale * ACT)
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()


def test_redq_is_registered_with_its_own_section():
    assert AGENTS["redq"] is REDQ and TrainConfig().redq.num_min == 2


def test_update_equals_the_papers_equations_after_three_updates():
    torch.manual_seed(0)
    cfg = _config()
    agent = REDQ(OBS, ACT, cfg, SeedStreams([3]))
    ref = Reference(agent, cfg)
    for _ in range(3):
        batch = reference_batch(B, OBS, ACT)
        noise = torch.randn(3, 1, B, ACT)
        agent.update(batch, named_noise(agent, noise))
        ref.update(*(batch[k][0] for k in ("obs", "action", "reward", "next_obs", "terminated")), noise[:, 0])
    pairs = [(_params(agent.actor, 0, (0, 1)), ref.actor)]
    pairs += [(_params(agent.critic, j, (0,)), ref.critics[j]) for j in range(N)]
    pairs += [(_params(agent.target_critic, j, (0,)), ref.targets[j]) for j in range(N)]
    worst = max((o - t).abs().max().item() for ours, theirs in pairs for ow, tw in zip(ours, theirs) for o,
                t in zip(ow, tw))
    worst = max(worst, abs(agent.log_alpha.item() - ref.log_alpha.item()))
    assert worst < 1e-6, worst
    assert agent.log_alpha.item() != math.log(cfg.alpha.init)  # the actor and temperature stepped


def test_the_random_subsets_are_uniform():
    """Every critic lies in the subset of M in M/N of the draws, every pair equally often."""
    g = torch.Generator().manual_seed(0)
    subsets = random_subset(torch.randn(20_000, B, ACT, generator=g), M, N)
    counts = torch.bincount(subsets.flatten(), minlength=N).double() / len(subsets)
    assert subsets.shape == (20_000, M) and (subsets[:, 0] != subsets[:, 1]).all()
    assert torch.allclose(counts, torch.full((N,), M / N, dtype=torch.float64), atol=0.015)


@pytest.mark.parametrize("options",
                         [{"critic": {"num_critics": 1}}, {"critic": {"num_critics": 3}, "redq": {"num_min": 5}}])
def test_a_subset_larger_than_the_ensemble_is_refused(options):
    with pytest.raises(ConfigError, match=r"^redq\.num_min: must be <= critic\.num_critics"):
        from_dict(TrainConfig, {"agent": "redq", **options})
    from_dict(TrainConfig, {"agent": "redq", "critic": {"num_critics": 2}})  # M = N: the minimum over all


def test_every_critic_is_drawn_when_a_noise_row_holds_fewer_normals_than_critics():
    """``batch_size·|A| < N`` (4·1 < 10): the subsets of the updates still cover every critic, about
    ``M/N`` of the time each."""
    agent = REDQ(OBS, 1, _config(), SeedStreams([0]))
    buffer, g = ReplayBuffer(64, OBS, 1, 1), torch.Generator().manual_seed(0)
    for _ in range(64):
        buffer.add(torch.randn(1, OBS, generator=g), torch.rand(1, 1, generator=g) * 2 - 1, torch.randn(1, generator=g),
                   torch.randn(1, OBS, generator=g), torch.zeros(1))
    subsets, target = [], agent.critic_target

    def spy(batch, noise, subset=None):
        subsets.append(subset)
        return target(batch, noise, subset)

    agent.critic_target = spy
    agent.train_steps(buffer, 400, 4)
    drawn = torch.cat(subsets)
    counts = torch.bincount(drawn.flatten(), minlength=N)
    assert drawn.shape == (400, M) and (drawn[:, 0] != drawn[:, 1]).all()
    assert ((counts > 40) & (counts < 120)).all(), counts  # 80 expected each
