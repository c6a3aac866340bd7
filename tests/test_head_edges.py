"""The critic heads at their edges: batches of one and two transitions with every agent, fewer
quantiles than critics (REDQ's subset, TQC's largest truncation), and ``precision=bf16``, where the
heads and SimbaV2's normalizations compute in float32 (a bf16 update's losses stay within a measured
bound of the float32 ones; the projected targets keep their mass to 1e-6)."""

import pytest
import torch

from conftest import reference_batch
from sac_spectral.agents import AGENTS, ReplayBuffer
from sac_spectral.agents.heads import CategoricalHead
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.config import ConfigError, from_dict
from sac_spectral.core.seeding import SeedStreams

OBS, ACT = 5, 2
HEADS = {
    "two_hot": {"head": "categorical", "num_atoms": 21, "v_min": -10.0, "v_max": 10.0},
    "hl_gauss": {"head": "categorical", "num_atoms": 21, "v_min": -10.0, "v_max": 10.0, "projection": "hl_gauss"},
    "quantile": {"head": "quantile", "num_quantiles": 5},
    "tqc_2_of_5": {"head": "quantile", "num_quantiles": 2, "drop_top": 1, "num_critics": 5},
}
#: every agent with the architectures it takes (CrossQ and DroQ build their own critics)
AGENT_ARCHS = [("sac", "mlp"), ("sac", "simbav2"), ("td3", "simbav2"), ("redq", "simbav2"), ("crossq", "mlp"),
               ("droq", "mlp")]


def _agent(name: str, arch: str, head: dict, precision: str = "fp32", seeds=(0, 1), **extra) -> torch.nn.Module:
    cfg = from_dict(TrainConfig, {"agent": name, "precision": precision, **extra,
                                  "critic": {"hidden": [16, 16], "arch": arch, "regularizers": [], **head},
                                  "actor": {"hidden": [16, 16], "arch": arch, "regularizers": []}})
    return AGENTS[name](OBS, ACT, cfg, SeedStreams(list(seeds)))


def _seeds_batch(b: int, seeds: int = 2) -> dict:
    """``[seeds, b, ·]`` transitions (each seed its own)."""
    parts = [reference_batch(b, OBS, ACT) for _ in range(seeds)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize(("name", "arch"), AGENT_ARCHS)
def test_batches_of_one_and_two_train_every_agent_with_every_head(name, arch, head, batch_size):
    """The per-example losses are ``[N, C, B]`` and finite; three updates from a buffer leave
    finite metrics and parameters."""
    agent = _agent(name, arch, HEADS[head])
    noise = {k: v[0] for k, v in agent.draw_noise(1, batch_size).items()}
    losses, q = agent.critic_losses(_seeds_batch(batch_size), noise)
    assert losses.shape == q.shape == (2, agent.num_critics, batch_size) and torch.isfinite(losses).all()
    buf = ReplayBuffer(8, OBS, ACT, 2)
    for _ in range(8):
        buf.add(torch.randn(2, OBS), torch.rand(2, ACT) * 2 - 1, torch.randn(2), torch.randn(2, OBS), torch.zeros(2))
    info = agent.train_steps(buf, 3, batch_size)
    assert [k for k, v in info.items() if not torch.isfinite(v).all()] == []
    assert all(torch.isfinite(p).all() for p in agent.parameters())


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize(("num_quantiles", "drop_top"), [(1, 0), (2, 1), (3, 2)])
def test_redqs_quantile_target_pools_its_subset_of_critics(num_quantiles, drop_top):
    """Fewer quantiles than critics (5), a subset of 2 in the target, drop_top at its largest: the
    target is the subset's ``2K`` next-state quantiles sorted, the top ``2·drop_top`` dropped, each
    moved to ``r + γ(1 − d)(θ − α log π)``."""
    head = {"head": "quantile", "num_quantiles": num_quantiles, "drop_top": drop_top, "num_critics": 5}
    agent = _agent("redq", "mlp", head, redq={"num_min": 2})
    batch = _seeds_batch(6)
    noise = {k: v[0] for k, v in agent.draw_noise(1, 6).items()}
    subset = torch.tensor([[4, 1], [0, 3]])
    target = agent.critic_target(batch, noise["next_action"], subset)
    next_action, next_logp = agent.policy(batch["next_obs"], noise["next_action"])
    out = agent.critic_outputs(agent.target_critic, batch["next_obs"], next_action)  # [N, 5, B, K]
    alpha, gamma = agent.log_alpha.exp(), agent.cfg.gamma
    for n in range(2):
        pooled = torch.cat([out[n, j] for j in subset[n]], dim=-1).sort(dim=-1).values  # [B, 2K]
        kept = pooled[:, : 2 * (num_quantiles - drop_top)]
        y = batch["reward"][n, :, None] + gamma * (1 - batch["terminated"][n, :, None]) * (
            kept - alpha[n] * next_logp[n, :, None])
        torch.testing.assert_close(target[n], y, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["sac", "td3", "redq", "crossq", "droq"])
def test_drop_top_is_checked_against_the_quantiles_every_agents_pooled_target_keeps(name):
    """Every agent pools the quantiles of the ``C′`` critics its target reads (all of them, or REDQ's
    subset) and keeps ``C′(K − drop_top)`` of them: ``drop_top = K − 1`` keeps ``C′`` (accepted with
    fewer quantiles than critics), ``drop_top = K`` none (refused in one line)."""
    extra = {"redq": {"num_min": 2}} if name == "redq" else {}
    head = {"head": "quantile", "num_quantiles": 2, "num_critics": 5}
    agent = _agent(name, "mlp", {**head, "drop_top": 1}, **extra)
    out = torch.randn(2, 2 if name == "redq" else 5, 3, 2)
    assert agent.head.next_value(out)[0].shape == (2, 3, out.shape[1])
    with pytest.raises(ConfigError, match=r"^critic\.drop_top: must lie in \[0, num_quantiles\) \(2\)") as err:
        _agent(name, "mlp", {**head, "drop_top": 2}, **extra)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("projection", ["two_hot", "hl_gauss"])
@pytest.mark.parametrize(("v_min", "v_max", "atoms"), [(-5.0, 5.0, 101), (-1000 / 3, 1000 / 3, 51), (0.1, 700.3, 201)])
def test_projected_targets_keep_their_mass_in_float32_on_any_support(projection, v_min, v_max, atoms):
    """Atoms anywhere (near the support's atoms, between them, beyond its ends) of a distribution
    project onto a float32 distribution whose mass is 1 within 1e-6 (two-hot in value units lost
    1.5e-6 on the widest support here)."""
    head = CategoricalHead(atoms, v_min, v_max, projection, 0.75)
    z = head.support(torch.zeros(()))
    width = (v_max - v_min) / (atoms - 1)
    near = z + (torch.rand(64, 8, atoms) - 0.5) * 1e-3 * width
    anywhere = v_min - 0.05 * (v_max - v_min) + torch.rand(64, 8, atoms) * 1.1 * (v_max - v_min)
    p = torch.rand(64, 8, atoms).softmax(-1)
    for y in (near, anywhere):
        m = head.target(y, p)
        assert m.dtype == torch.float32 and (m >= 0).all()
        assert (m.sum(-1) - 1).abs().max() < 1e-6


@pytest.mark.parametrize("projection", ["two_hot", "hl_gauss"])
def test_a_non_finite_atom_gives_a_nan_target_or_the_support_end_never_an_error(projection):
    """A NaN atom (a diverged critic or log π) makes its example's target NaN, so the run's
    non-finite check sees it; ±inf atoms land on the support's ends with their mass; the other
    examples are untouched."""
    head = CategoricalHead(11, -5.0, 5.0, projection, 0.75)
    y = torch.linspace(-4.0, 4.0, 11).expand(3, 11).clone()
    y[0, 4], y[1, 2], y[1, 3] = float("nan"), float("inf"), -float("inf")
    p = torch.full((3, 11), 1 / 11)
    m = head.target(y, p)
    assert m[0].isnan().any() and not m[1:].isnan().any()
    assert (m[1].sum() - 1).abs() < 1e-6
    if projection == "two_hot":  # HL-Gauss spreads the end atoms' mass over their neighbours too
        assert m[1, 0] >= 1 / 11 - 1e-6 and m[1, -1] >= 1 / 11 - 1e-6
    torch.testing.assert_close(m[2], head.target(y[2:], p[2:])[0])


BF16 = [("sac", "mlp"), ("sac", "simbav2"), ("crossq", "mlp")]


@pytest.mark.usefixtures("bf16_configs")
@pytest.mark.parametrize("head", ["two_hot", "hl_gauss", "quantile"])
@pytest.mark.parametrize(("name", "arch"), BF16)
def test_a_bf16_update_computes_its_head_in_float32_within_a_measured_bound(name, arch, head):
    """Same networks and batch in bf16 and float32: the bf16 per-example losses are float32 and
    within 2e-2 of the float32 ones relative to the largest (measured: at most 5.1e-3, CrossQ's
    two-hot), the projected target is float32 with mass 1 within 1e-6 (CrossQ's bf16 logits gave
    1.1e-3), and after three updates the critics' Q-values agree within 5e-3 (measured: 1.0e-3)."""
    spec = {**HEADS[head], "num_atoms": 51} if head != "quantile" else {**HEADS[head], "drop_top": 1}
    torch.manual_seed(1)
    batch = _seeds_batch(64)
    full, low = _agent(name, arch, spec), _agent(name, arch, spec, "bf16")
    noise = {k: v[0] for k, v in full.draw_noise(1, 64).items()}
    targets = []
    project = low.head.target
    low.head.target = lambda values, weights: targets.append(project(values, weights)) or targets[-1]
    reference = full.critic_losses(batch, noise)[0]
    with low.precision.forward():
        losses = low.critic_losses(batch, noise)[0]
    assert losses.dtype == targets[0].dtype == torch.float32
    loss_error = ((losses - reference).abs().max() / reference.abs().max()).item()
    if spec["head"] == "categorical":
        assert (targets[0].sum(-1) - 1).abs().max() < 1e-6
    for agent in (full, low):
        for _ in range(3):
            agent.update(batch, noise)
    q_full = full.q_values(full.critic, batch["obs"], batch["action"])
    q_low = low.q_values(low.critic, batch["obs"], batch["action"])
    q_error = ((q_low - q_full).abs().max() / q_full.abs().max()).item()
    print(f"{name} {arch} {head}: bf16 against float32: losses {loss_error:.1e}, Q after 3 updates {q_error:.1e}")
    assert loss_error < 2e-2 and q_error < 5e-3


@pytest.mark.usefixtures("bf16_configs")
def test_simbav2_normalizes_in_float32_under_bf16():
    """bf16 products, float32 normalizations: every feature of the stream lies on the unit sphere
    within 1e-6 (normalized in bf16 they were off by up to 8e-3), and the heads' outputs stay bf16
    products."""
    agent = _agent("sac", "simbav2", HEADS["two_hot"], "bf16")
    with agent.precision.forward():
        out, hidden = agent.critic(torch.randn(4, 8, OBS + ACT), return_hidden=True)
    assert out.dtype == torch.bfloat16
    for h in hidden:
        assert h.dtype == torch.float32 and (h.norm(dim=-1) - 1).abs().max() < 1e-6
