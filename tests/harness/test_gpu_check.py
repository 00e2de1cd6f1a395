"""`make gpu-check` (experiments/gpu_check.py) prepared without a GPU: its dry run prints the plan
within the budget; the Makefile target calls the machine's python3, never .venv; everything on its
path imports where DyNet, TensorFlow, Ray, tqdm and threadpoolctl are absent (as on the GPU
machine: a sitecustomize marks them absent); and, slow, the whole command rehearsed with the CuPy
stand-in (tests/engine/cupy_standin.py) as the GPU: test_gpu.py's tests, the sweep, the figures."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import gpu_check, profiles, registry

ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("dynet", "dynet_config", "tensorflow", "ray", "tqdm", "threadpoolctl", "hypothesis")
COMPILER = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
SITE = '''import os, sys
# the GPU machine's Python: these are not installed (a gpu-check stand-in on the path is allowed)
for name in {absent!r}:
    if not any(os.path.exists(os.path.join(d, name + ".py")) for d in sys.path if "cavs-gpu-check-shims" in d):
        sys.modules.setdefault(name, None)
if os.environ.get("CAVS_CUPY_STANDIN"):          # the GPU: the stand-in for CuPy
    from tests.engine import cupy_standin
    cupy_standin.COMPILER = os.environ["CAVS_CUPY_STANDIN"]
    sys.modules.update(cupy_standin.modules())
'''


def device_env(tmp_path, standin: bool = False) -> dict:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE.format(absent=ABSENT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    # pytest's plugins of this venv (hypothesis', pytest-timeout) are not on the GPU machine either
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.pop("CAVS_CUPY_STANDIN", None)
    if standin:
        env["CAVS_CUPY_STANDIN"] = COMPILER
    return env


def run(args, env, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_dry_run_prints_the_plan_within_the_budget_without_a_gpu(tmp_path):
    proc = run(["-m", "experiments.gpu_check", "--dry-run", "--results", str(tmp_path / "gpu")],
               device_env(tmp_path), timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "tests/engine/test_gpu.py" in out and "--junitxml" in out
    assert re.search(r"\d+ tests collected", out), out             # test_gpu.py collects without a GPU
    assert "fig8.csv" in out and "ablation.csv" in out and "panel d" in out
    minutes = float(re.search(r"estimated ([\d.]+) min in all", out).group(1))
    assert 0 < minutes <= gpu_check.PLAN_S / 60
    assert "replaced by stand-ins in a real run: tqdm, threadpoolctl" in out
    assert not list(tmp_path.glob("gpu/*")), "a dry run writes nothing"


def test_the_plan_is_panels_a_d_h_and_the_tree_lstm_ablation_on_gpu_systems():
    est = gpu_check.choose()
    assert est["total_s"] <= gpu_check.PLAN_S
    assert est["tests_s"] > 0 and est["compile_s"] > 0
    grid = (tuple(est["grid"]["batch_sizes"]), tuple(est["grid"]["hiddens"]))
    fig8, ablation = gpu_check.experiments(grid)
    assert [p.id for p in fig8.panels] == ["a", "d", "h"] and fig8.name == "fig8"
    assert [p.id for p in ablation.panels] == ["tree_lstm"] and len(ablation.panels[0].variants) == 6
    profile = profiles.get_profile(gpu_check.PROFILE)
    cells, _ = gpu_check.cells_of(fig8, profile)
    systems = {c["system"] for c in cells}
    assert systems == set(gpu_check.SYSTEMS)
    assert all(registry.SYSTEM_FACTS[s][1] for s in systems), "only systems that run on CUDA"
    assert all(c["device"] == "cuda" and c["profile"] == "gpu-check" for c in cells)
    assert {c["batch_size"] for c in cells if c["panel"] == "d"} == set(grid[0])
    assert {c["hidden"] for c in cells if c["panel"] == "h"} == set(grid[1])
    # a larger grid than the chosen one does not fit; the GPU model is a guess but a consistent one
    bigger = [g for g in gpu_check.GRIDS if len(g[0]) * len(g[1]) > len(grid[0]) * len(grid[1])]
    assert all(gpu_check.estimate(g)["total_s"] > gpu_check.PLAN_S for g in bigger)


def test_the_runner_skips_what_cannot_run_on_the_gpu():
    from experiments import runner
    plan = runner.plan(registry.get_experiment("fig8"), profiles.get_profile(gpu_check.PROFILE), device="cuda")
    assert {"dynet", "tensorflow"} <= set(plan.skipped)
    assert all(plan.skipped[s] == "cannot run on a GPU" for s in ("dynet", "tensorflow"))
    assert not {c["system"] for c in plan.cells} & {"dynet", "tensorflow", "dynet-depth"}


def test_the_makefile_target_uses_the_machines_python3():
    proc = subprocess.run(["make", "-n", "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "python3 -m experiments.gpu_check --results" in proc.stdout
    assert "python3 -m plots $figure" in proc.stdout
    assert ".venv" not in proc.stdout and "pip" not in proc.stdout


def test_everything_on_its_path_imports_without_the_absent_frameworks(tmp_path):
    """The driver (with its stand-ins for tqdm and threadpoolctl), a cell of every system it runs,
    the plots, and an engine pinned to one thread (which imports threadpoolctl)."""
    code = ("from experiments import gpu_check; print(gpu_check.install_shims());"
            "import experiments.runner, experiments.cell, experiments.executors, experiments.environment;"
            "import baselines; [baselines.get_system(s) for s in gpu_check.SYSTEMS];"
            "import plots.figures, plots.load, plots.tables, plots.__main__;"
            "import cavs; m = cavs.models.build('tree_fc', hidden=4, leaves=4);"
            "cavs.Engine(m, threads=1, blas='numpy');"
            "from experiments import environment; environment.collect(1, 'gpu-check');"
            "import sys; bad = [n for n in ('dynet', 'tensorflow', 'ray') if sys.modules.get(n) is not None];"
            "assert not bad, bad; print('imports ok')")
    proc = run(["-c", code], device_env(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "['tqdm', 'threadpoolctl']" in proc.stdout and "imports ok" in proc.stdout


def test_junit_counts(tmp_path):
    path = tmp_path / "t.xml"
    path.write_text('<testsuites><testsuite name="pytest" tests="4"><testcase name="a"/>'
                    '<testcase name="b"><failure message="x"/></testcase><testcase name="c"><skipped/></testcase>'
                    '<testcase name="d"><error message="y"/></testcase></testsuite></testsuites>')
    counts = gpu_check.junit_counts(path)
    assert {k: counts[k] for k in ("tests", "passed", "failed", "errors", "skipped")} == \
        {"tests": 4, "passed": 1, "failed": 1, "errors": 1, "skipped": 1}
    assert counts["not_passed"] == ["b", "d"]


@pytest.mark.slow
@pytest.mark.skipif(COMPILER is None, reason="the CuPy stand-in's kernel check needs a C++ compiler")
def test_rehearsal_with_the_cupy_standin_as_the_gpu(tmp_path):
    """The whole command on a small grid, on the device's module set, with the stand-in for CuPy:
    test_gpu.py's tests pass on it, the Cavs cells run on `cuda` (the torch ones fail: no CUDA
    here, and are recorded as failed), the report and the figures are written."""
    env = device_env(tmp_path, standin=True)
    out = tmp_path / "gpu"
    proc = run(["-m", "experiments.gpu_check", "--results", str(out), "--grid", "1:64", "--ablation-at", "1,64",
                "--systems", "cavs,fold", "--budget-min", "4"], env, timeout=400)
    assert proc.returncode == 1, proc.stdout + proc.stderr          # fold cannot run: not all passed
    assert "stand-ins for missing helpers: tqdm, threadpoolctl" in proc.stdout
    import json
    record = json.loads((out / "gpu_check.json").read_text())
    tests = record["tests"]
    assert tests["status"] == "ok" and tests["failed"] == tests["errors"] == 0 and tests["passed"] > 150, tests
    assert record["gpu"]["devices"] == 1
    for name in ("fig8", "ablation"):
        assert record["sweep"][name]["status"] == "ok"
    assert record["sweep"]["ablation"]["counts"] == {"already measured": 0, "ok": 6}
    rows = (out / "fig8.csv").read_text().splitlines()
    cavs_rows = [r for r in rows if ",cavs," in r]
    assert len(cavs_rows) == 3 and all(",ok," in r and ",cupy,cuda," in r for r in cavs_rows)
    assert all("PyTorch sees no CUDA GPU" in r for r in rows[1:] if ",fold," in r)
    for name in ("environment.json", "tests.xml", "tests.log", "cell_walltimes.csv", "gpu_check.md"):
        assert (out / name).exists(), name
    for figure in ("fig8", "ablation"):
        proc = run(["-m", "plots", figure, "--results", str(out)], env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (out / "figures" / f"{figure}.png").exists()
