"""Q-scale: the critic's mean Q on evaluation states against the discounted Monte-Carlo return."""

import gymnasium as gym
import numpy as np
import pytest

from sac_spectral.envs.evaluate import discounted_returns, evaluate, q_scale


class Countdown(gym.Env):
    """Reward 1 per step for ``length`` steps, then truncation; observation = steps left."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, length: int) -> None:
        self.length, self.left = length, length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = self.length
        return np.array([self.left], np.float32), {}

    def step(self, action):
        self.left -= 1
        return np.array([self.left], np.float32), 1.0, False, self.left == 0, {}


def test_discounted_returns_match_the_sum():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=17)
    expected = [sum(0.9**j * r for j, r in enumerate(rewards[t:])) for t in range(17)]
    np.testing.assert_allclose(discounted_returns(rewards, 0.9), expected, rtol=1e-12)


@pytest.mark.parametrize("length", [600, 50])
def test_an_exact_critic_has_zero_bias_and_a_doubled_one_bias_one(length):
    """With Q(s) = the true discounted return of s (to the episode's end), the normalized bias is 0
    and Q equals the MC return; doubling Q gives a bias of 1. Episodes longer than the horizon
    (459 steps at γ = 0.99) count only states 459 or more steps before their end; shorter ones count
    all and are marked truncated."""
    gamma, envs, seeds = 0.99, [Countdown(length), Countdown(length)], [0, 1]

    def exact(obs, action):
        left = obs[:, 0].astype(np.float64)
        return (1 - gamma**left) / (1 - gamma)

    def policy(obs):
        return np.zeros((len(obs), 1), np.float32)

    exact_scale = q_scale(policy, exact, envs, seeds, 0, 2, gamma)
    np.testing.assert_allclose(exact_scale["normalized_bias"], 0.0, atol=1e-9)
    np.testing.assert_allclose(exact_scale["q_mean"], exact_scale["mc_return"], rtol=1e-9)
    kept = length - 459 if length > 459 else length
    expected = np.mean([(1 - gamma ** (length - t)) / (1 - gamma) for t in range(kept)])
    np.testing.assert_allclose(exact_scale["mc_return"], expected, rtol=1e-9)
    assert exact_scale["truncated"].tolist() == [float(length <= 459)] * 2
    doubled = q_scale(policy, lambda o, a: 2 * exact(o, a), envs, seeds, 0, 2, gamma)
    np.testing.assert_allclose(doubled["normalized_bias"], 1.0, rtol=1e-9)
    np.testing.assert_allclose(evaluate(policy, envs, seeds, 0, 2), [length, length])


def test_an_agents_value_scale_is_in_reward_units_under_reward_scaling():
    """A run that divides its rewards (``reward_scale: simbav2``) trains critics in divided units:
    ``agent_q_scale`` multiplies each seed's Q by its current divisor, and the Monte-Carlo returns
    (the env's own rewards) do not change."""
    from conftest import reference_config
    from sac_spectral.agents import build_agent
    from sac_spectral.agents.reward_scale import RewardScale
    from sac_spectral.apps.rl.value_scale import agent_q_scale
    from sac_spectral.core.seeding import SeedStreams

    agent = build_agent(1, 1, reference_config("sac", [8, 8], num_seeds=2), SeedStreams([0, 1]))
    scale = RewardScale(2, 0.99)
    for t in range(30):
        scale.observe([1.0 + t, 3.0 * t], [t % 7 == 6, False])
    envs = [Countdown(50), Countdown(50)]
    plain = agent_q_scale(agent, envs, [0, 1], 0, 1, 0.99)
    scaled = agent_q_scale(agent, envs, [0, 1], 0, 1, 0.99, scale)
    divisor = scale.divisor().numpy()
    assert (divisor > 1).all() and divisor[0] != pytest.approx(divisor[1])
    np.testing.assert_allclose(scaled["q_scale/q_mean"], np.array(plain["q_scale/q_mean"]) * divisor, rtol=1e-6)
    np.testing.assert_allclose(scaled["q_scale/mc_return"], plain["q_scale/mc_return"], rtol=1e-12)
