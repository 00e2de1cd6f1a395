"""The child-sum engines of tests/engine, built once per session."""
import pytest

import cavs
from tests.engine.helpers import child_sum_model


@pytest.fixture(scope="session")
def engines():
    """Engines are built once per (arity, policy, fusion): building one with 32 child slots takes
    seconds. Every test sets the weights it needs."""
    cache = {}

    def get(arity, policy="batched", fusion=False, **model_options):
        key = (arity, policy, fusion, tuple(sorted(model_options.items())))
        if key not in cache:
            model = child_sum_model(arity, **model_options)
            cache[key] = (model, cavs.Engine(model, backend="numpy", policy=policy, fusion=fusion))
        model, engine = cache[key]
        for name, value in model.init_params().items():    # fresh weights, same seed
            engine.params[name] = value
        return model, engine
    return get
