"""The CPU's GEMM libraries (cavs/blas.py) on the views the engine passes, and the choice among them:
measured per product shape, cached per machine, forced when asked, a corrupt cache ignored."""
from __future__ import annotations

import json
import time
import warnings

import numpy as np
import pytest

import cavs
from cavs import blas


def views(rng, dtype, rows, layout, k=96, n=40):
    """(out, a, b) as the engine has them: a and out column blocks of wider buffers, b a parameter,
    its transpose (dy W^T), or a transposed activation (x^T dy)."""
    w = rng.standard_normal((k, n)).astype(dtype)
    if layout == "nn":
        b = w
    elif layout == "nt":
        b = rng.standard_normal((n, k)).astype(dtype).T           # (k, n), a transposed row-major matrix
    else:
        b = rng.standard_normal((rows, n)).astype(dtype)
    if layout == "tn":                                             # dW (k x n) += x^T dy, x: rows x k
        a = rng.standard_normal((rows, k + 9)).astype(dtype)[:, 3:3 + k].T
        out_buf = np.full((k, n + 5), 7.0, dtype=dtype)
    else:
        a = rng.standard_normal((rows, k + 9)).astype(dtype)[:, 3:3 + k]
        out_buf = np.full((rows, n + 5), 7.0, dtype=dtype)
    return out_buf, out_buf[:, 2:2 + n], a, b


@pytest.mark.parametrize("library", blas.LIBRARIES + ("numpy",))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
@pytest.mark.parametrize("rows", [0, 1, 7, 130])
def test_each_library_equals_numpy_on_strided_views(library, dtype, layout, rows):
    lib = blas.make(library)
    if not lib.supports(dtype, layout) or (library == "openblas" and not blas.available(dtype)):
        pytest.skip(f"{library} does not run {np.dtype(dtype).name} {layout} here")
    rng = np.random.default_rng(rows)
    out_buf, out, a, b = views(rng, dtype, rows, layout)
    bias = rng.standard_normal(out.shape[1]).astype(dtype)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    lib.gemm(out, a, b)
    np.testing.assert_allclose(out, a @ b, rtol=tol, atol=tol * 10)
    lib.gemm(out, a, b, accumulate=True)
    np.testing.assert_allclose(out, 2 * (a @ b), rtol=tol, atol=tol * 10)
    if layout != "tn":
        if hasattr(lib, "new_pass"):
            lib.new_pass()
        lib.gemm(out, a, b, bias=bias)
        np.testing.assert_allclose(out, a @ b + bias, rtol=tol, atol=tol * 10)
    assert (out_buf[:, :2] == 7).all() and (out_buf[:, 2 + out.shape[1]:] == 7).all()   # other columns untouched


def test_dnnl_on_an_empty_inner_dimension_and_without_its_library(monkeypatch):
    lib = blas.make("dnnl")
    if not lib.supports(np.float32, "nn"):
        pytest.skip("oneDNN's library (onednn-cpu-gomp) is not installed here")
    a, b = np.zeros((5, 0), np.float32), np.zeros((0, 3), np.float32)
    out = np.full((5, 3), 7.0, np.float32)
    lib.gemm(out, a, b, accumulate=True)
    assert (out == 7).all()                                      # += nothing
    lib.gemm(out, a, b, bias=np.arange(3, dtype=np.float32))
    assert (out == np.arange(3)).all()
    lib.gemm(out, a, b)
    assert (out == 0).all()
    # where the wheel is missing the library says so, and auto leaves it out
    monkeypatch.setattr(blas, "_dnnl", lambda: None)
    assert not blas.make("dnnl").supports(np.float32, "nn")
    assert "dnnl" not in blas.available("float32") and blas.dnnl_version() is None


def test_dnnl_t_copies_the_weight_once_per_pass():
    """dnnl-t runs dy W^T on a row-major copy of W^T: the copy serves the pass, and a weight updated
    in place between passes (as the optimizer does) is copied again at new_pass()."""
    lib = blas.make("dnnl-t")
    if not lib.supports(np.float32, "nt"):
        pytest.skip("oneDNN's library (onednn-cpu-gomp) is not installed here")
    assert not lib.supports(np.float32, "nn") and not lib.supports(np.float64, "nt")
    assert "dnnl-t" in blas.available("float32") and "dnnl-t" not in blas.available("float32", "nn")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 96)).astype(np.float32)          # (outer, inner): dx = dy @ w.T
    dy = rng.standard_normal((7, 96)).astype(np.float32)
    out = np.empty((7, 40), np.float32)
    lib.new_pass()
    lib.gemm(out, dy, w.T)
    np.testing.assert_allclose(out, dy @ w.T, rtol=1e-4, atol=1e-4)
    assert len(lib._copies) == 1
    lib.gemm(out, dy, w.T, accumulate=True)                        # the same copy, not a second one
    assert len(lib._copies) == 1
    w *= -2                                                        # the optimizer's in-place update
    lib.new_pass()
    lib.gemm(out, dy, w.T)
    np.testing.assert_allclose(out, dy @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("copier", sorted(blas._COPIERS))
def test_row_major_copy_equals_the_strided_weight_whichever_copy_runs(copier, monkeypatch):
    """dnnl-t's copy of W^T is exact by either copier, on transposed, sliced and float64 layouts;
    the faster one is measured once per layout and then reused."""
    if copier == "torch" and blas._torch() is None:
        pytest.skip("PyTorch is not installed here")
    monkeypatch.setattr(blas, "_copier_of", {})
    rng = np.random.default_rng(4)
    weights = [rng.standard_normal((40, 96)).astype(np.float32).T,
               rng.standard_normal((64, 130)).astype(np.float32)[:, 1:129].T,
               rng.standard_normal((33, 17)).T]
    for b in weights:
        blas._copier_of[(b.shape, b.strides, b.dtype.str)] = blas._COPIERS[copier]
        copy = blas.row_major_copy(b)
        assert copy.flags.c_contiguous and copy.dtype == b.dtype
        np.testing.assert_array_equal(copy, b)
    monkeypatch.setattr(blas, "_copier_of", {})
    b = weights[0]
    np.testing.assert_array_equal(blas.row_major_copy(b), b)
    assert blas._copier_of[(b.shape, b.strides, b.dtype.str)] in blas._COPIERS.values()


def test_measure_times_every_library_on_each_key():
    libs = [name for name in blas.available("float32")]
    times = blas.measure([("nn", 8, 16, 24), ("tn", 8, 16, 24)], np.float32, libs)
    for (layout, *_), ts in times.items():
        assert set(ts) == {n for n in libs if blas.make(n).supports(np.float32, layout)}
        assert all(0 < t < 1 for t in ts.values())


class SleepingLibrary:
    """A library whose every call takes `seconds` (slept) and is counted."""
    def __init__(self, seconds):
        self.seconds, self.calls = seconds, 0

    def gemm(self, out, a, b, accumulate=False, bias=None):
        self.calls += 1
        time.sleep(self.seconds)


def test_a_long_product_is_timed_in_two_samples_and_a_short_one_in_rounds():
    """Every library gets a first call (untimed) and a call that sizes its repeats. A short product
    is then timed in ROUNDS interleaved rounds; a long one (every library at LONG_CALL_S or more) in
    one round, the sizing call counting as the other sample."""
    long = {"a": SleepingLibrary(blas.LONG_CALL_S), "b": SleepingLibrary(blas.LONG_CALL_S * 1.5)}
    times = blas._time_interleaved(long, None, None, None, False)
    assert [lib.calls for lib in long.values()] == [3, 3]
    assert blas.LONG_CALL_S <= times["a"] < times["b"]
    # one fast library keeps the product short for all: every library in ROUNDS rounds
    mixed = {"fast": SleepingLibrary(blas.MIN_TIMED_S), "slow": SleepingLibrary(blas.LONG_CALL_S)}
    blas._time_interleaved(mixed, None, None, None, False)
    assert [lib.calls for lib in mixed.values()] == [2 + blas.ROUNDS] * 2


def test_parameters_and_measured_weights_share_one_alignment(monkeypatch):
    """Some libraries take another path by a weight's alignment (dnnl_sgemm on the Zen 3 EPYC:
    1.4-1.8x apart), so the engine's parameters, dnnl-t's copies and the weights blas.measure times
    all start WEIGHT_OFFSET bytes past a 64-byte boundary, whatever NumPy's allocator gives."""
    def offset(x):
        return x.ctypes.data % 64

    # an offset NumPy's allocator does not give by itself (it gives 16 more often than not), so that
    # these checks fail wherever an array is not laid out by weight_array
    monkeypatch.setattr(blas, "WEIGHT_OFFSET", 40)
    for shape in [(3,), (7, 5), (256, 1024), (1, 1)]:
        w = blas.weight_array(shape, np.float32)
        assert w.shape == shape and w.dtype == np.float32 and w.flags.c_contiguous and w.flags.writeable
        assert offset(w) == blas.WEIGHT_OFFSET
    engine = cavs.Engine(cavs.models.build("tree_lstm", hidden=8))
    assert {offset(engine._params[k]) for k in engine._params} == {blas.WEIGHT_OFFSET}
    engine.params["Uh"] = np.ones(engine.params["Uh"].shape)       # a user's assignment keeps it
    assert offset(engine._params["Uh"]) == blas.WEIGHT_OFFSET
    assert offset(blas.row_major_copy(np.ones((5, 7), np.float32).T)) == blas.WEIGHT_OFFSET
    seen = []
    real = blas._time_interleaved
    monkeypatch.setattr(blas, "_time_interleaved", lambda libs, out, a, b, acc: seen.append(
        (b.T if b.strides[0] == b.itemsize else b)) or real(libs, out, a, b, acc))
    blas.measure([("nn", 8, 16, 24), ("nt", 8, 16, 24)], np.float32, ["openblas"])
    assert [offset(b) for b in seen] == [blas.WEIGHT_OFFSET] * 2


def test_row_classes_and_keys():
    assert [blas.row_class(r) for r in (1, 2, 3, 63, 64, 65, 5000)] == [1, 2, 2, 32, 64, 64, blas.MAX_ROW_CLASS]
    x, w = np.zeros((40, 8), np.float32), np.zeros((8, 3), np.float32)
    assert blas.key_of(blas.layout_of(x, w), x, w) == ("nn", 32, 8, 3)
    dy = np.zeros((40, 3), np.float32)
    assert blas.key_of(blas.layout_of(dy, w.T), dy, w.T) == ("nt", 32, 3, 8)
    assert blas.key_of(blas.layout_of(x.T, dy), x.T, dy) == ("tn", 32, 8, 3)


def test_a_class_is_timed_inside_it_and_chosen_by_the_mean_time(cache, monkeypatch):
    """Each row class is timed at timed_rows, inside the class and off the powers of two, and its
    time is their mean: a library fastest at one row count only does not win the class."""
    for c in blas.ROW_CLASSES:
        assert blas.timed_rows(c) and all(blas.row_class(r) == c for r in blas.timed_rows(c))
    assert blas.timed_rows(64) == (81, 111) and blas.timed_rows(1) == (1,)
    names = blas.available("float32")
    if len(names) < 2:
        pytest.skip("one GEMM library installed")
    spiky, steady = names[:2]

    def fake_measure(keys, dtype, libs, threads=1, **options):
        # spiky: 1 s at a class's first timed count, 5 s at its second; steady: 2.5 s at both
        out = {}
        for k in keys:
            first = k[1] == blas.timed_rows(blas.row_class(k[1]))[0]
            out[k] = {n: (1.0 if first else 5.0) if n == spiky else 2.5 if n == steady else 9.0 for n in libs}
        return out
    monkeypatch.setattr(blas, "measure", fake_measure)
    gemm = blas.choose([("nn", 1, 8, 3), ("nn", 64, 8, 3)], np.float32, threads=1)
    assert gemm.choice == {("nn", 1, 8, 3): spiky, ("nn", 64, 8, 3): steady}
    stored = blas.read_cache(blas.cache_path(np.float32, 1))
    assert stored[("nn", 64, 8, 3)][f"{spiky}@1"] == pytest.approx(3.0)
    assert stored[("nn", 1, 8, 3)][f"{spiky}@1"] == pytest.approx(1.0)


def small_model():
    return cavs.models.build("tree_fc", hidden=8, leaves=4)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAVS_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("CAVS_CPU_BLAS", raising=False)
    return tmp_path


def test_a_forced_choice_is_honoured(cache, monkeypatch):
    for name in blas.available("float32") + ["numpy"]:
        engine = cavs.Engine(small_model(), blas=name)
        assert engine.backend.blas == name and engine.backend.gemm.forced == name
    monkeypatch.setenv("CAVS_CPU_BLAS", "numpy")                  # the variable, where no argument is given
    assert cavs.Engine(small_model()).backend.blas == "numpy"
    assert cavs.Engine(small_model(), blas="openblas").backend.blas == "openblas"   # the argument wins
    with pytest.raises(ValueError, match="unknown blas 'fast'"):
        cavs.Engine(small_model(), blas="fast")
    assert not list(cache.glob("blas-*.json"))                     # nothing was measured


def test_auto_measures_once_and_caches_per_machine_kind(cache, monkeypatch):
    model = small_model()
    engine = cavs.Engine(model)
    keys = set(cavs.Engine._gemm_keys(model))
    assert set(engine.backend.gemm.choice) == keys
    assert set(engine.backend.gemm.choice.values()) <= set(blas.available("float32"))
    [path] = cache.glob("blas-*.json")
    stored = json.loads(path.read_text())["times"]
    assert {tuple(json.loads(k)) for k in stored} == keys
    calls = []
    monkeypatch.setattr(blas, "measure", lambda *a, **k: calls.append(a) or {})
    assert cavs.Engine(model).backend.gemm.choice == engine.backend.gemm.choice and not calls   # read back
    # another CPU generation (same model string) is another cache entry
    from cavs.backend import cpu
    real, before = cpu.cpu_generation, blas.cache_key("float32", None)
    monkeypatch.setattr(cpu, "cpu_generation", lambda text=None: {**real(text), "cpu_family": "99"})
    assert blas.cache_key("float32", None) != before
    def fake_measure(keys, dtype, libs, threads=1, **options):      # libs[0] fastest at every setting
        calls.append(keys)
        return {k: {f"{lib}@{t}" if threads > 1 else lib: 1.0 if lib == libs[0] else 2.0
                    for lib in libs for t in {1, threads}} for k in keys}
    monkeypatch.setattr(blas, "measure", fake_measure)
    other = cavs.Engine(model)
    timed = {(layout, r, inner, outer) for layout, rows, inner, outer in keys for r in blas.timed_rows(rows)}
    assert calls and set(calls[0]) == timed and len(list(cache.glob("blas-*.json"))) == 2
    assert set(other.backend.gemm.choice.values()) == {blas.available("float32")[0]}


def test_a_corrupt_cache_is_ignored_with_a_warning(cache):
    model = small_model()
    cavs.Engine(model)
    [path] = cache.glob("blas-*.json")
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="cannot be read .* measuring them again"):
        engine = cavs.Engine(model)
    assert set(engine.backend.gemm.choice) == set(cavs.Engine._gemm_keys(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cavs.Engine(model)                                        # rewritten: read back silently


def test_every_choice_gives_the_same_training(cache):
    """The engine's loss and gradients do not depend on which library multiplies (float32 rounding)."""
    model = cavs.models.build("tree_lstm", hidden=16, dtype="float32")
    samples = cavs.datasets.load_samples("tree_lstm", limit=16)
    batch = model.make_batch(samples)
    ref = cavs.Engine(model, blas="numpy").loss_and_grads(batch)
    for name in blas.available("float32") + ["auto"]:
        loss, grads = cavs.Engine(model, blas=name).loss_and_grads(batch)
        assert loss == pytest.approx(ref[0], rel=1e-5)
        for k, g in grads.items():
            np.testing.assert_allclose(g, ref[1][k], rtol=1e-3, atol=1e-5, err_msg=f"{name}: {k}")


def test_packing_is_paid_once_per_weight_and_pass():
    """A packing library wins a weight when its savings over the pass's products of that weight
    exceed one packing, not one share of it per product; the next pass uses the counted choice."""
    small, large = ("nn", 1, 8, 3), ("nn", 64, 8, 3)
    times = {small: {"openblas": 3.0, "onednn": 1.0}, large: {"openblas": 10.0, "onednn": 9.0}}
    packs = {small: {"onednn": 5.0}, large: {"onednn": 5.0}}
    # one small and one large product: saving 3 < packing 5, no packing library
    assert blas.per_pass_choice({small: 1, large: 1}, times, packs) == {small: "openblas", large: "openblas"}
    # four small ones: saving 4 * 2 + 1 = 9 > 5, oneDNN for both (the packing is shared)
    assert blas.per_pass_choice({small: 4, large: 1}, times, packs) == {small: "onednn", large: "onednn"}
    # the engine's memo of each key's fastest library carries across passes without changing a choice
    memo: dict = {}
    for counts, want in (({small: 1, large: 1}, "openblas"), ({small: 4, large: 1}, "onednn"),
                         ({small: 1, large: 1}, "openblas")):
        assert blas.per_pass_choice(counts, times, packs, memo) == {small: want, large: want}
    gemm = blas.Gemm({"openblas": blas.make("numpy"), "onednn": blas.make("numpy")}, {small: "openblas", large: "openblas"},
                     "openblas", times=times, packs=packs)
    x, w, out = np.ones((1, 8), np.float32), np.ones((8, 3), np.float32), np.empty((1, 3), np.float32)
    for _ in range(4):
        gemm(out, x, w)
    np.testing.assert_array_equal(out, 8.0)
    gemm.new_pass()
    assert gemm.choice[small] == "onednn" and gemm.name == "auto: openblas 2"    # the name: the static choice


def test_the_pool_follows_the_products_a_pass_makes(monkeypatch):
    """With several threads, the pool whose libraries are fastest over the products the passes make
    (counted per key), not over the model's keys summed once: here OpenBLAS's pool wins the keys
    unweighted, and a pass making the large product four times as often moves to PyTorch's."""
    small, large = ("nn", 1, 8, 3), ("nn", 64, 8, 3)
    pools = {"openblas": ({small: "openblas", large: "openblas"},
                          {small: {"openblas": 1.0}, large: {"openblas": 10.0}}, {}),
             "torch": ({small: "mkl", large: "mkl"}, {small: {"mkl": 4.0}, large: {"mkl": 8.0}}, {})}
    settings = []
    monkeypatch.setattr(blas, "set_pool_threads", lambda pool, threads: settings.append((pool, threads)))
    numpy = blas.make("numpy")
    choice, times, packs = pools["openblas"]
    gemm = blas.Gemm({"openblas": numpy, "mkl": numpy}, dict(choice), "openblas", pool="openblas", threads=2,
                     times=times, packs=packs, pools=pools)
    x, w, out = np.ones((64, 8), np.float32), np.ones((8, 3), np.float32), np.empty((64, 3), np.float32)
    gemm(out[:1], x[:1], w)                          # one of each: 11 against 12, OpenBLAS's pool stays
    gemm(out, x, w)
    gemm.new_pass()
    assert gemm.pool == "openblas" and not settings
    for _ in range(7):                               # 1 + 7 large ones over two passes: 4 a pass
        gemm(out, x, w)
    gemm.new_pass()                                  # per pass 0.5 small, 4 large: 40.5 against 34
    assert gemm.pool == "torch" and settings == [("torch", 2)]
    assert gemm.choice == {small: "mkl", large: "mkl"} and gemm.name == "auto: mkl 2 (torch pool, 2 threads)"
    np.testing.assert_array_equal(out, 8.0)
