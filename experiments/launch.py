"""How every measurement process is started, pinned and read back: the sweeps' cells (runner,
executors, ci_bench) and the studies' (experiments/studies/) use these helpers alone.

- `env(threads)`: the environment of a measuring process, every BLAS and OpenMP pool pinned to
  `threads` (and `root`'s packages first on its path, for a checkout of another commit).
- `pin_threads(threads)`: the same inside a process that is already running (threadpoolctl, torch).
- `die_with_parent()`: first call of a measuring process; it dies when the process that started it
  dies, even by SIGKILL (PR_SET_PDEATHSIG), so a killed driver leaves no cell running behind it.
- `emit(result)` / `run(...)`: a measuring process prints one `CELL_RESULT {json}` line; `run`
  starts one (`python -m MODULE ARGS...`) in its own process group under a time limit, keeps its
  stderr in a log, and returns that result, or {"status": "failed: ..."} / {"status": "timeout"}.
- `run_records(...)`: the same for a process that reports as it goes (SST's epochs): every result
  line it printed, and how it ended; its progress on stderr passes through.
- `file_order_cell(...)` / `keep_fastest(...)`: the sweep cell a study times a system with (bench,
  policies), and the fastest of a study's interleaved rounds.
- `write_rows(path, rows)`: a study's CSV, written whole to a temporary file and renamed over.
"""
from __future__ import annotations

import csv
import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT_MARK = "CELL_RESULT "
EXTRA_MARK = "CELL_EXTRA "
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "NUMBA_NUM_THREADS")
# unset in benchmark cells (see env): the machine's pins of OpenBLAS's kernel set
NATIVE_BLAS_UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
PR_SET_PDEATHSIG = 1
PARENT_VAR = "CAVS_PARENT_PID"         # the launching process's pid, for die_with_parent


def env(threads: int = 1, root: Path | None = None, base: dict | None = None, native_blas: bool = True) -> dict:
    """The environment of a measuring process: `base` (default os.environ) with every thread pool
    pinned to `threads`; with `root`, that checkout's packages come first on the import path. With
    `native_blas` (benchmark cells, for every system alike), OpenBLAS picks its kernels for the CPU
    it finds: these machines set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for old OpenBLAS builds, which
    hold a current NumPy to its Haswell (AVX2) kernels. Tests and CI keep the machine's setting."""
    out = dict(os.environ if base is None else base, **{v: str(threads) for v in THREAD_VARS})
    if native_blas:
        for var in NATIVE_BLAS_UNSET:
            out.pop(var, None)
    if root is not None:          # a checkout's packages before the editable install's (this one)
        out["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [out.get("PYTHONPATH")] if p])
    return out


def pin_threads(threads: int = 1) -> None:
    """Pins this process's BLAS/OpenMP pools (threadpoolctl) and PyTorch's intra-op pool, and sets
    THREAD_VARS so that a pool loaded afterwards starts pinned too: threadpoolctl reaches only the
    libraries already loaded, and NumPy's OpenBLAS, loaded by a later `import numpy`, read its
    thread count from the environment and ran at two threads on these VMs."""
    os.environ.update({v: str(threads) for v in THREAD_VARS})
    from threadpoolctl import threadpool_limits
    threadpool_limits(threads)
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return
    torch.set_num_threads(threads)


def die_with_parent() -> None:
    """This process gets SIGKILL when its parent dies (Linux); exits at once if it already has
    (`run` passes its pid in PARENT_VAR: an orphan may be adopted by a subreaper, not by pid 1)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    expected = os.environ.get(PARENT_VAR)
    if (expected and os.getppid() != int(expected)) or os.getppid() == 1:
        os._exit(1)                        # the parent died before prctl took effect


def emit(result: dict, extra: dict | None = None) -> None:
    """A measuring process's answer: its extra details, then its result line (the last one counts)."""
    if extra is not None:
        print(EXTRA_MARK + json.dumps(extra), flush=True)
    print(RESULT_MARK + json.dumps(result), flush=True)


def parse(stdout: str) -> dict | None:
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARK)]
    return json.loads(lines[-1][len(RESULT_MARK):]) if lines else None


def run(module: str, args: list[str], *, threads: int = 1, time_limit_s: float | None = None,
        log: Path | None = None, root: Path | None = None, environ: dict | None = None,
        native_blas: bool = True) -> dict:
    """`python -m module *args` from checkout `root` (default: this one) in its own process group,
    pinned to `threads`; its result line, or why there is none. stderr goes to `log` (kept only when
    the result is not ok) or, without one, is read back for the reason of a failure."""
    cmd = [sys.executable, "-m", module, *args]
    where = root or REPO
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    err = open(log, "w") if log is not None else subprocess.PIPE
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**env(threads, root, environ, native_blas), PARENT_VAR: str(os.getpid())},
                                start_new_session=True, cwd=where)
        try:
            out, stderr = proc.communicate(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)       # the cell and any workers it started
            proc.communicate()
            return {"status": "timeout"}
        finally:
            if proc.poll() is None:                    # the driver itself is being stopped
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if log is not None:
            err.close()
    result = parse(out)
    if result is None:
        if proc.returncode == -signal.SIGKILL:
            result = {"status": "failed: killed by SIGKILL (out of memory?)"}
        else:
            text = log.read_text(errors="replace") if log is not None else (stderr or "")
            tail = text.strip().splitlines()[-1:] or [""]
            result = {"status": f"failed: exit code {proc.returncode}: {tail[0]}"[:300]}
    if log is not None and result.get("status") == "ok":
        log.unlink(missing_ok=True)                    # logs are kept for failed cells only
    return result


def run_cell(cell: dict, time_limit_s: float, log_dir: Path, root: Path | None = None,
             native_blas: bool = True) -> dict:
    """One sweep cell (`python -m experiments.cell SPEC`) in a fresh process: its result fields
    (status = ok / failed: why / timeout). `root`: the checkout whose harness and engine it imports
    (default: this one; `make bench-ci` runs the baseline commit's from a worktree, with the
    machine's BLAS setting: CI keeps it)."""
    return run("experiments.cell", [json.dumps(cell)], threads=cell["threads"], time_limit_s=time_limit_s,
               log=Path(log_dir) / f"{cell['cell_id']}.log", root=root, native_blas=native_blas)


PREPARE_LIMIT_S = 3600       # building a sweep's models once, the engine's measurements included


def model_key(cell: dict) -> tuple:
    """What a cell's model build measures the machine for: its system, workload, size and options."""
    return (cell["system"], cell["workload"], cell["hidden"], cell["leaves"], json.dumps(cell["options"], sort_keys=True))


def prepare_models(cells: list[dict], threads: int, log: Path) -> dict:
    """Builds the models of `cells` once, in one process at `threads` (`experiments.cell --prepare`),
    with an hour's limit: a system that measures the machine at its first construction (the engine's
    GEMM choice, registry.MEASURED_ONCE) caches the measurement there, outside the cells' limits."""
    distinct = list({model_key(c): c for c in cells}.values())
    return run("experiments.cell", ["--prepare", json.dumps(distinct)], threads=threads,
               time_limit_s=PREPARE_LIMIT_S, log=log)


def run_records(module: str, args: list[str], *, threads: int = 1,
                time_limit_s: float) -> tuple[list[dict], str]:
    """`python -m module *args` as run() starts it, for a process that prints a result line per step
    it finishes: those results in order, and how it ended (ok / timeout / failed: exit code N); what it
    reported before a timeout or a crash is kept. Its stderr (progress bars) passes through and its
    other output is echoed as it comes."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True,
                            env=env(threads), start_new_session=True, cwd=REPO)
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(time_limit_s, kill)
    timer.start()
    records = []
    try:
        for line in proc.stdout:
            if line.startswith(RESULT_MARK):
                records.append(json.loads(line[len(RESULT_MARK):]))
            else:
                sys.stdout.write(line)
        returncode = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:                        # the driver itself is being stopped
            os.killpg(proc.pid, signal.SIGKILL)
    if timed_out.is_set():
        return records, "timeout"
    return records, "ok" if returncode == 0 else f"failed: exit code {returncode}"


def file_order_cell(system: str, workload: str, hidden: int, samples: int, options: dict, repeats: int,
                    leaves: int = 256, threads: int = 1) -> dict:
    """The sweep cell the studies time a system with (bench, policies): training on the first
    `samples` samples of the file in batches of 64, `threads` compute threads, the largest batch
    stepped untimed first (buffers sized by the batch reach their maximum before the clock starts,
    for every system alike), then the fastest of `repeats` passes (run it with run_cell)."""
    name = "-".join([system, workload, f"h{hidden}", f"n{samples}", f"t{threads}",
                     *(f"{k}={v}" for k, v in sorted(options.items()))])
    return {"cell_id": name, "system": system, "workload": workload, "hidden": hidden, "batch_size": 64,
            "mode": "train", "threads": threads, "leaves": leaves, "device": "cpu", "options": options,
            "samples": samples, "warmup_batches": 1, "repeats": repeats, "order": "file", "warmup": "largest"}


def keep_fastest(best: dict, key, result: dict, time_field: str = "total_s") -> None:
    """Keeps in best[key] the faster of the result there and `result`; a result without the time
    (a failed one) counts as the slowest, so it stays only while no round has succeeded."""
    slowest = float("inf")
    if key not in best or result.get(time_field, slowest) < best[key].get(time_field, slowest):
        best[key] = result


def write_rows(path: Path, rows: list[dict], fields: list[str] | None = None) -> Path:
    """A study's CSV: `rows` under `fields` (default: every key, in first-seen order), written to a
    temporary file and renamed over, so a reader never sees half a file."""
    path = Path(path)
    fields = fields or list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(buf.getvalue())
    os.replace(tmp, path)
    return path
