"""The evaluation harness: a declared registry of the paper's figures and tables (registry.py), profiles
that size each cell (profiles.py), a runner that measures each cell in its own subprocess (runner.py,
cell.py) into long-format CSVs (results.py), and the bench-ci regression check (ci_bench.py)."""
