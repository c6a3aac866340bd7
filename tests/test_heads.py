"""Distributional critic heads against references written from their papers' equations: SAC with a
categorical head (C51's projection, Bellemare et al. 2017, Algorithm 1; HL-Gauss, Farebrother et al.
2024) and with a quantile head (QR-DQN's quantile Huber loss, Dabney et al. 2018; TQC's truncated
pooled target, Kuznetsov et al. 2020) gives the reference's networks after three updates, on batches
of 16, 2 and 1 and with fewer quantiles than critics; the options are checked in one line; a short
run with each head resumes and is diagnosed."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from conftest import named_noise, reference_batch, state_tensors
from sac_spectral.agents import AGENTS, SAC
from sac_spectral.agents.heads import CategoricalHead
from sac_spectral.apps.rl.config import TrainConfig, run_tag
from sac_spectral.apps.rl.train import main
from sac_spectral.core.config import ConfigError, from_dict
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.runs.checkpoint import load_checkpoint
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.layout import CHECKPOINT

OBS, ACT, B, C, H = 5, 2, 16, 2, 16
HEADS = {
    "two_hot": {"head": "categorical", "num_atoms": 11, "v_min": -4.0, "v_max": 4.0},
    "hl_gauss": {"head": "categorical", "num_atoms": 11, "v_min": -4.0, "v_max": 4.0, "projection": "hl_gauss",
                 "sigma": 0.75},
    "quantile": {"head": "quantile", "num_quantiles": 5},
    "tqc": {"head": "quantile", "num_quantiles": 5, "drop_top": 2},
    # fewer quantiles than critics: TQC's largest truncation, and a single quantile (no truncation)
    "tqc_2_of_5": {"head": "quantile", "num_quantiles": 2, "drop_top": 1, "num_critics": 5},
    "one_quantile": {"head": "quantile", "num_quantiles": 1, "num_critics": 3},
}


def _config(head: dict) -> TrainConfig:
    cfg = from_dict(TrainConfig, {"critic": {"hidden": [H, H], "regularizers": [], **head},
                                  "actor": {"hidden": [H, H], "regularizers": []}})
    return cfg


def _params(net, member, heads):
    layers = list(net.layers) + [net.heads[h] for h in heads]
    return [(m.weight[member].detach().clone().requires_grad_(), m.bias[member].detach().clone().requires_grad_())
            for m in layers]


def _two_hot(y, p, z):
    """C51 (Algorithm 1): each atom ``y_j`` (clipped) split between its neighbours ``l = ⌊b⌋``, ``u = ⌈b⌉``
    of ``b = (y − v_min)/Δ`` in proportion ``u − b`` and ``b − l`` (all on ``l`` when ``l = u``)."""
    dz = z[1] - z[0]
    b = ((y.clamp(z[0], z[-1]) - z[0]) / dz).clamp(0, len(z) - 1)  # rounding may put v_max's b past K − 1
    lo, up = b.floor().long(), b.ceil().long()
    m = torch.zeros(*y.shape[:-1], len(z))
    m.scatter_add_(-1, lo, p * (up - b + (lo == up).to(b.dtype)))
    m.scatter_add_(-1, up, p * (b - lo))
    return m


def _hl_gauss(y, p, z, sigma):
    """HL-Gauss: each atom a Normal(y_j, (σΔ)²) integrated over the bins ``z_i ± Δ/2``, renormalized to
    the support's mass, weighted by ``p_j``."""
    dz = z[1] - z[0]
    edges = torch.cat([z - dz / 2, z[-1:] + dz / 2])
    cdf = Normal(y.clamp(z[0], z[-1]).unsqueeze(-1), sigma * dz).cdf(edges)
    mass = (cdf[..., 1:] - cdf[..., :-1]) / (cdf[..., -1:] - cdf[..., :1])
    return (p.unsqueeze(-1) * mass).sum(-2)


def _quantile_huber(theta, y):
    """QR-DQN: ``Σ_i mean_j ρ^κ_{τ_i}(y_j − θ_i)``, ``ρ^κ_τ(u) = |τ − 1{u < 0}|·L_κ(u)/κ``, ``κ = 1``,
    per example (``theta [B, K]``, ``y [B, J]``)."""
    k = theta.shape[-1]
    tau = (2 * torch.arange(k) + 1) / (2 * k)
    u = y.unsqueeze(-2) - theta.unsqueeze(-1)
    huber = torch.where(u.abs() <= 1, 0.5 * u**2, u.abs() - 0.5)
    return ((tau.unsqueeze(-1) - (u < 0).to(u.dtype)).abs() * huber).sum(-2).mean(-1)


class Reference:
    """SAC for one seed with a distributional critic head: actor, ``num_critics`` critics and their
    targets, α."""

    def __init__(self, agent: SAC, cfg: TrainConfig) -> None:
        self.cfg, c = cfg, cfg.critic
        self.actor = _params(agent.actor, 0, (0, 1))
        self.critics = [_params(agent.critic, j, (0,)) for j in range(c.num_critics)]
        self.targets = [[(w.detach().clone(), b.detach().clone()) for w, b in c] for c in self.critics]
        self.log_alpha = torch.tensor(math.log(cfg.alpha.init), requires_grad=True)
        flat = lambda ps: [t for wb in ps for t in wb]  # noqa: E731
        self.actor_opt = torch.optim.Adam(flat(self.actor), lr=cfg.actor.lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.alpha.lr)
        self.critic_opt = torch.optim.Adam([t for c in self.critics for t in flat(c)], lr=c.lr)
        self.z = torch.linspace(c.v_min, c.v_max, c.num_atoms) if c.head == "categorical" else None

    def out(self, params, s, a):
        h = torch.cat([s, a], -1)
        for w, b in params[:-1]:
            h = F.relu(h @ w.T + b)
        w, b = params[-1]
        return h @ w.T + b

    def q(self, params, s, a):
        """The head's expectation: ``Σ softmax(ℓ) z`` or the mean of the quantiles."""
        o = self.out(params, s, a)
        return (o.softmax(-1) * self.z).sum(-1) if self.z is not None else o.mean(-1)

    def pi(self, s, eps):
        h = s
        for w, b in self.actor[:-2]:
            h = F.relu(h @ w.T + b)
        mean, raw = h @ self.actor[-2][0].T + self.actor[-2][1], h @ self.actor[-1][0].T + self.actor[-1][1]
        lo, hi = self.cfg.actor.log_std_min, self.cfg.actor.log_std_max
        std = (lo + 0.5 * (hi - lo) * (torch.tanh(raw) + 1)).exp()
        tanh = TanhTransform(cache_size=1)
        a = tanh(mean + std * eps)
        return a, TransformedDistribution(Normal(mean, std), [tanh]).log_prob(a).sum(-1)

    def critic_loss(self, s, a, r, s2, d, eps2, alpha):
        c = self.cfg.critic
        with torch.no_grad():
            a2, logp2 = self.pi(s2, eps2)
            outs = [self.out(t, s2, a2) for t in self.targets]
            def shift(atoms):
                return r[:, None] + self.cfg.gamma * (1 - d[:, None]) * (atoms - alpha * logp2[:, None])

            if self.z is not None:  # the distribution of the critic of smallest expectation
                probs = torch.stack(outs).softmax(-1)  # [C, B, K]
                p = probs[(probs * self.z).sum(-1).argmin(0), torch.arange(len(s))]
                y = shift(self.z.expand(len(s), -1))
                m = _two_hot(y, p, self.z) if c.projection == "two_hot" else _hl_gauss(y, p, self.z, c.sigma)
            else:  # TQC: pool, sort, drop the top d·N
                pooled = torch.cat(outs, -1).sort(-1).values
                y = shift(pooled[:, : pooled.shape[-1] - c.drop_top * len(outs)])
        losses = []
        for critic in self.critics:
            o = self.out(critic, s, a)
            losses.append(-(m * o.log_softmax(-1)).sum(-1) if self.z is not None else _quantile_huber(o, y))
        return sum(loss.mean() for loss in losses)

    def update(self, s, a, r, s2, d, eps):
        alpha = self.log_alpha.detach().exp()
        loss = self.critic_loss(s, a, r, s2, d, eps[0], alpha)
        self.critic_opt.zero_grad()
        loss.backward()
        self.critic_opt.step()
        with torch.no_grad():
            for online, target in zip(self.critics, self.targets, strict=True):
                for (w, b), (tw, tb) in zip(online, target, strict=True):
                    tw.lerp_(w, self.cfg.tau)
                    tb.lerp_(b, self.cfg.tau)
        act, logp = self.pi(s, eps[1])
        q = torch.stack([self.q([(w.detach(), b.detach()) for w, b in c], s, act) for c in self.critics]).min(0).values
        actor_loss = (alpha * logp - q).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()
        alpha_loss = self.log_alpha.exp() * (-logp.detach().mean() + self.cfg.alpha.target_entropy_scale * ACT)
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("batch_size", [B, 2, 1])
@pytest.mark.parametrize("head", list(HEADS))
def test_update_equals_the_papers_equations_after_three_updates(head, batch_size):
    torch.manual_seed(0)
    cfg = _config(HEADS[head])
    agent = SAC(OBS, ACT, cfg, SeedStreams([3]))
    ref = Reference(agent, cfg)
    for _ in range(3):
        batch = reference_batch(batch_size, OBS, ACT)
        batch["reward"] = 3 * batch["reward"]  # some targets beyond the categorical support: clipped
        noise = torch.randn(2, 1, batch_size, ACT)
        agent.update(batch, named_noise(agent, noise))
        ref.update(*(batch[k][0] for k in ("obs", "action", "reward", "next_obs", "terminated")), noise[:, 0])
    pairs = [(_params(agent.actor, 0, (0, 1)), ref.actor)]
    pairs += [(_params(agent.critic, j, (0,)), ref.critics[j]) for j in range(agent.num_critics)]
    pairs += [(_params(agent.target_critic, j, (0,)), ref.targets[j]) for j in range(agent.num_critics)]
    layers = [(ow, tw) for ours, theirs in pairs for ow, tw in zip(ours, theirs, strict=True)]
    worst = max((o - t).abs().max().item() for ow, tw in layers for o, t in zip(ow, tw, strict=True))
    worst = max(worst, abs(agent.log_alpha.item() - ref.log_alpha.item()))
    print(f"{head}, batch {batch_size}: largest difference from the reference: {worst:.2e}")
    assert worst < 1e-6, worst
    assert agent.critic.heads[0].weight.shape[1] == HEADS[head].get("num_atoms", HEADS[head].get("num_quantiles"))


@pytest.mark.usefixtures("float64")
def test_the_projections_keep_the_mass_and_the_two_hot_keeps_the_mean():
    """Both projections give distributions; two-hot keeps the mean of atoms inside the support; an
    HL-Gauss target's mean lies within a tenth of a bin of an atom at a bin's centre far from the edges."""
    head = CategoricalHead(21, -10.0, 10.0, "two_hot", 0.75)
    y = torch.rand(4, 7, 3) * 18 - 9
    p = torch.rand(4, 7, 3).softmax(-1)
    m = head.target(y, p)
    torch.testing.assert_close(m.sum(-1), torch.ones(4, 7))
    torch.testing.assert_close((m * head.support(m)).sum(-1), (p * y).sum(-1))
    gauss = CategoricalHead(21, -10.0, 10.0, "hl_gauss", 0.75)
    m = gauss.target(torch.full((1, 1, 1), 2.0), torch.ones(1, 1, 1))
    torch.testing.assert_close(m.sum(-1), torch.ones(1, 1))
    assert abs((m * gauss.support(m)).sum().item() - 2.0) < 0.1


def test_the_categorical_support_is_derived_from_dmcs_reward_range():
    cfg = from_dict(TrainConfig, {"env": "dmc:cartpole-balance", "gamma": 0.9, "action_repeat": 2,
                                  "critic": {"head": "categorical"}})
    assert (cfg.critic.v_min, cfg.critic.v_max) == (-20.0, 20.0)
    given = from_dict(TrainConfig, {"critic": {"head": "categorical", "v_min": -1, "v_max": 3}})
    assert (given.critic.v_min, given.critic.v_max) == (-1, 3)


@pytest.mark.parametrize(("options", "message"), [
    ({"critic": {"head": "categorical", "num_atoms": 1}}, r"^critic\.num_atoms: must be >= 2"),
    ({"critic": {"head": "categorical", "v_min": 2, "v_max": 2}}, r"^critic\.v_min: must be < v_max"),
    ({"critic": {"head": "categorical", "v_min": -2}}, r"^critic\.v_min: give v_min and v_max together"),
    ({"critic": {"head": "quantile", "num_quantiles": 4, "drop_top": 4}}, r"^critic\.drop_top: must lie in \[0, num_q"),
    ({"critic": {"num_atoms": 51}}, r"^critic\.num_atoms: is an option of head=categorical; this critic's head is "),
    ({"critic": {"head": "quantile", "projection": "hl_gauss"}}, r"^critic\.projection: is an option of head=categ"),
    ({"critic": {"head": "categorical", "drop_top": 1}}, r"^critic\.drop_top: is an option of head=quantile"),
    ({"critic": {"head": "gaussian"}}, r"^critic\.head: 'gaussian' is not one of scalar, categorical, quantile"),
    ({"critic": {"head": "categorical", "projection": "nearest"}}, r"^critic\.projection: 'nearest' is not one of"),
    ({"env": "Pendulum-v1", "critic": {"head": "categorical"}}, r"^critic\.v_min: the reward range of Pendulum-v1 is"),
])
def test_bad_head_options_are_refused_in_one_line(options, message):
    with pytest.raises(ConfigError, match=message) as err:
        from_dict(TrainConfig, options)
    assert "\n" not in str(err.value)


def test_run_names_carry_the_head():
    assert run_tag(from_dict(TrainConfig, {"critic": {"head": "quantile", "regularizers": []}, "actor": {
        "regularizers": []}})) == "sac+quantile"
    bronet = {"head": "categorical", "arch": "bronet", "hidden": [8, 8]}
    spectral = {**bronet, "regularizers": [{"name": "spectral"}]}
    assert run_tag(from_dict(TrainConfig, {"agent": "td3", "critic": bronet})) == "td3+bronet+categorical"
    assert run_tag(from_dict(TrainConfig, {"agent": "td3", "critic": spectral})) == "td3+spectral+bronet+categorical"


@pytest.mark.parametrize("head", ["categorical", "quantile"])
def test_q_values_are_the_heads_expectations_and_the_memory_counts_its_width(head):
    """``critic_outputs`` are ``[N, C, B, K]``, ``q_values`` their expectations ``[N, C, B]``; the memory
    estimate grows with the head's width."""
    cfg = _config({"head": head})
    agent = SAC(OBS, ACT, cfg, SeedStreams([0, 1]))
    obs, action = torch.randn(2, 8, OBS), torch.rand(2, 8, ACT)
    out = agent.critic_outputs(agent.critic, obs, action)
    assert out.shape == (2, C, 8, 101 if head == "categorical" else 25)
    torch.testing.assert_close(agent.q_values(agent.critic, obs, action), agent.head.expectation(out))
    ours, scalar = SAC.memory_estimate(cfg, OBS, ACT), SAC.memory_estimate(_config({}), OBS, ACT)
    assert ours["networks and Adam state"] > scalar["networks and Adam state"]
    assert ours["a batch's transitions and activations"] > scalar["a batch's transitions and activations"]
    assert "critic head's target and loss" in ours and "critic head's target and loss" not in scalar


TINY = ["env=dmc:cartpole-balance", "random_steps=50", "eval_every=50", "eval_episodes=1", "threads=1",
        "actor.hidden=[16,16]", "critic.hidden=[16,16]", "batch_size=32", "progress=false"]


@pytest.mark.parametrize(("agent", "head"), [("sac", ["critic.head=categorical", "critic.projection=hl_gauss"]),
                                             ("redq", ["critic.head=quantile", "critic.drop_top=2",
                                                       "critic.num_critics=3", "redq.policy_delay=2"])])
def test_a_short_run_with_a_head_resumes_to_the_straight_run(tmp_path, agent, head):
    """Stopped and resumed, the run ends as the straight one; its policy loads and replays the recorded
    last evaluation, and ``diagnose --q-scale`` reads the head's expectations."""
    from sac_spectral.apps.rl.diagnose import main as diagnose
    from sac_spectral.apps.rl.policy import load_policy, play_episodes

    straight, split = tmp_path / "straight", tmp_path / "split"
    args = TINY + [f"agent={agent}", *head]
    assert run_cli(main, args + ["total_steps=120", f"run_dir={straight}"]) == 0
    assert run_cli(main, args + ["total_steps=70", f"run_dir={split}"]) == 0
    assert run_cli(main, ["--resume", str(split), "total_steps=120"]) == 0
    a, b = load_checkpoint(straight / CHECKPOINT), load_checkpoint(split / CHECKPOINT)
    assert a["step"] == b["step"] == 120
    ours, theirs = dict(state_tensors(a)), dict(state_tensors(b))
    assert ours and [k for k, v in ours.items() if not torch.equal(v, theirs[k])] == []
    assert run_cli(diagnose, [str(straight), "--q-scale", "1", "--json", str(tmp_path / "d.json")]) == 0
    assert "q_scale" in (tmp_path / "d.json").read_text()
    policy = load_policy(straight)
    returns = play_episodes(policy, policy.recorded.reset_seeds(policy.seed))
    assert sum(returns) / len(returns) == policy.recorded.mean_return


def test_every_actor_critic_agent_takes_every_head():
    for name in ("sac", "td3", "redq", "crossq", "droq"):
        for head in HEADS.values():
            cfg = from_dict(TrainConfig, {"agent": name, "critic": {"hidden": [8, 8], **head},
                                          "actor": {"hidden": [8]}})
            agent = AGENTS[name](OBS, ACT, cfg, SeedStreams([0]))
            out = agent.critic_outputs(agent.critic, torch.randn(1, 4, OBS), torch.rand(1, 4, ACT))
            q = agent.q_values(agent.critic, torch.randn(1, 4, OBS), torch.rand(1, 4, ACT))
            assert out.shape[-1] == agent.head.width and q.shape == (1, agent.num_critics, 4)


def test_a_spectral_penalty_on_a_categorical_heads_logits_is_warned_about():
    """The default critic regularizer (spectral on every layer) with a categorical head is told at the
    start; on hidden layers only, with a scalar or quantile head, or without it, nothing is said."""
    def warnings(head: str, regularizers: list[dict]) -> list[str]:
        cfg = from_dict(TrainConfig, {"critic": {"head": head, "regularizers": regularizers}})
        return [w for w in SAC.run_warnings(cfg) if "categorical head" in w]

    spectral = {"name": "spectral", "coef": 1e-4}
    assert len(warnings("categorical", [spectral])) == 1
    assert warnings("categorical", [{**spectral, "layers": "hidden"}]) == []
    assert warnings("categorical", []) == warnings("quantile", [spectral]) == warnings("scalar", [spectral]) == []
