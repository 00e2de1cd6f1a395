"""Profiles: how much work each cell measures, on which device, under which time limit.

The `cpu` profile measures a fixed slice of each epoch sized by a rough cost model (below), so that every
cell costs about `target_s` seconds of timed work whatever its batch size, hidden size or system; the
per-epoch time is extrapolated from it and marked so. The same model estimates a sweep's duration
(`python -m experiments run ... --dry-run`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .registry import SYSTEM_FACTS


@dataclass(frozen=True)
class Profile:
    name: str
    device: str                  # cpu | cuda | auto (cuda where a GPU is present)
    time_limit_s: float          # per cell, start-up included
    timed_batches: int | None    # fixed number of timed batches; None: sized by target_s or the epoch
    target_s: float | None       # seconds of timed work per cell (cost model); None with timed_batches=None: whole epoch
    reduced_grid: bool           # two points per swept axis (its first and its middle value)
    sweep_budget_s: float | None = None   # no new cell starts past this; a rerun continues the sweep
    warmup_batches: int = 1
    repeats: int = 1             # passes over the timed slice; the fastest is kept
    min_timed_s: float = 0.0     # and more passes until they have taken this long


PROFILES = {p.name: p for p in (
    Profile("quick", "cpu", time_limit_s=120, timed_batches=1, target_s=None, reduced_grid=True),
    # `cpu`: the slice twice, the faster pass kept. One pass of about a second took whatever the VM did
    # in that second: on the Zen 4 VM (2026-12-07) the extrapolation check's one-pass slices read up to
    # 2.5x their 20x-longer runs, 5 cells of 15 past 15% (a first pass after the warm-up, or a slow
    # spell). Two passes of 0.75 s cost about half as much again as one of 1 s, not twice.
    Profile("cpu", "cpu", time_limit_s=90, timed_batches=None, target_s=0.75, reduced_grid=False,
            sweep_budget_s=42 * 60, repeats=2),     # `make fig8` must end within 45 minutes on 2 cores
    Profile("paper", "auto", time_limit_s=6 * 3600, timed_batches=None, target_s=None, reduced_grid=False),
    Profile("gpu-quick", "cuda", time_limit_s=300, timed_batches=2, target_s=None, reduced_grid=True),
    # `make gpu-check` (experiments/gpu_check.py, which picks its grid and its budget): 3 batches
    # twice, the faster pass kept; a cell normally takes 5-10 s, nearly all of it start-up
    Profile("gpu-check", "cuda", time_limit_s=60, timed_batches=3, target_s=None, reduced_grid=False,
            sweep_budget_s=4 * 60, repeats=2),
    # `make bench-ci`: 2 batches are 40-250 ms, which one slow spell of the VM (0.1-0.5 s at about 60%
    # speed, every few seconds) covers whole; passes go on for a second, so that one of them misses it
    Profile("ci", "cpu", time_limit_s=180, timed_batches=2, target_s=None, reduced_grid=False, repeats=3,
            min_timed_s=1.0),
)}

# ---- cost model: seconds per training sample on one core (an estimate, only used to size slices) ----
# The first guess below is scaled per system and workload by CALIBRATION (measured on the 2-core reference
# machine): within a factor of about 2 either way for most cells, which is all a slice size needs.
BATCHED_FLOPS = 30e9        # one core, a whole batched training step (its GEMMs alone reach 80-130)
PER_SAMPLE_FLOPS = 4e9      # one core, matrix-vector products: bound by reading the weights
STARTUP_S = {"tensorflow": 15.0}     # process start, imports, data loading, tracing; others:
DEFAULT_STARTUP_S = 3.5
PTB_VOCAB, SST_EMBED, TREE_LSTM_VERTICES, VAR_LSTM_TOKENS = 10_000, 300, 37.3, 22.1   # means over train
# seconds of Python/framework overhead per vertex and pass: batched systems amortize it over the batch,
# per-sample ones (PyTorch, Cavs-serial) pay it on every vertex
PER_SAMPLE_OVERHEAD_S = 3e-4
BATCHED_OVERHEAD_S = 2e-5
# measured / modelled time per sample, the median over each system's and workload's cpu-profile cells of
# results/{fig8,fig9,table1,table2}.csv on the reference machine (the model above overestimated most
# systems 2-13x, so the `cpu` slices held 0.1-0.7 s of work instead of the 1 s aimed at); a system or
# workload not listed keeps the model's guess times DEFAULT_CALIBRATION
CALIBRATION = {
    ("cavs", "fixed_lstm"): 0.18, ("cavs", "var_lstm"): 0.21, ("cavs", "tree_fc"): 0.072,
    ("cavs", "tree_lstm"): 0.10, ("cavs-serial", "tree_lstm"): 0.083,
    ("cudnn", "fixed_lstm"): 0.23, ("cudnn", "var_lstm"): 0.34,
    ("dynet", "fixed_lstm"): 0.43, ("dynet", "var_lstm"): 0.50, ("dynet", "tree_fc"): 0.14,
    ("dynet", "tree_lstm"): 0.23, ("fold", "tree_fc"): 0.14, ("fold", "tree_lstm"): 0.29,
    ("fold-n", "tree_lstm"): 0.25, ("pytorch", "fixed_lstm"): 0.43, ("pytorch", "var_lstm"): 0.43,
    ("pytorch", "tree_fc"): 0.39, ("pytorch", "tree_lstm"): 0.86,
    ("tensorflow", "fixed_lstm"): 0.35, ("tensorflow", "var_lstm"): 0.69,
}
DEFAULT_CALIBRATION = 0.3
MAX_SLICE_SAMPLES = 2048      # cheap cells: enough batches to average their variety, still about 1 s


def vertices_per_sample(workload: str, leaves: int) -> float:
    return {"fixed_lstm": 64, "var_lstm": VAR_LSTM_TOKENS, "tree_fc": 2 * leaves - 1,
            "tree_lstm": TREE_LSTM_VERTICES}[workload]


def flops_per_vertex(workload: str, h: int) -> float:
    """Forward multiply-adds of one vertex (cell matmuls + per-vertex softmax), times 2 flops."""
    macs = {"fixed_lstm": 8 * h * h + h * PTB_VOCAB, "var_lstm": 8 * h * h + h * PTB_VOCAB,
            "tree_fc": 2 * h * h, "tree_lstm": SST_EMBED * 5 * h + 10 * h * h + 5 * h}[workload]
    return 2 * macs


# a batched system's products have `bs` rows: each reads the weights once per batch, so its rate grows
# with bs as BATCHED_FLOPS * bs / (bs + HALF_RATE_BATCH) (half the rate at bs = 4, fitted with CALIBRATION;
# one number for all systems cut the spread of measured/predicted from 0.23-10x to 0.25-5.7x)
HALF_RATE_BATCH = 4.0


def sample_cost_s(system: str, workload: str, hidden: int, leaves: int, mode: str,
                  batch_size: int | None = None) -> float:
    passes = 3 if mode == "train" else 1          # backward costs about twice the forward
    per_sample = SYSTEM_FACTS.get(system, (None, False, False))[2]
    rate, overhead = (PER_SAMPLE_FLOPS, PER_SAMPLE_OVERHEAD_S) if per_sample else (BATCHED_FLOPS, BATCHED_OVERHEAD_S)
    if not per_sample and batch_size:
        rate = BATCHED_FLOPS * batch_size / (batch_size + HALF_RATE_BATCH)
    per_vertex = passes * (flops_per_vertex(workload, hidden) / rate + overhead)
    calibration = CALIBRATION.get((system, workload), DEFAULT_CALIBRATION if system in SYSTEM_FACTS else 1.0)
    return vertices_per_sample(workload, leaves) * per_vertex * calibration


def measured_samples(profile: Profile, cell: dict) -> int | None:
    """Samples a cell times (whole batches); None = the whole epoch."""
    bs = cell["batch_size"]
    if profile.timed_batches is not None:
        return profile.timed_batches * bs
    if profile.target_s is None:
        return None
    cost = sample_cost_s(cell["system"], cell["workload"], cell["hidden"], cell["leaves"], cell["mode"], bs)
    wanted = min(profile.target_s / cost, MAX_SLICE_SAMPLES)
    return max(1, math.ceil(wanted / bs)) * bs


def estimated_cell_s(profile: Profile, cell: dict, epoch_samples: int) -> float:
    """The cost model's guess of a cell's wall time, warm-up and start-up included, capped by the limit
    (a cuda cell: the GPU model below)."""
    if cell.get("device") == "cuda":
        return gpu_cell_s(profile, cell, epoch_samples)
    cost = sample_cost_s(cell["system"], cell["workload"], cell["hidden"], cell["leaves"], cell["mode"],
                         cell["batch_size"])
    timed = measured_samples(profile, cell) or epoch_samples
    work = (profile.warmup_batches * cell["batch_size"] + profile.repeats * timed) * cost
    return min(STARTUP_S.get(cell["system"], DEFAULT_STARTUP_S) + work, profile.time_limit_s)


# ---- GPU cost model (cuda cells): GUESSES. No cell of this harness has run on a GPU yet; every number below
# is an estimate from what these libraries usually cost, to be replaced by what results/gpu/ records after the
# first `make gpu-check` (cell_walltimes.csv: each cell's wall time next to this model's guess). On a GPU these
# cells are small: their time is start-up and kernel launches, not arithmetic.
GPU_STARTUP_S = 4.0            # guess: Python, cavs and CuPy imports, the CUDA context, data, the model
GPU_TORCH_STARTUP_S = 7.0      # guess: the same with `import torch` (2-4 s) and PyTorch's CUDA context
GPU_FIRST_COMPILE_S = 25.0     # guess: the sweep's first Cavs cell compiles CuPy's kernels (NVRTC, ~0.3 s each,
                               # 60-80 of them); later cells load them from CuPy's cache (~/.cupy/kernel_cache)
GPU_WARM_COMPILE_S = 10.0      # guess: the same after gpu-check's CuPy tests, which compile the float32 kernels of
                               # the same models and switches (a kernel's source does not depend on h or bs)
GPU_VARIANT_COMPILE_S = 6.0    # guess: the fused kernels of each further model or switch variant
GPU_LAUNCH_S = 30e-6           # guess: one kernel launch from Python (CuPy or PyTorch eager, with its Python code)
GPU_FLOPS = 15e12              # guess: float32 rate of these small products (an H200's FP32 peak: ~67 TFLOP/s)
GPU_BATCH_OVERHEAD_S = 3e-3    # guess: per batch, the loss, the update and the host-device copies
GPU_HOST_PER_VERTEX_S = 1e-5   # guess: per vertex, building the batch on the host (graphs, schedule, plans)
# guess: launches per task (a level of the batch, or one vertex for a per-sample system), forward + backward
GPU_LAUNCHES_PER_TASK = {"cavs": 40, "cavs-serial": 40, "fold": 70, "fold-n": 70, "pytorch-levels": 45,
                         "pytorch": 50, "cudnn": 0}
GPU_CUDNN_LAUNCHES = 40        # guess: cuDNN's LSTM: its steps run inside the library, a few launches a batch
GPU_CALIBRATION: dict = {}     # (system, workload) -> measured / modelled, once a GPU run has recorded some


def gpu_tasks(workload: str, batch_size: int) -> float:
    """Tasks (levels) of a batched pass: the mean depth of a batch of SST trees grows with the batch
    (10.6 at bs = 1, 21.9 at 64, 23.9 at 256, measured here on the shuffled train set), a Var-LSTM batch's
    longest sentence likewise (21.5, 50, 61); Fixed-LSTM has 64 steps, Tree-FC log2(leaves) + 1 levels."""
    lg = math.log2(max(1, batch_size))
    return {"tree_lstm": min(24.0, 10.6 + 2.0 * lg), "var_lstm": min(62.0, 21.5 + 5.0 * lg),
            "fixed_lstm": 64.0}.get(workload, 9.0)


def gpu_batch_s(system: str, workload: str, hidden: int, leaves: int, mode: str, batch_size: int) -> float:
    """The GPU model's seconds for one batch (prepare + step) of a cell."""
    passes = 3 if mode == "train" else 1
    vertices = vertices_per_sample(workload, leaves) * batch_size
    per_sample = SYSTEM_FACTS.get(system, (None, False, False))[2]
    tasks = vertices if per_sample else gpu_tasks(workload, batch_size)
    launches = GPU_CUDNN_LAUNCHES if system == "cudnn" else tasks * GPU_LAUNCHES_PER_TASK.get(system, 50)
    launches *= passes / 3
    flops = passes * vertices * flops_per_vertex(workload, hidden)
    seconds = GPU_BATCH_OVERHEAD_S + launches * GPU_LAUNCH_S + flops / GPU_FLOPS + vertices * GPU_HOST_PER_VERTEX_S
    return seconds * GPU_CALIBRATION.get((system, workload), 1.0)


def gpu_startup_s(system: str) -> float:
    framework = SYSTEM_FACTS.get(system, (None,))[0]
    return GPU_TORCH_STARTUP_S if framework == "torch" else GPU_STARTUP_S


def gpu_cell_s(profile: Profile, cell: dict, epoch_samples: int) -> float:
    """A cuda cell's wall time: start-up, then its warm-up and timed batches (as experiments/cell.py runs
    them), capped by the limit. Kernel compilation, paid once per sweep, is not in it (gpu_compile_s)."""
    bs = cell["batch_size"]
    batch = gpu_batch_s(cell["system"], cell["workload"], cell["hidden"], cell["leaves"], cell["mode"], bs)
    timed = measured_samples(profile, cell) or epoch_samples
    warmup = max(profile.warmup_batches, min(3, math.ceil(16 / bs))) if profile.warmup_batches else 0
    work = (warmup + profile.repeats * math.ceil(timed / bs)) * batch
    return min(gpu_startup_s(cell["system"]) + work, profile.time_limit_s)


def gpu_compile_s(cells: list[dict], warm: bool = False) -> float:
    """Kernel compilation a sweep of cuda cells pays once: the first Cavs cell's, and the fused kernels
    of each further (workload, lazy, eager) with fusion on (which ops fuse depends on those; the
    batched and serial policies share their kernels, the unfused variants CuPy's own). `warm`: CuPy's
    cache already holds most of them (gpu-check's tests ran first)."""
    cavs = [c for c in cells if c["system"] in ("cavs", "cavs-serial")]
    if not cavs:
        return 0.0
    fused = {(c["workload"], c["options"].get("lazy", True), c["options"].get("eager", True))
             for c in cavs if c["options"].get("fusion", True)}
    first = GPU_WARM_COMPILE_S if warm else GPU_FIRST_COMPILE_S
    return first + GPU_VARIANT_COMPILE_S * max(0, len(fused) - 1)


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]
