"""Rows record the code's commit (experiments.environment.git_revision): `-dirty` when code has
uncommitted changes, but not when only results/ does (a script that measures several things
rewrites tracked CSVs between its measurements)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from experiments.environment import git_revision

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_results_do_not_make_a_revision_dirty(tmp_path):
    assert git_revision(tmp_path) == "uncommitted"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "bench.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    rev = git_revision(tmp_path)
    assert rev and not rev.endswith("-dirty")
    (tmp_path / "results" / "bench.csv").write_text("b\n")
    assert git_revision(tmp_path) == rev
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_revision(tmp_path) == rev + "-dirty"
