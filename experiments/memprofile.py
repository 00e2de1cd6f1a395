"""DyNet's memory-movement time, which DyNet's own timers cannot separate, from sampling its native stacks
with Linux `perf` (Table 2). Used by experiments/cell.py after the timed pass, in an extra untimed pass
over the same batches, so the profiler never touches the reported times.

`perf record -e cpu-clock -g` samples this process's threads (user and kernel stacks, frame pointers)
about 1000 times per CPU second. A sample is memory movement when its innermost DyNet frame is one of
MEMORY_FUNCTIONS (the autobatcher gathering a batched op's inputs into one contiguous tensor, scattering
the batched gradient back to each node; the embedding lookup and its gradient, the counterpart of
Cavs's `pull`), or is the autobatcher's forward/backward loop calling memcpy/memmove (`combine_tensors`
inlined). memory_per_compute = (memory samples / all samples of the pass) x the pass's wall time / its
compute_s; the cell multiplies it by the timed pass's compute_s.
"""
from __future__ import annotations

import os
import shutil
import sys
import signal
import subprocess
import tempfile
import time
from pathlib import Path

MEMORY_FUNCTIONS = ("BatchedExecutionEngine::combine_tensors", "BatchedExecutionEngine::accumulate_tensors",
                    "LookupNode::forward", "LookupNode::backward", "LookupParameterStorage::accumulate_grad")
ENGINE_LOOPS = ("BatchedExecutionEngine::incremental_forward", "BatchedExecutionEngine::backward")
COPIES = ("memmove", "memcpy")
FREQUENCY = 2999        # samples per CPU second: ~3000 in a 1 s cell


def is_memory_movement(frames: list[str]) -> bool:
    """`frames`: a sample's symbols, innermost first. Decided by the innermost DyNet frame."""
    copying = False
    for sym in frames:
        if "dynet::" in sym:
            if any(f in sym for f in MEMORY_FUNCTIONS):
                return True
            return copying and any(f in sym for f in ENGINE_LOOPS)
        if any(c in sym for c in COPIES):
            copying = True
    return False


def parse_script(text: str) -> list[tuple[int, list[str]]]:
    """`perf script -F period,ip,sym` output -> [(period in ns, [symbols, innermost first])]: a sample is
    a header line (its period) followed by tab-indented `address symbol` lines."""
    samples = []
    for line in text.splitlines():
        if line.startswith("\t"):
            if samples:
                parts = line.strip().split(None, 1)
                samples[-1][1].append(parts[1] if len(parts) > 1 else "[unknown]")
        elif line.strip():
            try:
                samples.append((int(line.split()[-1]), []))
            except ValueError:
                continue
    return samples


def _wait_ack(fd, timeout_s=10.0) -> bool:
    import select
    ready, _, _ = select.select([fd], [], [], timeout_s)
    if not ready:
        return False
    return b"ack" in os.read(fd, 64)


def profile(system, batches, perf: str | None = None) -> dict:
    """Runs prepare() + step() over `batches` under `perf record`; returns the memory share, or
    {"memory_per_compute": None, "why": ...} where perf cannot sample here."""
    perf = perf or shutil.which("perf")
    if not perf:
        return {"memory_per_compute": None, "why": "no `perf` on PATH"}
    with tempfile.TemporaryDirectory(prefix="cavs-perf-") as tmp:
        tmp = Path(tmp)
        ctl, ack = tmp / "ctl", tmp / "ack"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        ctl_fd = os.open(ctl, os.O_RDWR)        # kept open: perf stops reading a fifo its writer closed
        ack_fd = os.open(ack, os.O_RDWR)
        log = open(tmp / "perf.log", "w+")
        proc = subprocess.Popen([perf, "record", "-e", "cpu-clock", "-F", str(FREQUENCY), "-g", "-D", "-1",
                                 "--control", f"fifo:{ctl},{ack}", "-p", str(os.getpid()),
                                 "-o", str(tmp / "perf.data")], stdout=log, stderr=subprocess.STDOUT)
        try:
            time.sleep(0.2)
            os.write(ctl_fd, b"enable\n")
            if proc.poll() is not None or not _wait_ack(ack_fd):
                log.seek(0)
                why = f"perf record did not start: {log.read().strip()[-300:] or proc.returncode}"
                print(f"memory profile: {why}", file=sys.stderr)
                return {"memory_per_compute": None, "why": why}
            system.timings.reset()
            t0 = time.perf_counter()
            for batch in batches:
                system.step(system.prepare(batch))
            system.synchronize()
            wall_s, compute_s = time.perf_counter() - t0, system.timings.compute_s
            os.write(ctl_fd, b"disable\n")
            _wait_ack(ack_fd)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            os.close(ctl_fd)
            os.close(ack_fd)
        script = subprocess.run([perf, "script", "-i", str(tmp / "perf.data"), "-F", "period,ip,sym"],
                                capture_output=True, text=True, timeout=300)
        log.seek(0)
        perf_log = log.read()
        log.close()
    samples = parse_script(script.stdout)
    if not samples:
        why = f"perf recorded no samples: {(script.stderr or perf_log).strip()[-300:]}"
        print(f"memory profile: {why}", file=sys.stderr)
        return {"memory_per_compute": None, "why": why}
    memory_ns = sum(p for p, frames in samples if is_memory_movement(frames))
    sampled_ns = sum(p for p, _ in samples)
    # the samples are CPU time, compute_s is wall time: on a shared machine the process is off the CPU
    # part of the time, so the memory share of the sampled CPU time is scaled to the pass's wall time
    memory_wall_s = memory_ns / sampled_ns * wall_s
    return {"memory_per_compute": memory_wall_s / compute_s if compute_s else None,
            "memory_cpu_s": memory_ns / 1e9, "sampled_cpu_s": sampled_ns / 1e9, "profiled_wall_s": wall_s,
            "profiled_compute_s": compute_s,
            "samples": len(samples), "how": f"perf record -e cpu-clock -F {FREQUENCY} -g"}
