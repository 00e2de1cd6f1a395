"""`bench --compare REV_A REV_B` runs each revision's systems and engine: the snapshot it puts first
on a cell's import path holds `baselines/` and `cavs/` of that revision (before commit 268b9c9 it held
`baselines/` alone, so an engine change compared the engine with itself), and the data the engine
reads beside its package."""
from __future__ import annotations

import subprocess

import pytest

from experiments import launch
from experiments.studies import bench


@pytest.mark.parametrize("rev", ["HEAD", "worktree"])
def test_a_snapshot_holds_the_systems_the_engine_and_the_data(tmp_path, rev):
    if rev == "HEAD" and subprocess.run(["git", "-C", str(launch.REPO), "rev-parse", "HEAD"],
                                        capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    root = bench.snapshot_code(rev, tmp_path)
    assert (root / "cavs" / "engine.py").is_file() and (root / "baselines" / "__init__.py").is_file()
    assert (root / "data").resolve() == (launch.REPO / "data").resolve()
    assert not (root / "experiments").exists()          # the harness stays this tree's
    assert bench.snapshot_code(rev, tmp_path) == root    # a second call finds it in place
