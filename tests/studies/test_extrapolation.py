"""The extrapolation study (experiments/studies/extrapolation.py) on a fake system: a slice of an
epoch against a long run."""
import csv

import pytest

from experiments import launch
from tests.harness.fake_system import FAKE

pytestmark = pytest.mark.usefixtures("importable_fake")


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


def test_cells_of_ones_own_are_read_with_a_clear_error_for_a_bad_one():
    """--cells: a curve that jumps gets its reproduction without editing the study's cells."""
    import argparse
    from experiments.studies import extrapolation
    assert extrapolation.parse_cells("cavs:var_lstm:1:512, dynet:var_lstm:2:512:epoch,fold:tree_lstm:4:64:20") == (
        ("cavs", "var_lstm", 1, 512, 10), ("dynet", "var_lstm", 2, 512, "epoch"), ("fold", "tree_lstm", 4, 64, 20))
    for bad, says in (("cavs:var_lstm:one:512", "'cavs:var_lstm:one:512' is not system:workload:bs:h"),
                      ("cavs:var_lstm:1", "is not system:workload:bs:h"),
                      ("cavs:var_lstm:1:512:1", "long >= 2"),
                      ("cavz:var_lstm:1:512", "unknown system 'cavz'"),
                      ("cavs:var_lsm:1:512", "unknown workload 'var_lsm'"), (",", "no cell given")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            extrapolation.parse_cells(bad)
