"""The harness's registry, CLI and runner (experiments/) on a fake system, so they are tested without
the engine or baselines: the paper's panels and grids, deterministic cell ids, failed and timed-out
cells recorded while the sweep goes on, the CSV's columns, a killed sweep resumed without lost or
duplicated rows, failed cells retried."""
from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import registry, results, runner
from experiments.__main__ import main as experiments_main
from experiments.profiles import get_profile
from tests.harness.fake_system import PROFILE, SLOW_FIRST_USE, experiment, fake_experiment, rows_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("importable_fake")


# ---------------------------------------------------------------- registry and CLI

def test_registry_has_the_papers_panels_and_grids():
    fig8 = {p.id: p for p in registry.get_experiment("fig8").panels}
    assert list(fig8) == list("abcdefgh")
    for pid, workload in zip("abcd", ("fixed_lstm", "var_lstm", "tree_fc", "tree_lstm")):
        assert (fig8[pid].workload, fig8[pid].vary, fig8[pid].hidden) == (workload, "batch_size", 512)
        assert fig8[pid].values == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    for pid, workload in zip("efgh", ("fixed_lstm", "var_lstm", "tree_fc", "tree_lstm")):
        assert (fig8[pid].workload, fig8[pid].vary, fig8[pid].batch_size) == (workload, "hidden", 64)
        assert fig8[pid].values == (64, 128, 256, 512, 1024)
    paper = {"a": {"cavs", "cudnn", "tensorflow", "dynet"}, "c": {"cavs", "fold", "dynet"},
             "d": {"cavs", "fold", "dynet", "cavs-serial"}}
    for pid, systems in paper.items():
        assert systems <= set(fig8[pid].systems)
    fig9 = registry.get_experiment("fig9").panels
    assert fig9[0].values == (32, 64, 128, 256, 512, 1024) and "fold-n" in fig9[1].systems
    assert registry.get_experiment("table2").panels[0].modes == ("train", "infer")
    ablation = registry.get_experiment("ablation")
    assert {p.workload for p in ablation.panels} == {"fixed_lstm", "var_lstm", "tree_lstm"}
    assert [v for v, _ in ablation.panels[0].variants] == ["all-off", "lazy", "fusion", "streaming", "eager", "share_tokens", "all-on"]


def test_cell_ids_are_deterministic_and_unique():
    exp = registry.get_experiment("fig8")
    first = runner.plan(exp, get_profile("cpu"), check_available=False).cells
    again = runner.plan(exp, get_profile("cpu"), check_available=False).cells
    assert [c["cell_id"] for c in first] == [c["cell_id"] for c in again]
    assert len({c["cell_id"] for c in first}) == len(first)
    assert all(c["samples"] % c["batch_size"] == 0 and c["samples"] >= c["batch_size"] for c in first)
    quick = runner.plan(exp, get_profile("quick"), check_available=False).cells
    assert {(c["panel"], c["system"]) for c in quick} == {(c["panel"], c["system"]) for c in first}


def test_cli_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exit_:
        experiments_main(["run", "fig8", "--systems", "cavs,nosuch"])
    assert exit_.value.code == 2 and "unknown system nosuch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        experiments_main(["run", "fig8", "--panels", "z"])
    with pytest.raises(SystemExit) as exit_:
        experiments_main(["run", "--help"])
    assert exit_.value.code == 0


def test_cli_refuses_a_file_as_the_results_directory(tmp_path, capsys):
    a_file = tmp_path / "fig8.csv"
    a_file.write_text("")
    with pytest.raises(SystemExit) as exit_:
        experiments_main(["run", "table1", "--results", str(a_file)])
    assert exit_.value.code == 2 and f"--results {a_file} is a file; give a directory" in capsys.readouterr().err


# ---------------------------------------------------------------- runner

@pytest.mark.slow
def test_failed_and_timed_out_cells_are_recorded_and_the_sweep_goes_on(tmp_path):
    exp = fake_experiment(variants=(("crash", {"crash": True}), ("hang", {"hang": True}), ("default", {})))
    counts = runner.run(exp, PROFILE, tmp_path, time_limit_s=4, progress=False)
    status = {(r["variant"], r["batch_size"]): r["status"] for r in rows_of(tmp_path)}
    assert status[("crash", "2")] == "failed: RuntimeError: fake crash"
    assert status[("hang", "4")] == "timeout"
    assert status[("default", "2")] == status[("default", "4")] == "ok"
    assert counts == {"already measured": 0, "failed": 2, "timeout": 2, "ok": 2}
    assert (tmp_path / "logs").exists() and (tmp_path / "environment.json").exists()
    env = tmp_path / "environment.json"                   # a redraw must not rewrite it
    env.write_text(json.dumps({**json.loads(env.read_text()), "marker": 1}))
    before = env.read_text()
    assert runner.run(exp, PROFILE, tmp_path, progress=False) == {"already measured": 6}
    assert env.read_text() == before


def test_a_systems_first_use_on_the_machine_is_paid_before_the_cells_not_inside_their_limit(tmp_path, monkeypatch):
    """A system that measures the machine at its first construction (registry.MEASURED_ONCE: the
    engine's GEMM choice) is built once per model before the cells, outside their time limit; the
    cells then find the measurement and finish in time. Without that step, the cell times out."""
    def sweep(name, values, prepared):
        machine_dir = tmp_path / f"machine-{name}"
        machine_dir.mkdir()
        options = {"machine": str(machine_dir), "first_use_s": 8}
        monkeypatch.setattr(registry, "MEASURED_ONCE", (SLOW_FIRST_USE,) if prepared else ())
        exp = experiment(SLOW_FIRST_USE, values, (("default", options),))
        counts = runner.run(exp, PROFILE, tmp_path / name, time_limit_s=5, progress=False)
        return counts, (machine_dir / "measured").exists()

    assert sweep("unprepared", (2,), prepared=False) == ({"already measured": 0, "timeout": 1}, False)
    assert sweep("prepared", (2, 4), prepared=True) == ({"already measured": 0, "ok": 2}, True)


def test_csv_has_the_documented_columns_and_epoch_extrapolation(tmp_path):
    runner.run(fake_experiment(), PROFILE, tmp_path, progress=False)
    with open(results.csv_path(tmp_path, "fake")) as f:
        header = next(csv.reader(f))
    assert header == list(results.COLUMNS)
    row = rows_of(tmp_path)[0]
    assert row["status"] == "ok" and row["extrapolated"] == "True" and row["samples"] == "4"
    assert float(row["epoch_s"]) == pytest.approx(float(row["total_s"]) / 4 * int(row["epoch_samples"]))
    assert int(row["epoch_samples"]) == 8192 and float(row["construct_s"]) > 0
    assert json.loads(row["options"]) == {} and row["threads"] == "1" and row["profile"] == "test"


def test_killed_sweep_resumes_without_lost_or_duplicated_rows(tmp_path):
    script = (f"import tests.harness.fake_system as t; from experiments import runner; "
              f"runner.run(t.fake_experiment(values=tuple(range(1, 9))), t.PROFILE, {str(tmp_path)!r}, "
              f"progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    deadline = time.monotonic() + 40
    while len(rows_of(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = len(rows_of(tmp_path))
    assert 3 <= before < 8, "the runner should have been killed mid-sweep"
    runner.run(fake_experiment(values=tuple(range(1, 9))), PROFILE, tmp_path, progress=False)
    ids = [r["cell_id"] for r in rows_of(tmp_path)]
    assert len(ids) == len(set(ids)) == 8


def test_retry_failed_reruns_only_failed_cells(tmp_path):
    exp = fake_experiment(variants=(("crash", {"crash": True}), ("default", {})))
    runner.run(exp, PROFILE, tmp_path, progress=False)
    assert runner.run(exp, PROFILE, tmp_path, retry_failed=True, progress=False) == \
        {"already measured": 2, "failed": 2}
    assert len(rows_of(tmp_path)) == 4
