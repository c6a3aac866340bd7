"""The member-batched products on oneDNN (sac_spectral.core.onednn) against torch.bmm."""

import pytest
import torch

from conftest import named_noise
from sac_spectral.agents import SAC
from sac_spectral.agents.config import SACConfig
from sac_spectral.core import native, onednn
from sac_spectral.core.seeding import SeedStreams

pytestmark = pytest.mark.skipif(native.load() is not None, reason="oneDNN products are unavailable here")


def _layouts(members: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    m, n, k, p = members, 9, 5, 7
    return {
        "row-major": (rand(m, n, k), rand(m, k, p)),
        "a transposed": (rand(m, k, n).transpose(1, 2), rand(m, k, p)),
        "b transposed": (rand(m, n, k), rand(m, p, k).transpose(1, 2)),
        "both transposed": (rand(m, k, n).transpose(1, 2), rand(m, p, k).transpose(1, 2)),
        "a shared by the members": (rand(1, n, k).expand(m, n, k), rand(m, k, p)),
        "b shared and transposed": (rand(m, n, k), rand(1, p, k).expand(m, p, k).transpose(1, 2)),
        "slices": (rand(m, n, 2 * k)[:, :, :k], rand(m, 2 * p, k)[:, :p].transpose(1, 2)),
    }


@pytest.mark.parametrize("members", [1, 3])
def test_member_bmm_equals_bmm_for_every_layout(members):
    for name, (a, b) in _layouts(members).items():
        out = torch.ops.sac_spectral.member_bmm(a, b)
        assert out.shape == (members, 9, 7) and out.is_contiguous(), name
        torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("case", ["one member, transposed but for its member stride", "shared by the members",
                                  "shared and transposed"])
def test_member_bmm_reads_one_member_and_shared_operands_in_place(case):
    """Operands that ``mkldnn_matmul`` would otherwise copy first are read where they lie: a
    one-member operand transposed but for the (free) stride of its member dimension (one seed's
    ``[batch, member, features]`` read as ``[member, features, batch]``), and an operand the members
    share (expanded, stride 0: the critics' common input), which oneDNN broadcasts. The product is
    still bmm's."""
    g = torch.Generator().manual_seed(2)
    a, b = {
        "one member, transposed but for its member stride": (
            torch.randn(9, 1, 7, generator=g).permute(1, 2, 0), torch.randn(1, 9, 5, generator=g)),
        "shared by the members": (torch.randn(1, 7, 9, generator=g).expand(3, 7, 9), torch.randn(3, 9, 5, generator=g)),
        "shared and transposed": (torch.randn(3, 7, 9, generator=g),
                                  torch.randn(1, 5, 9, generator=g).expand(3, 5, 9).transpose(1, 2)),
    }[case]
    with torch.profiler.profile() as prof:
        out = torch.ops.sac_spectral.member_bmm(a, b)
    calls = {e.key for e in prof.key_averages()}
    assert not calls & {"aten::contiguous", "aten::clone", "aten::copy_"}, calls
    torch.testing.assert_close(out, torch.bmm(a, b), rtol=1e-5, atol=1e-5)


def test_member_bmm_in_bf16_equals_bmm_to_bf16_rounding():
    a, b = (t.to(torch.bfloat16) for t in _layouts(2)["b transposed"])
    out = torch.ops.sac_spectral.member_bmm(a, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), torch.bmm(a.float(), b.float()), rtol=2e-2, atol=5e-2)


def test_compiled_products_go_to_onednn_forward_and_backward():
    """A compiled member-batched layer's forward and backward products all run on oneDNN, and
    values and gradients equal eager's."""
    g = torch.Generator().manual_seed(1)
    w0, b0, x = torch.randn(2, 6, 5, generator=g), torch.randn(2, 6, generator=g), torch.randn(2, 8, 5, generator=g)

    def loss(w, b, x):
        return (torch.relu(torch.bmm(x, w.transpose(1, 2)) + b.unsqueeze(1)) ** 2).sum()

    def grads(fn):
        w, b, xx = (t.clone().requires_grad_() for t in (w0, b0, x))
        return fn(w, b, xx), *torch.autograd.grad(fn(w, b, xx), (w, b, xx))

    compiled = torch.compile(loss, dynamic=False, options={"post_grad_custom_post_pass": onednn.OneDnnProducts()})
    grads(compiled)  # compiles
    with torch.profiler.profile() as prof:
        got = grads(compiled)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert "aten::bmm" not in calls and calls["sac_spectral::member_bmm"] >= 3
    want = grads(loss)
    for name, mine, ref in zip(("loss", "weight grad", "bias grad", "input grad"), got, want):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5, msg=name)


def test_compile_products_chooses_what_the_agents_programs_multiply_with():
    """A compiled SAC update's products run on oneDNN by default and on ATen's ``bmm`` (no oneDNN
    operator in the program) with ``compile_products: aten``, the opt-out for CPUs where MKL is
    the faster; both give the same update to rounding."""
    g = torch.Generator().manual_seed(0)
    batch = {"obs": torch.randn(1, 4, 3, generator=g), "action": torch.rand(1, 4, 1, generator=g),
             "reward": torch.randn(1, 4, generator=g), "next_obs": torch.randn(1, 4, 3, generator=g),
             "terminated": torch.zeros(1, 4)}
    noise = torch.randn(2, 1, 4, 1, generator=g)
    agents, calls = {}, {}
    for products in ("onednn", "aten"):
        cfg = SACConfig(compile=True, compile_products=products)
        cfg.actor.hidden = cfg.critic.hidden = [8]
        agents[products] = SAC(3, 1, cfg, SeedStreams([0]))
        agents[products].update(batch, named_noise(agents[products], noise))  # compiles
        with torch.profiler.profile() as prof:
            agents[products].update(batch, named_noise(agents[products], noise))
        calls[products] = {e.key for e in prof.key_averages()}
    assert "sac_spectral::member_bmm" in calls["onednn"] and "sac_spectral::member_bmm" not in calls["aten"]
    for (name, p), q in zip(agents["onednn"].state_dict().items(), agents["aten"].state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5, msg=name)
