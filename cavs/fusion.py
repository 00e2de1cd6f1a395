"""Kernel fusion: groups of directly linked elementwise ops of F or dF become one kernel each.

Union-find over the dataflow edges between elementwise ops (ops.py: those with an `expr`) of
the same phase and the same width finds the largest linked groups; a group whose members are
linked through an op outside it (a path that leaves and re-enters) is split, so a group can run
as one step. Each group is rendered from the ops' expression templates into one kernel that
reads its external inputs and writes only the values something outside the group reads (the
rest stay in registers): a Numba loop on the CPU, a `cupy.ElementwiseKernel` on the GPU.
On the CPU, a group of per-edge ops reads a `kids.broadcast(x)` input through the edges' parent
index (row parent[e] of x) instead of a materialized copy of x on every edge; the per-edge ops
that read one broadcast are fused together even where they are not otherwise linked, and one
such op alone is a kernel too (find_groups' `broadcasts`).
Compiled CPU kernels persist across processes in a kernel cache on disk (see compile_numba);
CuPy keeps its own (~/.cupy/kernel_cache).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import re
import sys
import uuid
from pathlib import Path
from dataclasses import dataclass, field

from .ops import OPS, Node


@dataclass(eq=False)
class FusedGroup:
    nodes: list[Node]        # in topological order
    inputs: list[Node]       # values read from outside the group (vertex tensors or parameters)
    outputs: list[Node]      # members read outside the group: materialized
    width: int
    passes: dict = field(default_factory=dict)   # member -> index of the input it passes through
                                                  # (an add whose other input is zero here)


def _find(parent, x):
    while parent[x] is not x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def find_groups(nodes: list[Node], consumers: dict[Node, list[Node]], broadcasts: bool = False) -> list[FusedGroup]:
    """Largest groups (2+ ops) of linked elementwise ops among `nodes` (one phase of F or dF).
    With `broadcasts` (the CPU's kernels read them through the parent index): the ops reading
    one broadcast are linked too, and one op reading a broadcast is a group by itself."""
    fusable = [n for n in nodes if OPS[n.op].elementwise]
    member = set(fusable)
    parent = {n: n for n in fusable}
    for n in fusable:
        for i in n.inputs:
            if i in member and i.shape == n.shape and i.domain == n.domain:
                parent[_find(parent, i)] = _find(parent, n)
    if broadcasts:
        for b in {i for n in fusable for i in n.inputs if i.op == "broadcast"}:
            readers = [c for c in consumers.get(b, []) if c in member and c.shape == b.shape]
            for c in readers[1:]:
                parent[_find(parent, c)] = _find(parent, readers[0])
    groups: dict[Node, list[Node]] = {}
    for n in fusable:
        groups.setdefault(_find(parent, n), []).append(n)
    out = []
    for members in groups.values():
        for part in _convex_parts(members, consumers):
            if _worth_a_kernel(part, broadcasts):
                out.append(describe(part, consumers))
    return out


def _worth_a_kernel(part: list[Node], broadcasts: bool) -> bool:
    return len(part) > 1 or (broadcasts and any(i.op == "broadcast" for m in part for i in m.inputs))


def reads_broadcast(group: "FusedGroup") -> bool:
    return any(i.op == "broadcast" for i in group.inputs)


# Numba's compile time grows much faster than a kernel's length: a child-sum Tree-LSTM over 22
# child slots fused into 90-op kernels took 15 s per kernel. Larger groups are cut into runs of
# this many members in topological order (each run stays convex: a path from a run to a later
# run cannot come back). The paper's four cells have groups of 4-17 members.
MAX_MEMBERS = 24


def bounded(groups: list[FusedGroup], consumers, limit: int = MAX_MEMBERS, broadcasts: bool = False) -> list[FusedGroup]:
    out = []
    for g in groups:
        if len(g.nodes) <= limit:
            out.append(g)
            continue
        for k in range(0, len(g.nodes), limit):
            part = g.nodes[k:k + limit]
            if _worth_a_kernel(part, broadcasts):
                out.append(describe(part, consumers))
    return out


def _convex_parts(members: list[Node], consumers) -> list[list[Node]]:
    """The group itself, or its members one by one when a path leaves it and re-enters (then it
    could not run as one step; none of the paper's four cells has such a group)."""
    inside = set(members)
    reach_out: set[Node] = set()       # outside nodes reachable from the group
    stack = [c for m in members for c in consumers.get(m, []) if c not in inside]
    while stack:
        n = stack.pop()
        if n not in reach_out:
            reach_out.add(n)
            stack.extend(consumers.get(n, []))
    if any(i in reach_out for m in members for i in m.inputs):
        return [[m] for m in members]
    return [members]


def describe(members: list[Node], consumers, passes: dict | None = None) -> FusedGroup:
    """The group of `members` (topologically ordered): what it reads and what it must write.
    `passes` {member: k}: that member is its input k (support.PASS), reading nothing else."""
    passes = passes or {}
    inside = set(members)
    inputs: list[Node] = []
    for m in members:
        for i in ([m.inputs[passes[m]]] if m in passes else m.inputs):
            if i not in inside and i not in inputs:
                inputs.append(i)
    outputs = [m for m in members if any(c not in inside for c in consumers.get(m, []))]
    return FusedGroup(members, inputs, outputs, members[0].shape[0], passes)


def contracted_order(nodes: list[Node], groups: list[FusedGroup]) -> list:
    """`nodes` in a topological order where each group is one item (a FusedGroup)."""
    group_of = {m: g for g in groups for m in g.nodes}
    item = lambda n: group_of.get(n, n)                       # noqa: E731
    items = list(dict.fromkeys(item(n) for n in nodes))
    position = {it: k for k, it in enumerate(items)}
    deps = {it: set() for it in items}
    for n in nodes:
        for i in n.inputs:
            if i in position or i in group_of:
                if item(i) is not item(n) and item(i) in deps:
                    deps[item(n)].add(item(i))
    order, done = [], set()
    while len(order) < len(items):       # Kahn's algorithm, keeping the original order on ties
        nxt = next(it for it in items if it not in done and deps[it] <= done)
        order.append(nxt)
        done.add(nxt)
    return order


def _literal(value) -> str:
    """An attribute as a literal of the kernel source: floats with a decimal point (see _CONSTANT)."""
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    return str(value)


def expression_lines(group: FusedGroup, ref) -> list[str]:
    """One assignment per member: `v<id> = <template over its inputs and attributes>`; ref(k, node)
    names input k."""
    local = {m: f"v{m.id}" for m in group.nodes}
    lines = []
    for m in group.nodes:
        args = [local.get(i) or ref(group.inputs.index(i), i)
                for i in ([m.inputs[group.passes[m]]] if m in group.passes else m.inputs)]
        attrs = {k: _literal(v) for k, v in m.attrs.items() if isinstance(v, (int, float))}
        lines.append(f"v{m.id} = {args[0] if m in group.passes else OPS[m.op].expr.format(*args, **attrs)}")
    return lines


# ---------------------------------------------------------------- CPU: Numba

# float32 kernels use Eigen's rational tanh (what TensorFlow and DyNet use on the CPU; about
# 2 ulp): libm's scalar tanhf does not vectorize and is slower than NumPy's SIMD loop.
# float64 kernels call libm's tanh, so the float64 correctness tests see unchanged arithmetic.
_RATIONAL_TANH = """
def tanh(x):
    x = min(max(x, F(-7.90531110763549805)), F(7.90531110763549805))
    x2 = x * x
    p = x2 * F(-2.76076847742355e-16) + F(2.00018790482477e-13)
    p = x2 * p + F(-8.60467152213735e-11)
    p = x2 * p + F(5.12229709037114e-08)
    p = x2 * p + F(1.48572235717979e-05)
    p = x2 * p + F(6.37261928875436e-04)
    p = x2 * p + F(4.89352455891786e-03)
    q = x2 * F(1.19825839466702e-06) + F(1.18534705686654e-04)
    q = x2 * q + F(2.26843463243900e-03)
    q = x2 * q + F(4.89352518554385e-03)
    return x * p / q
"""
_CONSTANT = re.compile(r"(?<![\w.])(\d+\.\d*(?:e[+-]?\d+)?|\d+e[+-]?\d+)")


def numba_source(group: FusedGroup) -> str:
    """A loop over rows; each vertex operand is passed as its C-contiguous buffer and the column
    where it starts, and each row is sliced into 1-D contiguous pieces so that LLVM vectorizes
    the inner loop (a strided 2-D view, or flat offset arithmetic, keeps it scalar: 2-4x slower).
    A broadcast input is passed as its vertex value and read at row parent[r] (the edge's parent)."""
    w = group.width
    through = reads_broadcast(group)
    args, pieces = (["parent"], ["p = parent[r]"]) if through else ([], [])
    for k, node in enumerate(group.inputs):
        if node.is_param:
            args.append(f"in{k}")
            pieces.append(f"x{k} = in{k}")
        elif node.op == "broadcast":
            args += [f"in{k}", f"in{k}_col"]
            pieces.append(f"x{k} = in{k}[p, in{k}_col:in{k}_col + {node.shape[0]}]")
        else:
            args += [f"in{k}", f"in{k}_col"]
            pieces.append(f"x{k} = in{k}[r, in{k}_col:in{k}_col + {node.shape[0]}]")
    for k in range(len(group.outputs)):
        args += [f"out{k}", f"out{k}_col"]
        pieces.append(f"y{k} = out{k}[r, out{k}_col:out{k}_col + {w}]")
    # a width-1 input (broadcast over the group's width) is read at column 0
    element = lambda k, node: f"x{k}[0]" if node.shape[0] == 1 and w > 1 else f"x{k}[j]"   # noqa: E731
    body = [_CONSTANT.sub(r"F(\1)", line) for line in expression_lines(group, element)]
    body += [f"y{k}[j] = v{o.id}" for k, o in enumerate(group.outputs)]
    row = "\n".join("        " + line for line in pieces)
    inner = "\n".join("            " + line for line in body)
    return (f"def kernel(r0, r1, {', '.join(args)}):\n"
            f"    for r in range(r0, r1):\n{row}\n"
            f"        for j in range({w}):\n{inner}\n")


# ---------------------------------------------------------------- CPU: the kernel cache

# Compiling a fused kernel takes Numba 0.5-4 s, and a Tree-LSTM engine has 4-6 of them (the cell,
# its gradient, and smaller versions where the leaves skip members; the loss kernel besides):
# seconds that every new process (each sweep cell is one) would pay in its first step. Each
# generated kernel is therefore written as a Python module into a cache directory, under a name
# hashed from its source, the library versions and the CPU, and jitted with `cache=True`, so
# Numba keeps its machine code next to it (`__pycache__/*.nbi`, `*.nbc`) and a later process
# loads it instead of compiling. Numba keys that index by the module file's modification time
# and size, so a module file is written once and never replaced: a temporary file, then
# `os.link` to the final name (atomic, and it fails if another process got there first). Numba
# itself writes its index and data through a temporary file and `os.replace`. Two processes
# compiling the same kernel at once therefore both compile and both succeed; the last one's
# index stays.
CACHE_ENV = "CAVS_KERNEL_CACHE"       # a directory; "off" compiles in memory only
_LOADED: list = []                    # every Numba dispatcher handed out (compile_stats reads them)


def kernel_cache_dir() -> Path | None:
    """Where compiled kernels persist: $CAVS_KERNEL_CACHE, else ~/.cache/cavs-kernels; None when
    the variable is "off" or the directory cannot be written (then kernels compile in memory)."""
    where = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "cavs-kernels")
    if where.lower() in ("off", "0", "none"):
        return None
    path = Path(where)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


@functools.lru_cache(maxsize=None)
def fingerprint() -> str:
    """What compiled machine code depends on besides its source: library versions and the CPU."""
    import llvmlite
    import numba
    import numpy as np
    from llvmlite import binding as ll
    return "|".join([sys.version.split()[0], platform.machine(), numba.__version__, llvmlite.__version__,
                     np.__version__, ll.get_host_cpu_name(), ll.get_host_cpu_features().flatten()])


def module_text(source: str, dtype: str, fast: bool | None = None) -> str:
    """A kernel as a self-contained module: the dtype, its helpers, `kernel` jitted."""
    fast = dtype == "float32" if fast is None else fast
    header = ["import math", "from math import exp, log", "import numba", "import numpy as np", f"F = np.{dtype}"]
    if dtype == "float32":
        header += ['@numba.njit(inline="always", fastmath=True, error_model="numpy")',
                   _RATIONAL_TANH.strip()]
    else:
        header += ["tanh = math.tanh"]
    # error_model="numpy": no division-by-zero branch (the rational tanh divides), which would
    # keep LLVM from vectorizing the loop
    jit = f'@numba.njit(nogil=True, fastmath={fast}, error_model="numpy", cache=True)'
    return "\n".join(header) + "\n\n\n" + jit + "\n" + source.strip() + "\n"


def _write_once(path: Path, text: str) -> None:
    if path.exists():
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(text)
        try:
            os.link(tmp, path)          # atomic; never replaces (Numba's index keys on the file's mtime)
        except FileExistsError:
            pass
        except OSError:                 # a file system without hard links
            if not path.exists():
                os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _module_path(where: Path, text: str) -> Path:
    return where / f"k_{hashlib.sha256((fingerprint() + chr(10) + text).encode()).hexdigest()[:32]}.py"


def is_cached(source: str, dtype: str, fast: bool | None = None) -> bool:
    """Whether a process already wrote this kernel into the cache (its machine code is there)."""
    where = kernel_cache_dir()
    if where is None:
        return False
    path = _module_path(where, module_text(source, dtype, fast))
    return path.exists() and any(path.parent.glob(f"__pycache__/{path.stem}*.nbi"))


@functools.lru_cache(maxsize=None)
def compile_numba(source: str, dtype: str, fast: bool | None = None):
    """The Numba dispatcher of `source` (a `def kernel(...)`); loaded from the kernel cache when
    a process compiled it before, else compiled at its first call (and then cached)."""
    text = module_text(source, dtype, fast)
    where = kernel_cache_dir()
    if where is None:
        namespace: dict = {}
        exec(compile(text.replace(", cache=True)", ")"), "<cavs-fused>", "exec"), namespace)
        kernel = namespace["kernel"]
    else:
        path = _module_path(where, text)
        key = path.stem[2:]
        _write_once(path, text)
        name = f"cavs_kernel_{key}"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module    # Numba's cached code looks its module up by name
            spec.loader.exec_module(module)
        kernel = module.kernel
    _LOADED.append(kernel)
    return kernel


def numba_signature(group: FusedGroup, dtype: str) -> tuple:
    """The argument types the engine calls a group's kernel with (numba_source's arguments)."""
    from numba import types
    f = getattr(types, dtype)
    rows = [types.Array(f, 2, "C"), types.int64]           # a C-contiguous buffer and a column
    args = [types.int64, types.int64] + ([types.Array(types.int64, 1, "C")] if reads_broadcast(group) else [])
    for node in group.inputs:
        args += [types.Array(f, len(node.shape), "C")] if node.is_param else rows
    return tuple(args + rows * len(group.outputs))


def warm_up(groups=(), dtype: str = "float32", cached_only: bool = False) -> None:
    """Numba's one-time start-up in a process, and `groups`' kernels loaded (or compiled) now.

    Importing Numba (~0.5-0.8 s) and filling its typing and target registries (~0.5-1 s) is
    paid once per process, by loading a cached kernel as much as by compiling one; loading a
    cached kernel then costs ~30 ms. Called at engine construction with F's and dF's fused
    groups, it keeps all of that out of the first step. (Groups made smaller at the leaves are
    batch-dependent: they load at their first use.)"""
    _numba_start_up()
    for g in groups:
        if cached_only and not is_cached(numba_source(g), dtype):
            continue            # compiled at its first use, if it is used (not every group is)
        kernel = compile_numba(numba_source(g), dtype)
        kernel.compile(numba_signature(g, dtype))


@functools.lru_cache(maxsize=None)
def _numba_start_up() -> None:
    import numba  # noqa: F401
    from numba.core.registry import cpu_target
    cpu_target.typing_context.refresh()
    cpu_target.target_context.refresh()
    fingerprint()


def compile_stats() -> dict:
    """Over every kernel this process asked for: {"compiled": signatures compiled here,
    "loaded": signatures loaded from the kernel cache}."""
    return {"compiled": sum(sum(k.stats.cache_misses.values()) for k in _LOADED),
            "loaded": sum(sum(k.stats.cache_hits.values()) for k in _LOADED)}


# ---------------------------------------------------------------- GPU: CuPy

# A kernel's source is generic in its element type T (a CuPy type placeholder: CuPy compiles it
# once per dtype, with `typedef float T;` or `typedef double T;` before the preamble). So that a
# float32 kernel computes in float, every numeric literal becomes T(...) (a bare 0.5 is a double,
# and would promote the whole expression: a double tanh per element), and every function of the
# expression templates (ops.py) calls a helper below, one overload per type, written with the CUDA
# C math API's float and double functions: no call depends on which C++ overloads NVRTC's headers
# declare (`max(float, double)` or `pow(float, int)` are ambiguous or missing there). fmax/fmin
# ignore a NaN operand where NumPy's maximum/minimum propagate it (the CPU's kernels, Python's
# max, do neither consistently); no other difference.
CUPY_FUNCTIONS = ("exp", "log", "tanh", "pow", "abs", "max", "min")
CUPY_PREAMBLE = """\
__device__ __forceinline__ float cavs_exp(float x) { return expf(x); }
__device__ __forceinline__ double cavs_exp(double x) { return exp(x); }
__device__ __forceinline__ float cavs_log(float x) { return logf(x); }
__device__ __forceinline__ double cavs_log(double x) { return log(x); }
__device__ __forceinline__ float cavs_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double cavs_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float cavs_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double cavs_pow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float cavs_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double cavs_abs(double x) { return fabs(x); }
__device__ __forceinline__ float cavs_max(float x, float y) { return fmaxf(x, y); }
__device__ __forceinline__ double cavs_max(double x, double y) { return fmax(x, y); }
__device__ __forceinline__ float cavs_min(float x, float y) { return fminf(x, y); }
__device__ __forceinline__ double cavs_min(double x, double y) { return fmin(x, y); }
"""
# every numeric literal of an expression: 0.5, 1e-05, 2 (not the digits of a name such as v12 or in0)
_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d*(?:e[+-]?\d+)?|\d+e[+-]?\d+|\d+)(?![\w.])")
_FUNCTION = re.compile(r"\b(" + "|".join(CUPY_FUNCTIONS) + r")\(")
_NONFINITE = {"inf": "(T(1.0) / T(0.0))", "nan": "(T(0.0) / T(0.0))"}


def _cupy_expression(text: str) -> str:
    """A template's expression as CUDA C++ over T: typed literals, the helpers' names."""
    text = _NUMBER.sub(r"T(\1)", text)
    text = re.sub(r"(?<![\w.])(inf|nan)(?![\w.(])", lambda m: _NONFINITE[m.group(1)], text)
    return _FUNCTION.sub(r"cavs_\1(", text)


def cupy_source(group: FusedGroup) -> tuple[str, str, str]:
    """(in_params, out_params, operation) of the group's cupy.ElementwiseKernel: one `T vN = ...;`
    per member (in registers), then each output written. Parameters (biases) are 1-D and vertex
    values (rows, width) or (rows, 1): the kernel broadcasts them over the output rows."""
    in_params = ", ".join(f"T in{k}" for k in range(len(group.inputs)))
    out_params = ", ".join(f"T out{k}" for k in range(len(group.outputs)))
    body = []
    for line in expression_lines(group, lambda k, node: f"in{k}"):
        name, _, expr = line.partition(" = ")
        body.append(f"T {name} = {_cupy_expression(expr)};")
    body += [f"out{k} = v{o.id};" for k, o in enumerate(group.outputs)]
    return in_params, out_params, "\n".join(body)


@functools.lru_cache(maxsize=None)
def compile_cupy(in_params: str, out_params: str, body: str):
    """The kernel (CuPy compiles it with NVRTC at its first call per dtype, and caches the binary in
    ~/.cupy/kernel_cache)."""
    import cupy
    return cupy.ElementwiseKernel(in_params, out_params, body, "cavs_fused", preamble=CUPY_PREAMBLE)
