"""The native-kernel check that `make bench` runs first: the engine's loss and gradients with
NumPy's OpenBLAS on the kernels it picks for this CPU equal those with the Haswell (AVX2) kernels
that these machines' `OPENBLAS_CORETYPE` setting would force, to float32 tolerance.

    python -m experiments.native_check [--results DIR]

Benchmark cells unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for every system (launch.env), so
the benchmarks run other kernels than the tests do. Two processes compute the Tree-LSTM's loss and
gradients on the same 32 SST trees, float32, with every product forced through OpenBLAS
(`blas="openblas"`: under the engine's own choice another library could run them all, and the check
would compare nothing): one with the cells' environment, one with OPENBLAS_CORETYPE=Haswell. Each
says which kernel set OpenBLAS ran (threadpoolctl). Writes DIR/native_check.json; exit status 1
when the numbers differ beyond tolerance or a side failed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import launch

HIDDEN, TREES = 64, 32
LOSS_RTOL = 1e-5            # float32: different kernels sum in another order
GRAD_TOL = 1e-4             # of each gradient's largest entry


def child(out: str) -> None:
    """One side: loss and gradients into the .npz file `out`, kernel set and loss on the result line."""
    import cavs
    from cavs import blas
    model = cavs.models.build("tree_lstm", hidden=HIDDEN, seed=1)
    engine = cavs.Engine(model, threads=1, blas="openblas")
    loss, grads = engine.loss_and_grads(model.make_batch(cavs.datasets.load_samples("tree_lstm", limit=TREES)))
    np.savez(out, loss=np.float64(loss), **{f"grad_{k}": np.asarray(v) for k, v in grads.items()})
    launch.emit({"status": "ok", "kernels": blas.openblas_kernels(), "loss": float(loss),
                 "coretype": os.environ.get("OPENBLAS_CORETYPE")})


def compare(native: dict, haswell: dict) -> dict:
    """Loss to LOSS_RTOL, every gradient to GRAD_TOL of its largest entry."""
    loss_a, loss_b = float(native["loss"]), float(haswell["loss"])
    worst, where = 0.0, None
    for key in native.files:
        if not key.startswith("grad_"):
            continue
        a, b = native[key], haswell[key]
        err = float(np.abs(a - b).max()) / max(1e-30, float(np.abs(b).max()))
        if err > worst:
            worst, where = err, key[5:]
    loss_err = abs(loss_a - loss_b) / max(1e-30, abs(loss_b))
    return {"loss_native": loss_a, "loss_haswell": loss_b, "loss_rel_diff": loss_err,
            "worst_grad_rel_diff": worst, "worst_grad": where, "loss_rtol": LOSS_RTOL, "grad_tol": GRAD_TOL,
            "equal": loss_err <= LOSS_RTOL and worst <= GRAD_TOL}


def check(results_dir: Path | None = None) -> dict:
    """Both sides, compared; written to results_dir/native_check.json when given."""
    with tempfile.TemporaryDirectory(prefix="cavs-native-check-") as tmp:
        sides = {}
        for side, native in (("native", True), ("haswell", False)):
            out = str(Path(tmp) / f"{side}.npz")
            environ = dict(os.environ) if native else {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
            sides[side] = launch.run("experiments.native_check", ["child", out], threads=1, time_limit_s=600,
                                     environ=environ, native_blas=native)
            sides[side]["file"] = out
        record = {"hidden": HIDDEN, "trees": TREES, "dtype": "float32", "blas": "openblas",
                  "kernels": {s: r.get("kernels") for s, r in sides.items()},
                  "status": {s: r.get("status") for s, r in sides.items()}}
        if all(r.get("status") == "ok" for r in sides.values()):
            with np.load(sides["native"]["file"]) as a, np.load(sides["haswell"]["file"]) as b:
                record.update(compare(a, b))
            record["verdict"] = "ok" if record["equal"] else "DIFFERENT beyond float32 tolerance"
        else:
            record["verdict"] = "failed: " + "; ".join(f"{s}: {r.get('status')}" for s, r in sides.items())
    if results_dir is not None:
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        (Path(results_dir) / "native_check.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def describe(r: dict) -> str:
    k = r["kernels"]
    if "equal" not in r:
        return f"native-kernel check: {r['verdict']}"
    return (f"native-kernel check (Tree-LSTM h = {r['hidden']}, {r['trees']} trees, OpenBLAS forced): kernels "
            f"{k.get('native')} against {k.get('haswell')}; loss {r['loss_native']:.7g} against "
            f"{r['loss_haswell']:.7g} (relative {r['loss_rel_diff']:.1e}), gradients within "
            f"{r['worst_grad_rel_diff']:.1e} of their largest entry ({r['worst_grad']}): {r['verdict']}")


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["child"]:
        child(argv[1])
        return 0
    ap = argparse.ArgumentParser(prog="python -m experiments.native_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args(argv)
    r = check(args.results)
    print(describe(r))
    return 0 if r.get("equal") else 1


if __name__ == "__main__":
    sys.exit(main())
