"""BroNet and SimBa, member-batched: against hand-written single-network references, their running
input statistics against numpy, their levels for resets, and every regularizer on their layers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import named_noise
from sac_spectral.agents import SAC, TD3
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.layers import layer_views
from sac_spectral.core.residual import ResidualNet, RunningNorm, make_network
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import ReDo, Spectral

IN, W = 6, 16


def _net(arch, members=3, blocks=2):
    gens = [torch.Generator().manual_seed(10 + m) for m in range(members)]
    return make_network(arch, members, IN, [W] * (blocks + 1), (2, 3), generators=gens)


def _lin(layer, m, x):
    return x @ layer.weight[m].T + layer.bias[m]


def _ln(norm, m, x):
    return F.layer_norm(x, (x.shape[-1],)) * norm.weight[m] + norm.bias[m]


def _reference(net, m, x):
    """Member ``m`` written out from the papers' block equations."""
    if net.arch == "bronet":
        h = F.relu(_ln(net.embed_norm, m, _lin(net.embed, m, x)))
        for b in net.blocks:
            h = h + _ln(b["norm_out"], m,
                        _lin(b["linear_out"], m, F.relu(_ln(b["norm_in"], m, _lin(b["linear_in"], m, h)))))
    else:
        x = (x - net.input_norm.mean[m]) / torch.sqrt(net.input_norm.var[m] + 1e-8)
        h = _lin(net.embed, m, x)
        for b in net.blocks:
            h = h + _lin(b["linear_out"], m, F.relu(_lin(b["linear_in"], m, _ln(b["norm_in"], m, h))))
        h = _ln(net.final_norm, m, h)
    return [_lin(head, m, h) for head in net.heads]


@pytest.mark.parametrize("arch", ["bronet", "simba"])
def test_each_member_is_the_papers_network(arch):
    net = _net(arch)
    with torch.no_grad():  # non-trivial gains, shifts and statistics
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
        if arch == "simba":
            net.observe(3 + 2 * torch.randn(3, 50, IN))
    x = torch.randn(3, 8, IN)
    out = net(x)
    for m in range(3):
        for ours, ref in zip(out, _reference(net, m, x[m])):
            assert torch.allclose(ours[m], ref, atol=1e-5)
    assert net.blocks[0]["linear_in"].weight.shape == (3, W * (4 if arch == "simba" else 1), W)


@pytest.mark.parametrize("arch", ["bronet", "simba"])
def test_member_i_is_the_single_network_of_its_generator(arch):
    batched, single = _net(arch), make_network(arch, 1, IN, [W] * 3, (2, 3),
                                               generators=[torch.Generator().manual_seed(11)])
    x = torch.randn(5, IN)
    assert all(torch.equal(b[1], s[0]) for b, s in zip(batched(x), single(x)))


def test_running_norm_matches_numpy_over_every_batch_seen():
    norm = RunningNorm(2, 4)
    batches = [torch.randn(2, n, 4, dtype=torch.float64) * 3 + 1 for n in (7, 1, 30)]
    norm = norm.double()
    for b in batches:
        norm.observe(b)
    data = torch.cat(batches, dim=1).numpy()
    assert np.allclose(norm.mean.numpy(), data.mean(axis=1)) and np.allclose(norm.var.numpy(), data.var(axis=1))
    assert norm.count.flatten().tolist() == [38, 38]


@pytest.mark.parametrize("arch", ["bronet", "simba"])
def test_the_last_two_levels_are_the_heads_and_the_last_block(arch):
    net = _net(arch)
    last_block = set(map(id, net.blocks[-1].values())) | ({id(net.final_norm)} if arch == "simba" else set())
    assert set(map(id, net.tail(2))) == last_block | set(map(id, net.heads))
    before = {n: p.clone() for n, p in net.named_parameters()}
    net.reset_parameters([torch.Generator().manual_seed(99 + m) for m in range(3)], last=2)
    changed = {n for n, p in net.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(("heads", "blocks.1")) for n in changed)


@pytest.mark.parametrize("arch", ["bronet", "simba"])
def test_spectral_sees_every_linear_layer_and_redo_recycles_block_units(arch):
    net = _net(arch)
    linears = [v for v in layer_views(net) if v.kind == "linear"]
    assert len(linears) == 1 + 2 * len(net.blocks) + len(net.heads)
    assert Spectral(net, coef=1.0).penalty().requires_grad
    redo = ReDo(net, tau=1.0, every=1)  # every unit at or below the mean score: about half are recycled
    redo.set_probe(lambda: torch.randn(3, 64, IN))
    redo.attach(torch.optim.Adam(net.parameters()))
    out = net.blocks[0]["linear_out"].weight.detach().clone()
    redo.after_step(1)
    assert redo.state["recycled"].min() > 0
    assert (net.blocks[0]["linear_out"].weight == 0).any() and not torch.equal(out, net.blocks[0]["linear_out"].weight)


def test_nap_takes_bronet_and_refuses_simba_whose_blocks_have_no_norm_before_the_relu():
    from sac_spectral.core.config import ConfigError
    from sac_spectral.regularizers import build_regularizers

    assert build_regularizers(_net("bronet"), [{"name": "nap"}])[0].name == "nap"
    with pytest.raises(ConfigError, match=r"missing after layer blocks\.0\.linear_in, blocks\.1\.linear_in\): SimBa's"):
        build_regularizers(_net("simba"), [{"name": "nap"}], "critic.regularizers")


@pytest.mark.parametrize("agent", [SAC, TD3])
def test_agents_train_on_residual_networks_and_simba_tracks_its_inputs(agent):
    cfg = TrainConfig()
    cfg.agent = agent.name
    cfg.critic.arch, cfg.actor.arch = "bronet", "simba"
    cfg.critic.hidden = cfg.actor.hidden = [32, 32]
    a = agent(IN, 2, cfg, SeedStreams([0, 1]))
    assert isinstance(a.critic, ResidualNet) and a.actor.observes and not a.critic.observes
    batch = {"obs": torch.randn(2, 16, IN) + 5, "action": torch.rand(2, 16, 2) * 2 - 1, "reward": torch.randn(2, 16),
             "next_obs": torch.randn(2, 16, IN) + 5, "terminated": torch.zeros(2, 16)}
    for _ in range(3):
        a.observe(batch)
        info = a.update(batch, named_noise(a, torch.randn(2, 2, 16, 2)))
    assert all(torch.isfinite(v).all() for v in info.values())
    assert a.actor.input_norm.count.flatten().tolist() == [48, 48] and a.actor.input_norm.mean.mean() > 4
