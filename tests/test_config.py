from pathlib import Path

import pytest

from sac_spectral.apps.rl.train import TrainConfig
from sac_spectral.core.config import (
    ConfigError,
    help_text,
    load_config,
    merge_sources,
    to_dict,
)

ROOT = Path(__file__).resolve().parents[1]


def test_default_yaml_is_the_embedded_default():
    assert to_dict(load_config(TrainConfig, ROOT / "run_configs" / "default.yaml")) == to_dict(TrainConfig())


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "run_configs").glob("*.yaml")
                                        if not p.name.startswith("continual")))
def test_every_rl_config_loads(name):
    load_config(TrainConfig, ROOT / "run_configs" / name)


def test_dotted_overrides_reach_nested_fields_and_parse_yaml():
    cfg = merge_sources(TrainConfig, None, ["critic.lr=1e-4", "actor.hidden=[64, 64]", "replay_ratio=0.5",
                                             "critic.regularizers=[{name: spectral, coef: 1e-3, k: 2}]"])
    assert cfg.critic.lr == 1e-4 and cfg.actor.hidden == [64, 64] and cfg.replay_ratio == 0.5
    assert cfg.critic.regularizers == [{"name": "spectral", "coef": 1e-3, "k": 2}]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("critic.lrr=1", "did you mean 'critic.lr'"),
        ("total_steps=abc", "total_steps: expected an integer"),
        ("replay_ratio=-1", "replay_ratio: must be > 0"),
        ("critic.regularizers=[{name: spectrall}]", "unknown regularizer 'spectrall' (did you mean 'spectral'?)"),
        ("critic.regularizers=[{name: spectral, kk: 2}]", "has no option 'kk'; valid: coef, k"),
        ("progress=maybe", "expected true or false"),
        ("resets.what=some", "is not one of all, last_layers"),
        ("compile_products=mkl", "compile_products: 'mkl' is not one of onednn, aten"),
        ("resets.at=[0]", "resets.at: must be env steps >= 1"),
        ("resets.networks=[actr]", "resets.networks: 'actr' is not one of actor, critic"),
        ("device=tpu", "device"),
        ("nokey", "not of the form key=value"),
    ],
)
def test_bad_values_name_the_key_and_the_choices(override, fragment):
    with pytest.raises(ConfigError) as err:
        merge_sources(TrainConfig, None, [override])
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_help_lists_every_key_with_default():
    text = help_text(TrainConfig)
    for key in ("env", "seed", "total_steps", "replay_ratio", "batch_size", "random_steps", "eval_every",
                "eval_episodes", "run_dir", "device", "actor.regularizers", "critic.regularizers", "resets.every"):
        assert f"  {key} " in text
    assert "default: dmc:cheetah-run" in text


def test_at_least_names_the_first_key_below_the_minimum():
    from types import SimpleNamespace

    from sac_spectral.core.config import at_least

    at_least(SimpleNamespace(a=1, b=0), 0, "a", "b")
    with pytest.raises(ConfigError, match=r"^b: must be >= 1, got 0$"):
        at_least(SimpleNamespace(a=1, b=0, c=-1), 1, "a", "b", "c")


def test_bf16_support_is_read_from_the_cpu_flags(tmp_path):
    from sac_spectral.core.precision import cpu_bf16

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n")
    assert cpu_bf16(info) is False
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n")
    assert cpu_bf16(info) is True
    assert cpu_bf16(tmp_path / "missing") is None


def test_bf16_on_a_cpu_without_it_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    import sac_spectral.apps.rl.config as run_config
    from sac_spectral.apps.rl.train import main
    from sac_spectral.runs.cli import run_cli

    monkeypatch.setattr(run_config, "cpu_bf16", lambda: False)
    assert run_cli(main, ["precision=bf16", f"run_dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no native bf16" in err and "precision=fp32" in err
    assert not (tmp_path / "r").exists()
    monkeypatch.setattr(run_config, "cpu_bf16", lambda: None)  # flags unknown: nothing is claimed
    merge_sources(TrainConfig, {}, ["precision=bf16"])
