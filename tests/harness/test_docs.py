"""The README and docs/ as a reader meets them (length, links, no tracker numbers), and the results
report plots/report.py generates (sections, commits, machine, the README's claims block)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from experiments.results import COLUMNS
from plots import report

ROOT = Path(__file__).resolve().parents[2]          # tests/harness/ (tests/README.md is not a docs page)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TRACKER = re.compile(r"issue [0-9]|#1[0-9]")


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)       # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)                                 # nor do code spans
    return LINK.findall(text)


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; keep it at most 250"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    broken = []
    for target in _links(page):
        if re.match(r"^(https?:|mailto:)", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_tracker_numbers(page):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(page.read_text().splitlines(), 1)
            if TRACKER.search(line)]
    assert not hits, f"{page.relative_to(ROOT)} names tracker numbers a reader cannot see: {hits}"


def test_readme_vertex_function_example_runs():
    """The README's code block trains one step with the current public API."""
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## A vertex function.*?```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert 0 < scope["loss"] < 10


def test_workload_spec_is_in_the_repository():
    assert (ROOT / "docs" / "workloads.md").exists()
    for page in PAGES:
        assert "WORKLOADS.md" not in page.read_text(), f"{page.name}: refer to docs/workloads.md"   # not ../shared/


def test_the_link_checker_sees_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See [a](docs/x.md#part), ![b](fig.png), [c](https://x.org), [d](#anchor).\n"
                    "Not links: `[e](f.md)` and\n```\n[g](h.md)\n```\n")
    assert _links(page) == ["docs/x.md#part", "fig.png", "https://x.org", "#anchor"]


# ---------------------------------------------------------------- the generated report

def _row(**values) -> dict:
    row = {c: "" for c in COLUMNS}
    row.update({"variant": "default", "options": "{}", "mode": "train", "leaves": 256, "threads": 1,
                "backend": "numpy", "device": "cpu", "samples": 64, "epoch_samples": 8192,
                "construct_s": 0.1, "compute_s": 0.9, "memory_s": 0.05, "total_s": 1.0, "extrapolated": True,
                "loss": 1.5, "status": "ok", "profile": "cpu", "timestamp": "2026-12-01T10:00:00",
                "ftz": True, "peak_rss_mb": 400.0})
    row.update(values)
    row["epoch_s"] = row["total_s"] / row["samples"] * row["epoch_samples"]
    row["cell_id"] = f"{row['experiment']}-{row['panel']}-{row['system']}-{row['batch_size']}-{row['hidden']}-{row['variant']}"
    return row


def _write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def results_dir(tmp_path):
    d = tmp_path / "results" / "test-cpu-2cpu-8gib"
    d.mkdir(parents=True)
    fig8 = []
    for system, speed in (("cavs", 1.0), ("dynet", 1.6), ("tensorflow", 2.5), ("cudnn", 1.1)):
        for panel, workload, bs, h in (("a", "fixed_lstm", 1, 512), ("a", "fixed_lstm", 64, 512),
                                       ("b", "var_lstm", 64, 512), ("e", "fixed_lstm", 64, 128)):
            fig8.append(_row(experiment="fig8", panel=panel, workload=workload, system=system,
                             batch_size=bs, hidden=h, total_s=speed * h / 512,
                             git_rev="abc1234" if system != "cudnn" else "def5678-dirty"))
    fig8.append(_row(experiment="fig8", panel="b", workload="var_lstm", system="dynet", batch_size=1,
                     hidden=512, status="timeout", git_rev="abc1234"))
    _write_csv(d / "fig8.csv", fig8)
    ablation = [_row(experiment="ablation", panel="tree_lstm", workload="tree_lstm", system="cavs", batch_size=64,
                     hidden=512, variant=v, total_s=t, git_rev="abc1234")
                for v, t in (("all-off", 1.2), ("lazy", 1.1), ("all-on", 1.0))]
    _write_csv(d / "ablation.csv", ablation)
    (d / "bench.csv").write_text("workload,hidden,system,total_s,floor_s,over_floor,git_rev\n"
                                 "tree_lstm,64,cavs,0.4,0.2,2.0,9999999\n")
    (d / "environment.json").write_text(json.dumps(
        {"machine_kind": {"cpu_model": "Test CPU", "cpu_vendor": "GenuineTest", "cpu_family": "6",
                          "cpu_model_number": "85", "cpu_isa": "avx2", "cpu_count": 2, "memory_gib": 8,
                          "gpu": None},
         "libraries": {"numpy": "2.0"}, "numeric": {"ftz": True, "daz": True}, "git_rev": "abc1234"}))
    (d / "figures").mkdir()
    (d / "figures" / "fig8.png").write_bytes(b"\x89PNG")
    (d / "notes.md").write_text("Hand-written: the VM was quiet.\n")
    return d


def test_report_has_sections_commits_and_machine(results_dir):
    out = report.write(results_dir)
    text = out.read_text()
    assert out == results_dir / "REPORT.md"
    assert "Test CPU (GenuineTest family 6 model 85, avx2), 2 CPUs, 8 GiB, no GPU" in text
    for heading in ("## Figure 8", "## Ablation", "## The engine against DyNet", "## The paper's claims",
                    "## Notes"):
        assert heading in text, heading
    assert "## Figure 9" not in text and "## Table 1" not in text      # only what the directory holds
    assert "`abc1234` (13 rows)" in text and "`def5678-dirty` (4 rows)" in text   # fig8's commits
    assert "`abc1234` (3 rows)" in text                               # the ablation's
    assert "`9999999` (1 row)" in text                                # a study's git_rev, read as text
    assert "![Figure 8" in text and "(figures/fig8.png)" in text
    assert "![Ablation" not in text                                   # no figures/ablation.png
    assert "Hand-written: the VM was quiet." in text
    assert "1 timeout" in text
    fig8 = text[text.index("## Figure 8"):text.index("## Ablation")]
    assert "| panel | workload | bs | h | cavs | cudnn | tensorflow | dynet |" in fig8
    assert "Fixed-LSTM" in fig8
    claims = text[text.index("## The paper's claims"):text.index("## Figure 8")]
    assert "fig8 b, f: tensorflow / cavs" in claims and "2.50x" in claims
    assert report.report(results_dir) == text                         # no date: regenerating changes nothing


def test_report_of_an_empty_directory(tmp_path):
    d = tmp_path / "empty-kind"
    d.mkdir()
    text = report.write(d).read_text()
    assert "No figure, table or study" in text and "## Figure 8" not in text


def test_report_all_writes_every_kind(results_dir):
    other = results_dir.parent / "other-kind"
    other.mkdir()
    report.main(["--all", "--root", str(results_dir.parent)])
    assert (results_dir / "REPORT.md").exists() and (other / "REPORT.md").exists()


def test_update_readme_replaces_only_the_claims_block(results_dir, tmp_path):
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    original = readme.read_text()
    assert report.BEGIN in original and report.END in original
    before, after = original.split(report.BEGIN)[0], original.split(report.END)[1]
    report.main(["--results", str(results_dir), "--update-readme", str(readme)])
    text = readme.read_text()
    assert text.startswith(before + report.BEGIN) and text.endswith(report.END + after)
    block = text.split(report.BEGIN)[1].split(report.END)[0]
    assert "| paper's claim |" in block and "fig8 b, f: tensorflow / cavs" in block
    assert "`abc1234`" in block and "Test CPU" in block
    report.main(["--results", str(results_dir), "--update-readme", str(readme)])
    assert readme.read_text() == text                                 # idempotent


def test_update_readme_without_markers_fails(results_dir, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(SystemExit):
        report.update_readme(readme, results_dir)
    assert readme.read_text() == "# no markers\n"
