"""`make bench-ci`: HEAD's engine against the baseline commit's on this machine, and the cross-system
speedups checked only against a baseline of this machine kind."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import ci_bench, machine

ROOT = Path(__file__).resolve().parents[2]
# timed against a baseline: `make test` runs these after the parallel part, alone
pytestmark = pytest.mark.serial
# a kind no real machine has: a real one (Zen 3 EPYC, once used here) became CI's own kind and broke
# the "no baseline for this kind" checks
OTHER_KIND = {"cpu_model": "Test CPU (no such machine)", "cpu_vendor": "TestVendor", "cpu_family": "0",
              "cpu_model_number": "0", "cpu_isa": "sse2", "cpu_count": 2, "memory_gib": 24, "gpu": None}
assert machine.differences(OTHER_KIND, machine.kind()), "OTHER_KIND must not be this machine's kind"
# one cheap cell per side: Tree-FC, L = 64, against DyNet
# (one reference cell, measured once: a speedup can swing by a third between runs of a busy machine, so
# the unchanged tree's check allows it half; the engine's side-by-side comparison keeps its tolerance)
SMALL = ["--workloads", "tree_fc", "--systems", "dynet", "--rounds", "1", "--speedup-tolerance", "0.5"]
# the unchanged tree's engine comparison allows half too: one round a side (two with the retry), and
# a busy VM's slow spells last tens of seconds (the same commit read 1.16x and 1.30x from one side)
UNCHANGED = SMALL + ["--tolerance", "0.5"]
# appended to cavs/engine.py in the slowed commit: every pass sleeps as long as its batch has tasks
SLOW_PASS = """

import os as _os
_plain_pass = Engine._pass


def _slow_pass(self, batch, *args, **kwargs):
    time.sleep(float(_os.environ.get("CAVS_TEST_TASK_SLEEP_S", 0)) * batch.schedule(self.policy).num_tasks)
    return _plain_pass(self, batch, *args, **kwargs)


Engine._pass = _slow_pass
"""


def test_code_comparison_fails_only_past_the_tolerance():
    m = {"head": {"tree_fc": 1.10, "tree_lstm": 2.0}, "base": {"tree_fc": 1.0, "tree_lstm": 1.5},
         "reference": {("tree_fc", "dynet"): 3.3}, "problems": []}
    rows, ok = ci_bench.compare_code(m, 0.15)
    assert not ok and [(r[0], r[4]) for r in rows] == [("tree_fc", "ok"), ("tree_lstm", "REGRESSION")]
    rows, ok = ci_bench.compare_code({**m, "base": {"tree_fc": 1.0}}, 0.15)
    assert not ok and rows[1][4] == "not measured"
    merged = ci_bench.merge(m, {"head": {"tree_lstm": 1.6}, "base": {}, "reference": {("tree_fc", "dynet"): 3.0},
                                "problems": ["x"]})
    assert merged["head"] == {"tree_fc": 1.10, "tree_lstm": 1.6} and merged["problems"] == ["x"]
    assert merged["reference"] == {("tree_fc", "dynet"): 3.0}
    assert ci_bench.speedups(merged) == {"tree_fc/dynet": 3.0 / 1.10}


def test_a_regression_shows_in_both_the_best_runs_and_the_paired_rounds():
    """One lucky base pass (116.5 s against HEAD's 137.8 s at best) is not a regression when the
    rounds, each side minutes apart, pair up even; a HEAD slower in every round still is."""
    m = {"head": {"var_lstm": 137.8}, "base": {"var_lstm": 116.5}, "reference": {}, "problems": [],
         "pairs": {"var_lstm": [1.19, 1.02, 0.97, 1.05]}}
    rows, ok = ci_bench.compare_code(m, 0.15)
    assert ok and rows == [("var_lstm", 116.5, 137.8, 137.8 / 116.5, "ok", (1.02 + 1.05) / 2)]
    rows, ok = ci_bench.compare_code({**m, "pairs": {"var_lstm": [1.19, 1.22, 1.31]}}, 0.15)
    assert not ok and rows[0][4] == "REGRESSION" and rows[0][5] == 1.22
    both = ci_bench.merge(m, {"head": {}, "base": {}, "reference": {}, "problems": [], "pairs": {"var_lstm": [1.3]}})
    assert both["pairs"] == {"var_lstm": [1.19, 1.02, 0.97, 1.05, 1.3]}


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


def test_the_baseline_of_this_kind_wins_else_the_newest(tmp_path):
    ours = machine.kind()
    assert ci_bench.find_baseline(tmp_path, ours) == (None, None, False)
    for name, kind, date in (("old-kind", OTHER_KIND, "2026-12-02"), ("older", {"cpu_model": "X"}, "2026-01-01")):
        path = tmp_path / name / ci_bench.BASELINE
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"kind": kind, "date": date, "commit": name, "speedups": {}}))
    path, data, same = ci_bench.find_baseline(tmp_path, ours)
    assert data["commit"] == "old-kind" and not same                 # no baseline of ours: the newest
    mine = ci_bench.baseline_path(tmp_path, ours)
    mine.parent.mkdir(parents=True)
    mine.write_text(json.dumps({"kind": ours, "date": "2020-01-01", "commit": "abc-dirty", "speedups": {}}))
    path, data, same = ci_bench.find_baseline(tmp_path, ours)
    assert path == mine and same and ci_bench.baseline_commit(data) == "abc"
    (tmp_path / "broken" / "ci").mkdir(parents=True)
    (tmp_path / "broken" / ci_bench.BASELINE).write_text("{not json")
    assert ci_bench.find_baseline(tmp_path, ours)[0] == mine          # another kind's corrupt file is skipped
    mine.write_text("{not json")                     # this kind's: skipping it would turn the check off
    with pytest.raises(ValueError, match=r"baseline.json is not readable JSON"):
        ci_bench.find_baseline(tmp_path, ours)
    mine.write_text(json.dumps({"kind": ours, "speedups": {}}))
    with pytest.raises(ValueError, match=r"baseline.json records no commit"):
        ci_bench.find_baseline(tmp_path, ours)


def test_an_unreadable_baseline_fails_the_check_naming_it(tmp_path, capsys):
    (tmp_path / "given.json").write_text("{not json")
    assert ci_bench.main(["check", "--baseline", str(tmp_path / "given.json")]) == 1
    assert "given.json is not readable JSON" in capsys.readouterr().out


def test_a_commit_missing_from_the_clone_is_named():
    with ci_bench.worktree("0" * 40) as (where, why):
        assert where is None and "is not in this clone" in why


def _git(repo: Path, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A git repository holding this working tree (tracked and untracked files, results/ left out) as
    one commit: what `make bench-ci` sees on a fresh clone of the tree under test."""
    repo = tmp_path_factory.mktemp("ci") / "repo"
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if name.startswith("results/") or not src.is_file():
            continue
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, repo / name)
    (repo / ".venv").symlink_to(Path(sys.prefix))          # the Python running the tests (.venv under make)
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "the tree under test")
    return repo


def _check(repo: Path, *args, env=None, make=False, small=SMALL) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo), **(env or {})}
    cmd = (["make", "-o", ".venv/.installed", "bench-ci", f"CI_ARGS={' '.join(small)}"] if make
           else [sys.executable, "-m", "experiments.ci_bench", *args, *small])
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def _write_baseline(repo: Path, kind: dict) -> None:
    """The baseline `update` recorded, moved under the results directory of `kind`."""
    ours = ci_bench.baseline_path(repo / "results", machine.kind())
    data = json.loads(ours.read_text())
    shutil.rmtree(repo / "results")
    path = ci_bench.baseline_path(repo / "results", kind)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**data, "kind": kind}))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_bench_ci_passes_on_the_unchanged_tree_here_and_on_another_kind(clone):
    proc = _check(clone, "update")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    recorded = json.loads(ci_bench.baseline_path(clone / "results", machine.kind()).read_text())
    assert recorded["commit"] == commit.strip() and recorded["kind"] == machine.kind()
    assert set(recorded["speedups"]) == {"tree_fc/dynet"} and recorded["cavs_epoch_s"]["tree_fc"] > 0

    proc = _check(clone, make=True, small=UNCHANGED)                  # this kind's baseline: both checks
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "HEAD's engine against commit" in proc.stdout and "against the baseline of this kind" in proc.stdout
    assert "bench-ci: ok" in proc.stdout

    _write_baseline(clone, OTHER_KIND)                                # the kind the check reads, rewritten
    proc = _check(clone, make=True, small=UNCHANGED)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "HEAD's engine against commit" in proc.stdout and "no baseline for this kind" in proc.stdout
    assert "tree_fc/dynet" in proc.stdout and "bench-ci: ok" in proc.stdout


@pytest.mark.slow
def test_bench_ci_fails_when_heads_engine_is_slower_than_the_baselines(clone):
    """A commit that sleeps in every task of the loop (behind a variable only this test sets), checked
    against the commit before it: the engine comparison fails, whatever the baseline's kind."""
    base = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    path = clone / "results" / machine.slug(OTHER_KIND) / ci_bench.BASELINE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commit": base, "kind": OTHER_KIND, "date": "2099-01-01", "speedups": {}}))
    engine = clone / "cavs" / "engine.py"
    text = engine.read_text()
    assert "class Engine" in text and "    def _pass(self, batch" in text
    engine.write_text(text + SLOW_PASS)
    _git(clone, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "a sleep per task")
    proc = _check(clone, "check", env={"CAVS_TEST_TASK_SLEEP_S": "0.005"})
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("tree_fc ")]
    assert lines and all("REGRESSION" in line for line in lines), proc.stdout
    assert "measuring once more" in proc.stdout and "bench-ci: FAILED" in proc.stdout
