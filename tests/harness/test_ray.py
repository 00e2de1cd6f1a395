"""Sweeps through the Ray executor on a local Ray cluster of 2 CPUs, with tiny fake cells.

The cluster starts once for this file (a few seconds); every test skips cleanly where Ray is not installed.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import executors, machine, registry, results, runner
from experiments.profiles import get_profile
from tests.harness.fake_system import MARKED, PROFILE, SLOW_FIRST_USE, experiment, fake_experiment, rows_of

ROOT = Path(__file__).resolve().parents[2]
try:
    import ray
except ImportError:
    ray = None
needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install -e '.[cluster]')")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs; its workers (and so the cells) can import the repository's tests/."""
    if ray is None:
        pytest.skip("Ray is not installed")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved]))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    info = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20,
                    logging_level="WARNING")
    yield info.address_info["gcs_address"]
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def ray_run(exp, results_dir, profile=get_profile("quick"), **kw):
    with executors.RayExecutor() as executor:          # joins the running cluster, leaves it running
        return runner.run(exp, profile, results_dir, progress=False, executor=executor, **kw)


@pytest.mark.slow
@needs_ray
def test_quick_sweep_through_ray_gives_the_local_executors_cells_and_statuses(cluster, tmp_path):
    exp = fake_experiment(variants=(("crash", {"crash": True}), ("hang", {"hang": True}), ("default", {})))
    local = runner.run(exp, get_profile("quick"), tmp_path / "local", time_limit_s=4, progress=False)
    through_ray = ray_run(exp, tmp_path / "ray", time_limit_s=4)
    assert local == through_ray == {"already measured": 0, "failed": 2, "timeout": 2, "ok": 2}
    mine = {r["cell_id"]: r["status"] for r in rows_of(tmp_path / "ray")}
    assert mine == {r["cell_id"]: r["status"] for r in rows_of(tmp_path / "local")}
    label = machine.label(machine.kind())
    assert all(r["node"] == machine.node() and r["machine"] == label for r in rows_of(tmp_path / "ray"))
    assert (tmp_path / "ray" / "logs").exists()                    # failed cells' logs came back to the driver
    env = json.loads((tmp_path / "ray" / "environment.json").read_text())
    assert env["machine_kind"] == machine.kind() and env["profile"] == "quick"
    assert ray_run(exp, tmp_path / "ray") == {"already measured": 6}     # resume by cell_id


@needs_ray
def test_a_systems_first_use_is_paid_on_the_node_before_the_cells_not_inside_their_limit(cluster, tmp_path, monkeypatch):
    """As the local runner does (test_runner), a Ray task builds a model whose system measures the
    machine at its first use (registry.MEASURED_ONCE) before its cell's timed run: the fake's first
    construction takes 8 s, its cells' limit is 5 s. The two cells start on the node's two CPUs at
    once; one builds, the other waits for it and finds the measurement."""
    machine_dir = tmp_path / "machine"
    machine_dir.mkdir()
    monkeypatch.setattr(registry, "MEASURED_ONCE", (SLOW_FIRST_USE,))
    exp = experiment(SLOW_FIRST_USE, (2, 4), (("default", {"machine": str(machine_dir), "first_use_s": 8}),))
    assert ray_run(exp, tmp_path / "out", PROFILE, time_limit_s=5) == {"already measured": 0, "ok": 2}
    assert (machine_dir / "measured").exists()


@needs_ray
def test_cells_of_two_threads_on_two_cpus_never_overlap(cluster, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    exp = experiment(MARKED, (1, 2), variants=(("default", {"marks": str(marks), "sleep_ms": 300}),))
    assert ray_run(exp, tmp_path / "out", PROFILE, threads=2)["ok"] == 2
    spans = sorted((m["start"], m["end"]) for m in (json.loads(p.read_text()) for p in marks.glob("*.json")))
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    assert executors.task_resources({"threads": 2, "device": "cuda"}) == {"num_cpus": 2, "num_gpus": 1}


@pytest.mark.slow
@needs_ray
def test_killed_worker_and_driver_lose_no_row_and_duplicate_none(cluster, tmp_path):
    """SIGKILL the Ray worker running a cell (Ray retries the task), then the driver mid-sweep; the
    resumed sweep completes with every cell exactly once."""
    marks, out = tmp_path / "marks", tmp_path / "out"
    marks.mkdir()
    values = (1, 2, 3, 4, 5, 6)
    options = {"marks": str(marks), "sleep_ms": 600}            # 2 timed batches + warm-up: ~2 s per cell
    script = (f"import ray, tests.harness.fake_system as t; from experiments import executors, runner; "
              f"ray.init(address={cluster!r}, log_to_driver=False, logging_level='WARNING'); "
              f"runner.run(t.experiment(t.MARKED, {values!r}, (('default', {options!r}),)), t.PROFILE, "
              f"{str(out)!r}, progress=False, executor=executors.RayExecutor())")
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=dict(os.environ))
    deadline = time.monotonic() + 90
    while not list(marks.glob("*.json")) and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.05)
    assert driver.poll() is None, "the driver ended before any cell started"
    first = json.loads(next(marks.glob("*.json")).read_text())
    os.kill(first["worker"], signal.SIGKILL)                       # a worker dies mid-cell
    while len(rows_of(out)) < 2 and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)                             # then the driver dies mid-sweep
    driver.wait()
    before = rows_of(out)
    assert 2 <= len(before) < 6, "the driver should have been killed mid-sweep"
    assert len({r["cell_id"] for r in before}) == len(before)
    assert all(r["status"] == "ok" for r in before)
    counts = ray_run(experiment(MARKED, values, (("default", options),)), out, PROFILE)
    rows = rows_of(out)
    assert counts == {"already measured": len(before), "ok": 6 - len(before)}
    assert len(rows) == len({r["cell_id"] for r in rows}) == 6 and all(r["status"] == "ok" for r in rows)
    assert str(first["cell"]) in {r["batch_size"] for r in rows}   # the killed worker's cell was measured


@needs_ray
def test_a_cell_whose_retries_run_out_is_recorded_as_failed_with_rays_reason(cluster, tmp_path):
    import threading
    marks = tmp_path / "marks"
    marks.mkdir()
    exp = experiment(MARKED, (1,), (("default", {"marks": str(marks), "sleep_ms": 3000}),))
    counts = {}
    with executors.RayExecutor(max_retries=0) as executor:
        sweep = threading.Thread(target=lambda: counts.update(
            runner.run(exp, PROFILE, tmp_path / "out", progress=False, executor=executor)))
        sweep.start()
        deadline = time.monotonic() + 60
        while not list(marks.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(json.loads(next(marks.glob("*.json")).read_text())["worker"], signal.SIGKILL)
        sweep.join(60)
    [row] = rows_of(tmp_path / "out")
    assert counts["failed"] == 1 and row["status"].startswith("failed: ray: "), row["status"]
    assert (tmp_path / "out" / "logs" / f"{row['cell_id']}.log").exists()


@needs_ray
def test_nodes_of_two_kinds_are_refused_naming_them(cluster, tmp_path, monkeypatch, capsys):
    ours = machine.kind()
    other = {**ours, "cpu_model": "Some Other CPU", "cpu_count": 96}
    probes = [{"node": "n1", "kind": ours, "git_rev": "x"}, {"node": "n2", "kind": other, "git_rev": "x"}]
    with executors.RayExecutor() as executor:
        monkeypatch.setattr(executor, "_probe_nodes", lambda threads, device: probes)
        with pytest.raises(SystemExit, match=r"n1: .*n2: Some Other CPU .*, 96 CPUs"):
            runner.run(fake_experiment(), get_profile("quick"), tmp_path, progress=False, executor=executor)
        probes[1] = {"node": "n2", "kind": ours, "git_rev": "other"}
        assert executor.check(1, "cpu", "x") == ours
    assert "n2 is at other" in capsys.readouterr().err
    assert not results.csv_path(tmp_path, "fake").exists()


@needs_ray
def test_cli_runs_a_sweep_through_ray_into_this_kinds_directory(cluster, tmp_path, monkeypatch, capsys):
    """`python -m experiments run EXP --executor ray --address ...` with no --results, where results/ holds
    another kind's results: the cells run as Ray tasks into results/<kind>/."""
    from experiments.__main__ import main
    monkeypatch.setitem(registry.EXPERIMENTS, "fake", fake_experiment())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "environment.json").write_text(json.dumps({"cpu_model": "Another CPU", "cpu_count": 64}))
    assert main(["run", "fake", "--profile", "quick", "--executor", "ray", "--address", cluster]) == 0
    own = Path("results") / machine.slug(machine.kind())
    assert f"results: {own}" in capsys.readouterr().err
    assert [r["status"] for r in rows_of(own)] == ["ok", "ok"]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == sorted(["environment.json", own.name])


def test_without_ray_the_executor_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)                  # import ray raises ImportError
    with pytest.raises(SystemExit, match=r"pip install -e '\.\[cluster\]'"):
        executors.make("ray")
    with pytest.raises(SystemExit, match="needs Ray"):
        from experiments.__main__ import main
        main(["run", "fig8", "--profile", "quick", "--executor", "ray"])


def test_a_ray_failure_is_recorded_with_its_reason():
    class WorkerCrashedError(Exception):
        pass
    assert executors.ray_failure(WorkerCrashedError("The worker died unexpectedly\nmore")) == \
        "failed: ray: WorkerCrashedError: The worker died unexpectedly"
