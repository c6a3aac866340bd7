"""Plasticity injection, Normalize-and-Project and continual backpropagation against hand
computations and loop references, their checkpoints, and each with spectral inside SAC."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import named_noise
from sac_spectral.agents import SAC, SACConfig
from sac_spectral.core.config import ConfigError
from sac_spectral.core.nets import BatchedMLP
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import CBP, NaP, PlasticityInjection, build_regularizers


def _clone_gens(gens):
    out = []
    for g in gens:
        c = torch.Generator()
        c.set_state(g.get_state())
        out.append(c)
    return out


def _step(model, opt, x, y, regs=(), step=1):
    """One Adam step on a regression loss (multi-head outputs summed), then the interventions."""
    out = model(x)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o - y[..., : o.shape[-1]]).square().sum() for o in outs)
    opt.zero_grad()
    loss.backward()
    opt.step()
    for reg in regs:
        reg.after_step(step)


def _outputs(model, x):
    with torch.no_grad():
        out = model(x)
    return [o.clone() for o in (out if isinstance(out, tuple) else (out,))]


NETS = {
    "mlp-multihead": lambda: (BatchedMLP(2, 5, [12, 10], (3, 2), activation="crelu", layer_norm=True),
                              torch.randn(16, 5)),
    "mlp-torch-init": lambda: (BatchedMLP(3, 5, [12, 10], 2, init="torch"), torch.randn(16, 5)),
    "sequential": lambda: (nn.Sequential(nn.Flatten(), nn.Linear(5, 12), nn.LayerNorm(12), nn.ReLU(), nn.Linear(12, 10),
                                         nn.ReLU(), nn.Linear(10, 3)), torch.randn(16, 5)),
    "conv": lambda: (nn.Sequential(nn.Conv2d(2, 3, 3), nn.GroupNorm(1, 3), nn.ReLU(), nn.Conv2d(3, 4, 3), nn.ReLU(),
                                   nn.Flatten(), nn.Linear(4 * 2 * 2, 3)), torch.randn(8, 2, 6, 6)),
}


# ----------------------------------------------------------------------------- plasticity_injection
@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("kind", list(NETS))
def test_injection_leaves_the_output_unchanged(kind, levels):
    torch.manual_seed(0)
    model, x = NETS[kind]()
    reg = PlasticityInjection(model, at_step=3, levels=levels)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    reg.attach(opt)
    y = torch.randn(_outputs(model, x)[0].shape)
    for step in (1, 2):
        _step(model, opt, x, y, [reg], step)
    assert not reg.injected
    _step(model, opt, x, y, [], 3)
    head = [p.detach().clone() for p in reg.head.params()]
    before = _outputs(model, x)
    reg.after_step(3)
    assert reg.injected and reg.metrics()["injected"].item() == 1.0
    assert not any(torch.equal(a, b) for a, b in zip(reg.head.params(), head) if a.abs().sum() > 0)  # a fresh head
    for a, b in zip(_outputs(model, x), before):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert all(p not in opt.state for p in reg.head.params())  # the head's Adam state restarts


def test_the_fresh_head_is_each_members_initializer_draw():
    net = BatchedMLP(2, 5, [12, 10], 3, layer_norm=True)
    reg = PlasticityInjection(net, at_step=1, levels=2)
    reg.seed_members([5, 6])
    reg.attach(torch.optim.Adam(net.parameters()))
    gens = _clone_gens(reg.generators)
    reg.after_step(1)
    for mod in (net.layers[1], net.norms[1], net.heads[0]):
        for m in range(2):
            w, b = mod.draw(gens[m])
            assert torch.equal(mod.weight[m], w) and torch.equal(mod.bias[m], b)
    assert not torch.equal(net.layers[1].weight[0], net.layers[1].weight[1])


def _reference(net, x, m, old, new, init, levels):
    """Member ``m`` of h_old + h_new − h_init on top of the trainable lower layers (a loop reference)."""
    n_hidden = len(net.layers)
    first = n_hidden - (levels - 1)

    def layer(h, i, params):
        w, b = params[f"layers.{i}.weight"][m], params[f"layers.{i}.bias"][m]
        g, s = params[f"norms.{i}.weight"][m], params[f"norms.{i}.bias"][m]
        return F.relu(F.layer_norm(F.linear(h, w, b), (w.shape[0],), g, s))

    h = x
    for i in range(first):
        h = layer(h, i, new)
    total = 0
    for sign, params in ((1, old), (1, new), (-1, init)):
        z = h
        for i in range(first, n_hidden):
            z = layer(z, i, params)
        total = total + sign * F.linear(z, params["heads.0.weight"][m], params["heads.0.bias"][m])
    return total


def test_after_injection_only_the_new_head_trains_and_the_network_is_the_sum():
    torch.manual_seed(1)
    net = BatchedMLP(2, 5, [12, 10], 3, layer_norm=True)
    x, y = torch.randn(16, 5), torch.randn(16, 3)
    reg = PlasticityInjection(net, at_step=2, levels=2)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    reg.attach(opt)
    for step in (1, 2):
        _step(net, opt, x, y, [reg], step)
    frozen = {k: v.clone() for k, v in reg.state.items()}
    names = [n for n, _ in net.named_parameters()]
    head_names = {n for n in names if n.startswith(("layers.1", "norms.1", "heads"))}
    at_injection = {n: p.detach().clone() for n, p in net.named_parameters()}
    for step in range(3, 8):
        _step(net, opt, x, y, [reg], step)
    for k, v in frozen.items():  # θ and θ′₀ stay frozen
        assert torch.equal(reg.state[k], v), k
    for n, p in net.named_parameters():  # θ′ and the encoder train
        assert not torch.equal(p, at_injection[n]), n
    slots = [f"{n}" for n in names if n in head_names]
    old = {**{n: p.detach() for n, p in net.named_parameters()},
           **{n: reg.state[f"old{j}"] for j, n in enumerate(slots)}}
    init = {**old, **{n: reg.state[f"init{j}"] for j, n in enumerate(slots)}}
    new = {n: p.detach() for n, p in net.named_parameters()}
    out = _outputs(net, x)[0]
    for m in range(2):
        torch.testing.assert_close(out[m], _reference(net, x, m, old, new, init, 2), rtol=1e-5, atol=1e-5)


def test_the_target_network_is_injected_alike_and_follows_the_new_head():
    torch.manual_seed(2)
    online = BatchedMLP(2, 5, [12, 10], 1)
    target = copy.deepcopy(online)
    reg = PlasticityInjection(online, at_step=1, levels=2)
    reg.set_target(target)
    opt = torch.optim.Adam(online.parameters(), lr=1e-2)
    reg.attach(opt)
    x, y = torch.randn(16, 5), torch.randn(16, 1)
    _step(online, opt, x, y)
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), 0.5)  # a target behind its network
    before, target_before = _outputs(online, x), _outputs(target, x)
    reg.after_step(1)
    torch.testing.assert_close(_outputs(online, x)[0], before[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_outputs(target, x)[0], target_before[0], rtol=1e-5, atol=1e-5)
    for p, q in zip(reg.head.params(), reg.target_head.params()):
        assert torch.equal(p, q)  # both heads are θ′
    for _ in range(3):  # Polyak averaging with τ = 1: the target becomes the network
        _step(online, opt, x, y)
        with torch.no_grad():
            torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), 1.0)
    torch.testing.assert_close(_outputs(target, x)[0] - _outputs(online, x)[0],
                               _reference_delta(reg, x), rtol=1e-4, atol=1e-4)


def _reference_delta(reg, x):
    """h_θtarget(x) − h_θ(x) with the same lower layers: the two frozen heads differ."""
    with torch.no_grad():
        h = x.unsqueeze(0).expand(2, -1, -1)
        h = F.relu(torch.baddbmm(reg.module.layers[0].bias.unsqueeze(1), h,
                                 reg.module.layers[0].weight.transpose(1, 2)))
        return reg.head.forward(h, reg._tensors("target_old"))[0] - reg.head.forward(h, reg._tensors("old"))[0]


def test_injection_checkpoint_round_trip_restores_the_hook_state():
    torch.manual_seed(3)
    x, y = torch.randn(16, 5), torch.randn(16, 3)

    def build():
        torch.manual_seed(4)
        net = BatchedMLP(2, 5, [12, 10], 3, layer_norm=True)
        reg = PlasticityInjection(net, at_step=4, levels=2, seed=7)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        reg.attach(opt)
        return net, reg, opt

    for stop in (2, 6):  # a checkpoint before and after the injection
        net, reg, opt = build()
        for step in range(1, stop + 1):
            _step(net, opt, x, y, [reg], step)
        saved = (copy.deepcopy(net.state_dict()), copy.deepcopy(opt.state_dict()), reg.state_dict())
        net2, reg2, opt2 = build()
        net2.load_state_dict(saved[0])
        opt2.load_state_dict(saved[1])
        reg2.load_state_dict(saved[2])
        assert reg2.injected == (stop >= 4)
        torch.testing.assert_close(_outputs(net2, x)[0], _outputs(net, x)[0], rtol=0, atol=0)
        for step in range(stop + 1, 10):
            _step(net, opt, x, y, [reg], step)
            _step(net2, opt2, x, y, [reg2], step)
        for a, b in zip(net.parameters(), net2.parameters()):
            assert torch.equal(a, b)
        torch.testing.assert_close(_outputs(net2, x)[0], _outputs(net, x)[0], rtol=0, atol=0)


def test_a_new_injection_on_the_same_network_replaces_the_old_hooks():
    net = BatchedMLP(1, 5, [8], 2)
    first = PlasticityInjection(net, at_step=1, levels=2)
    first.attach(torch.optim.Adam(net.parameters()))
    first.after_step(1)
    x = torch.randn(4, 5)
    fresh = _outputs(net, x)[0] - (first.head.forward(x.expand(1, -1, -1), first._tensors("old"))[0]
                                   - first.head.forward(x.expand(1, -1, -1), first._tensors("init"))[0])
    PlasticityInjection(net, at_step=1, levels=2)  # e.g. rebuilt by a full reset
    assert len(net.layers[0]._forward_pre_hooks) == 1 and len(net.heads[0]._forward_hooks) == 1
    torch.testing.assert_close(_outputs(net, x)[0], fresh)  # the first injection's branches are gone


def test_injection_refuses_what_it_cannot_inject():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    with pytest.raises(ValueError, match="levels=2 needs the layer order"):
        PlasticityInjection(Custom(), levels=2)
    PlasticityInjection(Custom(), levels=1)
    with pytest.raises(ValueError, match="batch normalization"):
        PlasticityInjection(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)), levels=2)
    with pytest.raises(ValueError, match="levels must be <= 3"):
        PlasticityInjection(BatchedMLP(1, 3, [4, 4], 2), levels=4)
    with pytest.raises(ConfigError, match="at_step must be an integer >= 1"):
        build_regularizers(BatchedMLP(1, 3, [4], 2), [{"name": "plasticity_injection", "at_step": 0}])


# ----------------------------------------------------------------------------- nap
@pytest.mark.parametrize("layers", ["hidden", "all"])
@pytest.mark.parametrize("kind", ["mlp-multihead", "sequential-ln", "conv"])
def test_nap_keeps_the_projected_norms_constant(kind, layers):
    torch.manual_seed(5)
    if kind == "sequential-ln":
        model, x = nn.Sequential(nn.Linear(5, 12), nn.LayerNorm(12), nn.ReLU(), nn.Linear(12, 10), nn.LayerNorm(10),
                                 nn.ReLU(), nn.Linear(10, 3)), torch.randn(16, 5)
    elif kind == "conv":
        model, x = nn.Sequential(nn.Conv2d(2, 3, 3), nn.GroupNorm(1, 3), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(3 * 4 * 4, 3)), torch.randn(8, 2, 6, 6)
    else:
        model, x = NETS[kind]()
    reg = NaP(model, layers=layers)
    initial_w = [v.weight().detach().flatten(1).norm(dim=1) for v in reg.weights]
    initial_n = [torch.cat([t.detach() for t in v.tensors()], 1).norm(dim=1) for v in reg.norms]
    assert reg.norms and all(torch.allclose(n,
                                            torch.full_like(n, n[0])) for n in initial_n)  # √features: gain 1, shift 0
    free = [p for p in model.parameters() if all(p is not v.weight_param for v in reg.weights)]
    free_before = [p.detach().clone() for p in free]
    opt = torch.optim.Adam(model.parameters(), lr=5e-2)
    y = torch.randn(_outputs(model, x)[0].shape)
    for step in range(1, 21):
        _step(model, opt, x, y, [reg], step)
        for view, n0 in zip(reg.weights, initial_w):
            torch.testing.assert_close(view.weight().detach().flatten(1).norm(dim=1), n0, rtol=1e-5, atol=0)
        for view, n0 in zip(reg.norms, initial_n):
            torch.testing.assert_close(torch.cat([t.detach() for t in view.tensors()], 1).norm(dim=1), n0, rtol=1e-5,
                                       atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(free, free_before))
    assert torch.all(reg.metrics()["growth"] > 1.0)  # Adam steps grow the weights; the projection takes it back
    out_weights = {id(v.weight_param) for v in reg.weights if v.is_output}
    assert bool(out_weights) == (layers == "all")


def test_nap_projection_is_the_formula_per_member():
    net = BatchedMLP(3, 5, [8, 8], 2, layer_norm=True)
    reg = NaP(net, layers="all")
    w0 = [layer.weight.detach().clone() for layer in (*net.layers, net.heads[0])]
    with torch.no_grad():
        for layer in (*net.layers, net.heads[0]):
            layer.weight.mul_(torch.tensor([2.0, 0.5, 3.0]).view(3, 1, 1)).add_(0.1)
        net.norms[0].weight.mul_(4.0)
        net.norms[0].bias.add_(1.0)
    grown = [layer.weight.detach().clone() for layer in (*net.layers, net.heads[0])]
    g, s = net.norms[0].weight.detach().clone(), net.norms[0].bias.detach().clone()
    reg.after_step(1)
    for layer, w, w_init in zip((*net.layers, net.heads[0]), grown, w0):
        for m in range(3):
            expected = w[m] * w_init[m].norm() / w[m].norm()
            torch.testing.assert_close(layer.weight[m], expected, rtol=1e-6, atol=1e-7)
    for m in range(3):
        scale = (8**0.5) / torch.cat([g[m], s[m]]).norm()
        torch.testing.assert_close(net.norms[0].weight[m], g[m] * scale)
        torch.testing.assert_close(net.norms[0].bias[m], s[m] * scale)


@pytest.mark.parametrize("model", [
    BatchedMLP(1, 3, [4, 4], 2),
    nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)),
    nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)),
], ids=["mlp", "sequential", "one-norm-missing"])
def test_nap_without_normalization_tells_how_to_add_it(model):
    with pytest.raises(ConfigError) as err:
        build_regularizers(model, [{"name": "nap"}], "actor.regularizers")
    msg = str(err.value)
    assert "layer_norm: true" in msg and "actor.layer_norm=true" in msg and "model.norm=layer" in msg
    assert "\n" not in msg


# ----------------------------------------------------------------------------- cbp
def _hand_net():
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
        net[0].bias.zero_()
        net[2].weight.copy_(torch.tensor([[1.0, 2.0, 0.0], [-1.0, 0.5, 3.0]]))
        net[2].bias.zero_()
    return net


def test_cbp_utility_is_the_hand_computed_running_contribution():
    net = _hand_net()
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    reg = CBP(net, replacement_rate=0.0, decay_rate=0.5)
    reg.attach(torch.optim.Adam(net.parameters()))
    reg.set_probe(lambda: x)
    # h = relu(W1 x): (1, 2, 0) and (3, 0, 4); mean |h| = (2, 1, 2); Σ_k |w_ki| = (2, 2.5, 3)
    contribution = torch.tensor([[4.0, 2.5, 6.0]])
    torch.testing.assert_close(reg.contributions()[0], contribution)
    reg.after_step(1)
    torch.testing.assert_close(reg.state["utility0"], torch.tensor([[2.0, 1.25, 3.0]]))
    reg.after_step(2)
    torch.testing.assert_close(reg.state["utility0"], torch.tensor([[3.0, 1.875, 4.5]]))
    assert torch.equal(reg.state["age0"], torch.full((1, 3), 2))
    corrected = reg.state["utility0"] / (1 - 0.5 ** reg.state["age0"])  # bias correction: the constant contribution
    torch.testing.assert_close(corrected, contribution)


def test_cbp_contribution_of_a_batched_crelu_network_matches_a_loop_reference():
    torch.manual_seed(6)
    net = BatchedMLP(2, 5, [6, 4], (3, 2), activation="crelu", layer_norm=True)
    x = torch.randn(2, 16, 5)
    reg = CBP(net)
    reg.set_probe(lambda: x)
    got = reg.contributions()
    for m in range(2):
        h = x[m]
        for i, layer in enumerate(net.layers):
            h = F.layer_norm(F.linear(h, layer.weight[m], layer.bias[m]), (layer.out_features,),
                             net.norms[i].weight[m], net.norms[i].bias[m])
            h = torch.cat([F.relu(h), F.relu(-h)], -1)
            consumers = [net.layers[i + 1]] if i + 1 < len(net.layers) else list(net.heads)
            out = sum(c.weight[m].abs().sum(0) for c in consumers)
            per_feature = h.abs().mean(0) * out
            expected = per_feature[: layer.out_features] + per_feature[layer.out_features:]
            torch.testing.assert_close(got[i][m], expected.detach(), rtol=1e-5, atol=1e-6)


def _count_reference(units, rate, maturity, steps):
    """Units replaced per step by the fractional accumulator over the eligible (mature) units."""
    ages, acc, counts = [0] * units, 0.0, []
    for _ in range(steps):
        ages = [a + 1 for a in ages]
        eligible = [j for j, a in enumerate(ages) if a > maturity]
        acc += rate * len(eligible)
        k = min(int(acc), len(eligible))
        acc -= k
        for j in eligible[:k]:
            ages[j] = 0
        counts.append(k)
    return counts


def test_cbp_replaces_as_many_units_as_the_accumulator_predicts():
    torch.manual_seed(7)
    net = nn.Sequential(nn.Linear(4, 100), nn.ReLU(), nn.Linear(100, 3))
    x = torch.randn(32, 4)
    reg = CBP(net, replacement_rate=0.01, maturity_threshold=100)
    reg.attach(torch.optim.Adam(net.parameters()))
    reg.set_probe(lambda: x)
    expected = _count_reference(100, 0.01, 100, 1100)
    for step, k in enumerate(expected, start=1):
        before = reg.state["age0"].clone()
        reg.after_step(step)
        replaced = (reg.state["age0"] == 0) & (before >= 0)
        assert int(replaced.sum()) == k, step
        assert bool(torch.all(before[replaced] + 1 > 100))  # only mature units
    assert sum(expected[:100]) == 0 and expected[100] == 1  # at step 101 the first unit is mature: 100 × 0.01
    assert reg.metrics()["replaced"].item() == sum(expected)
    # the steady state of E = H − ρ·E·m young units: E = H / (1 + ρm) = 50 eligible, 0.5 replaced per step
    assert abs(sum(expected[600:]) / 500 - 0.5) < 0.05


def test_cbp_replaces_the_lowest_utility_mature_units_with_fresh_draws():
    torch.manual_seed(8)
    net = BatchedMLP(2, 5, [10, 8], 3, init="torch")
    x = torch.randn(64, 5)
    reg = CBP(net, replacement_rate=0.1, maturity_threshold=2, decay_rate=0.9)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    reg.attach(opt)
    reg.set_probe(lambda: x)
    y = torch.randn(64, 3)
    with torch.no_grad():  # dead units, of contribution 0: member 0 unit 3 of layer 0, member 1 unit 6 of layer 0
        net.layers[0].bias[0, 3] = -100.0
        net.layers[0].bias[1, 6] = -100.0
    for step in (1, 2):
        _step(net, opt, x, y, [reg], step)
    _step(net, opt, x, y, [], 3)
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    moments = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in net.named_parameters()}
    gens = _clone_gens(reg.generators)
    reg.after_step(3)  # 10 mature units × 0.1 = one unit per member in layer 0; 0.8 accumulated in layer 1
    for m, unit in ((0, 3), (1, 6)):
        w, b = net.layers[0].draw(gens[m])
        assert torch.equal(net.layers[0].weight[m, unit], w[unit]) and torch.equal(net.layers[0].bias[m, unit], b[unit])
        assert torch.count_nonzero(net.layers[1].weight[m, :, unit]) == 0
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.count_nonzero(opt.state[net.layers[0].weight][key][m, unit]) == 0
            assert torch.count_nonzero(opt.state[net.layers[1].weight][key][m, :, unit]) == 0
        assert reg.state["age0"][m, unit] == 0 and reg.state["utility0"][m, unit] == 0
        keep = [j for j in range(10) if j != unit]
        assert torch.equal(net.layers[0].weight[m, keep], params["layers.0.weight"][m, keep])
        assert torch.equal(opt.state[net.layers[0].weight]["exp_avg"][m, keep],
                           moments["layers.0.weight"]["exp_avg"][m, keep])
    assert int((reg.state["age0"] == 0).sum()) == 2 and int((reg.state["age1"] == 0).sum()) == 0
    for name in ("layers.1.bias", "heads.0.weight", "heads.0.bias"):
        assert torch.equal(dict(net.named_parameters())[name], params[name])


def test_cbp_checkpoint_round_trip_continues_identically():
    x, y = torch.randn(32, 5), torch.randn(32, 3)

    def build():
        torch.manual_seed(9)
        net = BatchedMLP(2, 5, [10, 8], 3)
        reg = CBP(net, replacement_rate=0.05, maturity_threshold=3, seed=3)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        reg.attach(opt)
        reg.set_probe(lambda: x)
        return net, reg, opt

    net, reg, opt = build()
    for step in range(1, 8):
        _step(net, opt, x, y, [reg], step)
    net2, reg2, opt2 = build()
    net2.load_state_dict(copy.deepcopy(net.state_dict()))
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    reg2.load_state_dict(reg.state_dict())
    for step in range(8, 30):
        _step(net, opt, x, y, [reg], step)
        _step(net2, opt2, x, y, [reg2], step)
    assert reg.metrics()["replaced"].sum() > 0
    for a, b in zip(net.parameters(), net2.parameters()):
        assert torch.equal(a, b)
    for k, v in reg.state_dict().items():
        assert torch.equal(v, reg2.state_dict()[k]), k


# ----------------------------------------------------------------------------- with spectral inside SAC
def _batch(n, gen):
    return {"obs": torch.randn(n, 8, 5, generator=gen), "action": torch.rand(n, 8, 2, generator=gen) * 2 - 1,
            "reward": torch.randn(n, 8, generator=gen), "next_obs": torch.randn(n, 8, 5, generator=gen),
            "terminated": torch.zeros(n, 8)}


METHODS = {
    "plasticity_injection": {"name": "plasticity_injection", "at_step": 3},
    "nap": {"name": "nap"},
    "cbp": {"name": "cbp", "replacement_rate": 0.05, "maturity_threshold": 2},
}


@pytest.mark.parametrize("method", list(METHODS))
def test_each_method_composes_with_spectral_in_sac_and_resumes_exactly(method):
    cfg = SACConfig()
    cfg.actor.hidden = cfg.critic.hidden = [16, 16]
    cfg.actor.layer_norm = cfg.critic.layer_norm = True
    cfg.critic.regularizers = [dict(METHODS[method]), {"name": "spectral"}]
    cfg.actor.regularizers = [dict(METHODS[method]), {"name": "spectral", "coef": 1e-3}]
    agent = SAC(5, 2, cfg, SeedStreams([0, 1]))
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        info = agent.update(_batch(2, gen), named_noise(agent, torch.randn(2, 2, 8, 2, generator=gen)))
    assert all(torch.isfinite(v).all() for v in info.values())
    metrics = agent.metrics()
    assert all(torch.isfinite(v).all() for v in metrics.values())
    assert any(k.startswith(f"reg/critic/{method}/") for k in metrics) and "reg/actor/spectral/penalty" in metrics
    if method == "plasticity_injection":
        assert metrics["reg/critic/plasticity_injection/injected"].item() == 1.0
    if method == "cbp":
        assert metrics["reg/critic/cbp/replaced"].sum() > 0
    copy_ = SAC(5, 2, cfg, SeedStreams([0, 1]))
    copy_.load_full_state_dict(copy.deepcopy(agent.full_state_dict()))
    for _ in range(3):
        batch, noise = _batch(2, gen), torch.randn(2, 2, 8, 2, generator=gen)
        a, b = agent.update(batch, named_noise(agent, noise)), copy_.update(batch, named_noise(copy_, noise))
        for k in a:
            assert torch.equal(a[k], b[k]), k
    for p, q in zip(agent.parameters(), copy_.parameters()):
        assert torch.equal(p, q)


def test_injection_in_sac_leaves_the_critic_and_its_target_unchanged():
    cfg = SACConfig()
    cfg.actor.hidden = cfg.critic.hidden = [16, 16]
    cfg.critic.regularizers = [{"name": "plasticity_injection", "at_step": 2}]
    cfg.actor.regularizers = []
    agent = SAC(5, 2, cfg, SeedStreams([0]))
    gen = torch.Generator().manual_seed(1)
    agent.update(_batch(1, gen), named_noise(agent, torch.randn(2, 1, 8, 2, generator=gen)))
    probe = _batch(1, gen)
    reg = agent.trained["critic"].regularizers[0]
    assert reg.target_head is not None
    # the injecting update, split: critic step, then look at the networks around the injection
    with torch.no_grad():
        target_before = agent.q_values(agent.target_critic, probe["obs"], probe["action"])
    old_target = [p.detach().clone() for p in reg.target_head.params()]
    agent.update(_batch(1, gen), named_noise(agent, torch.randn(2, 1, 8, 2, generator=gen)))
    assert reg.injected
    for t, q in zip(reg._tensors("target_old"), old_target):  # the target's head at injection (Polyak comes after)
        assert torch.equal(t, q)
    with torch.no_grad():
        online_q = agent.q_values(agent.critic, probe["obs"], probe["action"])
        frozen = agent.q_values(agent.target_critic, probe["obs"], probe["action"])
    assert torch.isfinite(online_q).all()
    torch.testing.assert_close(frozen, target_before, rtol=0, atol=1e-4)  # its lower layers moved one Polyak step


def test_load_policy_acts_with_an_injected_actors_frozen_branches(tmp_path):
    """An actor injected during training: the exported policy carries the injection (its hooks and
    frozen branches), so playing the last evaluation's episodes gives the returns it recorded."""
    import numpy as np

    from conftest import SMALL
    from sac_spectral.apps.rl.policy import load_policy, play_episodes
    from sac_spectral.apps.rl.train import main
    from sac_spectral.runs.cli import run_cli

    rd = tmp_path / "injected"
    assert run_cli(main, [*SMALL, "env=dmc:cartpole-balance", "action_repeat=4", "total_steps=200", "random_steps=100",
                          "eval_every=200", "eval_episodes=2", "threads=1",
                          "actor.regularizers=[{name: plasticity_injection, at_step: 50}]", f"run_dir={rd}"]) == 0
    policy = load_policy(rd)
    assert policy.regularizers[0].injected and policy.recorded is not None
    returns = play_episodes(policy, policy.recorded.reset_seeds(policy.seed))
    assert float(np.mean(returns)) == policy.recorded.mean_return
    policy.regularizers[0].hooks[0].remove()  # without the frozen branches it acts otherwise
    assert not np.array_equal(policy.act(np.zeros(policy.obs_dim)), load_policy(rd).act(np.zeros(policy.obs_dim)))
