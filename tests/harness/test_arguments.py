"""The studies', the sweep's and bench-ci's options: a bad item is an argparse error naming the
option and the item, before anything is measured, never a traceback from main() or a list that
silently selects nothing (bench-ci with an unknown workload used to measure nothing and pass)."""
from __future__ import annotations

import argparse

import pytest

from experiments import arguments, ci_bench
from experiments.studies.__main__ import main as run_study


def test_counts_and_names_parse_lists_and_name_a_bad_item():
    assert arguments.counts("1, 2,") == [1, 2]
    for bad, said in (("x", "'x' is not a whole number"), ("1,0", "'0' must be at least 1"), (",", "at least one")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            arguments.counts(bad)
    pick = arguments.names("tree_lstm", "var_lstm")
    assert pick("var_lstm,tree_lstm") == ["var_lstm", "tree_lstm"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown 'foo'; choose from tree_lstm, var_lstm"):
        pick("tree_lstm,foo")


def test_scalar_types_name_a_bad_value():
    assert arguments.count(" 3") == 3 and arguments.positive("1.5") == 1.5 and arguments.at_least_zero("0") == 0
    for parse, bad, said in ((arguments.count, "0", "must be at least 1"), (arguments.count, "2.5", "not a whole number"),
                             (arguments.positive, "0", "must be above 0"), (arguments.positive, "inf", "not a finite"),
                             (arguments.at_least_zero, "-1", "must be at least 0"),
                             (arguments.at_least_zero, "nan", "not a finite"), (arguments.positive, "x", "not a number")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            parse(bad)


@pytest.mark.parametrize("argv, said", [
    (["bench", "--rounds", "0"], "argument --rounds: '0' must be at least 1"),
    (["bench", "--repeats", "-1"], "argument --repeats: '-1' must be at least 1"),
    (["bench", "--variants", "some"], "argument --variants: invalid choice: 'some'"),
    (["nary", "--trees", "0"], "argument --trees: '0' must be at least 1"),
    (["sst", "--time-limit", "-5"], "argument --time-limit: '-5' must be above 0"),
    (["torch_module", "--batch-size", "0"], "argument --batch-size: '0' must be at least 1"),
    (["bench", "--threads", "1,x"], "argument --threads: 'x' is not a whole number"),
    (["bench", "--hidden", "64,0"], "argument --hidden: '0' must be at least 1"),
    (["bench", "--workloads", "tree_fc"], "argument --workloads: unknown 'tree_fc'"),
    (["bench", "--systems", "cavs,dynet2"], "argument --systems: unknown 'dynet2'"),
    (["task_cost", "--hidden", "12x"], "argument --hidden: '12x' is not a whole number"),
    (["policies", "--policies", "batched,fast"], "argument --policies: unknown 'fast'"),
    (["extrapolation", "--only", "a"], "argument --only: 'a' is not a whole number"),
])
def test_a_study_refuses_a_bad_list_before_measuring(argv, said, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_study(argv + ["--results", str(tmp_path)])
    assert e.value.code == 2
    assert said in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_extrapolation_refuses_a_cell_number_beyond_its_cells(tmp_path, capsys):
    assert run_study(["extrapolation", "--only", "1,99", "--list", "--results", str(tmp_path)]) == 2
    assert "--only: no cell 99; there are 15" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["check", "--workloads", "tree_lstm,foo"], "argument --workloads: unknown 'foo'"),
    (["check", "--systems", "cavs"], "argument --systems: unknown 'cavs'; choose from none, dynet"),
    (["check", "--tolerance", "-0.1"], "argument --tolerance: '-0.1' must be at least 0"),
])
def test_bench_ci_refuses_an_unknown_workload_or_system(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        ci_bench.main(argv)
    assert e.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["run", "fig8", "--time-limit", "-1"], "argument --time-limit: '-1' must be above 0"),
    (["run", "fig8", "--budget-min", "-5"], "argument --budget-min: '-5' must be at least 0"),
])
def test_the_sweep_refuses_a_negative_time(argv, said, capsys):
    from experiments.__main__ import main as sweep
    with pytest.raises(SystemExit) as e:
        sweep(argv + ["--dry-run"])
    assert e.value.code == 2
    assert said in capsys.readouterr().err
