"""The whole-process benchmarks against SB3 and SBX (benchmarks/whole_run.py): their jobs, protocols,
settings and report, without running either peer (neither needs to be installed)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import vs_sb3, vs_sbx, whole_run
from sac_spectral.apps.rl.config import TrainConfig

ARGS = whole_run.parser("test").parse_args(["--steps", "300", "--random-steps", "100", "--threads", "1"])


def commands(peer: whole_run.Peer, protocol: str) -> dict[str, list[str]]:
    return {k: whole_run.command(job, ARGS, Path("/tmp/run"), peer)
            for k, job in whole_run.select(peer, None, protocol).items()}


def test_peer_settings_are_our_default_config() -> None:
    cfg = TrainConfig()
    kw = whole_run.peer_kwargs(random_steps=1000, act_dim=6)
    assert kw["policy_kwargs"] == {"net_arch": cfg.actor.hidden, "n_critics": cfg.critic.num_critics}
    assert cfg.critic.hidden == cfg.actor.hidden and cfg.actor.activation == cfg.critic.activation == "relu"
    assert kw["learning_rate"] == cfg.actor.lr == cfg.critic.lr == cfg.alpha.lr
    assert (kw["batch_size"], kw["gamma"], kw["tau"], kw["buffer_size"]) == (
        cfg.batch_size, cfg.gamma, cfg.tau, cfg.buffer_size)
    assert kw["ent_coef"] == f"auto_{cfg.alpha.init}" and cfg.alpha.learn
    assert kw["target_entropy"] == pytest.approx(-cfg.alpha.target_entropy_scale * 6)
    assert (kw["learning_starts"], kw["train_freq"], kw["gradient_steps"], cfg.replay_ratio) == (1000, 1, 1, 1.0)


@pytest.mark.parametrize("peer", [vs_sb3.PEER, vs_sbx.PEER])
def test_training_protocol_evaluates_one_episode_on_our_side_and_none_on_the_peers(peer: whole_run.Peer) -> None:
    cmds = commands(peer, "training")
    assert list(cmds) == ["train-default", "train-fast", f"train-{peer.id}"]
    for k in ("train-default", "train-fast"):
        ours = cmds[k]
        assert ours[1:3] == ["-m", "sac_spectral.train"] and "eval_episodes=1" in ours
        assert {"total_steps=300", "random_steps=100"} <= set(ours)
        assert not any(a.startswith(("threads=", "progress=")) for a in ours)  # as a user starts it
    assert "compile=true" in cmds["train-fast"] and "compile=true" not in cmds["train-default"]
    theirs = cmds[f"train-{peer.id}"]
    assert theirs[1:4] == ["-m", peer.module, "--peer-job"]
    args = whole_run.parser("test").parse_args(theirs[3:])  # what the peer's process reads
    assert (args.peer_job, args.episodes, args.steps, args.random_steps, args.threads) == (True, 0, 300, 100, 1)


def test_e10_protocol_evaluates_ten_episodes_on_both_sides() -> None:
    cmds = commands(vs_sbx.PEER, "e10")
    assert list(cmds) == ["default", "fast", "sbx"]
    assert TrainConfig().eval_episodes == 10
    assert not any(a.startswith("eval_episodes=") for a in cmds["default"] + cmds["fast"])
    assert whole_run.parser("test").parse_args(cmds["sbx"][3:]).episodes == 10


def test_both_protocols_compare_each_of_our_rows_with_its_own_peer_row() -> None:
    jobs = whole_run.select(vs_sbx.PEER, None, "both")
    assert {k: job.ref for k, job in jobs.items() if job.peer_episodes is None} == {
        "train-default": "train-sbx", "train-fast": "train-sbx", "default": "sbx", "fast": "sbx"}


def test_vs_sb3_keeps_its_jobs_and_labels() -> None:
    jobs = whole_run.select(vs_sb3.PEER, "default,fast,sb3,e1,e1-nodiag,e1-compile,plain,sb3-e1", "both")
    assert jobs["default"].label == "ours, default as a user runs it: E(10), threads=0"
    assert jobs["fast"].label == "ours, fast settings as a user runs them: E(10)"
    assert (jobs["sb3"].label, jobs["sb3"].peer_episodes, jobs["sb3-e1"].peer_episodes) == ("SB3, E(10)", 10, 1)
    plain = whole_run.command(jobs["plain"], ARGS, Path("/tmp/run"), vs_sb3.PEER)
    assert {"threads=1", "progress=false", "eval_episodes=1", "critic.regularizers=[]", "actor.regularizers=[]",
            "diagnostics.every=0"} <= set(plain)
    assert {k for k, job in jobs.items() if job.ref == "sb3-e1"} == {"e1", "e1-nodiag", "e1-compile", "plain"}


def test_unknown_job_names_the_valid_ones() -> None:
    with pytest.raises(SystemExit, match=r"unknown job nope; valid: train-default, .*sbx"):
        whole_run.select(vs_sbx.PEER, "fast,nope", "both")


def test_report_prints_peer_time_over_ours(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = whole_run.select(vs_sbx.PEER, None, "training")
    times = {"train-default": [(10.0, 8.0), (11.0, 9.0), (30.0, 9.0)], "train-fast": [(6.0, 5.0)] * 3,
             "train-sbx": [(12.0, 18.0), (13.2, 18.0), (12.1, 18.0)]}
    whole_run.report(jobs, times, vs_sbx.PEER)
    out = capsys.readouterr().out
    ratios = re.findall(r"^  (ours.*?) +(\d+\.\d\d)  \((\d+\.\d\d)\)  vs SBX, no evaluation$", out, re.M)
    assert ratios == [("ours, default as a user runs it: E(1), threads=0", "1.10", "2.00"),  # medians 12.1/11, 18/9
                      ("ours, fast settings as a user runs them: E(1)", "2.02", "3.60")]


def test_a_missing_peer_says_so_in_one_line_and_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sbx" else find_spec(name, *a))
    monkeypatch.setattr(sys, "argv", ["vs_sbx"])
    with pytest.raises(SystemExit) as exit_:
        whole_run.main(vs_sbx.PEER, "test")
    assert isinstance(exit_.value.code, str) and "\n" not in exit_.value.code  # argparse-style: status 1
    assert exit_.value.code.startswith("sbx is not installed") and "sbx-rl" in exit_.value.code


def test_first_line_times_a_run_to_its_config_line() -> None:
    """``benchmarks.first_line`` reads a real run's first line: the config line, not an error."""
    from benchmarks import first_line

    seconds, line = first_line.first_line(["total_steps=10", "random_steps=5", "threads=1"])
    assert seconds > 0 and line.startswith("config: sac | dmc:cheetah-run"), line


def test_agent_costs_arms_are_valid_configs_that_update() -> None:
    """Every arm ``benchmarks.agent_costs`` times is a config the agents accept and one that trains."""
    from benchmarks import agent_costs

    for name, overrides in agent_costs.ARMS.items():
        agent, buf = agent_costs.build(overrides, seeds=2, compiled=False, size=64)
        before = [p.detach().clone() for p in agent.nets()["critic"].parameters()]
        agent.train_steps(buf, 1, 32)
        after = list(agent.nets()["critic"].parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after)), name
