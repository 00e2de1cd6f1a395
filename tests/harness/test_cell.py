"""A cell (experiments/cell.py): the slice of an epoch it measures and its warm-up batches, the FTZ
state and peak memory it reports, and the memory-movement profile of DyNet's cells
(experiments/memprofile.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import launch, results, runner
from tests.harness.fake_system import FAKE, PROFILE, fake_experiment, rows_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("importable_fake")


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
    # a share where the kept pass lasted a clock tick (10 ms) or more, empty for a shorter one
    assert "cpu_steal" in row and (row["cpu_steal"] == "" or 0.0 <= float(row["cpu_steal"]) <= 1.0)


def test_cpu_steal_is_the_hosts_share_of_the_busy_time():
    """/proc/stat's cpu line: user nice system idle iowait irq softirq steal; idle and iowait do not
    count (an idle second core steals nothing), and no file or no progress gives None."""
    from experiments.environment import cpu_counters, steal_share
    before = cpu_counters("cpu  100 0 50 9000 40 5 5 10 0 0\ncpu0 1 2 3\n")
    after = cpu_counters("cpu  160 0 70 9900 40 5 5 30 0 0\n")
    assert before == (10, 170) and after == (30, 270)
    assert steal_share(before, after) == 0.2                  # 20 stolen of 100 wanted
    assert steal_share(before, before) is None and steal_share(None, after) is None
    assert cpu_counters("intr 1 2 3\n") is None


def test_a_cell_passes_over_its_slice_until_min_timed_s_has_gone():
    """At least `repeats` passes, then more until `min_timed_s` (the `ci` profile's guard against the
    VM's slow spells): 2 batches of 5 ms and more each (the fake system sleeps) for 0.3 s is 30 passes
    or fewer."""
    from experiments.launch import EXTRA_MARK
    cell = {"experiment": "fake", "panel": "a", "workload": "tree_fc", "system": FAKE, "variant": "default",
            "options": {"sleep_ms": 4.0}, "mode": "train", "batch_size": 2, "hidden": 8, "leaves": 8,
            "threads": 1, "device": "cpu", "profile": "test", "samples": 4, "warmup_batches": 1, "repeats": 2,
            "cell_id": "passes"}
    passes = {}
    for min_timed_s in (0.0, 0.3):
        proc = subprocess.run([sys.executable, "-m", "experiments.cell", json.dumps({**cell, "min_timed_s": min_timed_s})],
                              capture_output=True, text=True, timeout=120, env=launch.env(1), cwd=ROOT)
        extra = [x for x in proc.stdout.splitlines() if x.startswith(EXTRA_MARK)]
        assert extra, proc.stderr[-2000:]
        passes[min_timed_s] = json.loads(extra[-1][len(EXTRA_MARK):])["slice"]["passes"]
    assert passes[0.0] == 2 and 10 <= passes[0.3] <= 31, passes       # a pass sleeps at least 10 ms


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
                          text=True, timeout=300, env=launch.env(cell["threads"]), cwd=ROOT)
    extra = json.loads([x for x in proc.stdout.splitlines() if x.startswith(EXTRA_MARK)][-1][len(EXTRA_MARK):])
    result, prof = extra["result"], extra["memory_profile"]
    assert result["status"] == "ok" and prof["samples"] > 50, (prof, proc.stderr[-1500:])
    assert 0 < result["memory_s"] < result["compute_s"] and 0 < prof["memory_per_compute"] < 1
