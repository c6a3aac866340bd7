import numpy as np
import pytest

from conftest import TOY_ID
from sac_spectral.envs import EnvPool, UnknownEnvError, make_env


def test_dmc_short_and_shimmy_ids_give_flat_float32_obs_and_unit_actions():
    for env_id in ("dmc:cheetah-run", "dm_control/cheetah-run-v0"):
        env = make_env(env_id, seed=0)
        obs, _ = env.reset(seed=1)
        assert obs.shape == (17,) and obs.dtype == np.float32
        assert env.observation_space.shape == (17,)
        assert env.action_space.shape == (6,)
        assert np.all(env.action_space.low == -1) and np.all(env.action_space.high == 1)


def test_dmc_time_limit_is_a_truncation_not_a_termination():
    env = make_env("dmc:cartpole-balance", seed=0)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for t in range(1, 1001):
        _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, 1))
        assert not terminated
        assert truncated == (t == 1000)


def test_unknown_ids_name_close_matches():
    with pytest.raises(UnknownEnvError, match="dmc:cheetah-run"):
        make_env("dmc:cheeta-run", seed=0)
    with pytest.raises(UnknownEnvError, match="unknown environment 'NoSuchEnv-v9'"):
        make_env("NoSuchEnv-v9", seed=0)


def test_discrete_action_spaces_are_rejected():
    with pytest.raises(UnknownEnvError, match="continuous Box"):
        make_env("CartPole-v1", seed=0)


def test_actions_are_rescaled_and_repeated():
    env = make_env(TOY_ID, seed=0, action_repeat=3)
    assert env.action_space.low[0] == -1 and env.action_space.high[0] == 1
    obs, _ = env.reset(seed=0)
    nxt, reward, *_ = env.step(np.array([1.0]))  # rescaled to 2.0 → 0.2 per inner step
    assert reward == 3.0
    assert nxt[0] == pytest.approx(obs[0] + 0.6, abs=1e-6)


def test_pool_stores_final_obs_and_flags_true_termination():
    pool = EnvPool(TOY_ID, [0])
    for _ in range(100):
        tr = pool.step(np.array([[1.0]]))
        if tr.terminated[0]:
            break
    assert tr.terminated[0] and not tr.truncated[0]
    assert tr.next_obs[0, 0] > 1.0  # the true successor state …
    assert abs(tr.obs[0, 0]) <= 0.1  # … while the agent continues from the reset state
    assert tr.finished[0][0] == 0 and tr.finished[0][2] == 6


def test_pool_truncation_in_toy_env_is_not_termination():
    pool = EnvPool(TOY_ID, [0])
    flags = [pool.step(np.array([[0.0]])) for _ in range(50)]
    assert flags[-1].truncated[0] and not flags[-1].terminated[0]


@pytest.mark.parametrize("env_id", ["dmc:cheetah-run", TOY_ID])
def test_pool_state_restores_the_exact_trajectory(env_id):
    a = EnvPool(env_id, [3, 4])
    rng = np.random.default_rng(0)
    acts = rng.uniform(-1, 1, (300, 2, a.act_dim))
    for t in range(120):
        a.step(acts[t])
    state = a.state_dict()
    b = EnvPool(env_id, [3, 4])
    exact = b.load_state_dict(state)
    if env_id == TOY_ID:
        assert not exact  # plain envs cannot be restored: a new episode starts
        return
    assert exact
    for t in range(120, 300):
        ta, tb = a.step(acts[t]), b.step(acts[t])
        assert np.array_equal(ta.next_obs, tb.next_obs) and np.array_equal(ta.reward, tb.reward)
