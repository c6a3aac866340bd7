"""TD3 against a reference written from the paper's equations (Fujimoto et al. 2018, Algorithm 1)
with plain tensors and ``torch.optim.Adam``: the same parameters, batches and noise give the same
networks after three updates (two critic-only, one with the delayed actor and target step)."""

import copy

import pytest
import torch
import torch.nn.functional as F

from conftest import named_noise, reference_batch
from sac_spectral.agents import AGENTS, TD3, build_agent
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.seeding import SeedStreams

OBS, ACT, B = 5, 2, 16


def _config(**td3) -> TrainConfig:
    cfg = TrainConfig()
    cfg.agent = "td3"
    cfg.actor.hidden = cfg.critic.hidden = [32, 32]
    cfg.actor.regularizers, cfg.critic.regularizers = [], []
    for k, v in td3.items():
        setattr(cfg.td3, k, v)
    return cfg


def _params(net, member):
    """Member ``member``'s ``[(W, b), ...]`` (hidden layers, then the head) as leaf tensors."""
    layers = list(net.layers) + list(net.heads)
    return [(lin.weight[member].detach().clone().requires_grad_(), lin.bias[member].detach().clone().requires_grad_())
            for lin in layers]


def _mlp(params, x):
    for w, b in params[:-1]:
        x = F.relu(x @ w.T + b)
    w, b = params[-1]
    return x @ w.T + b


class Reference:
    """TD3 for one seed, from the paper: actor μ, critics Q1, Q2 and their targets."""

    def __init__(self, agent: TD3, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.actor = _params(agent.actor, 0)
        self.critics = [_params(agent.critic, j) for j in range(2)]
        self.t_actor = [(w.detach().clone(), b.detach().clone()) for w, b in self.actor]
        self.t_critics = [[(w.detach().clone(), b.detach().clone()) for w, b in c] for c in self.critics]
        flat = lambda ps: [t for wb in ps for t in wb]  # noqa: E731
        self.actor_opt = torch.optim.Adam(flat(self.actor), lr=cfg.actor.lr)
        self.critic_opt = torch.optim.Adam([t for c in self.critics for t in flat(c)], lr=cfg.critic.lr)
        self.it = 0

    def q(self, params, s, a):
        return _mlp(params, torch.cat([s, a], -1)).squeeze(-1)

    def update(self, s, a, r, s2, d, eps):
        o = self.cfg.td3
        with torch.no_grad():
            noise = (o.policy_noise * eps).clamp(-o.noise_clip, o.noise_clip)
            a2 = (torch.tanh(_mlp(self.t_actor, s2)) + noise).clamp(-1, 1)
            y = r + self.cfg.gamma * (1 - d) * torch.min(self.q(self.t_critics[0], s2, a2),
                                                         self.q(self.t_critics[1], s2, a2))
        loss = sum(((self.q(c, s, a) - y) ** 2).mean() for c in self.critics)
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        self.it += 1
        if self.it % o.policy_delay == 0:
            actor_loss = -self.q(self.critics[0], s, torch.tanh(_mlp(self.actor, s))).mean()
            self.actor_opt.zero_grad()
            actor_loss.backward()
            self.actor_opt.step()
            with torch.no_grad():
                for online, target in [(self.actor, self.t_actor), *zip(self.critics, self.t_critics)]:
                    for (w, b), (tw, tb) in zip(online, target):
                        tw.mul_(1 - self.cfg.tau).add_(self.cfg.tau * w)
                        tb.mul_(1 - self.cfg.tau).add_(self.cfg.tau * b)


def test_td3_is_registered_and_built_by_name():
    assert AGENTS["td3"] is TD3
    agent = build_agent(OBS, ACT, _config(), SeedStreams([0]))
    assert isinstance(agent, TD3) and agent.act(torch.zeros(1, OBS)).shape == (1, ACT)


def test_update_equals_the_papers_equations_after_three_updates():
    torch.manual_seed(0)
    cfg = _config()
    agent = TD3(OBS, ACT, cfg, SeedStreams([3]))
    ref = Reference(agent, cfg)
    for _ in range(3):
        batch = reference_batch(B, OBS, ACT)
        noise = torch.randn(2, 1, B, ACT)
        agent.update(batch, named_noise(agent, noise))
        ref.update(*(batch[k][0] for k in ("obs", "action", "reward", "next_obs", "terminated")), noise[0, 0])
    nets = [(agent.actor, 0, ref.actor), (agent.target_actor, 0, ref.t_actor),
            *[(agent.critic, j, ref.critics[j]) for j in range(2)],
            *[(agent.target_critic, j, ref.t_critics[j]) for j in range(2)]]
    worst = 0.0
    for net, member, params in nets:
        for ours, (w, b) in zip(_params(net, member), params):
            worst = max(worst, (ours[0] - w).abs().max().item(), (ours[1] - b).abs().max().item())
    assert worst < 1e-6, worst
    assert not torch.equal(agent.actor.heads[0].weight, ref.t_actor[-1][0].unsqueeze(0))  # the actor moved


def test_the_actor_and_targets_wait_for_the_policy_delay():
    cfg = _config(policy_delay=3)
    agent = TD3(OBS, ACT, cfg, SeedStreams([0]))
    actor0, target0 = copy.deepcopy(agent.actor.state_dict()), copy.deepcopy(agent.target_critic.state_dict())
    batch = {"obs": torch.randn(1, B, OBS), "action": torch.zeros(1, B, ACT), "reward": torch.ones(1, B),
             "next_obs": torch.randn(1, B, OBS), "terminated": torch.zeros(1, B)}
    for k in range(1, 4):
        agent.update(batch, named_noise(agent, torch.randn(2, 1, B, ACT)))
        moved = not all(torch.equal(v, agent.actor.state_dict()[n]) for n, v in actor0.items())
        target_moved = not all(torch.equal(v, agent.target_critic.state_dict()[n]) for n, v in target0.items())
        assert moved == target_moved == (k == 3)


@pytest.mark.parametrize("deterministic", [True, False])
def test_actions_lie_in_the_box(deterministic):
    cfg = _config(exploration_noise=5.0)
    agent = TD3(OBS, ACT, cfg, SeedStreams([0, 1]))
    a = agent.act(100 * torch.randn(2, OBS), deterministic)
    assert a.shape == (2, ACT) and a.abs().max() <= 1.0


def test_a_td3_run_plays_back_its_last_evaluation_and_its_policy_is_deterministic(tmp_path):
    import csv

    import numpy as np

    from conftest import SMALL
    from sac_spectral.apps.rl.policy import load_policy, play_episodes
    from sac_spectral.apps.rl.train import main
    from sac_spectral.envs.evaluate import eval_seed
    from sac_spectral.runs.cli import run_cli

    rd = tmp_path / "td3"
    assert run_cli(main, [*SMALL, "agent=td3", "env=dmc:cartpole-balance", "action_repeat=4", "total_steps=300",
                          "random_steps=100", "eval_every=150", "eval_episodes=2", "threads=1", f"run_dir={rd}"]) == 0
    policy = load_policy(rd)
    rows = [r for r in csv.DictReader((rd / "evals.csv").open()) if int(r["step"]) == 300]
    assert policy.recorded is not None
    assert policy.recorded.reset_seeds(policy.seed) == [eval_seed(0, 300, ep) for ep in range(2)]
    returns = play_episodes(policy, policy.recorded.reset_seeds(policy.seed))
    assert float(np.mean(returns)) == float(rows[0]["return"])
    obs = np.zeros(policy.obs_dim)
    assert np.array_equal(policy.act(obs), policy.act(obs)) and np.abs(policy.act(obs, deterministic=False)).max() <= 1


def test_what_a_run_would_silently_never_do_is_said_and_its_directory_names_its_networks(tmp_path, capsys, monkeypatch):
    """An actor delayed past the run's updates and an injection beyond them are warned of at the
    start and kept in the summary; the run directory's name carries the critic's architecture."""
    import json

    from conftest import SMALL
    from sac_spectral.runs.cli import run_cli
    from sac_spectral.train import main

    monkeypatch.chdir(tmp_path)
    assert run_cli(main, [*SMALL, "agent=td3", "td3.policy_delay=1e12", "critic.arch=bronet", "critic.hidden=[32, 32]",
                          "env=dmc:cartpole-balance", "total_steps=120", "random_steps=100", "eval_every=0",
                          "threads=1",
                          "actor.regularizers=[{name: plasticity_injection, at_step: 500}]"]) == 0
    (summary,) = (tmp_path / "runs").glob("*/summary.json")
    assert "__td3+plasticity_injection+bronet__" in summary.parent.name
    warnings = json.loads(summary.read_text())["warnings"]
    assert any("td3.policy_delay=1000000000000 exceeds the run's 20 updates: the actor never trains" in w
               for w in warnings)
    assert any("actor.regularizers[0] (plasticity_injection): at_step=500 lies beyond" in w for w in warnings)
    assert "the actor never trains" in capsys.readouterr().err
