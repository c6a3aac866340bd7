"""Supervised models: shapes, references, and that every parameterized layer is visible to the
regularizers (convolutions, normalization layers, attention projections)."""

import pytest
import torch
from torch import nn

from sac_spectral.core.layers import layer_views, unsupported_layers
from sac_spectral.regularizers import Spectral
from sac_spectral.supervised.models import DeepLinear, SelfAttention, build_model

CASES = [
    ("mlp", (1, 8, 8), {"width": 32, "depth": 2, "norm": "layer"}),
    ("mlp", (40,), {"width": 16, "depth": 3, "activation": "crelu", "norm": "batch"}),
    ("cnn", (1, 8, 8), {"width": 32, "norm": "layer"}),
    ("cnn", (3, 16, 16), {"width": 16}),
    ("resnet18", (3, 16, 16), {"width": 4}),
    ("resnet18", (3, 8, 8), {"width": 4, "norm": "layer"}),
    ("vit", (3, 8, 8), {"width": 16, "depth": 2, "heads": 2, "patch": 4}),
]


def _weighted_modules(model: nn.Module) -> list[nn.Module]:
    kinds = (nn.Linear, nn.Conv2d, nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)
    return [m for m in model.modules() if isinstance(m, kinds)]


@pytest.mark.parametrize("name, shape, kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_forward_shape_and_every_layer_is_regularized(name, shape, kw):
    torch.manual_seed(0)
    model = build_model(name, shape, 7, **kw)
    x = torch.randn(5, *shape)
    assert model(x).shape == (5, 7)
    views = layer_views(model)
    assert {id(v.module) for v in views} == {id(m) for m in _weighted_modules(model)}
    # only the ViT owns loose parameters (class token, positions), which no layer-wise method touches
    assert unsupported_layers(model) == (["ViT"] if name == "vit" else [])
    if name == "vit":
        with pytest.warns(UserWarning, match="loose parameters of ViT"):
            reg = Spectral(model, coef=1.0)
    else:
        reg = Spectral(model, coef=1.0)
    model.zero_grad()
    reg.penalty().backward()
    for m in _weighted_modules(model):
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0, m


def test_attention_projections_are_linear_and_match_multihead_attention():
    torch.manual_seed(0)
    ours = SelfAttention(12, 3)
    ref = nn.MultiheadAttention(12, 3, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q.weight, ours.k.weight, ours.v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q.bias, ours.k.bias, ours.v.bias]))
        ref.out_proj.weight.copy_(ours.out.weight)
        ref.out_proj.bias.copy_(ours.out.bias)
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(ours(x), ref(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-6)
    assert all(isinstance(p, nn.Linear) for p in (ours.q, ours.k, ours.v, ours.out))


def test_resnet18_has_the_standard_cifar_parameter_count():
    model = build_model("resnet18", (3, 32, 32), 10, width=64, norm="batch")
    assert sum(p.numel() for p in model.parameters()) == 11_173_962


def test_deep_linear_starts_at_the_identity():
    model = DeepLinear(3, 5)
    torch.testing.assert_close(model.product(), torch.eye(3))
    x = torch.randn(4, 3)
    torch.testing.assert_close(model(x), x)
    assert all(m.bias is None for m in model)


@pytest.mark.parametrize(
    "name, shape, kw, fragment",
    [
        ("cnn", (40,), {}, "needs image inputs"),
        ("vit", (3, 10, 10), {"patch": 4}, "must divide the image size"),
        ("vit", (3, 8, 8), {"width": 10, "heads": 3}, "divisible by heads"),
        ("mlp", (4,), {"activation": "swish"}, "unknown activation 'swish'"),
        ("transformer", (4,), {}, "unknown model"),
    ],
)
def test_bad_model_options_are_rejected(name, shape, kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        build_model(name, shape, 3, **kw)
