"""The harness (experiments/, plots/) on a fake system, so it is tested without the engine or baselines."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from baselines.base import System
from experiments import ci_bench, launch, registry, results, runner
from experiments.__main__ import main as experiments_main
from experiments.profiles import Profile, get_profile

TESTS = Path(__file__).resolve().parent
FAKE = "test_experiments:FakeSystem"      # a System by import path (experiments/cell.py)
PROFILE = Profile("test", "cpu", time_limit_s=20, timed_batches=2, target_s=None, reduced_grid=False)


class FakeSystem(System):
    """Sleeps instead of computing; options make it crash or hang."""
    name = "fake"

    def __init__(self, workload, *, sleep_ms=2.0, crash=False, hang=False, **kwargs):
        super().__init__(workload, **kwargs)
        self.sleep_s, self.crash, self.hang = sleep_ms / 1000, crash, hang
        self.timings.memory_s = 0.0

    def prepare(self, samples):
        with self.timings.timing("construct_s"):
            time.sleep(self.sleep_s / 4)
        return samples

    def step(self, batch):
        if self.crash:
            raise RuntimeError("fake crash")
        if self.hang:
            time.sleep(3600)
        with self.timings.timing("compute_s"):
            time.sleep(self.sleep_s)
        return 1.0


def fake_experiment(variants=(("default", {}),), values=(2, 4)):
    panel = registry.Panel("a", "tree_fc", (FAKE,), "batch_size", values, hidden=8, leaves=8, variants=variants)
    return registry.Experiment("fake", "fake experiment", (panel,), {"kind": "lines", "y": "epoch_s",
                                                                      "layout": (1, 1)})


@pytest.fixture(autouse=True)
def importable_fake(monkeypatch):
    """Cell subprocesses import this module by name."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))


def rows_of(results_dir, name="fake"):
    return results.read_rows(results.csv_path(results_dir, name))


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
    assert [v for v, _ in ablation.panels[0].variants] == ["all-off", "lazy", "fusion", "streaming", "eager", "all-on"]


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


# ---------------------------------------------------------------- runner

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
    script = (f"import test_experiments as t; from experiments import runner; "
              f"runner.run(t.fake_experiment(values=tuple(range(1, 9))), t.PROFILE, {str(tmp_path)!r}, "
              f"progress=False)")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=TESTS.parent)
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


# ---------------------------------------------------------------- plots

def synthetic_csv(results_dir, name):
    """Rows for every cell of a registry experiment with made-up times; a few failed, half extrapolated."""
    cells = runner.plan(registry.get_experiment(name), get_profile("cpu"), check_available=False).cells
    rows = []
    for i, c in enumerate(cells):
        t = 0.01 * c["hidden"] / c["batch_size"] * (1 + ["cavs", "fold", "dynet"].count(c["system"]))
        ok = i % 17 != 5
        rows.append({**{k: v for k, v in c.items() if k in results.COLUMNS},
                     "options": json.dumps(c["options"]), "samples": c["batch_size"], "epoch_samples": 8192,
                     "construct_s": t / 4, "compute_s": t, "memory_s": t / 3, "total_s": 1.25 * t,
                     "epoch_s": 1.25 * t * 8192 / c["batch_size"], "extrapolated": i % 2 == 0,
                     "status": "ok" if ok else "timeout", "timestamp": f"2026-01-01T00:00:{i % 60:02d}"})
    import pandas as pd
    pd.DataFrame(rows, columns=results.COLUMNS).to_csv(results.csv_path(results_dir, name), index=False)


@pytest.mark.parametrize("name,outputs", [("fig8", ["fig8.png", "fig8.pdf"]), ("fig9", ["fig9.png"]),
                                          ("ablation", ["ablation.png"]), ("table2", ["table2.md", "table2.csv"])])
def test_plots_render_from_a_csv(tmp_path, name, outputs):
    from plots.__main__ import render
    synthetic_csv(tmp_path, name)
    render(name, tmp_path)
    for out in outputs:
        assert (tmp_path / "figures" / out).stat().st_size > 0
    if name == "table2":
        text = (tmp_path / "figures" / "table2.md").read_text()
        assert "| mode | batch_size | cavs memory_s |" in text and "*" in text


# ---------------------------------------------------------------- bench-ci

def test_ci_compare_fails_only_past_the_tolerance():
    baseline = {"tree_lstm/dynet": 4.0, "var_lstm/tensorflow": 2.0, "tree_fc/fold": 3.0}
    rows, ok = ci_bench.compare(baseline, {"tree_lstm/dynet": 3.1, "var_lstm/tensorflow": 2.5,
                                           "tree_fc/fold": 3.0})
    assert ok and [r[4] for r in rows] == ["ok", "ok", "ok"]          # 3.1/4.0 = 0.775: within 25%
    rows, ok = ci_bench.compare(baseline, {"tree_lstm/dynet": 2.9, "var_lstm/tensorflow": 2.0})
    verdicts = {r[0]: r[4] for r in rows}
    assert not ok and verdicts == {"tree_lstm/dynet": "REGRESSION", "var_lstm/tensorflow": "ok",
                                   "tree_fc/fold": "not measured"}
    assert ci_bench.compare({}, {"tree_fc/dynet": 1.0}) == ([("tree_fc/dynet", None, 1.0, None, "new")], True)


def test_resuming_never_mixes_machines(tmp_path):
    """results/ holds the reference machine's rows: another machine must measure into its own dir."""
    (tmp_path / "environment.json").write_text(json.dumps({"cpu_model": "another CPU", "cpu_count": 64, "gpu": None}))
    with pytest.raises(SystemExit, match="measured on another machine"):
        runner._check_same_machine(tmp_path)
    runner.environment.write(tmp_path, 1, "quick")         # this machine's record: resuming is fine
    runner._check_same_machine(tmp_path)


# ---------------------------------------------------------------- the floors

@pytest.mark.parametrize("workload", ["tree_lstm", "var_lstm"])
def test_frontier_rows_cover_each_vertex_with_children_once(workload):
    """The frontier bound times every loop task's state matmul: its rows must be exactly the
    vertices with children (each in one task), so its flops are a part of the floor's."""
    from experiments import floors
    import cavs
    samples = cavs.datasets.load_samples(workload, limit=100)
    rows = floors.frontier_rows(workload, 64, samples, batch_size=32)
    graphs = [cavs.workloads.to_graph(workload, x, i) for i, x in enumerate(samples)]
    assert sum(rows) == sum(int((g.children >= 0).any(axis=1).sum()) for g in graphs)
    assert min(rows) > 0 and len(rows) >= max(int(cavs.graphs.levels(g.children).max()) for g in graphs)
    state_flops = 2 * 2 * sum(rows) * floors.state_in_width(workload, 64) * floors.GATES[workload] * 64
    assert state_flops < 2 * floors.needed_macs(workload, 64, samples)


def test_claims_pair_each_cell_with_its_own_panel():
    """bs = 64, h = 512 sits in a batch-size panel and a hidden-size panel: one ratio per panel."""
    import pandas as pd
    from plots.claims import _ratios
    rows = [(p, s, bs, h, t) for p, cells in (("d", [(8, 512), (64, 512)]), ("h", [(64, 256), (64, 512)]))
            for bs, h in cells for s, t in (("cavs", 1.0), ("fold", 3.0 if p == "d" else 2.0))]
    rows = [r for r in rows if r[1] == "cavs"] + [r for r in rows if r[1] == "fold"][::-1]   # any row order
    df = pd.DataFrame(rows, columns=["panel", "system", "batch_size", "hidden", "epoch_s"])
    r = _ratios(df, ["d", "h"], "fold")
    assert len(r) == 4 and sorted(r.tolist()) == [2.0, 2.0, 3.0, 3.0]


# ---------------------------------------------------------------- slices, numeric environment, memory

def test_spread_slice_follows_the_epochs_batch_sizes():
    from experiments.cell import pick_slice, pick_warmup
    import numpy as np
    work = [int(x) for x in np.random.default_rng(0).lognormal(3, 0.6, size=400)]
    picks = pick_slice(work, 8)
    assert picks == sorted(picks) and len(set(picks)) == 8 and pick_slice(work, 8) == picks   # deterministic
    assert np.mean([work[i] for i in picks]) == pytest.approx(np.mean(work), rel=0.05)
    assert np.mean(work[:8]) != pytest.approx(np.mean(work), rel=0.05)     # what the first batches give here
    assert pick_slice(work, 3, "first") == [0, 1, 2] and pick_slice(work, 500) == list(range(400))
    assert pick_slice([5] * 100, 4) == [0, 25, 50, 75]                    # equal batches: spread evenly
    warm = pick_warmup(work, picks, 1)
    assert warm[0] not in picks and work[warm[0]] == max(w for i, w in enumerate(work) if i not in picks)
    assert pick_warmup(work, picks, 2, "last") == [398, 399] and pick_warmup(work, picks, 0) == []


def test_cell_reports_ftz_and_peak_memory(tmp_path):
    runner.run(fake_experiment(values=(2,)), PROFILE, tmp_path, progress=False)
    row = rows_of(tmp_path)[0]
    env = json.loads((tmp_path / "environment.json").read_text())
    assert env["numeric"]["ftz"] is True and env["numeric"]["daz"] is True
    missing = [c for c in ("ftz", "peak_rss_mb") if c not in results.COLUMNS]
    if missing:
        pytest.xfail(f"experiments/results.py COLUMNS lacks {missing}: the cell reports them, the CSV drops them")
    assert row["ftz"] == "True" and float(row["peak_rss_mb"]) > 10


def test_flush_denormals_is_set_per_thread():
    import threading
    import numpy as np
    from experiments import environment
    if environment.control_register() is None:
        pytest.skip("no fenv access on this platform")
    seen = {}

    def thread():      # its own MXCSR: the test process's main thread is left as it was
        for on in (True, False, True):
            assert environment.set_flush_denormals(on)
            seen[on] = float(np.float32(1e-20) * np.float32(1e-20)), environment.flush_state()
            inner = []
            t = threading.Thread(target=lambda: inner.append(environment.flush_state()))
            t.start()
            t.join()
            assert inner == [on]             # a thread started now inherits the setting
    before = environment.control_register()
    t = threading.Thread(target=thread)
    t.start()
    t.join()
    assert seen[True] == (0.0, True) and seen[False][0] > 0 and seen[False][1] is False
    assert environment.control_register() == before
    assert environment.ftz_requested("0") is False and environment.ftz_requested(None) in (True, False)


def test_dynet_memory_samples_are_classified_by_the_innermost_dynet_frame():
    from experiments import memprofile
    text = ("   1000000 \n\t 7f1 __memmove_avx_unaligned_erms\n\t 7f2 dynet::BatchedExecutionEngine::incremental_forward_no_update\n\n"
            "   1000000 \n\t 7f3 dynet::BatchedExecutionEngine::accumulate_tensors\n\n"
            "   1000000 \n\t 7f4 Eigen::internal::gebp_kernel<float>\n\t 7f5 dynet::AffineTransform::forward_dev_impl<dynet::Device_CPU>\n\t 7f6 dynet::BatchedExecutionEngine::incremental_forward_no_update\n\n"
            "   2000000 \n\t 7f7 __memmove_avx_unaligned_erms\n\t 7f8 dynet::Concatenate::forward_dev_impl<dynet::Device_CPU>\n\n"
            "   1000000 \n\t 7f9 dynet::LookupNode::forward_dev_impl<dynet::Device_CPU>\n\n"
            "   1000000 \n\t 7fa PyLong_AsSsize_t\n\t 0 [unknown]\n")
    samples = memprofile.parse_script(text)
    assert [p for p, _ in samples] == [1000000, 1000000, 1000000, 2000000, 1000000, 1000000]
    assert [memprofile.is_memory_movement(f) for _, f in samples] == [True, True, False, False, True, False]


def test_memory_table_and_figure_render_from_fig8_rows(tmp_path):
    import pandas as pd
    from plots.__main__ import render
    synthetic_csv(tmp_path, "fig8")
    path = results.csv_path(tmp_path, "fig8")
    df = pd.read_csv(path)
    df["peak_rss_mb"] = 300 + df["hidden"] * 0.5 + df["system"].map({"dynet": 1024}).fillna(0)
    df.to_csv(path, index=False)
    paths = {p.name for p in render("fig8", tmp_path)}
    assert {"fig8.png", "memory.md", "memory.csv", "memory.png"} <= paths
    text = (tmp_path / "figures" / "memory.md").read_text()
    assert "| workload | batch_size | hidden | cavs |" in text and "| Tree-LSTM | 64 | 1024 |" in text
    assert "DyNet reserves its memory pool" in text


@pytest.mark.slow
def test_dynets_memory_movement_is_sampled_in_its_table2_cells():
    import importlib.util
    from experiments import environment
    from experiments.launch import EXTRA_MARK
    if importlib.util.find_spec("dynet") is None:
        pytest.skip("dynet is not installed")
    status = environment.perf_status()
    if status.startswith("unavailable"):
        pytest.skip(status)
    cell = {"experiment": "table2", "panel": "tree_lstm", "workload": "tree_lstm", "system": "dynet",
            "variant": "default", "options": {}, "mode": "train", "batch_size": 16, "hidden": 32, "leaves": 256,
            "threads": 1, "device": "cpu", "profile": "test", "samples": 64, "warmup_batches": 1, "repeats": 1,
            "cell_id": "perf"}
    proc = subprocess.run([sys.executable, "-m", "experiments.cell", json.dumps(cell)], capture_output=True,
                          text=True, timeout=300, env=launch.env(cell["threads"]), cwd=TESTS.parent)
    extra = json.loads([x for x in proc.stdout.splitlines() if x.startswith(EXTRA_MARK)][-1][len(EXTRA_MARK):])
    result, prof = extra["result"], extra["memory_profile"]
    assert result["status"] == "ok" and prof["samples"] > 50, (prof, proc.stderr[-1500:])
    assert 0 < result["memory_s"] < result["compute_s"] and 0 < prof["memory_per_compute"] < 1


def test_extrapolation_check_compares_a_slice_with_a_long_run(tmp_path):
    from experiments.studies import extrapolation
    assert extrapolation.long_samples(64, 64, 10, 8192) == 640
    assert extrapolation.long_samples(64, 64, "epoch", 8192) is None
    assert extrapolation.long_samples(1000, 64, 10, 8192) is None          # 10x would pass the epoch
    assert len(extrapolation.CELLS) >= 12
    row = extrapolation.check_cell((FAKE, "tree_fc", 64, 8, 10), tmp_path, "spread", "largest")
    assert row["status"] == "ok", row
    assert row["long_samples"] >= 10 * row["slice_samples"] or row["long_is_epoch"]
    # (the fake's sleeps are milliseconds: on a loaded machine its error says nothing, so it is not bounded)
    assert row["rel_error"] == pytest.approx(row["extrapolated_epoch_s"] / row["measured_epoch_s"] - 1, abs=0.01)
    launch.write_rows(tmp_path / "extrapolation.csv", [row], list(extrapolation.COLUMNS))
    with open(tmp_path / "extrapolation.csv") as f:
        assert next(csv.reader(f)) == list(extrapolation.COLUMNS)


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


def test_nary_floor_counts_each_product_on_the_rows_that_have_its_input():
    import cavs
    from experiments.floors import child_sum_macs
    g = cavs.Graph.from_children([[], [], [], [0, 1, 2]], tokens=[3, 4, 5, -1], labels=[1, 1, -1, 2])
    H, E, C = 8, 6, 5
    words, inner, edges, labelled = 3, 1, 3, 3
    assert child_sum_macs([g], H, E, C) == 3 * (words * E * 4 * H + inner * H * 3 * H + edges * H * H + labelled * H * C)


def test_task_cost_splits_compute_into_products_and_the_rest(tmp_path):
    from experiments.studies.__main__ import main as run_study
    assert run_study(["task_cost", "--hidden", "8", "--passes", "1", "--samples", "64", "--results", str(tmp_path)]) == 0
    with open(tmp_path / "task_cost.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["gemm_calls"]) > 0 and int(row["loop_tasks"]) > 0 and int(row["launches"]) >= int(row["loop_tasks"])
    assert float(row["gemm_s"]) + float(row["other_compute_s"]) == pytest.approx(float(row["timed_compute_s"]))
    assert float(row["forward_s"]) > 0 and float(row["input_grad_s"]) > 0 and float(row["weight_grad_s"]) > 0


def test_task_cost_tells_the_three_products_apart_by_their_layout():
    """The engine's three products (ops.py): out = x W, dx = dy W^T, dW += x^T dy, on views."""
    import numpy as np
    from experiments.studies.task_cost import gemm_kind
    buf, w = np.zeros((10, 12), dtype=np.float32), np.zeros((4, 6), dtype=np.float32)
    x, dy = buf[:, 2:6], buf[:, 6:12]          # column slices of one buffer, as dynamic tensors hold them
    assert gemm_kind(x, w) == "forward"
    assert gemm_kind(dy, w.T) == "input_grad"
    assert gemm_kind(x.T, dy) == "weight_grad"
