"""SST sentiment trained to accuracy on Cavs, DyNet and PyTorch (and Cavs through cavs.torch).

    python -m experiments.studies sst --profile quick|cpu|paper --results DIR --systems cavs,dynet,pytorch
    python -m plots.sst --results DIR          # then the figure and summary (`make sst` runs both)
    make sst SYSTEMS=cavs,cavs-torch           # the engine natively and as a torch module, side by side

The docs/workloads.md Tree-LSTM (h = 150, embedding width 300, as Tai et al. 2015's constituency
Tree-LSTM; the embeddings start random, pretrained vectors are not available here) trained on SST
train with every vertex's label in the loss (mean over the batch's vertices), Adagrad lr 0.05 with
L2 1e-4, batch size 25, no gradient clipping. Each system is the baselines/ one (Cavs, DyNet with
autobatching, PyTorch one vertex at a time) with the Adagrad option: baselines/base.py has the
exact rule, and each system's module how it follows it. `cavs-torch` (not run by default) is the
same engine as a cavs.torch.VertexModule with a torch embedding, head and torch.optim.Adagrad
(baselines/cavs_torch_system.py): the native run's steps, through PyTorch.
After each epoch: root accuracy on dev, fine-grained (5 classes) and binary (the 5-class
distribution collapsed, P(0)+P(1) against P(3)+P(4), over the dev trees whose gold root label is
not 2). At the end: test accuracy with the parameters of the best dev epoch (fine-grained).

Every system starts from the same weights (cavs.workloads.init_params) and reads the trees in the
same order: epoch e trains on the training set permuted by np.random.default_rng((seed, e)), cut
into consecutive batches (the last one partial; no tree is dropped). A system that trains on a
slice of an epoch (PyTorch, which goes one vertex at a time) takes the first trees of that order.

Each system runs in its own process (a cell, started one after the other, so they never share
the machine's cores) with one compute thread (OMP/MKL/... variables, torch.set_num_threads, the
engine's threadpool limit) and flush-to-zero set by this harness for all of them; it reports each
epoch as it ends. Timing: train_s is the wall time of the epoch's training steps (batch
reading/graph construction, forward, backward and update, all included: what each system's user
waits for), after one untimed warm-up (`warmup_s`: System.warm_up on the first batch, which
changes no weight: Cavs compiles its fused kernels with a forward and backward; recorded, never
hidden); eval_s is the time of `predict` over the dev set, in batches of `eval_batch` trees;
wall_s = the running sum of both. Time-to-accuracy (plots/sst.py) uses the running training time
(cum_train_s) and reports wall_s too.

Results: DIR/sst.csv, one row per system and epoch (the rows of the systems run replace their older
rows); plots/sst.py draws DIR/figures/sst.png/.pdf/.md from it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import arguments, environment, launch
from ..results import read_rows

SYSTEMS = ("cavs", "dynet", "pytorch", "cavs-torch")
DEFAULT_SYSTEMS = ("cavs", "dynet", "pytorch")
CLASSES = 5
COLUMNS = (
    "system", "epoch", "epoch_fraction", "trees", "train_s", "eval_s", "cum_train_s", "wall_s",
    "train_loss", "dev_fine", "dev_binary", "test_fine", "test_binary", "best_epoch",
    "train_trees_per_s", "eval_trees_per_s", "test_eval_s", "warmup_s",
    "train_set", "dev_set", "test_set", "batch_size", "eval_batch", "hidden", "embed", "lr",
    "weight_decay", "dtype", "threads", "seed", "profile", "status", "git_rev", "run_id",
)


@dataclass(frozen=True)
class Profile:
    name: str
    epochs: int                         # Cavs and DyNet
    train_limit: int | None = None      # N trees spread over train.txt (None: all 8544)
    dev_limit: int | None = None
    test_limit: int | None = None
    # systems that train on less: {system: (epochs, trees per epoch or None for all)}
    partial: dict = field(default_factory=dict)
    time_limit_s: float = 3600.0        # per system, start-up included


PROFILES = {p.name: p for p in (
    # a smoke run: a few hundred trees, one epoch each, small dev/test slices (minutes)
    Profile("quick", epochs=1, train_limit=300, dev_limit=200, test_limit=200,
            partial={"pytorch": (1, 100)}, time_limit_s=600),
    # Cavs and DyNet 10 full epochs; PyTorch the first 1500 trees of epoch 1 (~45 min on 2 cores)
    Profile("cpu", epochs=10, partial={"pytorch": (1, 1500)}, time_limit_s=40 * 60),
    # more epochs; PyTorch one whole epoch
    Profile("paper", epochs=20, partial={"pytorch": (1, None)}, time_limit_s=6 * 3600),
)}


@dataclass
class Config:
    """What one system's process (a cell) runs."""
    system: str
    profile: str
    epochs: int
    trees_per_epoch: int | None
    train_limit: int | None
    dev_limit: int | None
    test_limit: int | None
    hidden: int = 150
    embed: int = 300
    batch_size: int = 25
    eval_batch: int = 100
    lr: float = 0.05
    weight_decay: float = 1e-4
    dtype: str = "float32"
    threads: int = 1
    seed: int = 0
    progress: bool = True


# ---------------------------------------------------------------- data and metrics

def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of the training trees for `epoch` (1-based): the same for every system."""
    return np.random.default_rng((seed, epoch)).permutation(n)


def spread(samples: list, limit: int | None) -> list:
    """`limit` trees spread evenly over the file (SST's files are sorted by sentiment, so the
    first N would be nearly all positive), in file order; all of them when limit is None."""
    if limit is None or limit >= len(samples):
        return list(samples)
    return [samples[i] for i in np.linspace(0, len(samples) - 1, limit).round().astype(int)]


def root_label(line: str) -> int:
    """The gold label of an SST tree's root: the number after its first bracket."""
    return int(line.lstrip()[1:].split(None, 1)[0])


def vertex_count(line: str) -> int:
    """Vertices of an SST tree (every one is a bracket, and labelled)."""
    return line.count("(")


def accuracies(probs: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    """(fine-grained, binary) root accuracy. Binary: over trees whose gold label is not 2, the
    5-class distribution collapsed to negative P(0)+P(1) against positive P(3)+P(4)."""
    probs, gold = np.asarray(probs), np.asarray(gold)
    fine = float((probs.argmax(axis=1) == gold).mean()) if len(gold) else float("nan")
    polar = gold != 2
    if not polar.any():
        return fine, float("nan")
    positive = probs[polar, 3] + probs[polar, 4] > probs[polar, 0] + probs[polar, 1]
    return fine, float((positive == (gold[polar] >= 3)).mean())


# ---------------------------------------------------------------- one system, in its own process

def make_system(name: str, *, hidden: int, embed: int, dtype: str, lr: float, weight_decay: float,
                threads: int = 1, seed: int = 0, batch_size: int = 25, eval_batch: int = 100, **options):
    """System `name` of baselines/ for SST training: the Tree-LSTM at these sizes, Adagrad."""
    from baselines import get_system
    from baselines.base import Adagrad
    # batch_size: the largest batch it is given (DyNet reserves its memory pools for it)
    return get_system(name)("tree_lstm", hidden=hidden, embed=embed, dtype=dtype, threads=threads, seed=seed,
                            batch_size=max(batch_size, eval_batch),
                            optimizer=Adagrad(lr=lr, weight_decay=weight_decay), **options)


def predict(system, trees: list, eval_batch: int) -> np.ndarray:
    """Root probabilities, (len(trees), 5), computed `eval_batch` trees at a time."""
    out = [system.predict(system.prepare(trees[i:i + eval_batch])) for i in range(0, len(trees), eval_batch)]
    return np.concatenate(out) if out else np.zeros((0, CLASSES))


def cell(spec: dict) -> dict:
    """Trains one system as Config `spec` says, reporting each epoch (launch.emit) as it ends; its
    result is the test accuracy of its best dev epoch."""
    from tqdm import tqdm

    from cavs.models.datasets import load_samples
    from cavs.models.workloads import init_params
    cfg = Config(**spec)
    try:                      # the same numeric environment for every system: flush-to-zero on
        import torch
        torch.set_flush_denormal(True)
        torch.set_num_threads(cfg.threads)
    except ImportError:
        pass
    system = make_system(cfg.system, hidden=cfg.hidden, embed=cfg.embed, dtype=cfg.dtype, lr=cfg.lr,
                         weight_decay=cfg.weight_decay, threads=cfg.threads, seed=cfg.seed,
                         batch_size=cfg.batch_size, eval_batch=cfg.eval_batch)
    system.set_params(init_params("tree_lstm", cfg.hidden, cfg.seed, cfg.dtype, embed=cfg.embed))
    train = spread(load_samples("tree_lstm", "train"), cfg.train_limit)
    dev = spread(load_samples("tree_lstm", "dev"), cfg.dev_limit)
    test = spread(load_samples("tree_lstm", "test"), cfg.test_limit)
    dev_gold = np.array([root_label(s) for s in dev])
    test_gold = np.array([root_label(s) for s in test])
    sets = {"train_set": len(train), "dev_set": len(dev), "test_set": len(test)}

    # untimed warm-up on the first batch of epoch 1 (Cavs: kernel compilation); no update
    t0 = time.perf_counter()
    system.warm_up(system.prepare([train[i] for i in epoch_order(len(train), cfg.seed, 1)][:cfg.batch_size]))
    sets["warmup_s"] = time.perf_counter() - t0
    best, best_params = None, None
    cum_train = cum_wall = 0.0
    for epoch in range(1, cfg.epochs + 1):
        trees = [train[i] for i in epoch_order(len(train), cfg.seed, epoch)][:cfg.trees_per_epoch]
        batches = [trees[i:i + cfg.batch_size] for i in range(0, len(trees), cfg.batch_size)]
        weights = [sum(vertex_count(s) for s in b) for b in batches]
        bar = tqdm(batches, desc=f"{cfg.system} epoch {epoch}/{cfg.epochs}", unit="batch",
                   disable=not cfg.progress, mininterval=1.0, file=sys.stderr, leave=True)
        loss_sum = 0.0
        done = 0
        t0 = time.perf_counter()
        for k, batch in enumerate(bar):
            loss = system.step(system.prepare(batch))
            loss_sum += loss * weights[k]
            done += weights[k]
            bar.set_postfix(loss=f"{loss_sum / done:.4f}", refresh=False)
        train_s = time.perf_counter() - t0
        bar.close()
        if not np.isfinite(loss_sum):
            raise FloatingPointError(f"{cfg.system}: training loss became {loss_sum} in epoch {epoch}")
        t0 = time.perf_counter()
        probs = predict(system, dev, cfg.eval_batch)
        eval_s = time.perf_counter() - t0
        fine, binary = accuracies(probs, dev_gold)
        cum_train += train_s
        cum_wall += train_s + eval_s
        row = {"system": cfg.system, "epoch": epoch, "epoch_fraction": len(trees) / len(train),
               "trees": len(trees), "train_s": train_s, "eval_s": eval_s, "cum_train_s": cum_train,
               "wall_s": cum_wall, "train_loss": loss_sum / done, "dev_fine": fine, "dev_binary": binary,
               "train_trees_per_s": len(trees) / train_s, "eval_trees_per_s": len(dev) / eval_s, **sets}
        launch.emit({"kind": "epoch", **row})
        if cfg.progress:
            print(f"{cfg.system} epoch {epoch}: loss {row['train_loss']:.4f}  dev fine {fine:.4f}  binary "
                  f"{binary:.4f}  train {train_s:.1f} s ({row['train_trees_per_s']:.1f} trees/s)  "
                  f"dev predict {eval_s:.1f} s ({row['eval_trees_per_s']:.1f} trees/s)", file=sys.stderr, flush=True)
        if best is None or fine > best[1]:
            best, best_params = (epoch, fine), system.get_params()
    system.set_params(best_params)
    t0 = time.perf_counter()
    probs = predict(system, test, cfg.eval_batch)
    test_s = time.perf_counter() - t0
    test_fine, test_binary = accuracies(probs, test_gold)
    return {"kind": "test", "system": cfg.system, "epoch": best[0], "test_fine": test_fine,
            "test_binary": test_binary, "test_eval_s": test_s}


# ---------------------------------------------------------------- the driver

def rows_of(cfg: Config, records: list[dict], status: str, common: dict) -> list[dict]:
    epochs = [r for r in records if r["kind"] == "epoch"]
    test = next((r for r in records if r["kind"] == "test"), None)
    rows = []
    for r in epochs:
        row = {k: v for k, v in r.items() if k != "kind"}
        is_best = test is not None and r["epoch"] == test["epoch"]
        row.update(best_epoch=int(is_best), test_fine="", test_binary="", test_eval_s="")
        if is_best:
            row.update(test_fine=test["test_fine"], test_binary=test["test_binary"], test_eval_s=test["test_eval_s"])
        row.update(common, batch_size=cfg.batch_size, eval_batch=cfg.eval_batch, hidden=cfg.hidden,
                   embed=cfg.embed, lr=cfg.lr, weight_decay=cfg.weight_decay, dtype=cfg.dtype,
                   threads=cfg.threads, seed=cfg.seed, profile=cfg.profile, status=status)
        rows.append(row)
    if not rows:            # a system that failed before its first epoch still leaves a row
        rows.append({"system": cfg.system, "epoch": 0, "profile": cfg.profile, "status": status, **common})
    return rows


def write_csv(path: Path, rows: list[dict], replace_systems: set[str]) -> None:
    """Writes `rows` in place of the file's rows of the same systems."""
    old = [r for r in read_rows(path) if r.get("system") not in replace_systems]
    launch.write_rows(path, [{k: _fmt(r.get(k, "")) for k in COLUMNS} for r in old + rows], list(COLUMNS))


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.1f}"
    return v


def configs(profile: Profile, systems: list[str], overrides: dict) -> list[Config]:
    out = []
    for s in systems:
        epochs, trees = profile.partial.get(s, (profile.epochs, None))
        kw = dict(system=s, profile=profile.name, epochs=epochs, trees_per_epoch=trees,
                  train_limit=profile.train_limit, dev_limit=profile.dev_limit, test_limit=profile.test_limit)
        for k, v in overrides.items():
            if v is None:
                continue
            if k == "epochs" and s in profile.partial:
                continue                # --epochs sets the full runs; partial systems keep theirs
            if k == "partial_trees":
                if s in profile.partial:
                    kw["trees_per_epoch"] = v
                continue
            kw[k] = v
        out.append(Config(**kw))
    return out


def add_arguments(p) -> None:
    p.add_argument("--profile", choices=list(PROFILES), default="cpu", help="quick | cpu | paper (default cpu)")
    p.add_argument("--systems", type=_csv_list, default=list(DEFAULT_SYSTEMS),
                   help=f"comma-separated, of {', '.join(SYSTEMS)} (default: {','.join(DEFAULT_SYSTEMS)})")
    p.add_argument("--threads", type=_threads, default=1, help="compute threads per system (default 1)")
    p.add_argument("--epochs", type=arguments.count, help="epochs of the full runs (default: the profile's)")
    p.add_argument("--partial-trees", type=arguments.count, help="trees per epoch of the partial systems (PyTorch)")
    p.add_argument("--train-limit", type=arguments.count, help="train on N trees spread evenly over train.txt")
    p.add_argument("--dev-limit", type=arguments.count, help="evaluate on N trees spread evenly over dev.txt")
    p.add_argument("--test-limit", type=arguments.count, help="test on N trees spread evenly over test.txt")
    p.add_argument("--hidden", type=arguments.count, help="h (default 150)")
    p.add_argument("--embed", type=arguments.count, help="embedding width (default 300)")
    p.add_argument("--batch-size", type=arguments.count, help="trees per training step (default 25)")
    p.add_argument("--eval-batch", type=arguments.count, help="trees per predict call (default 100)")
    p.add_argument("--seed", type=arguments.count, help="initial weights and epoch order (default 0)")
    p.add_argument("--time-limit", type=arguments.positive, help="seconds per system (default: the profile's)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _csv_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [s for s in names if s not in SYSTEMS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown system(s) {', '.join(bad)}; choose from {', '.join(SYSTEMS)}")
    return names


def _threads(text: str) -> int:
    threads = int(text)
    if threads < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return threads


def main(results_dir: Path, args) -> int:
    profile = PROFILES[args.profile]
    overrides = {"epochs": args.epochs, "partial_trees": args.partial_trees, "train_limit": args.train_limit,
                 "dev_limit": args.dev_limit, "test_limit": args.test_limit, "hidden": args.hidden,
                 "embed": args.embed, "batch_size": args.batch_size, "eval_batch": args.eval_batch,
                 "seed": args.seed, "threads": args.threads, "progress": not args.quiet}
    common = {"git_rev": environment.git_revision(), "run_id": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())}
    path = results_dir / "sst.csv"
    all_rows, ran = [], set()
    for cfg in configs(profile, args.systems, overrides):
        print(f"== {cfg.system}: {cfg.epochs} epoch(s) of "
              f"{cfg.trees_per_epoch or cfg.train_limit or 'all'} trees, h={cfg.hidden}, bs={cfg.batch_size}, "
              f"{cfg.threads} thread(s)", flush=True)
        t0 = time.perf_counter()
        records, status = launch.run_records("experiments.studies", ["sst", "--cell", json.dumps(asdict(cfg))],
                                             threads=cfg.threads, time_limit_s=args.time_limit or profile.time_limit_s)
        all_rows += rows_of(cfg, records, status, common)
        ran.add(cfg.system)
        write_csv(path, all_rows, ran)          # after every system: a later failure loses nothing
        print(f"== {cfg.system}: {status} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(path)
    return 0 if all(r.get("status") == "ok" for r in all_rows) else 1
