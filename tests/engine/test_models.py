"""The model files (cavs/models/): the paper's four models start from the workloads' initial values."""
import numpy as np
import pytest

import cavs


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_models_start_from_the_workloads_initial_values(workload):
    """The model files (cavs.Model with shapes and a forget-bias array) and the baselines'
    cavs.workloads.init_params give the same arrays, in the same order."""
    model = cavs.models.build(workload, hidden=6, seed=4, dtype="float64", leaves=8)
    mine, theirs = model.init_params(), cavs.workloads.init_params(workload, 6, 4, "float64", leaves=8)
    assert list(mine) == list(theirs)
    for name in mine:
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
