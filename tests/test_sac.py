import copy
import math
import re

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from conftest import named_noise
from sac_spectral.agents import SAC, ReplayBuffer, SACConfig, tanh_gaussian
from sac_spectral.agents.compiled import COMPILE_MINUTES
from sac_spectral.apps.rl.config import TrainConfig
from sac_spectral.core.seeding import SeedStreams
from sac_spectral.regularizers import Regularizer


def small_cfg(**kw) -> SACConfig:
    cfg = SACConfig()
    cfg.actor.hidden = [16, 16]
    cfg.critic.hidden = [16, 16]
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def make_agent(seeds=(0,), cfg=None) -> SAC:
    return SAC(5, 2, cfg or small_cfg(), SeedStreams(list(seeds)))


def random_batch(n=1, b=8, obs=5, act=2, gen=None):
    g = gen or torch.Generator().manual_seed(0)
    return {
        "obs": torch.randn(n, b, obs, generator=g),
        "action": torch.rand(n, b, act, generator=g) * 2 - 1,
        "reward": torch.randn(n, b, generator=g),
        "next_obs": torch.randn(n, b, obs, generator=g),
        "terminated": torch.zeros(n, b),
    }


def test_tanh_gaussian_log_prob_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=g, dtype=torch.float64)
    log_std = torch.randn(64, 3, generator=g, dtype=torch.float64) * 0.5
    noise = torch.randn(64, 3, generator=g, dtype=torch.float64)
    action, logp = tanh_gaussian(mean, log_std, noise)
    ref = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform(cache_size=1)])
    u = mean + log_std.exp() * noise
    torch.testing.assert_close(action, torch.tanh(u))
    torch.testing.assert_close(logp, ref.log_prob(torch.tanh(u)).sum(-1), rtol=1e-7, atol=1e-7)


def test_tanh_gaussian_is_stable_when_saturated():
    action, logp = tanh_gaussian(torch.full((1, 2), 30.0), torch.zeros(1, 2), torch.zeros(1, 2))
    assert torch.isfinite(logp).all() and torch.all(action == 1.0)


def _manual_q(net, x):
    """Independent forward of member-batched MLP: loop over members with plain matmuls."""
    outs = []
    for m in range(net.members):
        h = x
        for layer in net.layers:
            h = torch.relu(torch.nn.functional.linear(h, layer.weight[m], layer.bias[m]))
        head = net.heads[0]
        outs.append(torch.nn.functional.linear(h, head.weight[m], head.bias[m]).squeeze(-1))
    return torch.stack(outs)


def test_critic_target_bootstraps_through_truncation_but_not_termination():
    agent = make_agent()
    batch = random_batch(b=6)
    batch["terminated"] = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0, 1.0]])
    noise = torch.randn(1, 6, 2, generator=torch.Generator().manual_seed(3))
    target = agent.critic_target(batch, noise)
    with torch.no_grad():
        a, logp = agent.policy(batch["next_obs"], noise)
        x = torch.cat([batch["next_obs"][0], a[0]], -1)
        min_q = _manual_q(agent.target_critic, x).amin(0)
        soft = min_q - agent.log_alpha.exp() * logp[0]
    done = batch["terminated"][0].bool()
    torch.testing.assert_close(target[0][done], batch["reward"][0][done])
    torch.testing.assert_close(target[0][~done], batch["reward"][0][~done] + 0.99 * soft[~done])


def test_polyak_update_of_target_critic():
    agent = make_agent()
    old_target = [p.clone() for p in agent.target_critic.parameters()]
    agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    for t, o, new in zip(agent.target_critic.parameters(), old_target, agent.critic.parameters()):
        torch.testing.assert_close(t, o + 0.005 * (new - o))


def test_actor_loss_builds_no_critic_weight_gradients():
    agent = make_agent()
    batch = random_batch()
    a, _ = agent.policy(batch["obs"], torch.randn(1, 8, 2))
    agent.q_values(agent.critic, batch["obs"], a, detach=True).sum().backward()
    assert all(p.grad is None for p in agent.critic.parameters())
    assert all(p.grad is not None for p in agent.actor.parameters())


def test_temperature_moves_toward_target_entropy():
    cfg = small_cfg()
    cfg.alpha.target_entropy_scale = 0.5
    agent = make_agent(cfg=cfg)
    assert agent.target_entropy == -1.0
    before = agent.log_alpha.item()
    entropy = agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))["entropy"].item()
    assert math.copysign(1, agent.log_alpha.item() - before) == math.copysign(1, agent.target_entropy - entropy)


def test_reset_all_redraws_everything_and_clears_optimizers():
    agent = make_agent()
    for _ in range(3):
        agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    agent.reset()
    for k, v in agent.state_dict().items():
        if "bias" not in k:
            assert not torch.equal(v, before[k]), k
    assert all(len(o.state) == 0 for o in (agent.trained["actor"].optimizer, agent.trained["critic"].optimizer))
    for t, c in zip(agent.target_critic.parameters(), agent.critic.parameters()):
        assert torch.equal(t, c)
    assert agent.log_alpha.item() == 0.0


def test_reset_last_layers_keeps_the_rest():
    agent = make_agent()
    agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    w0 = agent.critic.layers[-1].weight.clone()
    w_last = agent.critic.heads[0].weight.clone()
    actor_heads = [h.weight.clone() for h in agent.actor.heads]
    agent.reset(1)
    assert torch.equal(agent.critic.layers[-1].weight, w0)
    assert not torch.equal(agent.critic.heads[0].weight, w_last)
    assert all(not torch.equal(h.weight, w) for h, w in zip(agent.actor.heads, actor_heads))
    assert agent.critic.heads[0].weight not in agent.trained["critic"].optimizer.state
    assert agent.critic.layers[-1].weight in agent.trained["critic"].optimizer.state
    assert torch.equal(agent.target_critic.heads[0].weight, agent.critic.heads[0].weight)


@pytest.mark.parametrize("net, kept", [("critic", "actor"), ("actor", "critic")])
def test_a_reset_of_one_network_keeps_the_other_its_optimizer_state_and_its_regularizers(net, kept):
    cfg = small_cfg()
    cfg.critic.regularizers = cfg.actor.regularizers = [{"name": "l2_init", "coef": 1e-3}]
    agent = make_agent(cfg=cfg)
    for _ in range(3):
        agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    with torch.no_grad():
        agent.log_alpha.fill_(-1.0)
    before = {k: v.clone() for k, v in agent.state_dict().items()}
    kept_regs = agent.trained[kept].regularizers
    agent.reset(networks=[net])
    for k, v in agent.state_dict().items():
        if k.startswith(f"{kept}.") or k.startswith(f"target_{kept}."):
            assert torch.equal(v, before[k]), k
        elif k.startswith(f"{net}.") and "weight" in k:
            assert not torch.equal(v, before[k]), k
    assert len(agent.trained[net].optimizer.state) == 0
    assert len(agent.trained[kept].optimizer.state) > 0
    assert agent.trained[kept].regularizers is kept_regs and agent.trained[net].regularizers is not kept_regs
    assert agent.log_alpha.item() == (0.0 if net == "actor" else -1.0)


def test_a_reset_of_a_network_the_agent_does_not_train_is_refused_in_one_line():
    with pytest.raises(ValueError, match="'value' is not one of actor, critic"):
        make_agent().reset(networks=["value"])


def _paired_buffers(seeds, obs=5, act=2, n=64, vary_seed0=False):
    """Per-seed buffers with identical rows for every seed but (optionally) seed 0."""
    g = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(n, obs, act, seeds)
    for _ in range(n):
        row = [torch.randn(seeds, obs, generator=g), torch.rand(seeds, act, generator=g),
               torch.randn(seeds, generator=g),
               torch.randn(seeds, obs, generator=g), torch.zeros(seeds)]
        if vary_seed0:
            row[2] = row[2] + torch.tensor([1.0] + [0.0] * (seeds - 1))
        buf.add(*row)
    return buf


def test_seeds_in_one_agent_never_influence_each_other():
    """Exact: changing seed 0's data leaves seed 1 bit-for-bit unchanged."""
    a, b = make_agent(seeds=(4, 5)), make_agent(seeds=(4, 5))
    a.train_steps(_paired_buffers(2), 10, 16)
    b.train_steps(_paired_buffers(2, vary_seed0=True), 10, 16)
    changed = {}
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        n = pa.shape[0] // 2
        assert torch.equal(pa[n:], pb[n:])
        changed[name] = not torch.equal(pa[:n], pb[:n])
    # seed 0's critics and actor moved; its temperature and log-std head need not: Adam's first
    # steps are ≈ lr·sign(g), which a small change of the gradient may leave bit-identical
    assert all(v for k, v in changed.items() if not k.startswith(("log_alpha", "actor.heads.1")))


def test_seed_in_a_multi_seed_agent_matches_single_seed_agent():
    """To float rounding: vectorized kernels compute a tensor's tail with scalar code, so an element
    can round differently depending on its position in the batched tensor."""
    multi, single = make_agent(seeds=(4, 5)), make_agent(seeds=(5,))
    buf_m, buf_s = _paired_buffers(2), ReplayBuffer(64, 5, 2, 1)
    for k, v in buf_m.storage.items():
        buf_s.storage[k][0] = v[1]
    buf_s.size, buf_s.ptr = buf_m.size, buf_m.ptr
    multi.train_steps(buf_m, 5, 16)
    single.train_steps(buf_s, 5, 16)
    for pm, ps in zip(multi.parameters(), single.parameters()):
        n = ps.shape[0]
        torch.testing.assert_close(pm[n:], ps, rtol=1e-5, atol=1e-6)


def _train_copy(cfg, updates=3):
    agent = make_agent(cfg=cfg)
    g = torch.Generator().manual_seed(1)
    for _ in range(updates):
        info = agent.update(random_batch(b=32, gen=g), named_noise(agent, torch.randn(2, 1, 32, 2, generator=g)))
    return agent, info


def test_bf16_keeps_fp32_state_and_tracks_fp32_losses():
    ref, ref_info = _train_copy(small_cfg())
    bf, bf_info = _train_copy(small_cfg(precision="bf16"))
    assert all(p.dtype == torch.float32 for p in bf.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in bf.trained["critic"].optimizer.state.values())
    for key in ("loss/critic", "loss/actor", "entropy"):
        torch.testing.assert_close(bf_info[key], ref_info[key], rtol=3e-2, atol=3e-2)
    for p, q in zip(bf.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=5e-3)


def _linear_pairs(agent):
    nets = (agent.actor, agent.critic, agent.target_critic)
    return [(p, q) for net in nets for m in net.modules() if getattr(m, "low", None) is not None for p,
            q in zip((m.weight, m.bias), m.low[:2])]


def test_bf16_copies_follow_the_masters_after_updates_resets_and_loading():
    agent, _ = _train_copy(small_cfg(precision="bf16"))
    pairs = _linear_pairs(agent)
    assert len(pairs) == 2 * (4 + 3 + 3)
    for master, low in pairs:
        assert low.dtype == torch.bfloat16
        assert torch.equal(low, master.detach().to(torch.bfloat16))
    agent.reset(1)
    assert all(torch.equal(low, master.detach().to(torch.bfloat16)) for master, low in _linear_pairs(agent))
    fresh = make_agent(cfg=small_cfg(precision="bf16"))
    fresh.load_full_state_dict(agent.full_state_dict())
    assert all(torch.equal(low, master.detach().to(torch.bfloat16)) for master, low in _linear_pairs(fresh))


def test_bf16_gradients_equal_autocast_gradients_and_acting_stays_fp32():
    """The copies' gradients reach the fp32 masters as bf16 autocast's would (same bf16 matmuls,
    then fp32), penalties add theirs, and outside the update the networks run in fp32."""
    cfg = small_cfg(precision="bf16")
    cfg.critic.regularizers = [{"name": "l2", "coef": 1e-2}]
    agent = make_agent(cfg=cfg)
    ref = copy.deepcopy(agent)
    g = torch.Generator().manual_seed(3)
    batch, noise = random_batch(b=32, gen=g), torch.randn(1, 32, 2, generator=g)
    with agent.precision.forward():
        loss, _ = agent.critic_step(batch, named_noise(agent, noise.unsqueeze(0)))
    (loss + agent.trained["critic"].regularizers[0].penalty()).backward()
    agent.precision.collect_grads("critic")
    with torch.autocast("cpu", torch.bfloat16):
        ref_losses, _ = ref.critic_losses(batch, {"next_action": noise})
    (ref_losses.mean(dim=-1).sum() + ref.trained["critic"].regularizers[0].penalty()).backward()
    for p, q in zip(agent.critic.parameters(), ref.critic.parameters()):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-3)
    obs = torch.randn(1, 5, generator=g)
    expected = torch.tanh(agent.actor(obs.unsqueeze(1))[0]).squeeze(1)
    assert expected.dtype == torch.float32
    torch.testing.assert_close(agent.act(obs, deterministic=True), expected, rtol=0, atol=0)


class _Cubic(Regularizer):
    """A regularizer that only writes ``penalty()``: ``Σ θ⁴`` over the network's parameters."""

    name = "cubic_test"

    def penalty(self) -> torch.Tensor:
        return 1e-3 * sum(p.pow(4).sum() for p in self.module.parameters())


@pytest.mark.slow
def test_compiled_update_forms_every_penalty_inside_its_program(monkeypatch):
    """The built-in penalties (closed-form gradients) and one that only writes ``penalty()``
    (``torch.func`` of it) give eager's parameters under compile=true, and the compiled update never
    calls the built-in ``penalty()``: their gradients, and the spectral power step, are formed in
    the program."""
    def make(compile_: bool) -> SAC:
        cfg = small_cfg(compile=compile_)
        cfg.actor.regularizers = [{"name": "spectral", "coef": 1e-2, "k": 1.5}, {"name": "parseval", "coef": 1e-3}]
        cfg.critic.regularizers = [{"name": "l2_init", "coef": 1e-2}, {"name": "wasserstein_init", "coef": 1e-2},
                                   {"name": "spectral", "coef": 1e-2, "mode": "all"}]
        agent = make_agent(cfg=cfg)
        agent.trained["critic"].regularizers.append(_Cubic(agent.critic))
        return agent

    eager, compiled = make(False), make(True)
    g = torch.Generator().manual_seed(3)
    data = [(random_batch(b=32, gen=g), torch.randn(2, 1, 32, 2, generator=g)) for _ in range(3)]
    for batch, noise in data:
        eager.update(batch, named_noise(eager, noise))
    regularizers = compiled.trained["actor"].regularizers + compiled.trained["critic"].regularizers
    for cls in {type(r) for r in regularizers} - {_Cubic}:
        monkeypatch.setattr(cls, "penalty", lambda self: pytest.fail(f"{self.name}.penalty() ran in eager"))
    for batch, noise in data:
        compiled.update(batch, named_noise(compiled, noise))
    for p, q in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for r, q in zip(compiled.trained["actor"].regularizers[0]._plan.vectors,
                    eager.trained["actor"].regularizers[0]._plan.vectors):
        torch.testing.assert_close(r, q, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_agents_in_one_process_compile_programs_of_their_own():
    """Two compiled agents in one process, differing only in a constant of their update (tau),
    each get their own program (none reuses the other's, none falls back to eager at dynamo's
    recompile limit, here lowered to 1) and each equals its eager twin."""
    before = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(recompile_limit=1):
        for tau in (0.01, 0.2):
            comp, _ = _train_copy(small_cfg(compile=True, tau=tau), updates=2)
            ref, _ = _train_copy(small_cfg(tau=tau), updates=2)
            for p, q in zip(comp.parameters(), ref.parameters()):
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] - before == 2


def test_a_compiled_program_serves_every_count_of_updates_per_call():
    """``train_steps`` with 2, 5 and 1 updates per call (a replay ratio, heavy priming's chunks)
    runs one compiled program: the batch and noise of each update have the same layout whatever
    the count."""
    agent = make_agent(cfg=small_cfg(compile=True))
    buf = ReplayBuffer(64, 5, 2, 1)
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        buf.add(torch.randn(1, 5, generator=g), torch.rand(1, 2, generator=g) * 2 - 1, torch.randn(1, generator=g),
                torch.randn(1, 5, generator=g), torch.zeros(1))
    before = counters["stats"]["unique_graphs"]
    for count in (2, 5, 1):
        agent.train_steps(buf, count, 8)
    assert agent.num_updates == 8
    assert counters["stats"]["unique_graphs"] - before == 1


def test_a_compile_says_what_it_compiles_and_how_long_it_took(capsys):
    """The first call of a compiled program, its compile (minutes the first time on a busy machine,
    in silence before), says that it compiles and what a first compile takes, then how long it
    took; later calls say nothing."""
    agent = make_agent(cfg=small_cfg(compile=True))
    agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    first, done = capsys.readouterr().err.splitlines()
    assert first == f"compiling the update (first time on this machine: ~{COMPILE_MINUTES} min; cached afterwards)"
    assert re.fullmatch(r"compiled the update in \d+ s", done), done
    agent.update(random_batch(), named_noise(agent, torch.randn(2, 1, 8, 2)))
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_compiled_bf16_tracks_fp32():
    """compile=true with precision=bf16 casts the weights inside the program: fp32 state, losses and
    weights within bf16 rounding of the fp32 update's."""
    ref, ref_info = _train_copy(small_cfg())
    bf, bf_info = _train_copy(small_cfg(precision="bf16", compile=True))
    assert all(p.dtype == torch.float32 for p in bf.parameters())
    for key in ("loss/critic", "loss/actor", "entropy"):
        torch.testing.assert_close(bf_info[key], ref_info[key], rtol=3e-2, atol=3e-2)
    for p, q in zip(bf.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=5e-3)


def test_networks_are_initialized_as_in_rl_with_resets():
    """Orthogonal gain √2 for every critic layer (output included) and the actor's trunk and mean
    head; gain 1 for the separate log-std head; zero biases."""
    agent = make_agent()
    sqrt2 = math.sqrt(2)
    critic_layers = [*agent.critic.layers, *agent.critic.heads]
    for layer in critic_layers + list(agent.actor.layers) + [agent.actor.heads[0]]:
        s = torch.linalg.svdvals(layer.weight.detach())
        torch.testing.assert_close(s, torch.full_like(s, sqrt2))
    s = torch.linalg.svdvals(agent.actor.heads[1].weight.detach())
    torch.testing.assert_close(s, torch.ones_like(s))
    assert [tuple(h.weight.shape) for h in agent.actor.heads] == [(1, 2, 16), (1, 2, 16)]
    assert all(torch.count_nonzero(p) == 0 for n, p in agent.named_parameters() if n.endswith("bias"))


@pytest.mark.parametrize("width", [1, 3])
def test_the_critics_head_width_is_the_heads(width):
    """The critic head's width (``critic.head``: 1 for a scalar, ``num_quantiles`` for quantiles)
    shapes the critic's output layer, its ``critic_outputs`` (``[N, C, B]`` for a scalar head,
    ``[N, C, B, W]`` otherwise) and its memory estimate; ``q_values`` are ``[N, C, B]`` either way."""
    cfg, scalar = TrainConfig(num_seeds=2), TrainConfig(num_seeds=2)
    cfg.actor.hidden = cfg.critic.hidden = scalar.actor.hidden = scalar.critic.hidden = [16, 16]
    if width > 1:
        cfg.critic.head, cfg.critic.num_quantiles = "quantile", width
    agent = SAC(5, 2, cfg, SeedStreams([0, 1]))
    assert agent.critic.heads[0].weight.shape == agent.target_critic.heads[0].weight.shape == (4, width, 16)
    batch = random_batch(n=2)
    out = agent.critic_outputs(agent.critic, batch["obs"], batch["action"])
    assert out.shape == (2, 2, 8) + ((width,) if width > 1 else ())
    assert agent.q_values(agent.critic, batch["obs"], batch["action"]).shape == (2, 2, 8)
    part = "a batch's transitions and activations"
    grown = SAC.memory_estimate(cfg, 5, 2)[part] - SAC.memory_estimate(scalar, 5, 2)[part]
    assert grown == 4 * 2 * 2 * 2 * cfg.batch_size * 4 * (width - 1)  # fp32 · 2 · N · C · B · 4 per unit


def test_update_losses_are_the_means_of_the_per_example_losses():
    agent = make_agent(seeds=(0, 1))
    batch = random_batch(n=2, b=8)
    noise = torch.randn(2, 2, 8, 2, generator=torch.Generator().manual_seed(5))
    actor_before = copy.deepcopy(agent.actor.state_dict())
    with torch.no_grad():
        critic_ex, _ = agent.critic_losses(batch, named_noise(agent, noise))
        alpha = agent.log_alpha.exp()
    info = agent.update(batch, named_noise(agent, noise))
    torch.testing.assert_close(info["loss/critic"], critic_ex.mean(-1).sum(1))
    agent.actor.load_state_dict(actor_before)  # the actor step sees the updated critic, the old actor
    with torch.no_grad():
        agent.log_alpha.copy_(alpha.log())
        actor_ex, logp = agent.actor_losses(batch, named_noise(agent, noise))
    torch.testing.assert_close(info["loss/actor"], actor_ex.mean(-1))
    torch.testing.assert_close(info["entropy"], -logp.mean(-1))
    torch.testing.assert_close(info["loss/alpha"], alpha * (-logp.mean(-1) - agent.target_entropy))


def test_diagnostics_differentiate_the_losses_the_update_minimizes():
    """The gradient-rank closures' per-example losses average to the update's losses on the same
    batch and noise (one definition of SAC's losses)."""
    from sac_spectral.agents.probes import network_loss

    agent = make_agent(seeds=(0, 1))
    batch = random_batch(n=2, b=8)
    noise = named_noise(agent, torch.randn(2, 2, 8, 2, generator=torch.Generator().manual_seed(5)))
    critic_fn, critic_probe = network_loss(agent, "critic", batch, noise)
    actor_fn, actor_probe = network_loss(agent, "actor", batch, noise)
    with torch.no_grad():
        per_example_critic = critic_fn(agent.critic, critic_probe).view(2, agent.num_critics, 8)
        per_example_actor = actor_fn(agent.actor, actor_probe)
        critic_update = agent.critic_step(batch, noise)[1]["loss/critic"]
        actor_update = agent.actor_step(batch, noise)[1]["loss/actor"]
    torch.testing.assert_close(per_example_critic.mean(-1).sum(1), critic_update)
    torch.testing.assert_close(per_example_actor.mean(-1), actor_update)
