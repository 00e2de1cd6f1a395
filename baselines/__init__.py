"""Baseline systems behind one interface (base.System); `get_system(name)` returns a system's class.

Imports are lazy so that a framework missing on a machine (TensorFlow and DyNet on the GPU box)
only fails the systems that need it.
"""
from __future__ import annotations

import importlib

# name -> (module, class, keyword options passed to the constructor)
_REGISTRY = {
    "cavs":          ("baselines.cavs_system", "CavsSystem", {"policy": "batched"}),
    "cavs-serial":   ("baselines.cavs_system", "CavsSystem", {"policy": "serial"}),
    "cavs-torch":    ("baselines.cavs_torch_system", "CavsTorchSystem", {}),   # SST through cavs.torch
    "dynet":         ("baselines.dynet_autobatch", "DynetSystem", {"autobatch": 1}),
    "dynet-depth":   ("baselines.dynet_autobatch", "DynetSystem", {"autobatch": 2}),
    "tensorflow":    ("baselines.tensorflow_unroll", "TensorflowSystem", {}),
    "cudnn":         ("baselines.cudnn_lstm", "CudnnLstmSystem", {}),
    "fold":          ("baselines.fold", "FoldSystem", {"workers": 1}),
    "fold-n":        ("baselines.fold", "FoldSystem", {"workers": 0}),   # 0 = one per core
    "pytorch":       ("baselines.pytorch_sample", "PytorchSampleSystem", {}),
    "pytorch-levels": ("baselines.pytorch_levels", "PytorchLevelsSystem", {}),
}


def get_system(name: str):
    """A constructor for system `name`: call it with base.System's arguments."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown system {name!r}; known: {', '.join(_REGISTRY)}")
    module, cls, preset = _REGISTRY[name]
    klass = getattr(importlib.import_module(module), cls)

    def make(workload, **kwargs):
        system = klass(workload, **{**preset, **kwargs})
        system.name = name
        return system
    make.system_class = klass
    return make


def system_names() -> list[str]:
    return list(_REGISTRY)
