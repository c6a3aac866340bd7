"""CrossQ against a reference written from its paper's equations (Bhatt et al. 2024) with plain
tensors, ``torch.distributions`` and ``torch.optim.Adam`` (β₁ = 0.5): no target networks, batch
renormalization (Ioffe 2017) in the critics, one joint forward of (s, a) and (s′, a′). The same
parameters, batches and noise give the same networks and running statistics after three updates
(the first in the warm-up as batch normalization, the actor stepping on the third)."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import named_noise, reference_batch, reference_config, reference_policy
from sac_spectral.agents import AGENTS, CrossQ
from sac_spectral.agents.crossq import BatchRenorm
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.config import ConfigError, from_dict
from sac_spectral.core.seeding import SeedStreams

OBS, ACT, B, C = 5, 2, 16, 2
EPS = 1e-3


def _config() -> TrainConfig:
    cfg = reference_config("crossq", [32, 32], [24, 24])
    cfg.actor.lr = cfg.critic.lr = cfg.alpha.lr = 1e-3
    cfg.crossq.warmup, cfg.crossq.policy_delay, cfg.crossq.r_max, cfg.crossq.d_max = 1, 3, 1.2, 0.1
    cfg.alpha.target_entropy_scale = 1.0
    return cfg


def _leaf(t):
    return t.detach().clone().requires_grad_()


class RenormCritic:
    """One critic: BRN(input) → [Linear → ReLU → BRN] × 2 → Linear, with its running statistics."""

    def __init__(self, net, j):
        self.linears = [(_leaf(lin.weight[j]), _leaf(lin.bias[j])) for lin in [*net.layers, net.heads[0]]]
        self.norms = [(_leaf(n.weight[j]), _leaf(n.bias[j])) for n in [net.in_norm, *net.norms]]
        self.mean = [n.running_mean[j].clone() for n in [net.in_norm, *net.norms]]
        self.var = [n.running_var[j].clone() for n in [net.in_norm, *net.norms]]
        self.steps = 0

    def params(self):
        return [t for pair in self.linears + self.norms for t in pair]

    def brn(self, k, x, train, opts):
        gain, shift = self.norms[k]
        if not train:
            return (x - self.mean[k]) / (self.var[k] + EPS).sqrt() * gain + shift
        mu, var = x.mean(0), x.var(0, unbiased=False)
        sigma, running = (var + EPS).sqrt(), (self.var[k] + EPS).sqrt()
        r, d = torch.ones_like(mu), torch.zeros_like(mu)
        if self.steps >= opts.warmup:
            r = (sigma / running).detach().clamp(1 / opts.r_max, opts.r_max)
            d = ((mu - self.mean[k]) / running).detach().clamp(-opts.d_max, opts.d_max)
        self.mean[k] = self.mean[k] + opts.momentum * (mu.detach() - self.mean[k])
        self.var[k] = self.var[k] + opts.momentum * (var.detach() - self.var[k])
        return ((x - mu) / sigma * r + d) * gain + shift

    def __call__(self, x, train, opts):
        x = self.brn(0, x, train, opts)
        for k, (w, b) in enumerate(self.linears[:-1]):
            x = self.brn(k + 1, F.relu(x @ w.T + b), train, opts)
        w, b = self.linears[-1]
        if train:
            self.steps += 1
        return (x @ w.T + b).squeeze(-1)


class Reference:
    def __init__(self, agent: CrossQ, cfg: TrainConfig) -> None:
        self.cfg, self.opts = cfg, cfg.crossq
        self.actor = [(_leaf(lin.weight[0]), _leaf(lin.bias[0])) for lin in [*agent.actor.layers, *agent.actor.heads]]
        self.critics = [RenormCritic(agent.critic, j) for j in range(C)]
        self.log_alpha = torch.tensor(math.log(cfg.alpha.init), requires_grad=True)
        betas = (cfg.crossq.adam_beta1, 0.999)
        self.actor_opt = torch.optim.Adam([t for wb in self.actor for t in wb], lr=cfg.actor.lr, betas=betas)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha.lr, betas=betas)
        self.critic_opt = torch.optim.Adam([t for c in self.critics for t in c.params()], lr=cfg.critic.lr, betas=betas)
        self.it = 0

    def pi(self, s, eps):
        return reference_policy(self.actor, s, eps, self.cfg.actor)

    def update(self, s, a, r, s2, d, eps):
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            a2, logp2 = self.pi(s2, eps[0])
        joint = torch.cat([torch.cat([s, a], -1), torch.cat([s2, a2], -1)])  # one forward of both batches
        qs = [c(joint, True, self.opts) for c in self.critics]
        q2 = torch.stack([q[B:] for q in qs]).detach().min(dim=0).values
        y = r + self.cfg.gamma * (1 - d) * (q2 - alpha * logp2)
        loss = sum(((q[:B] - y) ** 2).mean() for q in qs)
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        self.it += 1
        if self.it % self.opts.policy_delay:
            return
        act, logp = self.pi(s, eps[1])
        sa = torch.cat([s, act], -1)
        detached = []
        for c in self.critics:  # evaluation mode, weights held fixed
            frozen = RenormCritic.__new__(RenormCritic)
            frozen.linears = [(w.detach(), b.detach()) for w, b in c.linears]
            frozen.norms = [(g.detach(), b.detach()) for g, b in c.norms]
            frozen.mean, frozen.var, frozen.steps = c.mean, c.var, c.steps
            detached.append(frozen(sa, False, self.opts))
        actor_loss = (alpha * logp - torch.stack(detached).min(dim=0).values).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()
        alpha_loss = self.log_alpha.exp() * (-logp.detach().mean() + self.cfg.alpha.target_entropy_scale * ACT)
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()


def test_crossq_is_registered_with_its_own_section_and_no_target():
    agent = CrossQ(OBS, ACT, _config(), SeedStreams([0]))
    assert AGENTS["crossq"] is CrossQ and TrainConfig().crossq.adam_beta1 == 0.5
    assert agent.trained["critic"].target is None and not hasattr(agent, "target_critic")
    assert agent.trained["critic"].optimizer.param_groups[0]["betas"] == (0.5, 0.999)


def test_update_equals_the_papers_equations_after_three_updates():
    torch.manual_seed(0)
    cfg = _config()
    agent = CrossQ(OBS, ACT, cfg, SeedStreams([3]))
    ref = Reference(agent, cfg)
    for _ in range(3):
        batch = reference_batch(B, OBS, ACT)
        noise = torch.randn(2, 1, B, ACT)
        agent.update(batch, named_noise(agent, noise))
        ref.update(*(batch[k][0] for k in ("obs", "action", "reward", "next_obs", "terminated")), noise[:, 0])
    net = agent.critic
    linears = [*net.layers, net.heads[0]]
    ours = [[lin.weight[j] for lin in linears] + [lin.bias[j] for lin in linears]
            + [n.weight[j] for n in [net.in_norm, *net.norms]] + [n.running_mean[j] for n in [net.in_norm, *net.norms]]
            + [n.running_var[j] for n in [net.in_norm, *net.norms]] for j in range(C)]
    theirs = [[w for w, _ in c.linears] + [b for _, b in c.linears] + [g for g, _ in c.norms] + c.mean + c.var
              for c in ref.critics]
    actor = [lin.weight[0] for lin in [*agent.actor.layers, *agent.actor.heads]]
    pairs = [*zip(actor, [w for w, _ in ref.actor]), *(p for o, t in zip(ours, theirs) for p in zip(o, t))]
    worst = max(max((a - b).abs().max().item() for a, b in pairs), abs(agent.log_alpha.item() - ref.log_alpha.item()))
    assert worst < 1e-6, worst
    assert agent.log_alpha.item() != math.log(cfg.alpha.init)  # the actor and temperature stepped
    assert int(net.in_norm.steps) == 3


def test_bf16_updates_keep_fp32_running_statistics_and_follow_fp32():
    """``precision=bf16`` (bf16 matmuls, the renormalization in fp32): three updates, the second and
    third renormalizing and the third stepping the actor, keep the running statistics fp32 and agree
    with fp32's updates to bf16's rounding."""
    torch.manual_seed(0)
    data = [(reference_batch(B, OBS, ACT), torch.randn(2, 1, B, ACT)) for _ in range(3)]
    agents, losses = {}, {}
    for precision in ("fp32", "bf16"):
        cfg = _config()
        cfg.precision = precision
        agents[precision] = agent = CrossQ(OBS, ACT, cfg, SeedStreams([3]))
        losses[precision] = torch.stack([agent.update(batch, named_noise(agent, noise))["loss/critic"]
                                         for batch, noise in data])
    norms = [m for m in agents["bf16"].critic.modules() if isinstance(m, BatchRenorm)]
    assert all(m.running_mean.dtype == m.running_var.dtype == torch.float32 for m in norms)
    assert int(norms[0].steps) == 3 and agents["bf16"].log_alpha.item() != math.log(_config().alpha.init)
    assert torch.allclose(losses["bf16"], losses["fp32"], rtol=0.05), (losses["bf16"], losses["fp32"])
    ours, theirs = (dict(agents[p].critic.named_buffers()) for p in ("bf16", "fp32"))
    for name in ours:
        if "running" in name:
            assert torch.allclose(ours[name], theirs[name], rtol=0.02, atol=1e-3), name


def test_the_critic_follows_critic_activation_and_init():
    cfg = _config()
    cfg.critic.activation, cfg.critic.init = "tanh", "torch"
    critic = CrossQ(OBS, ACT, cfg, SeedStreams([0])).critic
    assert all(layer.init == "torch" for layer in [*critic.layers, *critic.heads])
    x = torch.randn(C, 8, OBS + ACT)
    h = critic.in_norm(x)
    for layer, norm in zip(critic.layers, critic.norms):
        h = norm(torch.tanh(layer(h)))
    assert torch.equal(critic(x), critic.heads[0](h))


@pytest.mark.parametrize("critic, key",
                         [({"arch": "bronet"}, "critic.arch"), ({"layer_norm": True}, "critic.layer_norm"),
                                         ({"activation": "crelu"}, "critic.activation")])
def test_critic_options_it_cannot_honour_are_refused(critic, key):
    """In one line naming the key; the same options stay valid for SAC."""
    with pytest.raises(ConfigError, match=rf"^{key}: crossq"):
        from_dict(TrainConfig, {"agent": "crossq", "critic": critic})
    from_dict(TrainConfig, {"agent": "sac", "critic": critic})
