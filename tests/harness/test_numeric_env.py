"""Every registered system computes in the harness's numeric environment: a tiny cell of each, in its own
process like a sweep's cells, computes float32 products whose exact results are denormal inside that
system's framework (experiments/cell.py probe_denormals) and checks they were flushed to zero, or, with
the option off ($CAVS_FTZ=0), that they were not. Systems whose framework is missing here skip."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from baselines import get_system, system_names
from experiments import launch, runner
from experiments.cell import frameworks_of
from experiments.launch import EXTRA_MARK
from experiments.registry import SYSTEM_FACTS

ROOT = Path(__file__).resolve().parents[2]
# frameworks that flush denormals inside their own kernels whatever the thread's setting
# (TensorFlow: ScopedFlushDenormal around every kernel and in its thread pools)
ALWAYS_FLUSH = {"tensorflow"}
WORKLOAD_ORDER = ("tree_fc", "fixed_lstm", "tree_lstm", "var_lstm")


def tiny_cell(system: str) -> dict:
    klass = get_system(system).system_class
    workload = next(w for w in WORKLOAD_ORDER if w in klass.workloads)
    cell = {"experiment": "numeric-env", "panel": "x", "workload": workload, "system": system,
            "variant": "default", "options": {}, "mode": "train", "batch_size": 2, "hidden": 8, "leaves": 4,
            "threads": 1, "device": "cpu", "profile": "test", "samples": 2, "warmup_batches": 1, "repeats": 1,
            "probe_denormals": True}
    cell["cell_id"] = f"numeric-{system}"
    return cell


def run_tiny_cell(system: str, ftz: bool) -> dict:
    cell = tiny_cell(system)
    env = dict(launch.env(cell["threads"]), CAVS_FTZ="1" if ftz else "0")
    proc = subprocess.run([sys.executable, "-m", "experiments.cell", json.dumps(cell)], capture_output=True,
                          text=True, timeout=400, env=env, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(EXTRA_MARK)]
    assert lines, f"{system}: no result line; exit {proc.returncode}; stderr: {proc.stderr[-2000:]}"
    extra = json.loads(lines[-1][len(EXTRA_MARK):])
    assert extra["result"]["status"] == "ok", f"{system}: {extra['result']['status']}\n{proc.stderr[-2000:]}"
    return extra


@pytest.mark.slow
@pytest.mark.parametrize("ftz", [True, False], ids=["ftz-on", "ftz-off"])
@pytest.mark.parametrize("system", system_names())
def test_denormals_flushed_in_every_systems_computation(system, ftz):
    if system in SYSTEM_FACTS:
        why = runner.unavailable(system, "cpu")
        if why:
            pytest.skip(f"{system}: {why}")
    extra = run_tiny_cell(system, ftz)
    result, probe = extra["result"], extra["denormals"]
    assert result["ftz"] is ftz and result["peak_rss_mb"] > 10
    assert probe["main_thread_ftz_daz"] is ftz
    frameworks = [fw for fw in frameworks_of(system) if fw in probe] or ["numpy"]
    expected_framework = SYSTEM_FACTS.get(system, (None,))[0]
    if expected_framework:
        assert expected_framework in probe, f"{system}: its framework {expected_framework} was not probed"
    for fw in frameworks:
        assert "error" not in probe[fw], f"{system}/{fw}: the probe failed: {probe[fw]['error']}"
        want = ftz or fw in ALWAYS_FLUSH
        assert (all(probe[fw]["each"]) if want else not any(probe[fw]["each"])), \
            f"{system}/{fw}: denormal results {'not ' if want else ''}flushed with FTZ/DAZ {'on' if ftz else 'off'}" \
            f" (largest |result| {probe[fw]['max_abs']:.3g})"


def test_the_option_reaches_the_cells_through_the_environment(monkeypatch):
    """`CAVS_FTZ=0 python -m experiments run ...` (Makefile FTZ=0): the runner passes its environment on."""
    monkeypatch.setenv("CAVS_FTZ", "0")
    assert launch.env(tiny_cell("cavs")["threads"])["CAVS_FTZ"] == "0"
    from experiments import environment
    assert environment.numeric_record()["ftz"] is False
    monkeypatch.delenv("CAVS_FTZ")
    assert environment.numeric_record()["ftz"] is True
    assert os.environ.get("CAVS_FTZ") is None


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


def test_pin_threads_also_pins_the_pools_loaded_after_it():
    """threadpoolctl reaches only loaded libraries: NumPy's OpenBLAS, imported after pin_threads,
    must still start at one thread (it read the core count before, two threads on these VMs)."""
    code = ("from experiments import launch; launch.pin_threads(1)\n"
            "import numpy, json\n"
            "from threadpoolctl import threadpool_info\n"
            "print(json.dumps([i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']))")
    env = {k: v for k, v in os.environ.items() if k not in launch.THREAD_VARS}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts and all(n == 1 for n in counts), counts
