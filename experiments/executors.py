"""Where a sweep's cells run: here, one at a time (`local`, the default), or as Ray tasks on a cluster (`ray`).

Either way each cell is the same `python -m experiments.cell` subprocess (launch.run_cell) under its time
limit, and only the driver (the process running `python -m experiments run`) writes the results: a cell's
row is appended when its result reaches the driver. With Ray:

- each cell is one task (`@ray.remote`) asking for the resources its cell uses: CPUs = its threads, and one
  GPU on a cuda cell, so cells that Ray places on one node never share a core or a GPU;
- a worker or node that dies mid-cell has measured nothing yet: Ray runs the task again (`max_retries`),
  and a cell whose retries run out is recorded as failed with Ray's reason; the cell subprocess dies with
  its worker (experiments/cell.py sets PR_SET_PDEATHSIG);
- the nodes that can run cells must all be of one machine kind (checked first, by one probe task pinned
  to each node, which also warns about a node whose checkout is at another revision than the driver's);
  each row records its node and kind;
- at most as many cells are in flight as the cluster can run at once, so the sweep's time budget still
  decides which cells start;
- a cell whose system measures the machine at its first use (registry.MEASURED_ONCE, the engine's GEMM
  choice) has its model built on the node first, outside its limit, as the local runner builds every
  model before the cells.

Ray is optional (`pip install -e '.[cluster]'`); nothing here imports it until `--executor ray` is used.
"""
from __future__ import annotations

import fcntl
import os
import sys
import tempfile
from pathlib import Path

from . import environment, launch, machine, registry

RAY_INSTALL = ("the ray executor needs Ray: `.venv/bin/pip install -e '.[cluster]'` "
               "(or `pip install 'ray[client]==2.60.0'`)")
MAX_RETRIES = 2          # a task whose worker or node died runs again this many times


class LocalExecutor:
    """Cells one after another in subprocesses of this process."""
    name = "local"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def describe(self) -> str:
        return f"this machine ({machine.node()})"

    def kind(self) -> dict:
        return machine.kind()

    def gpu_present(self) -> bool:
        return machine.gpu_present()

    def environment(self, threads: int, profile: str) -> dict:
        return environment.collect(threads, profile)

    def check(self, threads: int, device: str, git_rev: str) -> dict:
        return self.kind()

    def run(self, cells, limit_s: float, log_dir: Path, may_start):
        """Yields (cell, result) as cells finish; starts no cell for which may_start(cell) is False."""
        ours = machine.label(machine.kind())
        for cell in cells:
            if not may_start(cell):
                return
            result = launch.run_cell(cell, limit_s, log_dir)
            yield cell, {**result, "node": machine.node(), "machine": ours}


# ---------------------------------------------------------------- Ray

def import_ray():
    try:
        import ray
    except ImportError:
        sys.exit(RAY_INSTALL)
    return ray


def _probe(threads: int, profile: str) -> dict:
    """Runs on a node: its name, kind and code revision."""
    return {"node": machine.node(), "kind": machine.kind(), "git_rev": environment.git_revision()}


_BUILT: set = set()          # in a Ray worker: the models it has built (launch.model_key)


def _build_on_node(cell: dict, tmp: Path) -> None:
    """Builds the cell's model before its timed run, outside its limit (launch.prepare_models), once
    per model in this worker; one build at a time on the node (a file lock), so that a second worker
    finds the first's measurements cached instead of measuring beside it."""
    key = launch.model_key(cell)
    if key in _BUILT:
        return
    with open(Path(tempfile.gettempdir()) / "cavs-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        launch.prepare_models([cell], cell["threads"], tmp / "prepare.log")
    _BUILT.add(key)          # built or failed: a failed build leaves the cell to measure, as locally


def _cell_task(cell: dict, limit_s: float, build_first: bool = False) -> dict:
    """Runs on a node: one cell, as locally; its log (failed cells only) travels back with the result.
    `build_first`: the cell's system measures the machine at its first use (registry.MEASURED_ONCE),
    so its model is built first on this node (_build_on_node), as the local runner builds it before
    the cells (runner._prepare)."""
    with tempfile.TemporaryDirectory(prefix="cavs-cell-") as tmp:
        if build_first:
            _build_on_node(cell, Path(tmp))
        result = launch.run_cell(cell, limit_s, Path(tmp))
        log = Path(tmp) / f"{cell['cell_id']}.log"
        text = log.read_text(errors="replace") if log.exists() else None
    return {**result, "node": machine.node(), "machine": machine.label(machine.kind()), "_log": text}


def task_resources(cell: dict) -> dict:
    """What one cell's task asks Ray for: its threads' cores, and a GPU on a cuda cell."""
    return {"num_cpus": cell["threads"], "num_gpus": 1 if cell["device"] == "cuda" else 0}


def ray_failure(exc: BaseException) -> str:
    """A cell whose task failed in Ray (retries spent): its status."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"failed: ray: {type(exc).__name__}: {first}"[:300]


class RayExecutor:
    """Cells as Ray tasks. address None starts a Ray instance on this machine (all its cores),
    'auto' joins the cluster this machine belongs to (`ray start`), 'ray://host:10001' is a Ray client."""
    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, max_retries: int = MAX_RETRIES):
        self.address, self.num_cpus, self.max_retries = address, num_cpus, max_retries
        self.ray = import_ray()
        self._started = False

    def __enter__(self):
        self._connect()
        return self

    def _connect(self):
        """Joins (or starts) Ray on first use; entering the executor is needed only to shut down what it started."""
        ray = self.ray
        if getattr(self, "_task", None) is not None and ray.is_initialized():
            return
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")      # no usage reports to the network
        if not ray.is_initialized():
            kwargs = dict(log_to_driver=False, logging_level="WARNING")
            if self.address is None:          # a private instance: no dashboard, small object store
                kwargs.update(num_cpus=self.num_cpus, include_dashboard=False, object_store_memory=100 * 2**20)
            # "local": a new instance even where a cluster was started with `ray start` on this machine
            ray.init(address=self.address or "local", **kwargs)
            self._started = True
        self._task = ray.remote(max_retries=self.max_retries, retry_exceptions=False)(_cell_task)
        self._probe = ray.remote(num_cpus=0, max_retries=MAX_RETRIES)(_probe)

    def __exit__(self, *exc):
        if self._started:
            self.ray.shutdown()
            self._started, self._task = False, None
        return False

    def describe(self) -> str:
        return f"the Ray cluster at {self.address or 'a local instance'}"

    def _nodes(self, threads: int = 1, device: str = "cpu") -> list[dict]:
        """Alive nodes with room for one cell."""
        self._connect()
        need_gpu = device == "cuda"
        return [n for n in self.ray.nodes() if n.get("Alive")
                and n["Resources"].get("CPU", 0) >= threads and (not need_gpu or n["Resources"].get("GPU", 0) >= 1)]

    def gpu_present(self) -> bool:
        self._connect()
        return any(n["Resources"].get("GPU", 0) >= 1 for n in self.ray.nodes() if n.get("Alive"))

    def _probe_nodes(self, threads: int, device: str) -> list[dict]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        nodes = self._nodes(threads, device)
        if not nodes:
            biggest = max((n["Resources"].get("CPU", 0) for n in self.ray.nodes() if n.get("Alive")), default=0)
            sys.exit(f"no node of {self.describe()} can run a cell of {threads} thread(s)"
                     + (" and one GPU" if device == "cuda" else "") + f" (the most CPUs a node offers: {biggest:g})")
        self._cell_nodes = [n["NodeID"] for n in nodes]
        refs = [self._probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(threads, "") for n in nodes]
        return self.ray.get(refs)

    def kind(self, threads: int = 1, device: str = "cpu") -> dict:
        return machine.check_nodes({p["node"]: p["kind"] for p in self._probe_nodes(threads, device)})

    def check(self, threads: int, device: str, git_rev: str) -> dict:
        """The kind of the nodes that will run cells (stops when they differ); warns when a node's
        checkout is at another code revision than the driver's (the rows record the driver's)."""
        probes = self._probe_nodes(threads, device)
        kind = machine.check_nodes({p["node"]: p["kind"] for p in probes})
        other = sorted({f"{p['node']} is at {p['git_rev']}" for p in probes if p["git_rev"] != git_rev})
        if other:
            print(f"warning: the rows record the driver's revision {git_rev}, but {'; '.join(other)}: "
                  f"check out the same revision on every node", file=sys.stderr)
        return kind

    def environment(self, threads: int, profile: str) -> dict:
        """environment.json from a node that runs cells (the first one check() probed), not from the driver."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        self._connect()
        nodes = getattr(self, "_cell_nodes", None) or [n["NodeID"] for n in self._nodes(threads)]
        collect = self.ray.remote(num_cpus=0)(environment.collect).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[0], soft=True))
        return self.ray.get(collect.remote(threads, profile))

    def slots(self, threads: int, device: str) -> int:
        """Cells the cluster runs at once."""
        per = [int(n["Resources"].get("CPU", 0) // threads) if device != "cuda"
               else int(min(n["Resources"].get("CPU", 0) // threads, n["Resources"].get("GPU", 0)))
               for n in self._nodes(threads, device)]
        return max(1, sum(per))

    def run(self, cells, limit_s: float, log_dir: Path, may_start):
        """Yields (cell, result) in the order cells finish. Keeps at most `slots` tasks in flight, so
        that may_start (the sweep budget) is asked when a cell could really start."""
        ray = self.ray
        self._connect()
        cells = list(cells)
        if not cells:
            return
        slots = self.slots(cells[0]["threads"], cells[0]["device"])
        pending, queue, stopped = {}, iter(cells), False
        try:
            while True:
                while not stopped and len(pending) < slots:
                    cell = next(queue, None)
                    if cell is None or not may_start(cell):
                        stopped = True
                        break
                    build_first = cell["system"] in registry.MEASURED_ONCE and cell["device"] == "cpu"
                    pending[self._task.options(**task_resources(cell)).remote(cell, limit_s, build_first)] = cell
                if not pending:
                    return
                ready, _ = ray.wait(list(pending), num_returns=1)
                cell = pending.pop(ready[0])
                try:
                    result = ray.get(ready[0])
                except Exception as exc:        # retries spent: the worker or node kept dying, or Ray failed
                    result = {"status": ray_failure(exc), "_log": f"{type(exc).__name__}: {exc}"}
                log = result.pop("_log", None)
                if log is not None and result["status"] != "ok":
                    log_dir.mkdir(parents=True, exist_ok=True)
                    (log_dir / f"{cell['cell_id']}.log").write_text(log)
                yield cell, result
        finally:
            for ref in pending:               # the driver stops (budget, Ctrl-C): its cells stop too
                ray.cancel(ref, force=True)


def make(name: str = "local", address: str | None = None):
    if name == "local":
        if address:
            raise ValueError("--address is for the ray executor")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address)
    raise ValueError(f"unknown executor {name!r}; known: local, ray")
