# Every target sets up .venv by itself on first use (pinned versions from pyproject.toml).
PYTHON_BOOT ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PROFILE     ?=
SYSTEMS     ?=
# RESULTS empty: results/ on the reference kind of machine (or an empty results/), else results/<kind>/
RESULTS     ?=
# EXECUTOR=ray runs each cell as a Ray task (pip extra `cluster`); RAY_ADDRESS=auto|ray://host:10001
EXECUTOR    ?=
RAY_ADDRESS ?=
RUN_ARGS     = $(if $(EXECUTOR),--executor $(EXECUTOR)) $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS))
EXP_ARGS     = $(if $(PROFILE),--profile $(PROFILE)) $(if $(SYSTEMS),--systems $(SYSTEMS)) $(RUN_ARGS)

.PHONY: venv test fig8 fig9 table1 table2 ablation all sst bench bench-ci bench-ci-update gpu-check clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[baselines,harness,dev,cluster]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q --timeout=600 tests

# the directory is chosen once (experiments/machine.py) and both steps use it
fig8 fig9 table1 table2 ablation: $(STAMP)
	@dir=$$($(PY) -m experiments results-dir $(RUN_ARGS) $(if $(RESULTS),--results $(RESULTS))) && \
	echo "results in $$dir" && \
	$(PY) -m experiments run $@ $(EXP_ARGS) --results $$dir && \
	$(PY) -m plots $@ --results $$dir

all: fig8 fig9 table1 table2 ablation

# SST sentiment trained to accuracy on Cavs, DyNet and PyTorch: results/sst.csv, figures/sst.* (issue 13)
sst: $(STAMP)
	$(PY) -m experiments.sst --no-plot $(if $(PROFILE),--profile $(PROFILE)) $(if $(SYSTEMS),--systems $(SYSTEMS)) --results $(or $(RESULTS),results)
	$(PY) -m plots.sst --results $(or $(RESULTS),results)

# the engine's speed against DyNet and the GEMM floor (issues 2 and 3)
bench: $(STAMP)
	$(PY) -m experiments.bench --results $(or $(RESULTS),results)

bench-ci: $(STAMP)
	$(PY) -m experiments.ci_bench check --results $(or $(RESULTS),results)/ci

bench-ci-update: $(STAMP)
	$(PY) -m experiments.ci_bench update --results $(or $(RESULTS),results)/ci

# on a GPU machine (CuPy and PyTorch preinstalled there): tests on CuPy + a short sweep into results/gpu
gpu-check:
	CAVS_BACKEND=cupy python3 -m pytest -q -x tests
	python3 -m experiments run fig8 --profile gpu-quick --results results/gpu

clean-venv:
	rm -rf $(VENV)
