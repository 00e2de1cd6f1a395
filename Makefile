# Every target sets up .venv by itself on first use (pinned versions from pyproject.toml).
PYTHON_BOOT ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PROFILE     ?=
SYSTEMS     ?=
RESULTS     ?= results
EXP_ARGS     = $(if $(PROFILE),--profile $(PROFILE)) $(if $(SYSTEMS),--systems $(SYSTEMS)) --results $(RESULTS)

.PHONY: venv test fig8 fig9 table1 table2 ablation all bench bench-ci bench-ci-update gpu-check clean-venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[baselines,harness,dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q --timeout=600 tests

fig8 fig9 table1 table2 ablation: $(STAMP)
	$(PY) -m experiments run $@ $(EXP_ARGS)
	$(PY) -m plots $@ --results $(RESULTS)

all: fig8 fig9 table1 table2 ablation

# the engine's speed against DyNet and the GEMM floor (issues 2 and 3)
bench: $(STAMP)
	$(PY) -m experiments.bench --results $(RESULTS)

bench-ci: $(STAMP)
	$(PY) -m experiments.ci_bench check --results $(RESULTS)/ci

bench-ci-update: $(STAMP)
	$(PY) -m experiments.ci_bench update --results $(RESULTS)/ci

# on a GPU machine (CuPy and PyTorch preinstalled there): tests on CuPy + a short sweep into results/gpu
gpu-check:
	CAVS_BACKEND=cupy python3 -m pytest -q -x tests
	python3 -m experiments run fig8 --profile gpu-quick --results results/gpu

clean-venv:
	rm -rf $(VENV)
