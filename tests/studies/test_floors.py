"""The floors of the bench and nary studies (experiments/floors.py): the frontier bound's rows, and the
child-sum model's multiply-adds counted on the rows that have each product's input."""
import pytest


@pytest.mark.parametrize("workload", ["tree_lstm", "var_lstm"])
def test_frontier_rows_cover_each_vertex_with_children_once(workload):
    """The frontier bound times every loop task's state matmul: its rows must be exactly the
    vertices with children (each in one task), so its flops are a part of the floor's."""
    from experiments import floors
    import cavs
    samples = cavs.datasets.load_samples(workload, limit=100)
    rows = floors.frontier_rows(workload, 64, samples, batch_size=32)
    graphs = [cavs.workloads.to_graph(workload, x, i) for i, x in enumerate(samples)]
    assert sum(rows) == sum(int((g.children >= 0).any(axis=1).sum()) for g in graphs)
    assert min(rows) > 0 and len(rows) >= max(int(cavs.graphs.levels(g.children).max()) for g in graphs)
    state_flops = 2 * 2 * sum(rows) * floors.state_in_width(workload, 64) * floors.GATES[workload] * 64
    assert state_flops < sum(p.flops for p in floors.workload_products(workload, 64, samples))


def test_nary_floor_counts_each_product_on_the_rows_that_have_its_input():
    """x W at the words, x Wf only where a word meets children (only edges read it), h_sum U at
    the vertices with children, h_k Uf per edge, the head at the labels."""
    import cavs
    from experiments.floors import child_sum_products

    def child_sum_macs(trees, H, E, C):           # training multiply-adds: 3 x forward
        return sum(p.flops for p in child_sum_products(trees, H, E, C)) / 2
    g = cavs.Graph.from_children([[], [], [], [0, 1, 2]], tokens=[3, 4, 5, -1], labels=[1, 1, -1, 2])
    H, E, C = 8, 6, 5
    words, inner, edges, labelled = 3, 1, 3, 3
    assert child_sum_macs([g], H, E, C) == 3 * (words * E * 3 * H + inner * H * 3 * H + edges * H * H + labelled * H * C)
    worded_root = cavs.Graph.from_children([[], [], [], [0, 1, 2]], tokens=[3, 4, 5, 6], labels=[1, 1, -1, 2])
    assert child_sum_macs([worded_root], H, E, C) == child_sum_macs([g], H, E, C) + 3 * (E * 3 * H + E * H)


def test_a_library_is_timed_on_the_layouts_it_runs_and_skipped_on_the_others():
    """oneDNN has no x^T dy: a list with such a product still times its other products with it, at
    the thread count asked for (in the measuring process)."""
    from cavs import blas
    from experiments import floors
    if "onednn" not in blas.available("float32"):
        pytest.skip("oneDNN is not usable here")
    products = [floors.Product("nn", 64, 32, 96), floors.Product("tn", 64, 32, 96)]
    got = floors._time_products("onednn", [[p.layout, p.rows, p.inner, p.outer] for p in products], threads=2)
    assert got["status"] == "ok" and got["seconds"][0] > 0 and got["seconds"][1] is None
    timed = floors.time_products(products, libraries=("onednn", "openblas"))
    assert timed["libraries"] == {"onednn": "ok", "openblas": "ok"}
    assert timed["best"][products[1]][1] == "openblas"


def test_the_fma_peak_counts_the_lanes_the_pipes_execute():
    """Zen 4 (AMD family 25) decodes AVX-512 but runs each 512-bit FMA on two 256-bit pipes: 8
    float32 lanes a pipe, where Zen 5 (family 26) and AVX-512 Xeons have 16."""
    from experiments import floors
    clock = {"status": "ok", "hz": 3.0e9}
    zen4 = floors._fma_peak({"cpu_vendor": "AuthenticAMD", "cpu_family": "25", "cpu_isa": "avx512f"}, clock)
    zen5 = floors._fma_peak({"cpu_vendor": "AuthenticAMD", "cpu_family": "26", "cpu_isa": "avx512f"}, clock)
    xeon = floors._fma_peak({"cpu_vendor": "GenuineIntel", "cpu_family": "6", "cpu_isa": "amx"}, clock)
    assert (zen4["lanes"], zen5["lanes"], xeon["lanes"]) == (8, 16, 16)
    assert zen4["peak_gflops"] == pytest.approx(8 * 2 * 2 * 3.0)
    assert floors._fma_peak({"cpu_vendor": "AuthenticAMD", "cpu_family": "25", "cpu_isa": "avx2"},
                            {"status": "failed"})["peak_gflops"] is None
