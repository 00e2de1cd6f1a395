"""Machine kinds: a results directory holds one kind, and a machine of another kind measures into its own."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import machine, results, runner
from experiments.__main__ import main as experiments_main

ROOT = Path(__file__).resolve().parents[2]
OTHER = {"cpu_model": "Another CPU(R) @ 9.9GHz", "cpu_count": 64, "gpu": None, "libraries": {}}


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_kind_label_and_slug():
    k = {"cpu_model": "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", "cpu_count": 80, "memory_gib": 377,
         "gpu": "4 x NVIDIA A100-SXM4-80GB"}
    assert machine.label(k) == "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz, 80 CPUs, 377 GiB, 4 x NVIDIA A100-SXM4-80GB"
    assert machine.slug(k) == "intel-xeon-gold-6248-80cpu-377gib-4-x-nvidia-a100-sxm4-80gb"
    ours = machine.kind()
    assert set(ours) == set(machine.KIND_KEYS) and ours["cpu_count"] == os.cpu_count()
    # environment.json before machine_kind existed: nvidia-smi's name, memory, driver lines
    old = {"cpu_model": "X", "cpu_count": 8, "gpu": "NVIDIA H200, 143771 MiB, 570.1\nNVIDIA H200, 143771 MiB, 570.1"}
    assert machine.kind_of_environment(old) == {"cpu_model": "X", "cpu_count": 8, "gpu": "2 x NVIDIA H200"}


def test_default_directory_is_always_this_kinds_own(tmp_path):
    """The results root holds one directory per kind and its index, never rows of its own."""
    ours = machine.kind()
    path, why = machine.default_results_dir(ours, tmp_path)
    assert path == tmp_path / machine.slug(ours) and "is new" in why                     # empty root
    (tmp_path / "environment.json").write_text(json.dumps({**OTHER}))
    assert machine.default_results_dir(ours, tmp_path)[0] == tmp_path / machine.slug(ours)
    with pytest.raises(SystemExit, match=r"holds results measured on another machine .* Measure into a "
                                         r"directory of your own"):
        machine.check_results_dir(tmp_path, ours)
    own = tmp_path / machine.slug(ours)
    own.mkdir()
    (own / "environment.json").write_text(json.dumps({"machine_kind": ours}))
    path, why = machine.default_results_dir(ours, tmp_path)
    assert path == own and "holds this kind's results" in why                           # this kind: use it
    machine.check_results_dir(own, ours)


def test_rows_of_another_kind_refuse_the_directory(tmp_path):
    """A CSV whose rows name another machine kind is not resumed here even without environment.json."""
    ours = machine.kind()
    row = {c: "" for c in results.COLUMNS}
    results.append_row(results.csv_path(tmp_path, "fig8"), {**row, "cell_id": "a", "status": "ok",
                                                            "machine": "Another CPU, 64 CPUs, 256 GiB, no GPU"})
    with pytest.raises(SystemExit, match="Another CPU, 64 CPUs"):
        machine.check_results_dir(tmp_path, ours)
    assert machine.default_results_dir(ours, tmp_path)[0] == tmp_path / machine.slug(ours)


def test_nodes_of_one_kind_pass_and_two_kinds_name_their_nodes():
    ours = machine.kind()
    assert machine.check_nodes({"a": ours, "b": dict(ours)}) == ours
    with pytest.raises(SystemExit, match=r"2 machine kinds \(a, c: .*; b: Another CPU"):
        machine.check_nodes({"a": ours, "b": {**ours, "cpu_model": "Another CPU"}, "c": ours})


def test_an_old_csv_gets_the_new_columns_when_a_row_is_appended(tmp_path):
    path = results.csv_path(tmp_path, "fig8")
    old = [c for c in results.COLUMNS if c not in ("node", "machine")]
    path.write_text(",".join(old) + "\n" + ",".join("ok" if c == "status" else "x" if c == "cell_id" else ""
                                                    for c in old) + "\n")
    assert results.append_row(path, {"cell_id": "y", "status": "ok", "node": "n", "machine": "m"})
    assert not results.append_row(path, {"cell_id": "x", "status": "ok"})
    rows = results.read_rows(path)
    assert path.read_text().splitlines()[0].split(",") == list(results.COLUMNS)
    assert [(r["cell_id"], r["node"], r["machine"]) for r in rows] == [("x", "", ""), ("y", "n", "m")]


def test_results_dir_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "environment.json").write_text(json.dumps(OTHER))
    assert experiments_main(["results-dir"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"results/{machine.slug(machine.kind())}" and "this kind has no results yet" in err
    assert experiments_main(["results-dir", "--results", "mine"]) == 0 and capsys.readouterr().out == "mine\n"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_fig8_on_another_kind_of_machine_measures_into_its_own_directory(tmp_path):
    """`make fig8 PROFILE=quick SYSTEMS=cavs PANELS=c,g` (Tree-FC, the cheapest), no RESULTS=, in a
    checkout whose results/ came from another kind of machine: the sweep and figure land in results/<this kind>/ and results/ is left as it was."""
    for name in ("Makefile",):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))          # the Python running the tests (.venv under make)
    reference = tmp_path / "results"
    reference.mkdir()
    (reference / "environment.json").write_text(json.dumps(OTHER))
    (reference / "fig8.csv").write_text(",".join(results.COLUMNS) + "\n")
    before = snapshot(reference)
    own = f"results/{machine.slug(machine.kind())}"
    # -o: the .venv stamp counts as made (this is the project's .venv, not a fresh one)
    proc = subprocess.run(["make", "-o", ".venv/.installed", "fig8", "PROFILE=quick", "SYSTEMS=cavs",
                           "PANELS=c,g"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"results in {own}" in proc.stdout and "this kind has no results yet" in proc.stderr
    rows = results.read_rows(tmp_path / own / "fig8.csv")
    assert len(rows) == 4 and {r["system"] for r in rows} == {"cavs"} and {r["panel"] for r in rows} == {"c", "g"}
    assert all(r["status"] == "ok" for r in rows), {r["status"] for r in rows}
    assert {r["machine"] for r in rows} == {machine.label(machine.kind())}
    assert (tmp_path / own / "figures" / "fig8.png").stat().st_size > 0
    assert json.loads((tmp_path / own / "environment.json").read_text())["machine_kind"] == machine.kind()
    after = {k: v for k, v in snapshot(reference).items() if not k.startswith(own[len("results/"):] + "/")}
    assert after == before


CPUINFO = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: {family}
model		: 2
model name	: AMD EPYC
flags		: fpu sse2 sse4_2 avx avx2 fma {extra}

processor	: 1
vendor_id	: AuthenticAMD
cpu family	: {family}
model		: 2
model name	: AMD EPYC
flags		: fpu sse2 sse4_2 avx avx2 fma {extra}
"""


def test_cpu_generations_of_one_model_string_are_two_kinds():
    """These VMs call every EPYC generation "AMD EPYC": the family (and ISA) must tell them apart."""
    old = machine.kind(CPUINFO.format(family=25, extra="avx512f"))
    new = machine.kind(CPUINFO.format(family=26, extra="avx512f"))
    assert old["cpu_model"] == new["cpu_model"] == "AMD EPYC"
    assert (old["cpu_vendor"], old["cpu_family"], old["cpu_model_number"], old["cpu_isa"]) == \
        ("AuthenticAMD", "25", "2", "avx512f")
    assert old != new and machine.differences(old, new) == ["cpu_family"]
    assert machine.slug(old) != machine.slug(new) and machine.label(old) != machine.label(new)
    assert machine.slug(new) == f"amd-epyc-f26m2-avx512f-{os.cpu_count()}cpu-{new['memory_gib']}gib"
    assert machine.kind(CPUINFO.format(family=26, extra=""))["cpu_isa"] == "avx2"
    assert machine.kind(CPUINFO.format(family=26, extra="avx512f amx_tile"))["cpu_isa"] == "amx"
    arm = machine.kind("processor : 0\nFeatures : fp asimd sve\nCPU implementer : 0x41\n"
                       "CPU architecture: 8\nCPU part : 0xd40\n")
    assert (arm["cpu_vendor"], arm["cpu_family"], arm["cpu_model_number"], arm["cpu_isa"]) == \
        ("0x41", "8", "0xd40", "sve")


def test_a_directory_recorded_before_the_generation_was_known_is_another_kind(tmp_path):
    """results/amd-epyc-2cpu-24gib/ was measured before the kind had the CPU family: whatever machine
    reads it now, it cannot tell that the numbers are its own, so a sweep refuses to add to it and
    measures into a directory of its own."""
    ours = machine.kind()
    legacy = {k: ours[k] for k in ("cpu_model", "cpu_count", "memory_gib", "gpu")}
    (tmp_path / "environment.json").write_text(json.dumps({"machine_kind": legacy}))
    assert machine.differences(legacy, ours) == list(machine.GENERATION_KEYS)
    with pytest.raises(SystemExit, match=re.escape(machine.label(legacy))):
        machine.check_results_dir(tmp_path, ours)
    assert machine.slug(ours) != machine.slug(legacy)


def test_resuming_never_mixes_machines(tmp_path):
    """results/ holds the reference machine's rows: another machine must measure into its own dir."""
    (tmp_path / "environment.json").write_text(json.dumps({"cpu_model": "another CPU", "cpu_count": 64, "gpu": None}))
    with pytest.raises(SystemExit, match="measured on another machine"):
        runner._check_same_machine(tmp_path)
    runner.environment.write(tmp_path, 1, "quick")         # this machine's record: resuming is fine
    runner._check_same_machine(tmp_path)
