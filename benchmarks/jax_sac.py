"""The SAC update of :mod:`sac_spectral.agents.sac` written in plain JAX + optax, in jaxrl's form (for
``benchmarks/vs_jax.py``; imports neither torch nor the project).

One seed's state is a pytree: actor (trunk ``[(w [out, in], b [out]), …]``, ``mean`` and ``log_std``
heads), critic and target critic (the ``num_critics`` ensemble stacked: ``w [C, out, in]``,
``b [C, out]``), ``log_alpha`` (a scalar) and three ``optax.adam`` states (critic, actor, log α;
actor and log α touch disjoint parameters, so two optimizers equal the fused one of
:class:`sac_spectral.agents.SAC`). Weights are laid out as ``nn.Linear``'s, so the parameters of a ``SAC`` copy
over as they are. Seeds are a leading axis: every public function is ``jax.vmap``-ed over it.

Per update, as ``SAC.update``: critic step on ``mean_i (Q_j − y)²`` summed over critics, Polyak
update ``t + τ(o − t)`` of the targets, then the actor and temperature step on the updated critic
(its parameters under ``stop_gradient``), ``L(α) = α·(H − H̄)`` with ``H = −mean log π`` held fixed.
Each update returns the metrics ``SAC.update`` returns.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

Array = jax.Array
Tree = dict[str, Any]
Layer = tuple[Array, Array]  # (w [out, in], b [out]), as nn.Linear
_LOG2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_GAIN = math.sqrt(2.0)


@dataclass(frozen=True)
class Hyper:
    """Hyperparameters; the defaults are ``SACConfig``'s (cheetah-run: target entropy −6/2)."""

    gamma: float = 0.99
    tau: float = 0.005
    critic_lr: float = 3e-4
    actor_lr: float = 3e-4
    alpha_lr: float = 3e-4
    log_std_min: float = -10.0
    log_std_max: float = 2.0
    target_entropy: float = -3.0


def _mlp(key: Array, dims: list[int], heads: list[tuple[int, float]]) -> tuple[list[Layer], list[Layer]]:
    """Trunk layers ``dims[0] → … → dims[-1]`` and heads ``(width, gain)``: orthogonal ``w [out, in]``
    (gain √2 in the trunk), zero bias."""
    keys = iter(jax.random.split(key, len(dims) - 1 + len(heads)))

    def layer(d_in: int, d_out: int, gain: float) -> Layer:
        return jax.nn.initializers.orthogonal(gain)(next(keys), (d_out, d_in)), jnp.zeros(d_out)

    trunk = [layer(i, o, _GAIN) for i, o in itertools.pairwise(dims)]
    return trunk, [layer(dims[-1], o, g) for o, g in heads]


def init_params(key: Array, obs_dim: int, act_dim: int, hidden: list[int], num_critics: int) -> Tree:
    """One seed's networks, initialized as ``SAC``'s (orthogonal, gain √2, log-std head 1, zero bias)."""
    k_actor, k_critic = jax.random.split(key)
    trunk, (mean, log_std) = _mlp(k_actor, [obs_dim, *hidden], [(act_dim, _GAIN), (act_dim, 1.0)])
    ctrunk, (out,) = jax.vmap(lambda k: _mlp(k, [obs_dim + act_dim, *hidden], [(1, _GAIN)]))(
        jax.random.split(k_critic, num_critics))
    critic = {"trunk": ctrunk, "out": out}
    return {"actor": {"trunk": trunk, "mean": mean, "log_std": log_std}, "critic": critic, "target": critic,
            "log_alpha": jnp.zeros(())}


def _dense(p: Layer, x: Array) -> Array:
    return x @ p[0].T + p[1]


def policy(actor: Tree, obs: Array, noise: Array, h: Hyper) -> tuple[Array, Array]:
    """Tanh-Gaussian action ``[B, A]`` and its log-density ``[B]`` (``sac_spectral.agents.sac.tanh_gaussian``)."""
    x = obs
    for p in actor["trunk"]:
        x = jax.nn.relu(_dense(p, x))
    mean, raw = _dense(actor["mean"], x), _dense(actor["log_std"], x)
    log_std = h.log_std_min + 0.5 * (h.log_std_max - h.log_std_min) * (jnp.tanh(raw) + 1.0)
    u = mean + jnp.exp(log_std) * noise
    log_prob = (-0.5 * jnp.square(noise) - log_std - _HALF_LOG_2PI).sum(-1)
    log_prob = log_prob - (2.0 * (_LOG2 - u - jax.nn.softplus(-2.0 * u))).sum(-1)
    return jnp.tanh(u), log_prob


def q_values(critic: Tree, obs: Array, action: Array) -> Array:
    """``[C, B]`` Q-values of the ensemble."""
    x = jnp.concatenate([obs, action], axis=-1)
    x = jnp.broadcast_to(x, (critic["out"][0].shape[0], *x.shape))
    for w, b in critic["trunk"]:
        x = jax.nn.relu(jnp.einsum("cbi,coi->cbo", x, w) + b[:, None])
    w, b = critic["out"]
    return (jnp.einsum("cbi,coi->cbo", x, w) + b[:, None])[..., 0]


class JaxSAC:
    """Initialization and the jitted, seed-vmapped updates for fixed hyperparameters."""

    def __init__(self, h: Hyper) -> None:
        self.h = h
        self.opts = {"critic": optax.adam(h.critic_lr), "actor": optax.adam(h.actor_lr),
                     "alpha": optax.adam(h.alpha_lr)}
        self.train_batch = jax.jit(jax.vmap(self.update, in_axes=(0, 0, 1)), donate_argnums=0)
        self.step = jax.jit(jax.vmap(self._sample_update), donate_argnums=0)
        self.scan = jax.jit(jax.vmap(self._scan, in_axes=(0, 0, 0, None)), static_argnums=3, donate_argnums=0)

    def init_state(self, params: Tree) -> Tree:
        """``[N, …]`` state (params with a leading seed axis) with fresh Adam states."""
        params = {**params, "target": jax.tree.map(jnp.copy, params["target"])}  # own buffers (donation)
        opt = {
            "critic_opt": jax.vmap(self.opts["critic"].init)(params["critic"]),
            "actor_opt": jax.vmap(self.opts["actor"].init)(params["actor"]),
            "alpha_opt": jax.vmap(self.opts["alpha"].init)(params["log_alpha"]),
        }
        return {**params, **opt}

    def _critic_loss(self, critic: Tree, state: Tree, batch: Tree, noise: Array) -> tuple[Array, Array]:
        h = self.h
        next_action, next_logp = policy(state["actor"], batch["next_obs"], noise, h)
        next_q = q_values(state["target"], batch["next_obs"], next_action).min(axis=0)
        alpha = jnp.exp(state["log_alpha"])
        target = batch["reward"] + h.gamma * (1.0 - batch["terminated"]) * (next_q - alpha * next_logp)
        q = q_values(critic, batch["obs"], batch["action"])
        return jnp.square(q - jax.lax.stop_gradient(target)).mean(axis=-1).sum(), q.mean()

    def _actor_loss(self, trained: tuple[Tree, Array], critic: Tree, obs: Array, noise: Array) -> tuple[Array, Any]:
        actor, log_alpha = trained
        action, logp = policy(actor, obs, noise, self.h)
        q = q_values(jax.lax.stop_gradient(critic), obs, action).min(axis=0)
        actor_loss = (jnp.exp(jax.lax.stop_gradient(log_alpha)) * logp - q).mean()
        entropy = -jax.lax.stop_gradient(logp).mean()
        alpha_loss = jnp.exp(log_alpha) * (entropy - self.h.target_entropy)
        return actor_loss + alpha_loss, (actor_loss, alpha_loss, entropy)

    def _adam(self, name: str, grads: Any, params: Any, opt_state: Any) -> tuple[Any, Any]:
        updates, opt_state = self.opts[name].update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    def update(self, state: Tree, batch: Tree, noise: Array) -> tuple[Tree, Tree]:
        """One seed's update on ``batch`` (``[B, …]``) with ``noise [2, B, A]``; new state, metrics."""
        (critic_loss, q_mean), grads = jax.value_and_grad(self._critic_loss, has_aux=True)(
            state["critic"], state, batch, noise[0])
        critic, critic_opt = self._adam("critic", grads, state["critic"], state["critic_opt"])
        tau = self.h.tau
        target = jax.tree.map(lambda t, o: t + tau * (o - t), state["target"], critic)
        (_, (actor_loss, alpha_loss, entropy)), (g_actor, g_alpha) = jax.value_and_grad(self._actor_loss, has_aux=True)(
            (state["actor"], state["log_alpha"]), critic, batch["obs"], noise[1])
        actor, actor_opt = self._adam("actor", g_actor, state["actor"], state["actor_opt"])
        log_alpha, alpha_opt = self._adam("alpha", g_alpha, state["log_alpha"], state["alpha_opt"])
        new = {"actor": actor, "critic": critic, "target": target, "log_alpha": log_alpha,
               "critic_opt": critic_opt, "actor_opt": actor_opt, "alpha_opt": alpha_opt}
        metrics = {"loss/critic": critic_loss, "loss/actor": actor_loss, "loss/alpha": alpha_loss,
                   "q/mean": q_mean, "entropy": entropy}
        return new, metrics

    def _sample_update(self, state: Tree, buffer: Tree, key: Array, batch_size: int = 256) -> tuple[Tree, Array, Tree]:
        """Draw a uniform batch from ``buffer`` (full, ``[size, …]``) and the noise with ``key``, update."""
        key, k_idx, k_noise = jax.random.split(key, 3)
        idx = jax.random.randint(k_idx, (batch_size,), 0, buffer["obs"].shape[0])
        batch = {k: v[idx] for k, v in buffer.items()}
        noise = jax.random.normal(k_noise, (2, batch_size, buffer["action"].shape[-1]))
        state, metrics = self.update(state, batch, noise)
        return state, key, metrics

    def _scan(self, state: Tree, buffer: Tree, key: Array, count: int) -> tuple[Tree, Array, Tree]:
        """``count`` sampled updates in one ``lax.scan``; the last update's metrics."""
        def body(carry: tuple[Tree, Array], _: None) -> tuple[tuple[Tree, Array], Tree]:
            s, k, metrics = self._sample_update(carry[0], buffer, carry[1])
            return (s, k), metrics

        (state, key), metrics = jax.lax.scan(body, (state, key), None, length=count)
        return state, key, jax.tree.map(lambda m: m[-1], metrics)
