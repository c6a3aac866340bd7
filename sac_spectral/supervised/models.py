"""Models for continual supervised streams, built from plain ``nn.Linear`` / ``nn.Conv2d`` /
normalization layers so that every regularizer of the library applies to them (convolutions are
reshaped to matrices, normalization gains and shifts are seen as such, and attention uses four
``nn.Linear`` projections instead of ``nn.MultiheadAttention``'s packed weight).

- ``mlp``: ``depth`` hidden layers of ``width`` units, optional normalization, then a linear head;
- ``cnn``: two 3×3 conv blocks (``width/8`` and ``width/4`` channels, 2×2 max-pool) and an MLP head
  with ``width`` units;
- ``resnet18``: the CIFAR variant of ResNet-18 (3×3 stem, no max-pool, stages of 2 basic blocks
  with ``width·{1,2,4,8}`` channels — 64 for the standard model — global average pool);
- ``vit``: a small pre-norm Vision Transformer (conv patch embedding, class token, learned
  positions, ``depth`` blocks of ``heads``-head self-attention and a 4× MLP, width ``width``);
- ``deep_linear``: ``depth`` bias-free ``d×d`` linear layers initialized to the identity.

``norm``: ``none``, ``layer`` (``nn.LayerNorm`` on features; ``nn.GroupNorm(1, C)`` — layer norm
over a feature map — after convolutions) or ``batch`` (``nn.BatchNorm1d/2d``). The ViT always uses
layer norm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sac_spectral.core.nets import Activation

MODELS = ("mlp", "cnn", "resnet18", "vit", "deep_linear")
NORMS = ("none", "layer", "batch")
IMAGE_MODELS = ("cnn", "resnet18", "vit")
#: bounds far beyond any model that trains here; a model deeper still takes minutes just to
#: build (even on the meta device, where its memory is estimated)
MAX_DEPTH = 1000
MAX_WIDTH = 1 << 24


def _norm1d(norm: str, features: int) -> list[nn.Module]:
    if norm == "layer":
        return [nn.LayerNorm(features)]
    if norm == "batch":
        return [nn.BatchNorm1d(features)]
    return []


def _norm2d(norm: str, channels: int) -> nn.Module:
    if norm == "layer":
        return nn.GroupNorm(1, channels)
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    return nn.Identity()


class MLP(nn.Sequential):
    """``Flatten → [Linear → norm → activation] × depth → Linear``."""

    def __init__(
        self, in_features: int, num_outputs: int, width: int = 256, depth: int = 2,
        activation: str = "relu", norm: str = "none",
    ) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        d = in_features
        for _ in range(depth):
            act = Activation(activation)
            layers += [nn.Linear(d, width), *_norm1d(norm, width), act]
            d = width * act.width_mult
        layers.append(nn.Linear(d, num_outputs))
        super().__init__(*layers)


class CNN(nn.Module):
    """Two conv blocks and an MLP head; for small images (8×8 digits up to 64×64)."""

    def __init__(
        self, input_shape: Sequence[int], num_outputs: int, width: int = 256,
        activation: str = "relu", norm: str = "none",
    ) -> None:
        super().__init__()
        c, h, w = input_shape
        c1, c2 = max(width // 8, 1), max(width // 4, 1)
        act1, act2 = Activation(activation), Activation(activation)
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, 3, padding=1), _norm2d(norm, c1), act1, nn.MaxPool2d(2),
            nn.Conv2d(c1 * act1.width_mult, c2, 3, padding=1), _norm2d(norm, c2), act2, nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = c2 * act2.width_mult * (h // 4) * (w // 4)
        if flat == 0:
            raise ValueError(f"cnn needs images of at least 4×4 pixels, got {h}×{w}")
        self.head = MLP(flat, num_outputs, width, 1, activation, norm)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3×3 convs with normalization and a (projected) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, activation: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=norm == "none")
        self.norm1 = _norm2d(norm, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=norm == "none")
        self.norm2 = _norm2d(norm, c_out)
        self.act = Activation(activation)
        if self.act.width_mult != 1:
            raise ValueError("resnet18 needs a width-preserving activation (not crelu)")
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=norm == "none"), _norm2d(norm, c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = self.act(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.act(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18: 3×3 stem, 4 stages × 2 basic blocks, global average pool, linear head."""

    def __init__(self, in_channels: int, num_outputs: int, width: int = 64, norm: str = "batch",
                 activation: str = "relu") -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=norm == "none"), _norm2d(norm, width), Activation(activation)
        )
        blocks, c = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            for j in range(2):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(BasicBlock(c, width * mult, stride, norm, activation))
                c = width * mult
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate ``nn.Linear`` q, k, v and output projections."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"vit width {dim} must be divisible by heads {heads}")
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape

        def split(t: Tensor) -> Tensor:
            return t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(LN(x))``, then ``x + MLP(LN(x))`` with a 4× GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small Vision Transformer: ``patch×patch`` conv embedding, class token, learned positions."""

    def __init__(self, input_shape: Sequence[int], num_outputs: int, width: int = 128, depth: int = 4,
                 heads: int = 4, patch: int = 4) -> None:
        super().__init__()
        c, h, w = input_shape
        if h % patch or w % patch:
            raise ValueError(f"vit patch size {patch} must divide the image size {h}×{w}")
        self.embed = nn.Conv2d(c, width, patch, patch)
        tokens = (h // patch) * (w // patch) + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.blocks = nn.Sequential(*(TransformerBlock(width, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1) + self.pos
        return self.head(self.norm(self.blocks(tokens))[:, 0])


class DeepLinear(nn.Sequential):
    """``f(x) = Θ_L ⋯ Θ_1 x`` with bias-free ``d×d`` layers, each initialized to the identity."""

    def __init__(self, dim: int, depth: int) -> None:
        layers = [nn.Linear(dim, dim, bias=False) for _ in range(depth)]
        for layer in layers:
            nn.init.eye_(layer.weight)
        super().__init__(*layers)

    def product(self) -> Tensor:
        """The end-to-end matrix ``Θ_L ⋯ Θ_1``."""
        out = self[0].weight
        for layer in list(self)[1:]:
            out = layer.weight @ out
        return out


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_outputs: int,
    width: int = 256,
    depth: int = 2,
    activation: str = "relu",
    norm: str = "none",
    heads: int = 4,
    patch: int = 4,
) -> nn.Module:
    """Build model ``name`` for inputs of ``input_shape`` (``[C, H, W]`` images or ``[D]``);
    ``depth`` and ``width`` beyond :data:`MAX_DEPTH` and :data:`MAX_WIDTH` are refused at once."""
    for key, value, most in (("depth", depth, MAX_DEPTH), ("width", width, MAX_WIDTH)):
        if not 1 <= value <= most:
            raise ValueError(f"{key} {value} is out of range; valid: 1 to {most}")
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; valid: {', '.join(MODELS)}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got '{norm}'")
    if name in IMAGE_MODELS and len(input_shape) != 3:
        raise ValueError(f"model '{name}' needs image inputs [C, H, W]; this data has shape {list(input_shape)} (use "
                         "mlp)")
    if name == "mlp":
        return MLP(math.prod(input_shape), num_outputs, width, depth, activation, norm)
    if name == "cnn":
        return CNN(input_shape, num_outputs, width, activation, norm)
    if name == "resnet18":
        return ResNet18(input_shape[0], num_outputs, width, norm, activation)
    if name == "vit":
        return ViT(input_shape, num_outputs, width, depth, heads, patch)
    return DeepLinear(num_outputs, depth)
