"""The paper's evaluation as data: every figure, table and the ablation, with its sweep grid (docs/workloads.md),
the systems the paper compared in it, and what its plot reads. The runner expands these into cells;
nothing here runs anything.
"""
from __future__ import annotations

from dataclasses import dataclass

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)          # Figure 8 a-d
HIDDENS = (64, 128, 256, 512, 1024)                       # Figure 8 e-h
LEAVES = (32, 64, 128, 256, 512, 1024)                    # Figure 9 a
FIG9_BATCH_SIZES = (1, 16, 32, 64, 128, 256)              # Figure 9 b, Table 1
TABLE2_BATCH_SIZES = (16, 32, 64, 128, 256)

# the paper's comparisons, plus PyTorch per-sample as the unbatched reference, PyTorch batched by level
# on the trees (what a PyTorch user writes today for speed) and Cavs-serial on the Tree-LSTM (the paper
# shows batched vs serial scheduling there)
LSTM_SYSTEMS = ("cavs", "cudnn", "tensorflow", "dynet", "pytorch")
TREE_FC_SYSTEMS = ("cavs", "fold", "dynet", "pytorch-levels", "pytorch")
TREE_LSTM_SYSTEMS = ("cavs", "cavs-serial", "fold", "dynet", "pytorch-levels", "pytorch")

WORKLOAD_TITLES = {"fixed_lstm": "Fixed-LSTM", "var_lstm": "Var-LSTM", "tree_fc": "Tree-FC",
                   "tree_lstm": "Tree-LSTM"}

# system -> (Python module of its framework or None, can it run on a CUDA device, one sample at a time)
SYSTEM_FACTS = {
    "cavs":        (None, True, False),          # numpy on CPU, CuPy on GPU
    "cavs-serial": (None, True, True),
    "cavs-torch":  ("torch", False, False),       # the engine on numpy, head and embedding in torch (CPU)
    "dynet":       ("dynet", False, False),      # not installed on the GPU machine
    "dynet-depth": ("dynet", False, False),
    "tensorflow":  ("tensorflow", False, False),
    "cudnn":       ("torch", True, False),
    "fold":        ("torch", True, False),
    "fold-n":      ("torch", True, False),
    "pytorch":     ("torch", True, True),
    "pytorch-levels": ("torch", True, False),
}
# systems whose first construction on a machine measures it: the engine times its GEMM libraries on the
# model's product shapes and caches the choice (cavs/blas.py), up to minutes for one model at h = 1024 on
# the 2-core VMs. The local runner builds each of their models once before the cells (runner._prepare), so
# that no cell pays it inside its time limit.
MEASURED_ONCE = ("cavs", "cavs-serial", "cavs-torch")
# A per-sample system's time per epoch does not depend on the batch size, and its matrix-vector products
# make large cells very slow: it is measured at these points of a sweep only (where the sweep has them).
PER_SAMPLE_POINTS = {"batch_size": (1, 4, 16), "hidden": (64, 128)}

_OFF = {"lazy": False, "fusion": False, "streaming": False, "eager": False, "share_tokens": False}
ABLATION_VARIANTS = (
    ("all-off", _OFF),
    ("lazy", {**_OFF, "lazy": True}),
    ("fusion", {**_OFF, "fusion": True}),
    ("streaming", {**_OFF, "streaming": True}),
    ("eager", {**_OFF, "eager": True}),
    ("share_tokens", {**_OFF, "share_tokens": True}),
    ("all-on", {k: True for k in _OFF}),
)
DEFAULT_VARIANT = (("default", {}),)


@dataclass(frozen=True)
class Panel:
    """One sub-figure: a workload and a set of systems, swept over one column (`vary`)."""
    id: str
    workload: str
    systems: tuple[str, ...]
    vary: str                        # batch_size | hidden | leaves
    values: tuple[int, ...]
    batch_size: int = 64             # the fixed settings; `vary` overrides one of them
    hidden: int = 512
    leaves: int = 256
    modes: tuple[str, ...] = ("train",)
    variants: tuple[tuple[str, dict], ...] = DEFAULT_VARIANT   # (label, constructor options)

    def values_for(self, system: str) -> tuple[int, ...]:
        if SYSTEM_FACTS[system][2] and self.vary in PER_SAMPLE_POINTS:
            return tuple(v for v in self.values if v in PER_SAMPLE_POINTS[self.vary]) or self.values
        return self.values

    @property
    def title(self) -> str:
        fixed = {"batch_size": f"bs={self.batch_size}", "hidden": f"h={self.hidden}",
                 "leaves": f"L={self.leaves}"}
        fixed.pop(self.vary)
        if self.workload != "tree_fc":
            fixed.pop("leaves")
        return f"({self.id}) {WORKLOAD_TITLES[self.workload]}, {', '.join(fixed.values())}"


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    panels: tuple[Panel, ...]
    plot: dict        # what plots/ draws: kind, the columns it reads, layout

    @property
    def systems(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for p in self.panels for s in p.systems))


FIG8_PANELS = (
    Panel("a", "fixed_lstm", LSTM_SYSTEMS, "batch_size", BATCH_SIZES, hidden=512),
    Panel("b", "var_lstm", LSTM_SYSTEMS, "batch_size", BATCH_SIZES, hidden=512),
    Panel("c", "tree_fc", TREE_FC_SYSTEMS, "batch_size", BATCH_SIZES, hidden=512),
    Panel("d", "tree_lstm", TREE_LSTM_SYSTEMS, "batch_size", BATCH_SIZES, hidden=512),
    Panel("e", "fixed_lstm", LSTM_SYSTEMS, "hidden", HIDDENS, batch_size=64),
    Panel("f", "var_lstm", LSTM_SYSTEMS, "hidden", HIDDENS, batch_size=64),
    # no PyTorch per-sample: on 511-vertex trees it takes a minute per 64-tree batch at any h (panel c has it)
    Panel("g", "tree_fc", ("cavs", "fold", "dynet", "pytorch-levels"), "hidden", HIDDENS, batch_size=64),
    Panel("h", "tree_lstm", TREE_LSTM_SYSTEMS, "hidden", HIDDENS, batch_size=64),
)


EXPERIMENTS = {e.name: e for e in (
    Experiment("fig8", "Figure 8: time per epoch vs batch size (h=512) and vs hidden size (bs=64)",
               FIG8_PANELS,
               {"kind": "lines", "y": "epoch_s", "layout": (2, 4), "logy": True}),
    Experiment("fig9", "Figure 9: graph construction time and its share of the epoch",
               (Panel("a", "tree_fc", ("cavs", "fold", "dynet"), "leaves", LEAVES),
                Panel("b", "tree_lstm", ("cavs", "fold", "fold-n", "dynet"), "batch_size", FIG9_BATCH_SIZES)),
               {"kind": "construction", "y": "construct_s", "share_of": "total_s", "layout": (1, 2)}),
    Experiment("table1", "Table 1: computation time per epoch (graph construction excluded), h=512",
               (Panel("tree_fc", "tree_fc", ("cavs", "fold", "dynet", "pytorch-levels"), "batch_size",
                      FIG9_BATCH_SIZES),
                Panel("tree_lstm", "tree_lstm", ("cavs", "fold", "dynet", "pytorch-levels"), "batch_size",
                      FIG9_BATCH_SIZES)),
               {"kind": "table", "values": ("compute_s",), "rows": ("workload", "batch_size")}),
    Experiment("table2", "Table 2: Tree-LSTM time per epoch in memory movement vs computation, h=512",
               (Panel("tree_lstm", "tree_lstm", ("cavs", "dynet"), "batch_size", TABLE2_BATCH_SIZES,
                      modes=("train", "infer")),),
               {"kind": "table", "values": ("memory_s", "computation_s"), "rows": ("mode", "batch_size")}),
    Experiment("ablation", "Ablation: speedup of each Cavs optimization over none, bs=64, h=512",
               tuple(Panel(w, w, ("cavs",), "batch_size", (64,), variants=ABLATION_VARIANTS)
                     for w in ("fixed_lstm", "var_lstm", "tree_lstm")),
               {"kind": "speedup_bars", "y": "epoch_s", "baseline": "all-off"}),
    # the small fixed suite of `make bench-ci` (experiments/ci_bench.py), run with the `ci` profile
    Experiment("ci", "bench-ci: Cavs's speedup over the reference systems, same run",
               (Panel("tree_lstm", "tree_lstm", ("cavs", "dynet", "pytorch", "fold"), "batch_size", (64,),
                      hidden=128),
                Panel("var_lstm", "var_lstm", ("cavs", "dynet", "pytorch", "tensorflow"), "batch_size", (64,),
                      hidden=128),
                Panel("tree_fc", "tree_fc", ("cavs", "dynet", "pytorch", "fold"), "batch_size", (64,),
                      hidden=128, leaves=64)),
               {"kind": "table", "values": ("epoch_s",), "rows": ("workload", "batch_size")}),
)}


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]
