"""The examples run (tiny sizes) and learn: each `main(argv)` returns its per-epoch mean losses
(child_sum_tree_lstm: the last epoch's), which must be finite and, over a few epochs, decrease."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import cavs

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, argv: list[str]):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def test_child_sum_tree_lstm(capsys, monkeypatch):
    # without generated kernels: compiling them for a dozen child slots takes up to a minute on a
    # cold cache (tests/engine/test_fusion.py checks the fused kernels at a small arity)
    class Unfused(cavs.Engine):
        def __init__(self, model, *args, **kwargs):
            kwargs.setdefault("fusion", False)
            super().__init__(model, *args, **kwargs)
    monkeypatch.setattr(cavs, "Engine", Unfused)
    loss = run_example("child_sum_tree_lstm", ["--trees", "16", "--batch-size", "8", "--hidden", "8",
                                               "--embed", "8", "--epochs", "2"])
    out = capsys.readouterr().out
    assert np.isfinite(loss) and 0 < loss < 3
    first, last = (float(line.split("mean loss ")[1].split()[0]) for line in out.splitlines()
                   if line.startswith("epoch ") and line.split()[1] in ("0:", "1:"))
    assert last < first, out


def test_gru_language_model():
    losses = run_example("gru_language_model", ["--sentences", "16", "--batch-size", "8", "--hidden", "8",
                                                "--embed", "8", "--epochs", "3", "--max-length", "8",
                                                "--fusion", "0"])
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]
    assert losses[0] == pytest.approx(np.log(10_000), rel=0.05)    # starts near uniform over the vocabulary


def test_dag():
    losses = run_example("dag", ["--graphs", "32", "--vertices", "6", "--hidden", "8", "--batch-size", "8",
                                 "--epochs", "4", "--fusion", "0"])
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]


def test_child_attention():
    losses = run_example("child_attention", ["--trees", "16", "--batch-size", "8", "--hidden", "8", "--embed", "8",
                                             "--epochs", "3"])
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]


def test_torch_head(capsys):
    pytest.importorskip("torch")
    losses = run_example("torch_head", ["--trees", "32", "--sst-trees", "40", "--dev-trees", "10", "--batch-size", "8",
                                        "--hidden", "8", "--embed", "8", "--epochs", "3"])
    for part in ("regression", "sst"):
        assert np.isfinite(losses[part]).all() and losses[part][-1] < losses[part][0], (part, losses[part])
    assert "dev root accuracy (fine-grained, 10 trees)" in capsys.readouterr().out


@pytest.mark.parametrize("name, argv, said", [
    ("child_sum_tree_lstm", ["--trees", "0"], "argument --trees: 0 is not at least 1"),
    ("child_sum_tree_lstm", ["--trees", "8"], "--trees 8 is fewer than one batch of --batch-size 64"),
    ("child_attention", ["--batch-size", "-2"], "argument --batch-size: -2 is not at least 1"),
    ("dag", ["--vertices", "1"], "--vertices must be at least 2"),
    ("gru_language_model", ["--max-length", "1"], "--max-length must be at least 2"),
    ("gru_language_model", ["--sentences", "x"], "argument --sentences: invalid positive value: 'x'"),
    ("torch_head", ["--epochs", "0"], "argument --epochs: 0 is not at least 1"),
])
def test_examples_name_a_bad_option(name, argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        run_example(name, argv)
    assert e.value.code == 2
    assert said in capsys.readouterr().err
