"""The engine's own training step against the same step through cavs.torch: what a torch head,
autograd and a torch optimizer around engine.forward / engine.backward cost.

    python -m experiments.studies torch_module             # 512 SST trees, h = 64, 256, 512 (`make torch-bench`)
    python -m experiments.studies torch_module --trees 16 --batch-size 8 --hidden 8 --passes 1 --rounds 1 \\
        --results /tmp/torch-module                        # a quick try

Workload: the first `--trees` (512) SST training trees (file order), batches of `--batch-size` (64),
the WORKLOADS.md Tree-LSTM (embedding width 300, 5 classes) from the same initial weights
(cavs.models.build, seed 0), every vertex labelled. Cells, per h:

  engine  engine.step(batch): the built-in softmax head and cross-entropy (mean over the labelled
          vertices), cavs.optim.SGD(lr=0.1), the embedding updated on the rows read
  module  cavs.torch.VertexModule(model, sparse=True)(batch); a torch nn.Linear head (Wout^T, bout)
          and F.cross_entropy (the same mean); loss.backward() (engine.backward through autograd);
          torch.optim.SGD(lr=0.1) on the module's and the head's parameters, the embedding's gradient
          sparse (the rows read), so both update the same entries

The same math: both runs give the same losses (first_loss, last_loss). Neither clips (torch's
clip_grad_norm_ takes no sparse gradient). Each cell runs in its own one-thread process
(launch.run) with flush-to-zero as the sweeps set it ($CAVS_FTZ); the batches are built before the
clock and each is stepped once untimed (kernels, plans, buffers); then `--passes` (2) timed passes
over all batches, the fastest kept. The cells run in `--rounds` (3) interleaved rounds (h by h, the
engine then the module), each keeping its fastest round. Writes RESULTS/torch_module.csv (with the
git revision; `module_over_engine` on the module's rows) and prints the ratio per h.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from .. import arguments, environment, launch

CELLS = ("engine", "module")
LR = 0.1
FIELDS = ["cell", "hidden", "trees", "batch_size", "batches", "passes", "rounds", "best_s", "pass_s", "step_ms",
          "module_over_engine", "first_loss", "last_loss", "blas", "ftz", "status", "git_rev"]


def add_arguments(ap) -> None:
    ap.add_argument("--trees", type=arguments.count, default=512, help="SST training trees, file order (default 512)")
    ap.add_argument("--hidden", type=arguments.counts, default=[64, 256, 512], help="comma-separated h (default 64,256,512)")
    ap.add_argument("--batch-size", type=arguments.count, default=64, help="trees per step (default 64)")
    ap.add_argument("--passes", type=arguments.count, default=2, help="timed passes per cell process (fastest kept)")
    ap.add_argument("--rounds", type=arguments.count, default=3, help="interleaved rounds over the cells (fastest kept)")
    ap.add_argument("--timeout", type=arguments.count, default=1800, help="seconds per cell")


# ---------------------------------------------------------------- one cell (in its own process)

def engine_step(model):
    import cavs
    engine = cavs.Engine(model, threads=1, optimizer=cavs.optim.SGD(lr=LR))
    return engine.step, engine.backend.blas


def module_step(model, batches):
    import torch
    import torch.nn.functional as F

    import cavs.torch
    torch.sparse.check_sparse_tensor_invariants.disable()    # (torch warns on sparse updates unless told)
    module = cavs.torch.VertexModule(model, sparse=True, threads=1)
    head = torch.nn.Linear(*model.param_shapes["Wout"])
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(module.engine.params["Wout"]).T)
        head.bias.copy_(torch.as_tensor(module.engine.params["bout"]))
    opt = torch.optim.SGD([*module.parameters(), *head.parameters()], lr=LR)
    targets = {}                  # per batch, before the clock: its labelled rows (None: all) and labels
    for b in batches:
        labels = torch.as_tensor(b.forest.labels)
        rows = None if bool((labels >= 0).all()) else torch.nonzero(labels >= 0).squeeze(1)
        targets[id(b)] = (rows, labels if rows is None else labels[rows])

    def step(batch):
        rows, y = targets[id(batch)]
        out = module(batch)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(head(out if rows is None else out[rows]), y)
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step, f"{module.engine.backend.blas}; head: torch"


def cell(spec: dict) -> dict:
    ftz = environment.ftz_requested()               # $CAVS_FTZ, the harness's setting (default on)
    environment.set_flush_denormals(ftz)            # first, before any framework starts a thread
    launch.pin_threads(1)
    import numpy as np
    import cavs
    model = cavs.models.build("tree_lstm", hidden=spec["hidden"])
    samples = cavs.datasets.load_samples("tree_lstm", "train", limit=spec["trees"])
    bs = spec["batch_size"]
    batches = [model.make_batch(samples[i:i + bs]) for i in range(0, len(samples) - bs + 1, bs)] \
        or [model.make_batch(samples)]
    step, blas = engine_step(model) if spec["cell"] == "engine" else module_step(model, batches)
    environment.set_flush_denormals(ftz)            # whatever torch set
    first_loss = [step(b) for b in batches][0]      # untimed: kernels, plans, buffers
    best, passes, losses = float("inf"), [], []
    for _ in range(spec["passes"]):
        t0 = time.perf_counter()
        losses = [step(b) for b in batches]
        elapsed = time.perf_counter() - t0
        passes.append(round(elapsed, 4))
        best = min(best, elapsed)
    return {"cell": spec["cell"], "hidden": spec["hidden"], "trees": sum(b.num_samples for b in batches),
            "batch_size": bs, "batches": len(batches), "passes": spec["passes"],
            "best_s": round(best, 4), "pass_s": " ".join(map(str, passes)),
            "step_ms": round(best / len(batches) * 1e3, 3), "first_loss": round(float(first_loss), 6),
            "last_loss": round(float(np.mean(losses)), 6), "blas": blas, "ftz": ftz, "status": "ok"}


# ---------------------------------------------------------------- the driver

def table(rows: list[dict]) -> str:
    lines = [f"{'h':>5} {'cell':7} {'best s':>8} {'ms/step':>8} {'first loss':>11} {'last loss':>10} "
             f"{'module/engine':>13}  status"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"{r['hidden']:5d} {r['cell']:7} {r.get('status')}")
            continue
        ratio = f"{r['module_over_engine']:.3f}" if r.get("module_over_engine") != "" else ""
        lines.append(f"{r['hidden']:5d} {r['cell']:7} {r['best_s']:8.3f} {r['step_ms']:8.2f} {r['first_loss']:11.6f} "
                     f"{r['last_loss']:10.6f} {ratio:>13}  ok")
    return "\n".join(lines)


def main(results_dir: Path, args) -> int:
    rev, best = environment.git_revision(), {}
    for round_ in range(args.rounds):
        for h in args.hidden:
            for name in CELLS:
                spec = {"cell": name, "hidden": h, "trees": args.trees, "batch_size": args.batch_size,
                        "passes": args.passes}
                r = {"cell": name, "hidden": h, **launch.run("experiments.studies", ["torch_module", "--cell",
                                                                                       json.dumps(spec)],
                                                               time_limit_s=args.timeout)}
                print(f"round {round_ + 1} h={h} {name}: {r.get('best_s', '')} s ({r.get('status')})", flush=True)
                launch.keep_fastest(best, (h, name), r, "best_s")
    rows = []
    for h in args.hidden:
        engine, module = best[(h, "engine")], best[(h, "module")]
        both = engine.get("status") == "ok" and module.get("status") == "ok"
        module["module_over_engine"] = round(module["best_s"] / engine["best_s"], 4) if both else ""
        engine["module_over_engine"] = ""
        rows += [{**r, "rounds": args.rounds, "git_rev": rev} for r in (engine, module)]
    out = launch.write_rows(results_dir / "torch_module.csv", rows, FIELDS)
    print(table(rows))
    print(f"wrote {out}")
    return 0 if all(r.get("status") == "ok" for r in rows) else 1
