import re

import pytest
import torch

from sac_spectral.core import native, optim
from sac_spectral.core.optim import adam_state, adam_step_, make_optimizer


@pytest.mark.parametrize("name,weight_decay", [("adam", 0.0), ("adam", 0.1), ("adamw", 0.1)])
def test_functional_adam_step_follows_torch_optim(name, weight_decay):
    """adam_step_ on an optimizer's own state equals torch's step, also for a parameter whose state
    was dropped half-way (a reset: its step count restarts while the other's goes on), and for a
    gradient in another layout than its parameter (a transposed weight gradient)."""
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(5, generator=g, requires_grad=True)]
    ours = [p.detach().clone() for p in params]
    ref_opt = make_optimizer(name, params, lr=1e-2, weight_decay=weight_decay)
    own_opt = make_optimizer(name, [torch.nn.Parameter(p) for p in ours], lr=1e-2, weight_decay=weight_decay)
    keys = list(own_opt.param_groups[0]["params"])
    for step in range(6):
        if step == 3:
            ref_opt.state.pop(params[1])
            own_opt.state.pop(keys[1])
        grads = [torch.randn(4, 3, generator=g).t(), torch.randn(5, generator=g)]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        ref_opt.step()
        group = own_opt.param_groups[0]
        adam_step_(ours, grads, *adam_state(own_opt, keys), group["lr"], group["betas"], group["eps"],
                   group["weight_decay"], decoupled=name == "adamw")
    for p, q in zip(ours, params):
        torch.testing.assert_close(p, q.detach(), rtol=1e-5, atol=1e-6)  # rounding; a wrong step is ~lr = 1e-2 off
    assert [float(own_opt.state[k]["step"]) for k in keys] == [6.0, 3.0]


def test_compiled_adam_step_equals_eager_with_gradients_made_in_the_program():
    """Inside a compiled program (the compiled update's use) the step reads gradients in the layout
    inductor made them, here transposed products, and equals the eager step."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 8, 3, generator=g), torch.randn(2, 8, 4, generator=g)

    def step(params, state):
        grads = [torch.bmm(x.transpose(1, 2), y).transpose(1, 2) * p.sum() for p in params]
        adam_step_(params, grads, *state, 1e-2, (0.9, 0.999), 1e-8, 0.0, False)

    runs = []
    for fn in (step, torch.compile(step, dynamic=False)):
        params = [torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(2))]
        state = ([torch.zeros_like(params[0])], [torch.zeros_like(params[0])], [torch.zeros(())])
        for _ in range(3):
            fn(params, state)
        runs.append((params[0], *(s[0] for s in state)))
    for eager, compiled in zip(*runs):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(native.load() is not None, reason="the package's C++ kernels are unavailable here")
@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("step_dtype", [torch.float32, torch.float64])
def test_the_cpu_kernel_of_the_adam_step_equals_its_composite_form(decoupled, step_dtype):
    """The C++ CPU kernel of ``sac_spectral::adam_`` (what compiled CPU programs call) takes the step
    of the operator's composite form (what other devices run), for a transposed gradient too, and
    counts steps held in float32 (ours) or float64 (torch's optimizer under a float64 default)."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("sac_spectral::adam_", "CPU")
    g = torch.Generator().manual_seed(3)
    start = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
    runs = []
    for fn in (torch.ops.sac_spectral.adam_, optim._adam):
        params = [p.clone() for p in start]
        state = ([torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
                 [torch.zeros((), dtype=step_dtype) for _ in params])
        for k in range(4):
            grads = [torch.randn(4, 3, generator=torch.Generator().manual_seed(k)).t(), torch.full((5,), 0.5 - k)]
            fn(params, grads, *state, 1e-2, 0.9, 0.999, 1e-8, 0.1, decoupled)
        runs.append((*params, *state[0], *state[1], *state[2]))
    for ours, composite in zip(*runs):
        torch.testing.assert_close(ours, composite, rtol=1e-6, atol=1e-7)
    assert [float(s) for s in runs[0][-2:]] == [4.0, 4.0]


@pytest.mark.parametrize("form", ["composite", "cpu kernel"])
@pytest.mark.parametrize("case", ["more gradients", "fewer second moments", "a gradient of another shape",
                                  "a step of two elements"])
def test_the_adam_step_refuses_lists_that_do_not_match_its_parameters(form, case):
    """Both forms of ``sac_spectral::adam_`` refuse, in a ValueError, lists that do not hold one
    tensor per parameter of its shape (the C++ kernel ended the process on 50 gradients for 2
    parameters; the composite form used the first 2, or read past a smaller gradient's end)."""
    if form == "cpu kernel" and native.load() is not None:
        pytest.skip("the package's C++ kernels are unavailable here")
    params = [torch.zeros(3, 4), torch.zeros(5)]
    grads, exp_avgs, exp_avg_sqs = ([torch.full((3, 4), v), torch.full((5,), v)] for v in (1.0, 0.0, 0.0))
    steps = [torch.zeros(()), torch.zeros(())]
    message = {"more gradients": "50 gradients for 2 parameters",
               "fewer second moments": "1 exp_avg_sqs for 2 parameters",
               "a gradient of another shape": "parameter 1 of shape [5] has gradient [1]",
               "a step of two elements": "and step [2]"}[case]
    if case == "more gradients":
        grads = [torch.ones(5)] * 50
    elif case == "fewer second moments":
        exp_avg_sqs = exp_avg_sqs[:1]
    elif case == "a gradient of another shape":
        grads[1] = torch.ones(1)
    else:
        steps[1] = torch.zeros(2)
    fn = torch.ops.sac_spectral.adam_ if form == "cpu kernel" else optim._adam
    with pytest.raises(ValueError, match=re.escape(message)):
        fn(params, grads, exp_avgs, exp_avg_sqs, steps, 1e-2, 0.9, 0.999, 1e-8, 0.0, False)
    assert all(not p.any() for p in params)  # nothing written
