"""evals.csv (appends, resume without duplicates) and the report on run directories with known
numbers: its statistics equal rliable called directly on the same arrays; one seed, ragged runs,
loose runs, figures that are not blank."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import SMALL, TOY_ID
from sac_spectral.apps.continual.runner import main as continual_main
from sac_spectral.apps.rl.kind import COLUMNS as RL_COLUMNS
from sac_spectral.apps.rl.train import main as train_main
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.evals import append_rows, read_evals
from sac_spectral.runs.kinds import RunKind, config_header, get_kind, kind_names, register_kind
from sac_spectral.runs.layout import CHECKPOINT
from sac_spectral.studies import report, results

rliable_library = pytest.importorskip("rliable.library")
from rliable import metrics  # noqa: E402

REPS, SEED = 300, 7
ROOT = Path(__file__).resolve().parents[1]


def rliable_estimates(scores, func):
    """rliable called directly; its bootstrap draws from numpy's global generator."""
    np.random.seed(SEED)
    return rliable_library.get_interval_estimates(scores, func, reps=REPS, random_state=np.random.RandomState(SEED))


# --------------------------------------------------------------------------------------- evals.csv
def test_append_drops_rows_at_or_after_the_new_key_and_a_cut_off_line(tmp_path):
    path = tmp_path / "evals.csv"
    for step in (10, 20, 30):
        append_rows(path, RL_COLUMNS, [{"step": step, "seed": s, "return": step + s / 10} for s in (0, 1)])
    with path.open("a") as f:
        f.write("40,0,,1.5")  # a kill in the middle of a line
    append_rows(path, RL_COLUMNS, [{"step": 20, "seed": s, "return": -1.0} for s in (0, 1)])
    rows = read_evals(tmp_path)
    assert [(r["step"], r["seed"], r["return"]) for r in rows] == [(10, 0, 10.0), (10, 1, 10.1), (20, 0, -1.0),
                                                                     (20, 1, -1.0)]
    assert rows[0]["updates"] is None and isinstance(rows[0]["step"], int)


def test_an_evals_csv_written_before_a_column_keeps_its_rows_when_appended_to(tmp_path):
    """A run resumed from a version whose evals.csv lacked ``warmup``: its rows stay, that cell empty."""
    path = tmp_path / "evals.csv"
    old = [c for c in RL_COLUMNS if c != "warmup"]
    path.write_text(",".join(old) + "\n" + "".join(f"{s},0,{s},{s / 10},1,0.5,t,0\n" for s in (10, 20)))
    append_rows(path, RL_COLUMNS,
                [{"step": 20, "seed": 0, "updates": 20, "return": 9.0, "task": "t", "stage": 0, "warmup": 0}])
    assert path.read_text().splitlines()[0] == ",".join(RL_COLUMNS)
    rows = read_evals(tmp_path)
    assert [(r["step"], r["return"], r["task"], r["warmup"]) for r in rows] == [(10, 1.0, "t", None), (20, 9.0, "t", 0)]


def test_a_resumed_run_rewrites_the_evaluations_after_its_checkpoint_once(tmp_path):
    """Killed after its evaluations at steps 400 and 500 but before the checkpoint at 500: the
    resumed run (from the checkpoint at 300) evaluates 400 and 500 again; the CSV holds each step
    once: the uninterrupted run's values up to the checkpoint, the resumed run's after it (the toy
    env's state is not restored, so after the checkpoint the values may differ from the
    uninterrupted run's)."""
    common = SMALL + [f"env={TOY_ID}", "random_steps=100", "eval_every=100", "log_every=100", "buffer_size=1000",
                      "diagnostics.every=0", "checkpoint_every=300"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_cli(train_main, common + ["total_steps=600", f"run_dir={straight}"]) == 0
    assert run_cli(train_main, common + ["total_steps=300", f"run_dir={split}"]) == 0
    at_300 = (split / CHECKPOINT).read_bytes()
    assert run_cli(train_main, ["--resume", str(split), "total_steps=500"]) == 0
    (split / CHECKPOINT).write_bytes(at_300)
    assert run_cli(train_main, ["--resume", str(split), "total_steps=600"]) == 0
    a, b = read_evals(straight), read_evals(split)
    assert [r["step"] for r in b] == [100, 200, 300, 400, 500, 600]
    assert [r["updates"] for r in a] == [r["updates"] for r in b]
    assert [r["return"] for r in a[:3]] == [r["return"] for r in b[:3]]
    history = json.loads((split / "summary.json").read_text())["eval_history"]
    assert [r["return"] for r in b] == [e["returns"][0] for e in history]


def test_a_continual_run_writes_one_row_per_task(tmp_path):
    rd = tmp_path / "run"
    assert run_cli(continual_main, ["progress=false", "stream.num_tasks=3", "stream.iters_per_task=20",
                                    "gradient_diagnostics=false", f"run_dir={rd}", "seed=4"]) == 0
    rows, tasks = read_evals(rd), json.loads((rd / "summary.json").read_text())["tasks"]
    assert [(r["task"], r["iteration"], r["seed"], r["train_acc"], r["test_acc"]) for r in rows] == \
        [(t["task"], t["iteration"], 4, t["train_acc"], t["test_acc"]) for t in tasks]


# --------------------------------------------------------------------------------------- synthetic runs
def make_run(path: Path, config: dict, rows: list[tuple[int, int, float]]) -> None:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [",".join(RL_COLUMNS)] + [f"{step},{seed},{step},{float(ret)!r},1,0.0" for step, seed, ret in rows]
    (path / "evals.csv").write_text("\n".join(lines) + "\n")


def make_sweep(root: Path, scores: dict[str, np.ndarray], tasks: list[str], steps: list[int],
               lengths: dict | None = None) -> None:
    """A sweep directory whose method m, task j, seed i has return 1000·scores[m][i, j, k] at steps[k]."""
    trials = {}
    for m, arr in scores.items():
        for j, task in enumerate(tasks):
            for i in range(arr.shape[0]):
                tid = f"{m}/{task.replace(':', '-')}/s{i}"
                n = (lengths or {}).get((m, j, i), len(steps))
                make_run(root / tid, {"env": task, "seed": i}, [(steps[k], i, 1000 * arr[i, j, k]) for k in range(n)])
                trials[tid] = {"status": "done", "method": m, "task": {"env": task}, "seeds": [i], "run_dir": tid,
                               "error": None}
    trials["pending/s0"] = {"status": "pending", "method": "pending", "task": {}, "seeds": [0], "run_dir": "pending/s0",
                            "error": None}
    (root / "sweep.yaml").write_text(yaml.safe_dump({"name": root.name, "kind": "train", "task_keys": ["env"],
                                                     "grid": {"env": tasks}}))
    (root / "status.json").write_text(json.dumps({"trials": trials}))


TASKS = ["dmc:cheetah-run", "dmc:walker-walk"]
STEPS = [1000, 2000, 3000, 4000]


@pytest.fixture
def known(tmp_path):
    rng = np.random.default_rng(0)
    scores = {"sac": rng.uniform(0.1, 0.5, (4, 2, 4)), "spectral": rng.uniform(0.3, 0.8, (4, 2, 4)),
              "resets": rng.uniform(0.2, 0.6, (4, 2, 4))}
    make_sweep(tmp_path / "study", scores, TASKS, STEPS)
    return tmp_path / "study", scores


@pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")  # arch, called by rliable
def test_statistics_equal_rliable_on_the_same_arrays(known):
    root, scores = known
    study = results.load([str(root)])
    al = results.align(study)
    assert al.methods == ["sac", "spectral", "resets"] and al.tasks == TASKS and al.x.tolist() == STEPS
    st = report.compute_statistics(al, study.kind, "sac", REPS, SEED)
    final = {m: s[:, :, -1] for m, s in scores.items()}
    for m in scores:
        np.testing.assert_allclose(al.scores[m], scores[m], rtol=1e-12)
        ref_point, ref_ci = rliable_estimates(
            {m: final[m]}, lambda x: np.array([metrics.aggregate_median(x), metrics.aggregate_iqm(x),
                                               metrics.aggregate_mean(x), metrics.aggregate_optimality_gap(x)]))
        np.testing.assert_allclose(st["point"][m], ref_point[m], rtol=1e-12)
        np.testing.assert_allclose(st["ci"][m], ref_ci[m], rtol=1e-12)
        per_step = np.array([metrics.aggregate_iqm(scores[m][..., k]) for k in range(len(STEPS))])
        np.testing.assert_allclose(st["curve_point"][m], per_step, rtol=1e-12)
        taus = st["taus"]
        np.testing.assert_array_equal(report.profile(final[m], taus),
                                      rliable_library.score_distributions(final[m], taus))
    poi_point, poi_ci = rliable_estimates({"spectral;sac": (final["spectral"], final["sac"])},
                                          metrics.probability_of_improvement)
    assert st["poi_point"]["spectral;sac"] == pytest.approx(poi_point["spectral;sac"], rel=1e-12)
    np.testing.assert_allclose(st["poi_ci"]["spectral;sac"], poi_ci["spectral;sac"], rtol=1e-12)


def test_report_files_and_figures_are_not_blank(known, tmp_path):
    import matplotlib.image

    root, scores = known
    out = tmp_path / "out"
    assert run_cli(report.main, [str(root), "--out", str(out), "--reps", str(REPS), "--seed", str(SEED),
                                 "--baseline", "spectral"]) == 0
    data = json.loads((out / "report.json").read_text())
    iqm = metrics.aggregate_iqm(scores["resets"][:, :, -1])
    assert data["methods"]["resets"]["iqm"][0] == pytest.approx(iqm, rel=1e-12)
    assert data["baseline"] == "spectral" and set(data["probability_of_improvement"]) == {"sac", "resets"}
    md = (out / "report.md").read_text()
    assert "| resets | " in md and f"{iqm:.3f} [" in md and "pending/s0 (pending: no scored evaluation yet)" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["final_scores.png", "iqm_curves.png", "per_task_curves.png", "performance_profile.png",
                    "probability_of_improvement.png"]
    for name in pngs:
        img = matplotlib.image.imread(out / name)[..., :3]
        assert img.shape[0] > 150 and img.shape[1] > 300, name
        assert (img < 0.9).mean() > 0.01 and img.std() > 0.05, name  # drawn on, not a blank canvas


@pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")  # arch, called by rliable
def test_many_methods_get_distinct_colours_and_a_legend_beside_the_curves(tmp_path):
    from sac_spectral.studies import figures

    rng = np.random.default_rng(0)
    names = [f"arm{i:02d}" for i in range(13)]
    make_sweep(tmp_path / "study", {m: rng.uniform(0, 1, (3, 1, 4)) for m in names}, TASKS[:1], STEPS)
    study = results.load([str(tmp_path / "study")])
    al = results.align(study)
    st = report.compute_statistics(al, study.kind, names[0], REPS, SEED)
    figs = figures.build_figures(al, st, study.kind, normalized=True)
    for name in ("iqm_curves.png", "performance_profile.png"):
        ax = figs[name].axes[0]
        assert len({line.get_color() for line in ax.get_lines()}) == 13, name
        figs[name].canvas.draw()
        renderer = figs[name].canvas.get_renderer()
        legend, data = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.x0 >= data.x1, name  # beside the axes, not over the curves


def _study_sequence(path: Path) -> None:
    """A run of the CPU study's sequence (one permuted task, 4 stages of 3000 steps, each warming up
    for 1000 steps after a cleared buffer), 2 seeds, evaluated every 500 steps."""
    path.mkdir(parents=True)
    config = {"env": "dmc:cartpole-swingup", "seed": 0, "num_seeds": 2, "random_steps": 1000, "steps_per_task": 3000,
              "cycles": 4, "on_switch": {"buffer": "clear"},
              "tasks": [{"env": "dmc:cartpole-swingup", "name": "swingup-permuted", "permute_obs": True}]}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for step in range(500, 12001, 500):
        stage = (step - 1) // 3000
        warmup = step - 3000 * stage <= 1000
        rows += [{"step": step, "seed": seed, "updates": step, "return": 100.0 * stage + step % 3000 / 10 + seed,
                  "task": "swingup-permuted", "stage": stage, "warmup": int(warmup)} for seed in (0, 1)]
    append_rows(path / "evals.csv", RL_COLUMNS, rows)


def test_the_study_sequence_figures_label_stages_and_mark_warm_ups_and_switches(tmp_path):
    """A one-task sequence is not shaded all over; each stage is labelled with its index and task,
    warm-up evaluations are hollow, the y label says what the score is, the legend names the run (not
    "runs") and the switches are dashed on iqm_curves.png as on continual_tasks.png."""
    from matplotlib.collections import PathCollection

    from sac_spectral.studies import figures
    from sac_spectral.studies.sequences import read_sequences, task_curves

    _study_sequence(tmp_path / "cartpole-permuted")
    study = results.load([str(tmp_path / "cartpole-permuted")])
    seqs = read_sequences(study)
    fig = task_curves(seqs, figures.method_colors(["cartpole-permuted"]), "return / 1000 (DMC)")
    (ax,) = fig.axes
    assert not ax.patches  # no shading: every stage is the one task's
    assert [t.get_text() for t in ax.texts] == [f"stage {s}\nswingup-permuted" for s in range(4)]
    assert [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--"] == [3000, 6000, 9000]
    (hollow,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert hollow.get_offsets()[:, 0].tolist() == [500, 1000, 3500, 4000, 6500, 7000, 9500, 10000]
    assert ax.get_ylabel() == "return / 1000 (DMC),\nmean over seeds"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0] == "cartpole-permuted (2 seeds; band ± 1.96 SE)" and "evaluation in a warm-up" in legend[1]
    assert legend[2].startswith("task switch") and len(legend) == 3
    al = results.align(study)
    st = report.compute_statistics(al, study.kind, al.methods[0], 20, SEED)
    iqm = figures.build_figures(al, st, study.kind, normalized=True, stages=seqs.marks)["iqm_curves.png"].axes[0]
    assert [line.get_xdata()[0] for line in iqm.lines if line.get_linestyle() == "--"] == [3000, 6000, 9000]
    assert [t.get_text() for t in iqm.texts] == [f"stage {s}\nswingup-permuted" for s in range(4)]
    out = tmp_path / "out"
    assert run_cli(report.main, [str(tmp_path / "cartpole-permuted"), "--out", str(out), "--reps", "20"]) == 0
    assert {"iqm_curves.png", "continual_tasks.png"} <= {p.name for p in out.glob("*.png")}
    assert "warm-up (before the stage's first update" in (out / "report.md").read_text()


def test_one_seed_has_no_confidence_interval(tmp_path):
    arr = {"a": np.array([[[0.2, 0.4], [0.5, 0.7]]]), "b": np.array([[[0.1, 0.3], [0.6, 0.9]]])}
    make_sweep(tmp_path / "one", arr, TASKS, [1000, 2000])
    out = tmp_path / "out"
    assert run_cli(report.main, [str(tmp_path / "one"), "--out", str(out), "--reps", "50"]) == 0
    data = json.loads((out / "report.json").read_text())
    point, lo, hi = data["methods"]["b"]["iqm"]
    assert point == lo == hi == pytest.approx(0.6)  # IQM of the final scores 0.3 and 0.9
    assert "One seed per task: no confidence intervals" in (out / "report.md").read_text()


def test_ragged_runs_are_cut_to_common_steps_and_seeds(tmp_path):
    rng = np.random.default_rng(1)
    scores = {"a": rng.uniform(0, 1, (3, 2, 4)), "b": rng.uniform(0, 1, (2, 2, 4))}
    make_sweep(tmp_path / "ragged", scores, TASKS, STEPS, lengths={("b", 1, 0): 3})
    (tmp_path / "ragged" / "a/dmc-walker-walk/s2").rename(tmp_path / "gone")  # a seed missing on one task
    al = results.align(results.load([str(tmp_path / "ragged")]))
    assert al.x.tolist() == STEPS[:3]
    assert al.seeds == {"a": [0, 1], "b": [0, 1]}
    np.testing.assert_allclose(al.scores["a"], scores["a"][:2, :, :3])
    assert any("seeds [2] left out" in n for n in al.notes)
    assert any("curves cut to 3000" in n and "up to 4000" in n for n in al.notes)
    final = results.final_scores(al, get_kind("train"))
    np.testing.assert_allclose(final["b"], scores["b"][:, :, 2])


def test_loose_runs_are_grouped_by_the_keys_in_which_they_differ(tmp_path):
    for reg, level in (([], 0.2), ([{"name": "spectral", "coef": 1e-3}], 0.6)):
        for seed in (0, 1):
            cfg = {"env": "dmc:cheetah-run", "seed": seed, "run_dir": f"x{seed}",
                   "critic": {"regularizers": reg, "lr": 3e-4}}
            make_run(tmp_path / "runs" / f"{len(reg)}_{seed}", cfg, [(1000, seed, 1000 * (level + seed / 100))])
    study = results.load([str(tmp_path / "runs")])
    assert "critic.regularizers" in study.grouping and "critic.lr" not in study.grouping
    al = results.align(study)
    assert al.methods == ["critic.regularizers=[]", 'critic.regularizers=[{"coef": 0.001, "name": "spectral"}]']
    np.testing.assert_allclose(results.final_scores(al, get_kind("train"))[al.methods[1]][:, 0], [0.6, 0.61])


def test_priming_diagnostics_per_method_with_the_largest_sigma(tmp_path):
    """Two primed runs of one method (2 seeds and 1 seed) and an unprimed one: the report pools the
    primed runs' seeds and takes σ_max as the largest over a net's layers."""
    def summary(values: dict, phase_scale: float, seeds: int) -> dict:
        return {k: [v * phase_scale + i for i in range(seeds)] for k, v in values.items()}

    base = {"grad_rank/critic/erank": 100.0, "spectral/critic/layer0/sigma_max": 1.5,
            "spectral/critic/layer1/sigma_max": 2.0}
    for name, seeds in (("a", 2), ("b", 1)):
        make_run(tmp_path / "runs" / name, {"env": "dmc:cheetah-run", "seed": 0, "priming": {"updates": 10}},
                 [(1000, s, 100.0) for s in range(seeds)])
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps(
            {"priming": {"before": summary(base, 1.0, seeds), "after": summary(base, 0.5, seeds)}}))
    make_run(tmp_path / "runs" / "c", {"env": "dmc:cheetah-run", "seed": 0, "priming": {"updates": 0}},
             [(1000, 0, 1.0)])
    got = results.priming_diagnostics(results.load([str(tmp_path / "runs")]))
    assert list(got) == ["priming.updates=10"]
    d = got["priming.updates=10"]
    assert d["grad_rank/critic/erank"] == [[100.0, 101.0, 100.0], [50.0, 51.0, 50.0]]
    assert d["sigma_max/critic"] == [[2.0, 3.0, 2.0], [1.0, 2.0, 1.0]]
    assert "grad_rank/actor/erank" not in d


def test_priming_predictors_pair_each_seed_with_its_final_score_and_rank_correlate(tmp_path):
    """Each seed's value after priming is paired with that seed's last score, across methods (a run's
    seeds listed out of order in its summary); the report's Spearman ρ is +1 for a diagnostic that
    rises with the final score and −1 for one that falls."""
    finals = {"a": {0: 300.0, 1: 100.0}, "b": {5: 500.0, 6: 200.0, 7: 400.0}}
    for name, per_seed in finals.items():
        seeds = list(per_seed)[::-1]
        make_run(tmp_path / "runs" / name, {"env": "dmc:cheetah-run", "seed": min(per_seed), "priming": {"updates": 10},
                                            "critic": {"lr": 1e-3 if name == "a" else 3e-4}},
                 [(step, seed, ret * step / 2000) for seed, ret in per_seed.items() for step in (1000, 2000)])
        after = {"grad_rank/critic/erank": [per_seed[s] / 100 for s in seeds],
                 "churn/critic": [-per_seed[s] for s in seeds]}
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps(
            {"seeds": seeds, "priming": {"before": after, "after": after}}))
    study = results.load([str(tmp_path / "runs")])
    pairs = results.priming_predictors(study)
    assert sorted(zip(*pairs["grad_rank/critic/erank"])) == [
        (1.0, 0.1, "critic.lr=0.001"), (2.0, 0.2, "critic.lr=0.0003"), (3.0, 0.3, "critic.lr=0.001"),
        (4.0, 0.4, "critic.lr=0.0003"), (5.0, 0.5, "critic.lr=0.0003")]
    assert run_cli(report.main, [str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    corr = json.loads((tmp_path / "rep" / "report.json").read_text())["priming_correlation"]
    assert corr["grad_rank/critic/erank"]["rho"] == pytest.approx(1.0) and corr["grad_rank/critic/erank"]["runs"] == 5
    assert corr["grad_rank/critic/erank"]["rho_within"] == pytest.approx(1.0)
    assert corr["churn/critic"]["rho"] == pytest.approx(-1.0)


def test_within_a_method_a_correlation_made_by_the_methods_difference_vanishes():
    """Two methods that differ in both the diagnostic and the score, with no relation inside either:
    pooled, ρ is strongly positive; within a method it is what the seeds show (here −1)."""
    xs = [1.0, 2.0, 3.0, 11.0, 12.0, 13.0]
    ys = [3.0, 2.0, 1.0, 13.0, 12.0, 11.0]
    groups = ["a"] * 3 + ["b"] * 3
    _, out = results.correlation_table({"d": (xs, ys, groups)}, "caption", "runs", "runs")
    assert out["d"]["rho"] > 0.5
    assert out["d"]["rho_within"] == pytest.approx(-1.0)
    assert results.within_methods([1.0, 3.0, 7.0], ["a", "a", "b"]).tolist()[:2] == [-1.0, 1.0]
    assert np.isnan(results.within_methods([1.0, 3.0, 7.0], ["a", "a", "b"])[2])  # a method with one value


def test_report_errors_are_one_line(tmp_path, capsys):
    assert run_cli(report.main, [str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    make_run(tmp_path / "rl", {"env": "dmc:cheetah-run", "seed": 0}, [(1000, 0, 1.0)])
    (tmp_path / "cl").mkdir()
    (tmp_path / "cl" / "config.yaml").write_text(yaml.safe_dump({"stream": {"kind": "random_label"}, "seed": 0}))
    assert run_cli(report.main, [str(tmp_path)]) == 2
    assert "mix continual and train runs" in capsys.readouterr().err
    assert run_cli(report.main, [str(tmp_path / "rl"), "--baseline", "nope"]) == 2
    assert "--baseline 'nope' is not one of the methods: rl" in capsys.readouterr().err


def test_merged_sweeps_name_a_baseline_by_its_method(tmp_path, capsys):
    """Merged sweeps name methods ``<sweep>/<method>``: ``--baseline sac`` names the one ending so,
    and a name that two sweeps share is refused, listing both."""
    rng = np.random.default_rng(1)
    make_sweep(tmp_path / "first", {"sac": rng.random((2, 1, 2)), "spectral": rng.random((2, 1, 2))}, TASKS[:1],
               [1000, 2000])
    make_sweep(tmp_path / "second", {"spectral": rng.random((2, 1, 2)), "cbp": rng.random((2, 1, 2))}, TASKS[:1],
               [1000, 2000])
    dirs = [str(tmp_path / "first"), str(tmp_path / "second")]
    out = tmp_path / "out"
    assert run_cli(report.main, [*dirs, "--out", str(out), "--reps", "50", "--baseline", "sac"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert data["baseline"] == "first/sac"
    assert set(data["probability_of_improvement"]) == {"first/spectral", "second/spectral", "second/cbp"}
    assert run_cli(report.main, [*dirs, "--out", str(out), "--baseline", "spectral"]) == 2
    assert "--baseline 'spectral' names several methods: first/spectral, second/spectral" in capsys.readouterr().err


def test_report_modules_import_without_torch_or_runners():
    code = ("import sys, sac_spectral.studies.report; "
            "bad = [m for m in ('torch', 'sac_spectral.apps.rl.train', 'sac_spectral.apps.continual.runner', "
            "'sac_spectral.apps.rl.diagnose', "
            "'sac_spectral.studies.sweep') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")  # arch, called by rliable
def test_diagnostics_table_is_the_iqm_of_each_methods_final_values(known, tmp_path, capsys):
    from torch.utils.tensorboard import SummaryWriter

    root, scores = known
    rng = np.random.default_rng(1)
    final = {}
    for run in sorted(p.parent for p in root.rglob("config.yaml")):
        method, task = run.parts[-3], run.parts[-2]
        writer = SummaryWriter(str(run))
        value = float(rng.uniform(1, 50))
        for step, v in ((1000, -1.0), (4000, value)):  # the last step's value counts
            writer.add_scalar("features/critic/stable_rank", v, step)
        writer.close()
        final.setdefault(method, {}).setdefault(task, []).append(value)
    out = tmp_path / "out"
    assert run_cli(report.main, [str(root), "--out", str(out), "--reps", str(REPS), "--seed", str(SEED),
                                 "--diagnostics", "features/critic/stable_rank"]) == 0
    data = json.loads((out / "report.json").read_text())["diagnostics"]
    for method, by_task in final.items():
        arr = np.array(list(by_task.values())).T  # [seeds, tasks]
        point, interval = rliable_estimates({method: arr}, lambda s: np.array([metrics.aggregate_iqm(s)]))
        assert data[method]["features/critic/stable_rank"] == pytest.approx(
            [point[method][0], interval[method][0, 0], interval[method][1, 0]])
    assert "## Diagnostics at the end of training" in (out / "report.md").read_text()
    assert run_cli(report.main, [str(root), "--out", str(out), "--diagnostics", "features/nope"]) == 2
    assert "no run logged features/nope" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- run kinds
def test_the_installed_run_kinds_are_found_and_an_unknown_one_is_a_one_line_error():
    assert {"train", "continual"} <= set(kind_names())
    assert get_kind("train").load("config").__name__ == "TrainConfig"
    with pytest.raises(Exception, match=r"^run kind 'bandit' is not one of .*continual.*train"):
        get_kind("bandit")


def test_a_kind_registered_by_other_code_is_read_and_reported_with_its_own_columns_and_labels(tmp_path):
    """A runner of another package: its runs name their kind in config.yaml and write their own
    evals.csv columns; the report reads them through the registered kind alone."""
    kind = RunKind(name="coinflip", runner="coinflip.run", title="coin flips (coinflip.run)", config="coinflip:Config",
                   cost="coinflip:cost", unit="flips", columns=("round", "seed", "heads"), x="round",
                   x_label="round", score="heads", score_label="fraction of heads", raw_label="heads", test=None,
                   task_keys=("coin",), window=2, members=False, scale=lambda config: 1.0,
                   history=lambda summary: [], names_run=lambda summary, config: True)
    register_kind(kind)
    try:
        for method, bias in (("fair", 0.5), ("loaded", 0.9)):
            for seed in range(3):
                run_dir = tmp_path / f"{method}_s{seed}"
                run_dir.mkdir()
                config = {"coin": "euro", "bias": bias, "seed": seed}
                (run_dir / "config.yaml").write_text(config_header("coinflip") + yaml.safe_dump(config))
                for r in range(1, 5):
                    append_rows(run_dir / "evals.csv", kind.columns,
                                [{"round": r, "seed": seed, "heads": bias + 0.01 * seed}])
        study = results.load([str(tmp_path)])
        assert study.kind is kind and study.normalized
        al = results.align(study)
        final = results.final_scores(al, kind)
        np.testing.assert_allclose(sorted(final[m].mean() for m in al.methods), [0.51, 0.91])
        assert run_cli(report.main, [str(tmp_path), "--reps", "50", "--out", str(tmp_path / "out")]) == 0
        text = (tmp_path / "out" / "report.md").read_text()
        assert ("Kind: coin flips (coinflip.run); score: fraction of heads; "
                "final score: the mean over the last 2") in text
    finally:
        from sac_spectral.runs import kinds

        kinds._KINDS.pop("coinflip", None)

