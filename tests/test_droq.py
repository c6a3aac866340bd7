"""DroQ against a reference written from its paper's equations (Hiraoka et al. 2022, Algorithm 2)
with plain tensors, ``torch.distributions`` and ``torch.optim.Adam``: the same parameters, batches
and noise (dropout masks included) give the same networks after three updates (the actor steps on
the second); the masks are per seed; a short run resumes bit for bit."""

import math

import pytest
import torch
from torch.distributions import Normal

from conftest import named_noise, reference_batch, reference_config, reference_policy, state_tensors
from sac_spectral.agents import AGENTS, DroQ, ReplayBuffer
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.apps.rl.train import main
from sac_spectral.core.config import ConfigError, from_dict
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.runs.checkpoint import load_checkpoint
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.layout import CHECKPOINT

OBS, ACT, B, M, H, P = 5, 2, 16, 2, 8, 0.2
UNITS = B * M * 2 * H  # one mask draw: (batch row, critic, unit of each hidden layer)


def _config(**kw) -> TrainConfig:
    cfg = reference_config("droq", [H, H], **kw)
    cfg.droq.dropout, cfg.droq.policy_delay = P, 2
    return cfg


def _linear(layer, member):
    return layer.weight[member].detach().clone().requires_grad_(), layer.bias[member].detach().clone().requires_grad_()


def _critic(net, member):
    """Per hidden layer (W, b, LayerNorm gain, shift), then the head's (W, b)."""
    hidden = [(*_linear(lin, member), *_linear(n, member)) for lin, n in zip(net.layers, net.norms)]
    return hidden + [_linear(net.heads[0], member)]


class Reference:
    """DroQ for one seed: actor, M dropout critics with LayerNorm and their targets, α."""

    def __init__(self, agent: DroQ, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.actor = [_linear(lin, 0) for lin in list(agent.actor.layers) + list(agent.actor.heads)]
        self.critics = [_critic(agent.critic, i) for i in range(M)]
        self.targets = [[tuple(t.detach().clone() for t in p) for p in c] for c in self.critics]
        self.log_alpha = torch.tensor(math.log(cfg.alpha.init), requires_grad=True)
        self.actor_opt = torch.optim.Adam([t for p in self.actor for t in p], lr=cfg.actor.lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha.lr)
        self.critic_opt = torch.optim.Adam([t for c in self.critics for p in c for t in p], lr=cfg.critic.lr)
        self.it = 0

    def q(self, params, s, a, z):
        """``Q_Dr(s, a)``: per hidden layer ``ReLU(LN(m ⊙ (W x + b)))``, ``m = 1[Φ(z) ≥ p]/(1 − p)``."""
        x = torch.cat([s, a], -1)
        for (w, b, g, c), zl in zip(params[:-1], z.split(H, dim=-1)):
            mask = (Normal(0.0, 1.0).cdf(zl) >= P).to(x.dtype) / (1 - P)
            h = (x @ w.T + b) * mask
            h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5)
            x = torch.relu(h * g + c)
        w, b = params[-1]
        return (x @ w.T + b).squeeze(-1)

    def pi(self, s, eps):
        return reference_policy(self.actor, s, eps, self.cfg.actor)

    def update(self, s, a, r, s2, d, flat):
        """One update on normals ``flat``: next action, action, then the TD, target and actor masks
        ``[B, M, 2H]`` each."""
        eps2, eps = flat[: B * ACT].view(B, ACT), flat[B * ACT: 2 * B * ACT].view(B, ACT)
        z_q, z_target, z_actor = flat[2 * B * ACT:].split(UNITS)[:3]
        z_q, z_target, z_actor = (z.view(B, M, 2 * H) for z in (z_q, z_target, z_actor))
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            a2, logp2 = self.pi(s2, eps2)
            q2 = torch.stack([self.q(t, s2, a2, z_target[:, i]) for i, t in enumerate(self.targets)]).min(dim=0).values
            y = r + self.cfg.gamma * (1 - d) * (q2 - alpha * logp2)
        loss = sum(((self.q(c, s, a, z_q[:, i]) - y) ** 2).mean() for i, c in enumerate(self.critics))
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        with torch.no_grad():
            for online, target in zip(self.critics, self.targets):
                for p, tp in zip(online, target):
                    for t, tt in zip(p, tp):
                        tt.lerp_(t, self.cfg.tau)
        self.it += 1
        if self.it % self.cfg.droq.policy_delay:
            return
        act, logp = self.pi(s, eps)
        detached = [[tuple(t.detach() for t in p) for p in c] for c in self.critics]
        mean_q = torch.stack([self.q(c, s, act, z_actor[:, i]) for i, c in enumerate(detached)]).mean(dim=0)
        actor_loss = (alpha * logp - mean_q).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()
        alpha_loss = self.log_alpha.exp() * (-logp.detach().mean() + self.cfg.alpha.target_entropy_scale * ACT)
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()


def test_droq_is_registered_with_its_own_section():
    assert AGENTS["droq"] is DroQ and TrainConfig().droq.dropout == 0.01 and TrainConfig().critic.num_critics == 2


@pytest.mark.usefixtures("float64")
def test_update_equals_the_papers_equations_after_three_updates():
    torch.manual_seed(0)
    cfg = _config()
    agent = DroQ(OBS, ACT, cfg, SeedStreams([3]))
    ref = Reference(agent, cfg)
    rows = 2 + 3 * UNITS // (B * ACT)
    for _ in range(3):
        batch = reference_batch(B, OBS, ACT)
        noise = torch.randn(rows, 1, B, ACT)
        agent.update(batch, named_noise(agent, noise))
        ref.update(*(batch[k][0] for k in ("obs", "action", "reward", "next_obs", "terminated")), noise[:, 0].flatten())
    pairs = [(_linear(lin, 0), p) for lin, p in zip(list(agent.actor.layers) + list(agent.actor.heads), ref.actor)]
    pairs += [(o, r) for i in range(M) for o, r in zip(_critic(agent.critic, i), ref.critics[i])]
    pairs += [(o, r) for i in range(M) for o, r in zip(_critic(agent.target_critic, i), ref.targets[i])]
    worst = max((o - t).abs().max().item() for ours, theirs in pairs for o, t in zip(ours, theirs))
    worst = max(worst, abs(agent.log_alpha.item() - ref.log_alpha.item()))
    print(f"largest difference from the reference: {worst:.2e}")
    assert worst < 1e-6, worst
    assert agent.log_alpha.item() != math.log(cfg.alpha.init)  # the actor and temperature stepped


def _buffer(seeds: int) -> ReplayBuffer:
    g, buf = torch.Generator().manual_seed(0), ReplayBuffer(64, OBS, ACT, seeds)
    for _ in range(64):
        row = (torch.randn(1, OBS, generator=g), torch.rand(1, ACT, generator=g) * 2 - 1, torch.randn(1, generator=g),
               torch.randn(1, OBS, generator=g), torch.zeros(1))
        buf.add(*(t.expand(seeds, *t.shape[1:]) for t in row))
    return buf


def _masks_of(agent: DroQ) -> list[torch.Tensor]:
    seen, masks = [], DroQ.dropout_q

    def spy(self, net, obs, action, noise, detach=False):
        seen.append(noise)
        return masks(self, net, obs, action, noise, detach)

    agent.dropout_q = spy.__get__(agent)
    return seen


def test_each_seed_draws_the_masks_of_its_single_seed_run():
    """Seed 5 as the second member of a two-seed run draws the masks (and learns the networks) of
    ``seed=5`` alone; 20 % of the units are dropped."""
    pair, alone = DroQ(OBS, ACT, _config(), SeedStreams([3, 5])), DroQ(OBS, ACT, _config(), SeedStreams([5]))
    seen_pair, seen_alone = _masks_of(pair), _masks_of(alone)
    pair.train_steps(_buffer(2), 4, B)
    alone.train_steps(_buffer(1), 4, B)
    assert len(seen_pair) == len(seen_alone) == 4 * 2 + 2  # TD and target each update, the actor's twice
    for two, one in zip(seen_pair, seen_alone):
        assert torch.equal(two[1:], one) and not torch.equal(two[0], one[0])
    kept = torch.cat([(z >= Normal(0.0, 1.0).icdf(torch.tensor(P))).flatten() for z in seen_alone]).double().mean()
    assert abs(kept.item() - (1 - P)) < 0.01
    for (name, p), q in zip(alone.critic.state_dict().items(), pair.critic.state_dict().values()):
        torch.testing.assert_close(p, q[M:], msg=name)


def test_the_actor_masks_are_drawn_only_for_the_updates_with_an_actor_step():
    """At ``policy_delay: 2`` updates 2 and 4 step the actor: only their rows of ``dropout_actor`` hold
    draws, taken from the seed's stream after the four updates' other draws, in the documented order."""
    agent = DroQ(OBS, ACT, _config(), SeedStreams([3]))
    noise = agent.draw_noise(4, B)
    actor = noise["dropout_actor"]
    assert torch.count_nonzero(actor[[0, 2]]) == 0
    assert torch.count_nonzero(actor[[1, 3]]) == actor[[1, 3]].numel()
    g = SeedStreams([3])["sample"][0]
    every = {k: v for k, v in noise.items() if k != "dropout_actor"}
    flat = torch.randn((4, sum(v[0, 0].numel() for v in every.values())), generator=g)
    assert torch.equal(flat[:, -every["dropout_target"][0, 0].numel():],
                       every["dropout_target"][:, 0].flatten(1))
    assert torch.equal(torch.randn((2, *actor.shape[2:]), generator=g), actor[[1, 3], 0])


@pytest.mark.slow
@pytest.mark.usefixtures("float64")
def test_compiled_updates_equal_eager():
    """Four updates on two seeds (the actor on the second and fourth): about a minute of compiling
    on a 2-core CPU, so slow."""
    eager, comp = (DroQ(OBS, ACT, _config(compile=c), SeedStreams([0, 1])) for c in (False, True))
    eager.train_steps(_buffer(2), 4, B)
    comp.train_steps(_buffer(2), 4, B)
    for (name, p), q in zip(comp.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-9, msg=name)


TINY = ["agent=droq", "env=dmc:cartpole-balance", "random_steps=60", "eval_every=50", "eval_episodes=1",
        "batch_size=16", "replay_ratio=2", "droq.policy_delay=2", "actor.hidden=[16,16]", "critic.hidden=[16,16]",
        "actor.regularizers=[]", "critic.regularizers=[]", "threads=1", "progress=false"]


def test_a_short_run_resumes_to_the_straight_run_bit_for_bit(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_cli(main, TINY + ["total_steps=160", f"run_dir={straight}"]) == 0
    assert run_cli(main, TINY + ["total_steps=100", f"run_dir={split}"]) == 0
    assert run_cli(main, ["--resume", str(split), "total_steps=160"]) == 0
    a, b = load_checkpoint(straight / CHECKPOINT), load_checkpoint(split / CHECKPOINT)
    assert a["step"] == b["step"] == 160
    ours, theirs = dict(state_tensors(a)), dict(state_tensors(b))
    assert ours and ours.keys() == theirs.keys()
    assert [k for k, v in ours.items() if not torch.equal(v, theirs[k])] == []


@pytest.mark.parametrize("dropout", [-0.1, 1.0])
def test_a_dropout_outside_0_1_is_refused_in_one_line(dropout):
    with pytest.raises(ConfigError, match=r"^droq\.dropout: must lie in \[0, 1\)") as err:
        from_dict(TrainConfig, {"agent": "droq", "droq": {"dropout": dropout}})
    assert "\n" not in str(err.value)


def test_diagnostics_differentiate_the_dropout_loss_and_measure_features_without_dropout():
    """The gradient diagnostics differentiate the update's loss, dropout with the probe's masks
    included (its per-example losses average to the update's critic loss; other masks give another
    loss); the feature diagnostics (ranks, dormant units) forward the critics without dropout, as
    ``q_values`` does, so they do not depend on the masks."""
    from sac_spectral.agents.probes import DiagnosticsConfig, agent_diagnostics, network_loss, probe_batch

    agent = DroQ(OBS, ACT, _config(), SeedStreams([0]))
    batch, noise = probe_batch(agent, _buffer(1), B, [0], 0)
    g = torch.Generator().manual_seed(1)
    other = {name: torch.randn(v.shape, generator=g) for name, v in noise.items()}
    loss, probe = network_loss(agent, "critic", batch, noise)
    other_loss, other_probe = network_loss(agent, "critic", batch, other)
    with torch.no_grad():
        per_example = loss(agent.critic, probe).view(1, M, -1)
        update = agent.critic_step(batch, noise)[1]["loss/critic"]
        assert not torch.allclose(other_loss(agent.critic, other_probe).view(1, M, -1), per_example)
    torch.testing.assert_close(per_example.mean(-1).sum(1), update)
    cfg = DiagnosticsConfig(histograms=False, per_layer=False)
    first, second = (agent_diagnostics(agent, batch, n, cfg)["critic"].scalars for n in (noise, other))
    features = [k for k in first if k.startswith(("features/", "dormant/", "active/"))]
    assert features
    for key in features:
        torch.testing.assert_close(first[key], second[key], msg=key)
    grads = [k for k in first if k.startswith("grad_rank/")]
    assert grads and any(not torch.allclose(first[k], second[k]) for k in grads)
