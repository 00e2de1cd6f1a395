"""Wall time of one sweep with the local executor and on a local Ray cluster of N one-CPU worker nodes.

    python -m experiments.studies ray_walltime [--experiment fig8] [--profile quick] [--systems cavs] [--workers 2]

Runs the sweep twice into fresh temporary directories (nothing under results/ is touched): first cell by
cell here, then as Ray tasks on a cluster of a head node (no CPUs for cells) and `--workers` nodes of one
CPU each (ray.cluster_utils.Cluster, all on this machine). Prints the wall times, the cluster's start-up
time apart, and whether both sweeps gave the same cells and statuses.
"""
from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from .. import arguments, executors, machine, results, runner
from ..profiles import PROFILES, get_profile
from ..registry import EXPERIMENTS, get_experiment


def statuses(results_dir: Path, experiment: str) -> dict[str, str]:
    return {r["cell_id"]: r["status"] for r in results.read_rows(results.csv_path(results_dir, experiment))}


def add_arguments(parser) -> None:
    parser.add_argument("--experiment", default="fig8", choices=list(EXPERIMENTS))
    parser.add_argument("--profile", default="quick", choices=list(PROFILES))
    parser.add_argument("--systems", default=["cavs"], type=arguments.items, help="comma-separated (default: cavs)")
    parser.add_argument("--panels", type=arguments.items, help="comma-separated subset of panels (default: all)")
    parser.add_argument("--workers", type=arguments.count, default=2, help="one-CPU worker nodes of the Ray cluster")


def main(results_dir: Path, args) -> int:
    """results_dir is not written: both sweeps measure into temporary directories."""
    exp, profile = get_experiment(args.experiment), get_profile(args.profile)
    systems, panels = args.systems, args.panels
    unknown = arguments.not_in_experiment(exp, systems, panels)
    if unknown:
        print(f"ray_walltime: {exp.name}: {unknown}", file=sys.stderr)
        return 2
    ray = executors.import_ray()
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with tempfile.TemporaryDirectory(prefix="cavs-walltime-") as tmp:
        local_dir, ray_dir = Path(tmp) / "local", Path(tmp) / "ray"
        t0 = time.perf_counter()
        local = runner.run(exp, profile, local_dir, systems=systems, panels=panels, progress=False)
        local_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                                 "object_store_memory": 80 * 2**20})
        for _ in range(args.workers):
            cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        cluster.wait_for_nodes()
        start_s = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            through_ray = runner.run(exp, profile, ray_dir, systems=systems, panels=panels, progress=False,
                                     executor=executors.RayExecutor())
            ray_s = time.perf_counter() - t0
        finally:
            ray.shutdown()
            cluster.shutdown()
        same = statuses(local_dir, exp.name) == statuses(ray_dir, exp.name)

    cells = sum(v for k, v in local.items() if k != "already measured")
    what = f"{exp.name} --profile {profile.name}" + (f" --systems {','.join(systems)}" if systems else "") \
        + (f" --panels {','.join(panels)}" if panels else "")
    print(f"sweep: {what}, {cells} cells; machine: {machine.label(machine.kind())} "
          f"({platform.node()}, load average {os.getloadavg()[0]:.1f} at the end)")
    print(f"local executor:                       {local_s:7.1f} s   {local}")
    print(f"Ray, {args.workers} one-CPU worker nodes:          {ray_s:7.1f} s   {through_ray}"
          f"   (+{start_s:.1f} s to start the cluster)")
    print(f"speedup: {local_s / ray_s:.2f}x; same cells and statuses: {same}")
    return 0 if same else 1
