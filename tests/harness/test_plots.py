"""Figures and tables from results (plots/): every figure and table renders from a CSV, the claims
pair each cell with its own panel, and the memory table and figure render from fig8's rows."""
from __future__ import annotations

import json

import pytest

from experiments import registry, results, runner
from experiments.profiles import get_profile


def synthetic_csv(results_dir, name):
    """Rows for every cell of a registry experiment with made-up times; a few failed, half extrapolated."""
    cells = runner.plan(registry.get_experiment(name), get_profile("cpu"), check_available=False).cells
    rows = []
    for i, c in enumerate(cells):
        t = 0.01 * c["hidden"] / c["batch_size"] * (1 + ["cavs", "fold", "dynet"].count(c["system"]))
        ok = i % 17 != 5
        rows.append({**{k: v for k, v in c.items() if k in results.COLUMNS},
                     "options": json.dumps(c["options"]), "samples": c["batch_size"], "epoch_samples": 8192,
                     "construct_s": t / 4, "compute_s": t, "memory_s": t / 3, "total_s": 1.25 * t,
                     "epoch_s": 1.25 * t * 8192 / c["batch_size"], "extrapolated": i % 2 == 0,
                     "status": "ok" if ok else "timeout", "timestamp": f"2026-01-01T00:00:{i % 60:02d}"})
    import pandas as pd
    pd.DataFrame(rows, columns=results.COLUMNS).to_csv(results.csv_path(results_dir, name), index=False)


@pytest.mark.parametrize("name,outputs", [("fig8", ["fig8.png", "fig8.pdf"]), ("fig9", ["fig9.png"]),
                                          ("ablation", ["ablation.png"]), ("table2", ["table2.md", "table2.csv"])])
def test_plots_render_from_a_csv(tmp_path, name, outputs):
    from plots.__main__ import render
    synthetic_csv(tmp_path, name)
    render(name, tmp_path)
    for out in outputs:
        assert (tmp_path / "figures" / out).stat().st_size > 0
    if name == "table2":
        text = (tmp_path / "figures" / "table2.md").read_text()
        assert "| mode | batch_size | cavs memory_s |" in text and "*" in text


def test_claims_pair_each_cell_with_its_own_panel():
    """bs = 64, h = 512 sits in a batch-size panel and a hidden-size panel: one ratio per panel."""
    import pandas as pd
    from plots.claims import _ratios
    rows = [(p, s, bs, h, t) for p, cells in (("d", [(8, 512), (64, 512)]), ("h", [(64, 256), (64, 512)]))
            for bs, h in cells for s, t in (("cavs", 1.0), ("fold", 3.0 if p == "d" else 2.0))]
    rows = [r for r in rows if r[1] == "cavs"] + [r for r in rows if r[1] == "fold"][::-1]   # any row order
    df = pd.DataFrame(rows, columns=["panel", "system", "batch_size", "hidden", "epoch_s"])
    r = _ratios(df, ["d", "h"], "fold")
    assert len(r) == 4 and sorted(r.tolist()) == [2.0, 2.0, 3.0, 3.0]


def test_memory_table_and_figure_render_from_fig8_rows(tmp_path):
    import pandas as pd
    from plots.__main__ import render
    synthetic_csv(tmp_path, "fig8")
    path = results.csv_path(tmp_path, "fig8")
    df = pd.read_csv(path)
    df["peak_rss_mb"] = 300 + df["hidden"] * 0.5 + df["system"].map({"dynet": 1024}).fillna(0)
    df.to_csv(path, index=False)
    paths = {p.name for p in render("fig8", tmp_path)}
    assert {"fig8.png", "memory.md", "memory.csv", "memory.png"} <= paths
    text = (tmp_path / "figures" / "memory.md").read_text()
    assert "| workload | batch_size | hidden | cavs |" in text and "| Tree-LSTM | 64 | 1024 |" in text
    assert "DyNet reserves its memory pool" in text


def test_a_commit_id_that_reads_as_a_number_stays_text(tmp_path):
    """`3010e33` is a valid float: every plots reader keeps git_rev as the commit's text."""
    import pandas as pd
    from plots import load, sst
    synthetic_csv(tmp_path, "fig8")
    path = results.csv_path(tmp_path, "fig8")
    df = pd.read_csv(path)
    df["git_rev"] = "3010e33"
    df.to_csv(path, index=False)
    ok, _, _ = load.load(tmp_path, "fig8")
    assert set(ok["git_rev"]) == {"3010e33"}
    rows = [{"system": s, "epoch": e, "epoch_fraction": 1, "trees": 100, "train_s": 2.0 * (1 + (s == "dynet")),
             "eval_s": 0.1, "cum_train_s": 2.0 * e, "wall_s": 2.1 * e, "train_loss": 1.0 / e,
             "dev_fine": 0.40 + 0.01 * e, "dev_binary": 0.8, "best_epoch": int(e == 2),
             "test_fine": 0.41 if e == 2 else "", "test_binary": 0.8 if e == 2 else "", "batch_size": 25,
             "hidden": 8, "threads": 1, "profile": "quick", "status": "ok", "git_rev": "3010e33"}
            for s in ("cavs", "dynet") for e in (1, 2)]
    from experiments.studies import sst as study
    for r in rows:                                   # the study's other columns, as a run fills them
        r.update({c: 1.0 for c in study.COLUMNS if c not in r and c.endswith(("_s", "_per_s"))})
    pd.DataFrame(rows).reindex(columns=study.COLUMNS).to_csv(tmp_path / "sst.csv", index=False)
    sst.render(tmp_path)
    assert "git 3010e33," in (tmp_path / "figures" / "sst.md").read_text()


def test_a_line_without_the_headers_fields_is_left_out_naming_it_and_the_rest_is_kept(tmp_path):
    """One bad line (a hand edit, a write cut short) used to make the newest row's profile NaN, and
    the whole figure 'no rows of profile nan'."""
    from plots import load
    synthetic_csv(tmp_path, "fig8")
    path = results.csv_path(tmp_path, "fig8")
    good_rows = len(results.read_rows(path))
    with open(path, "a") as f:
        f.write("garbage,line\n")
    with pytest.warns(UserWarning, match=rf"fig8.csv: line {good_rows + 2} does not have the header's \d+ fields"):
        ok, failed, profile = load.load(tmp_path, "fig8")
    assert len(ok) + len(failed) == good_rows and profile == "cpu"


def test_claims_say_where_their_cells_ran(tmp_path):
    """The claims table names the device and threads of its own rows: a gpu-check directory's claims
    are not labelled 'CPU, 1 thread', nor told that GPU ratios are not expected there."""
    import pandas as pd
    from plots.claims import claims
    from plots.report import claims_section
    synthetic_csv(tmp_path, "fig8")
    assert "| measured here (CPU, 1 thread) |" in claims(tmp_path)
    assert "not launch-bound" in "\n".join(claims_section(tmp_path))
    path = results.csv_path(tmp_path, "fig8")
    df = pd.read_csv(path)
    df["device"], df["threads"] = "cuda", 1
    df.to_csv(path, index=False)
    assert "| measured here (GPU) |" in claims(tmp_path)
    section = "\n".join(claims_section(tmp_path))
    assert "Measured on a GPU" in section and "not launch-bound" not in section
    df["device"], df["threads"] = "cpu", 2
    df.to_csv(path, index=False)
    assert "| measured here (CPU, 2 threads) |" in claims(tmp_path)
