"""The targets study (experiments/studies/targets.py): each goal against the floor of its own run."""
import csv

import pytest

from experiments import results


def write(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        w.writerows(rows)


def test_targets_compare_each_goal_with_the_floor_of_its_own_run(tmp_path):
    """The targets study: a met target, one below the floor, one below the frontier bound, one
    reachable but not met, a thread speedup, the degree sweep, and a missing measurement, from
    hand-made rows."""
    from experiments.studies import targets
    from experiments.studies.__main__ import main as run_study
    fields = ["workload", "hidden", "system", "threads", "total_s", "construct_s", "floor_s", "frontier_bound_s",
              "status", "git_rev"]
    bench = [("tree_lstm", 512, "cavs", 1, 6.0, 0.1, 5.0, 5.5), ("tree_lstm", 512, "pytorch-levels", 1, 9.0, 0.1, 5.0, 5.5),
             ("tree_lstm", 512, "cavs", 2, 3.5, 0.1, 5.0, 5.5), ("tree_lstm", 512, "dynet", 2, 4.0, 0.1, 5.0, 5.5),
             ("tree_lstm", 256, "cavs", 1, 2.2, 0.1, 1.5, 1.6), ("tree_lstm", 256, "pytorch-levels", 1, 3.0, 0.1, 1.5, 1.6),
             ("tree_lstm", 64, "cavs", 1, 0.5, 0.05, 0.2, 0.21), ("tree_lstm", 64, "dynet", 1, 2.4, 0.6, 0.2, 0.21)]
    write(tmp_path / "bench.csv", fields, [[*r, "ok", "abc1234"] for r in bench])
    nary_fields = ["cell", "best_s", "construct_s", "floor_s", "frontier_bound_s", "per_edge_us", "status", "git_rev"]
    nary = [("cavs", 1.0, 0.1, 0.5, 0.8, 1.0), ("dynet", 2.5, 0.5, 0.5, 0.8, 3.0),
            ("cavs-deg4", 0.3, 0.0, 0.1, 0.1, 2.0), ("cavs-deg256", 0.3, 0.0, 0.1, 0.1, 2.2)]
    write(tmp_path / "nary.csv", nary_fields, [[*r, "ok", "abc1234"] for r in nary])
    assert run_study(["targets", "--results", str(tmp_path)]) == 0
    rows = {r["target"]: r for r in targets.assess(results.read_rows(tmp_path / "bench.csv"),
                                                   results.read_rows(tmp_path / "nary.csv"))}
    verdict = {k: v["verdict"] for k, v in rows.items()}
    assert verdict["Tree-LSTM h = 512 within 1.3x of the frontier bound"] == "met"          # 6.0 / 5.5
    assert verdict["Tree-LSTM h = 512 at least 2x faster than PyTorch by level"].endswith("GEMM floor")   # 4.5 < 5
    assert verdict["Tree-LSTM h = 256 at least 2x faster than PyTorch by level"].endswith("frontier bound")  # 1.5 < 1.6
    assert verdict["Tree-LSTM h = 256 within 1.3x of the frontier bound"].startswith("not met: needs Cavs at")
    assert rows["Tree-LSTM h = 256 within 1.3x of the frontier bound"]["required_s"] == pytest.approx(2.08)
    assert verdict["Tree-LSTM h = 64 at least 3x faster than DyNet"] == "met"              # 2.4 / 0.5 = 4.8
    assert verdict["Tree-LSTM h = 512 at two threads at least 1.6x its one-thread time"] == "met"   # 6.0 / 3.5
    assert rows["Tree-LSTM h = 512 at two threads at least 1.6x its one-thread time"]["measured"] == pytest.approx(6 / 3.5)
    assert verdict["Tree-LSTM h = 512 at two threads ahead of DyNet"] == "met"
    assert verdict["Tree-LSTM h = 512 at two threads ahead of PyTorch by level"].startswith("no measurement")
    assert verdict["child-sum Tree-LSTM on edges at least 2x faster than DyNet"] == "met"   # 2.5 / 1.0
    assert verdict["child-sum Tree-LSTM on edges within 1.35x of the floor"].endswith("frontier bound")  # 0.675 < 0.8
    assert verdict["child-sum on edges: the same time per edge at degrees 4, 32, 256 (within 15%)"] == "met"
    assert verdict["Var-LSTM h = 256 at least 1.5x faster than TensorFlow"].startswith("no measurement")
    text = (tmp_path / "targets.md").read_text()
    assert "abc1234" in text and text.count("\n| ") == len(targets.TARGETS) + 1      # + the separator row
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_study(["targets", "--results", str(empty)]) == 2
