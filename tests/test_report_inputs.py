"""The report on damaged or unusual inputs: unsorted and duplicated evaluations, non-finite scores,
unreadable files and bad options are one-line errors or named warnings, never tracebacks or
``nan`` numbers; few seeds are flagged; printed values keep the digits that tell them apart."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from sac_spectral.apps.rl.kind import COLUMNS as RL_COLUMNS
from sac_spectral.runs.cli import run_cli
from sac_spectral.runs.kinds import get_kind
from sac_spectral.studies import report, results

pytest.importorskip("rliable")
REPS = 50


def make_run(path: Path, env: str, seed: int, rows: list[tuple[int, float]]) -> Path:
    """A loose RL run directory with return ``ret`` at each ``(step, ret)``, in the given order."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"env": env, "seed": seed, "critic": {"lr": 3e-4}}))
    lines = [",".join(RL_COLUMNS)] + [f"{step},{seed},{step},{ret!r},1,0.0" for step, ret in rows]
    (path / "evals.csv").write_text("\n".join(lines) + "\n")
    return path


def runs(tmp_path: Path, n_seeds: int = 2, returns=(100.0, 300.0, 200.0)) -> Path:
    root = tmp_path / "runs"
    for seed in range(n_seeds):
        make_run(root / f"s{seed}", "dmc:cheetah-run", seed,
                 [(1000, returns[0] + seed), (2000, returns[1] + seed), (3000, returns[2] + seed)])
    return root


def report_of(root: Path, tmp_path: Path, *extra: str) -> int:
    return run_cli(report.main, [str(root), "--out", str(tmp_path / "out"), "--reps", str(REPS), *extra])


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ----------------------------------------------------------------------------- evals.csv order
@pytest.mark.parametrize("order", [(1000, 3000, 2000), (3000, 2000, 1000), (2000, 1000, 3000)])
def test_unsorted_evaluations_are_sorted_by_step(tmp_path, order):
    root = tmp_path / "runs"
    value = {1000: 100.0, 2000: 200.0, 3000: 900.0}
    for seed in (0, 1):
        make_run(root / f"s{seed}", "dmc:cheetah-run", seed, [(s, value[s] + seed) for s in order])
    al = results.align(results.load([str(root)]))
    np.testing.assert_array_equal(al.x, [1000, 2000, 3000])
    np.testing.assert_allclose(results.final_scores(al, get_kind("train"))["runs"][:, 0], [0.9, 0.901])
    assert report_of(root, tmp_path) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["final_x"] == 3000


def test_a_step_evaluated_twice_is_a_one_line_error(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root / "s0", "dmc:cheetah-run", 0, [(1000, 1.0), (2000, 2.0), (1000, 3.0)])
    assert report_of(root, tmp_path) == 2
    line = one_error_line(capsys)
    assert "evals.csv" in line and "step 1000 appears 2 times" in line
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- non-finite scores
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_runs_with_non_finite_scores_are_named_and_left_out(tmp_path, capsys, bad):
    root = runs(tmp_path, n_seeds=3)
    lines = (root / "s1" / "evals.csv").read_text().splitlines()
    lines[-1] = lines[-1].replace("201.0", bad)
    (root / "s1" / "evals.csv").write_text("\n".join(lines) + "\n")
    assert report_of(root, tmp_path) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    warning = md.split("## Warnings", 1)[1].split("##", 1)[0]
    assert str(root / "s1") in warning and "non-finite" in warning
    assert "nan" not in md.split("## Warnings", 1)[0] + md.split("## Aggregate", 1)[1].lower()
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["methods"]["runs"]["seeds"] == [0, 2]
    assert all(np.isfinite(v) for v in data["methods"]["runs"]["iqm"])
    assert "non-finite" in capsys.readouterr().err


# ----------------------------------------------------------------------------- one-line errors
def test_a_non_numeric_evals_cell_is_a_one_line_error(tmp_path, capsys):
    root = runs(tmp_path)
    path = root / "s0" / "evals.csv"
    path.write_text(path.read_text().replace("100.0", "abc"))
    assert report_of(root, tmp_path) == 2
    assert "evals.csv" in one_error_line(capsys)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"eval_history": 3}'])
def test_a_garbage_summary_is_a_one_line_error(tmp_path, capsys, text):
    root = runs(tmp_path)
    (root / "s0" / "evals.csv").unlink()
    (root / "s0" / "summary.json").write_text(text)
    assert report_of(root, tmp_path) == 2
    assert "summary.json" in one_error_line(capsys)


@pytest.mark.parametrize("text", ["", "[1, 2]\n", "a: [\n"])
def test_an_empty_or_garbage_config_is_a_one_line_error(tmp_path, capsys, text):
    root = runs(tmp_path)
    (root / "s0" / "config.yaml").write_text(text)
    assert report_of(root, tmp_path) == 2
    assert "config.yaml" in one_error_line(capsys)


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_cannot_take_is_a_one_line_error(tmp_path, capsys, seed):
    assert report_of(runs(tmp_path), tmp_path, "--seed", seed) == 2
    assert "--seed" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- few seeds, digits
def test_few_seeds_are_flagged_and_values_keep_their_digits(tmp_path, capsys):
    """Scores 0.003–0.004 with 3 seeds: the warning is in report.md, on stderr and under the
    figures; the interval's three numbers print differently (not ``0.003 [0.003, 0.003]``)."""
    root = runs(tmp_path, n_seeds=3, returns=(3.0, 3.5, 3.2))
    assert report_of(root, tmp_path) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    warning = md.split("## Warnings", 1)[1].split("##", 1)[0]
    assert "few seeds per task (runs: 3; fewer than 5)" in warning and "unreliable" in warning
    assert "few seeds" in capsys.readouterr().err
    row = next(line for line in md.splitlines() if line.startswith("| runs |"))
    iqm = row.split("|")[2].strip()
    point, lo, hi = iqm.replace("[", "").replace("]", "").replace(",", "").split()
    assert len({point, lo, hi}) == 3, iqm
    assert float(lo) <= float(point) <= float(hi)


def test_five_seeds_are_not_flagged(tmp_path):
    assert report_of(runs(tmp_path, n_seeds=5), tmp_path) == 0
    assert "few seeds" not in (tmp_path / "out" / "report.md").read_text()


def test_a_method_with_one_seed_gets_no_interval_beside_methods_with_several(tmp_path, capsys):
    """One seed of ``critic.lr=0.0001``, three of the other: its scores and every probability of
    improvement it takes part in say there is no interval, instead of ``0.85 [0.85, 0.85]``."""
    root = runs(tmp_path, n_seeds=3, returns=(700.0, 900.0, 900.0))
    make_run(root / "one", "dmc:cheetah-run", 0, [(1000, 650.0), (2000, 850.0), (3000, 850.0)])
    cfg = yaml.safe_load((root / "one" / "config.yaml").read_text())
    (root / "one" / "config.yaml").write_text(yaml.safe_dump({**cfg, "critic": {"lr": 1e-4}}))
    assert report_of(root, tmp_path, "--baseline", "critic.lr=0.0003") == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**One seed per task for critic.lr=0.0001: no confidence intervals**" in md
    aggregate, improvement = md.split("## Aggregate", 1)[1].split("## Probability", 1)
    one, three = (next(line for line in aggregate.splitlines() if line.startswith(f"| critic.lr={lr} |"))
                  for lr in ("0.0001", "0.0003"))
    assert "[" not in one and one.count("0.85 (1 seed, no CI)") == 3, one
    assert "0.901 [0.9, 0.902]" in three
    poi = next(line for line in improvement.splitlines() if line.startswith("| critic.lr=0.0001 |"))
    assert poi == "| critic.lr=0.0001 | 0 (1 seed, no CI) |", poi
    task = md.split("## Final score per task", 1)[1].split("##", 1)[0]
    assert "| critic.lr=0.0001 | 0.85 |" in task, task  # its value, not "0.85 ± 0"
    assert "IQM 0.85 (1 seed, no CI)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- --diagnostics
def test_an_unknown_diagnostic_is_one_readable_line_with_the_closest_logged_tags(tmp_path, capsys):
    """Runs that logged 40 diagnostics: a misspelt tag's error names the closest whole tags (none cut
    mid-word) and how many there are; a few logged tags are all listed."""
    from torch.utils.tensorboard import SummaryWriter

    root = runs(tmp_path)
    tags = ([f"spectral/critic/layer{i}/sigma_max" for i in range(36)] +
            ["features/critic/stable_rank", "features/critic/erank", "active/critic/fraction", "churn/critic"])
    for run_dir in root.iterdir():
        writer = SummaryWriter(str(run_dir))
        for tag in tags:
            writer.add_scalar(tag, 1.0, 3000)
        writer.close()
    assert report_of(root, tmp_path, "--diagnostics", "features/critic/stabel_rank") == 2
    line = one_error_line(capsys)
    assert line.startswith("error: --diagnostics: no run logged features/critic/stabel_rank; closest of the 40 logged "
                           "tags: features/critic/stable_rank"), line
    assert set(line.split("tags: ", 1)[1].split(", ")) <= set(tags) and len(line) < 250, line
    assert report_of(root, tmp_path, "--diagnostics", "q/mean") == 2
    line = one_error_line(capsys)
    assert line.endswith("none of the 40 logged tags is close; they start with active, churn, features, spectral"), line
    few = runs(tmp_path / "few")
    for run_dir in few.iterdir():
        writer = SummaryWriter(str(run_dir))
        writer.add_scalar("churn/critic", 1.0, 3000)
        writer.close()
    assert report_of(few, tmp_path, "--diagnostics", "features/critic/stabel_rank") == 2
    assert one_error_line(capsys).endswith("no run logged features/critic/stabel_rank; the runs logged churn/critic")


def test_a_diagnostic_one_seed_lacks_is_named_as_missing(tmp_path, capsys):
    """Two seeds, one of which logged the tag: the report names the other under what is missing and
    takes the cell from the seed that has it."""
    from torch.utils.tensorboard import SummaryWriter

    root = runs(tmp_path)
    writer = SummaryWriter(str(root / "s0"))
    writer.add_scalar("churn/critic", 0.25, 3000)
    writer.close()
    assert report_of(root, tmp_path, "--diagnostics", "churn/critic") == 0
    md = (tmp_path / "out" / "report.md").read_text()
    cut = md.split("## What was cut or missing", 1)[1].split("##", 1)[0]
    assert (f"- `churn/critic`: {root.name} lacks it for seed 1 ({root / 's1'}); "
            "its cell uses the other seeds") in cut, cut
    assert "0.25 (1 seed, no CI)" in md.split("## Diagnostics", 1)[1].split("##", 1)[0]


# ----------------------------------------------------------------------------- figures
def overlaps(texts, renderer) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def study_figures(tmp_path: Path, scale: float, low: float) -> dict:
    """Figures of three methods on two tasks, 3 seeds, scores ``low + scale·u`` with u in [0, 1];
    ``copy`` has exactly the scores of ``sac``, so their curves lie on top of each other."""
    rng = np.random.default_rng(1)
    root = tmp_path / f"study{scale}"
    for task in ("dmc:cheetah-run", "dmc:walker-walk"):
        for seed in range(3):
            u = rng.uniform(0, 0.7, 3)
            for m, shift in (("sac", 0.0), ("spectral", 0.3), ("copy", 0.0)):
                returns = 1000 * (low + scale * (u + shift))
                run = make_run(root / m / task / f"s{seed}", task, seed,
                               list(zip((1000, 2000, 3000), returns.tolist())))
                cfg = yaml.safe_load((run / "config.yaml").read_text())
                (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "method": m}))
    from sac_spectral.studies.figures import build_figures

    study = results.load([str(root)])
    al = results.align(study)
    st = report.compute_statistics(al, study.kind, al.methods[0], REPS, 0)
    return build_figures(al, st, study.kind, study.normalized, "few seeds per task (3; fewer than 5)")


@pytest.mark.parametrize("scale,low", [(0.009, 0.003), (1000.0, 0.0)])
def test_figures_tick_labels_do_not_overlap_at_any_scale(tmp_path, scale, low):
    import matplotlib.pyplot as plt

    figs = study_figures(tmp_path, scale, low)
    assert {"final_scores.png", "performance_profile.png", "probability_of_improvement.png"} <= set(figs)
    try:
        for name, fig in figs.items():
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            for ax in fig.axes:
                for axis in (ax.xaxis, ax.yaxis):
                    clashes = overlaps(axis.get_ticklabels(), renderer)
                    assert not clashes, (name, clashes)
                assert not overlaps([*ax.xaxis.get_ticklabels(), ax.xaxis.label], renderer), name
                assert len([t for t in ax.xaxis.get_ticklabels() if t.get_text()]) <= 7, name
            if name == "final_scores.png":
                labels = [ax.get_xlabel() for ax in fig.axes]
                assert len(set(labels)) == len(labels) and "optimality gap (lower is better)" in labels
            if name == "probability_of_improvement.png":
                assert fig.axes[0].get_title()
            if name == "performance_profile.png":
                lo, hi = fig.axes[0].get_xlim()  # τ spans the scores, not a fixed 0–1
                assert low - 0.1 * scale <= lo < hi <= low + 1.1 * scale
                assert len({line.get_linestyle() for line in fig.axes[0].get_lines()}) == 3
                assert fig.axes[0].collections, "no CI bands"
    finally:
        for fig in figs.values():
            plt.close(fig)
