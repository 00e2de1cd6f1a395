"""The task_cost study (experiments/studies/task_cost.py): a task's compute split into the three
products and the rest."""
import csv

import pytest


def test_task_cost_splits_compute_into_products_and_the_rest(tmp_path):
    from experiments.studies.__main__ import main as run_study
    assert run_study(["task_cost", "--hidden", "8", "--passes", "1", "--samples", "64", "--results", str(tmp_path)]) == 0
    with open(tmp_path / "task_cost.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert int(row["gemm_calls"]) > 0 and int(row["loop_tasks"]) > 0 and int(row["launches"]) >= int(row["loop_tasks"])
    assert float(row["gemm_s"]) + float(row["other_compute_s"]) == pytest.approx(float(row["timed_compute_s"]))
    assert float(row["forward_s"]) > 0 and float(row["input_grad_s"]) > 0 and float(row["weight_grad_s"]) > 0


def test_task_cost_tells_the_three_products_apart_by_their_layout():
    """The engine's three products (ops.py): out = x W, dx = dy W^T, dW += x^T dy, on views."""
    import numpy as np
    from experiments.studies.task_cost import gemm_kind
    buf, w = np.zeros((10, 12), dtype=np.float32), np.zeros((4, 6), dtype=np.float32)
    x, dy = buf[:, 2:6], buf[:, 6:12]          # column slices of one buffer, as dynamic tensors hold them
    assert gemm_kind(x, w) == "forward"
    assert gemm_kind(dy, w.T) == "input_grad"
    assert gemm_kind(x.T, dy) == "weight_grad"
