"""The targets study (experiments/studies/targets.py): each goal against the floor of its own run."""
import csv

import pytest

from experiments import results


def test_targets_compare_each_goal_with_the_floor_of_its_own_run(tmp_path):
    """The targets study: a met target, one below the floor, one below the frontier bound, one
    reachable but not met, and a missing measurement, from hand-made rows."""
    from experiments.studies import targets
    from experiments.studies.__main__ import main as run_study
    fields = ["workload", "hidden", "system", "total_s", "construct_s", "floor_s", "frontier_bound_s",
              "status", "git_rev"]
    bench = [("tree_lstm", 512, "cavs", 6.0, 0.1, 5.0, 5.5), ("tree_lstm", 512, "pytorch-levels", 9.0, 0.1, 5.0, 5.5),
             ("tree_lstm", 256, "cavs", 2.0, 0.1, 1.5, 1.6), ("tree_lstm", 256, "pytorch-levels", 3.4, 0.1, 1.5, 1.6),
             ("tree_lstm", 64, "cavs", 0.5, 0.05, 0.2, 0.21), ("tree_lstm", 64, "pytorch-levels", 0.8, 0.05, 0.2, 0.21),
             ("tree_lstm", 64, "dynet", 2.4, 0.6, 0.2, 0.21)]
    with open(tmp_path / "bench.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        w.writerows([*r, "ok", "abc1234"] for r in bench)
    assert run_study(["targets", "--results", str(tmp_path)]) == 0
    rows = {(r["target"]): r for r in targets.assess(results.read_rows(tmp_path / "bench.csv"), [])}
    verdict = {k: v["verdict"] for k, v in rows.items()}
    assert verdict["Tree-LSTM h = 512 within 1.25x of the frontier bound"] == "met"       # 6.0 / 5.5
    assert verdict["Tree-LSTM h = 512 at least 2x faster than PyTorch by level"].endswith("GEMM floor")  # 4.5 < 5
    assert verdict["Tree-LSTM h = 256 at least 2x faster than PyTorch by level"].endswith("frontier bound")  # 1.55 < 1.6
    assert verdict["Tree-LSTM h = 64 at least 4x faster than DyNet"] == "met"              # 2.4 / 0.5 = 4.8
    assert verdict["Tree-LSTM h = 64 at least 2x faster than PyTorch by level"].startswith("not met: needs Cavs at 2.00x")
    assert rows["Tree-LSTM h = 64 at least 2x faster than PyTorch by level"]["required_s"] == pytest.approx(0.4)
    assert verdict["Var-LSTM h = 256 within 1.25x of the GEMM floor"].startswith("no measurement")
    text = (tmp_path / "targets.md").read_text()
    assert "abc1234" in text and text.count("\n| #") == len(targets.TARGETS)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_study(["targets", "--results", str(empty)]) == 2
