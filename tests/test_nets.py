import math

import pytest
import torch
from torch import nn

from sac_spectral.core.layers import layer_views
from sac_spectral.core.nets import BatchedLayerNorm, BatchedLinear, BatchedMLP


def test_batched_linear_equals_per_member_linear():
    torch.manual_seed(0)
    layer = BatchedLinear(3, 5, 4, init="torch")
    x = torch.randn(3, 7, 5)
    y = layer(x)
    for m in range(3):
        ref = nn.functional.linear(x[m], layer.weight[m], layer.bias[m])
        torch.testing.assert_close(y[m], ref)


def test_weight_gradients_arrive_in_the_weights_layout():
    """The feature-major product hands autograd each weight gradient contiguous, as the weight is,
    so no layout copy is made before it is accumulated (x·Wᵀ would deliver it transposed)."""
    torch.manual_seed(1)
    net = BatchedMLP(2, 5, [8, 8], 3, init="torch")
    seen = []
    for p in net.parameters():
        p.register_hook(lambda g: seen.append(g.is_contiguous()))
    out = net(torch.randn(2, 7, 5))
    out.square().sum().backward()
    assert len(seen) == len(list(net.parameters())) and all(seen)
    for m in range(2):  # and the product is still x·Wᵀ + b
        h = torch.randn(7, 5)
        ref = nn.functional.linear(h, net.layers[0].weight[m], net.layers[0].bias[m])
        torch.testing.assert_close(net.layers[0](h.expand(2, 7, 5))[m], ref)


def test_a_member_is_laid_out_like_nn_linear():
    layer = BatchedLinear(2, 5, 3, init="torch")
    plain = nn.Linear(5, 3)
    assert layer.weight[1].shape == plain.weight.shape and layer.bias[1].shape == plain.bias.shape


def test_member_i_of_a_batch_equals_single_member_network_from_same_generator():
    gens = [torch.Generator().manual_seed(s) for s in (10, 11, 12)]
    big = BatchedMLP(3, 6, [16, 16], 2, generators=gens)
    for m, s in enumerate((10, 11, 12)):
        single = BatchedMLP(1, 6, [16, 16], 2, generators=[torch.Generator().manual_seed(s)])
        for pb, ps in zip(big.parameters(), single.parameters()):
            assert torch.equal(pb[m], ps[0])


def test_orthogonal_init_has_unit_gain_singular_values():
    layer = BatchedLinear(2, 64, 32, init="orthogonal", gain=math.sqrt(2))
    s = torch.linalg.svdvals(layer.weight)
    torch.testing.assert_close(s, torch.full_like(s, math.sqrt(2)), rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(layer.bias) == 0


def test_torch_init_matches_nn_linear_bounds():
    layer = BatchedLinear(4, 100, 50, init="torch")
    assert layer.weight.abs().max() <= 0.1 and layer.bias.abs().max() <= 0.1
    assert layer.weight.std().item() == pytest.approx(0.1 / math.sqrt(3), rel=0.05)


def test_members_are_independent_in_gradients():
    net = BatchedMLP(2, 4, [8], 1, layer_norm=True, activation="crelu")
    x = torch.randn(2, 5, 4)
    net(x)[0].sum().backward()
    for p in net.parameters():
        assert p.grad[1].abs().sum() == 0 and p.grad[0].abs().sum() > 0


def test_layer_norm_matches_torch():
    ln = BatchedLayerNorm(2, 6)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.normal_()
    x = torch.randn(2, 3, 6)
    for m in range(2):
        ref = nn.functional.layer_norm(x[m], (6,), ln.weight[m], ln.bias[m])
        torch.testing.assert_close(ln(x)[m], ref)


def test_reset_last_layers_redraws_only_the_tail():
    gen = torch.Generator().manual_seed(0)
    net = BatchedMLP(1, 4, [8, 8], 2, init="torch", generators=[gen])
    before = [p.detach().clone() for p in net.parameters()]
    net.reset_parameters([gen], last=1)
    after = list(net.parameters())
    for b, a in zip(before[:-2], after[:-2]):
        assert torch.equal(a, b)
    for b, a in zip(before[-2:], after[-2:]):
        assert not torch.equal(a, b)


def test_layer_views_cover_linear_conv_norm_and_mark_output():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LayerNorm(4 * 6 * 6), nn.Linear(4 * 6 * 6, 5),
                          nn.Linear(5, 2))
    views = layer_views(model)
    assert [v.kind for v in views] == ["conv", "norm", "linear", "linear"]
    assert views[0].weight().shape == (1, 4, 27)
    assert [v.is_output for v in views] == [False, False, False, True]
    assert len(layer_views(model, "hidden")) == 3


def test_heads_share_the_trunk_and_count_as_outputs():
    gen = torch.Generator().manual_seed(0)
    net = BatchedMLP(2, 4, [8, 8], (3, 3), out_gains=(math.sqrt(2), 1.0), generators=[gen, gen])
    x = torch.randn(2, 5, 4)
    (mean, log_std), hidden = net(x, return_hidden=True)
    assert mean.shape == log_std.shape == (2, 5, 3)
    for head, out in zip(net.heads, (mean, log_std)):
        torch.testing.assert_close(out, torch.baddbmm(head.bias.unsqueeze(1), hidden[-1], head.weight.transpose(1, 2)))
    s_mean, s_std = (torch.linalg.svdvals(h.weight) for h in net.heads)
    torch.testing.assert_close(s_mean, torch.full_like(s_mean, math.sqrt(2)))
    torch.testing.assert_close(s_std, torch.ones_like(s_std))
    views = layer_views(net)
    assert [v.is_output for v in views] == [False, False, True, True]
    assert net.tail(1) == list(net.heads) and net.tail(2)[0] is net.layers[1]


def test_layer_names_count_linear_layers_and_norms_separately():
    from sac_spectral.core.layers import view_names
    from sac_spectral.diagnostics import layer_sigma_max
    from sac_spectral.regularizers import Spectral

    net = BatchedMLP(2, 4, [8, 8], (3, 3), layer_norm=True)
    views = layer_views(net)
    assert view_names(views) == ["layer0", "layer1", "norm0", "norm1", "layer2", "layer3"]
    reg = Spectral(net, coef=1.0)
    for _ in range(100):
        reg.penalty()
    metrics = reg.metrics()
    for i, exact in enumerate(layer_sigma_max(net)):  # the tags spectral/<net>/layer<i> use this order
        torch.testing.assert_close(metrics[f"layer{i}/sigma_max"], exact, rtol=1e-4, atol=1e-5)
    assert "norm1/sigma_max" in metrics
