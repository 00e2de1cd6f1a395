# Every target sets up .venv by itself on first use (pinned versions from pyproject.toml).
PYTHON_BOOT ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PROFILE     ?=
SYSTEMS     ?=
# PANELS=b,d: a subset of the experiment's panels (`python -m experiments list` names them)
PANELS      ?=
# RESULTS empty: results/<this machine's kind>/ (experiments/machine.py)
RESULTS     ?=
# EXECUTOR=ray runs each cell as a Ray task (pip extra `cluster`); RAY_ADDRESS=auto|ray://host:10001
# FTZ=0: flush-to-zero and denormals-are-zero off in every system's cells (default on, for all)
FTZ         ?= 1
EXECUTOR    ?=
RAY_ADDRESS ?=
RUN_ARGS     = $(if $(EXECUTOR),--executor $(EXECUTOR)) $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS))
EXP_ARGS     = $(if $(PROFILE),--profile $(PROFILE)) $(if $(SYSTEMS),--systems $(SYSTEMS)) $(if $(PANELS),--panels $(PANELS)) $(RUN_ARGS)

.PHONY: venv test fig8 fig9 table1 table2 ablation all sst extrapolation bench nary targets task-cost bench-ci bench-ci-update gpu-check report clean-venv torch-bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[baselines,harness,dev,cluster]'
	touch $(STAMP)

# two workers (pytest-xdist; a file's tests stay on one worker), then the tests that time the engine
# against a baseline (marked serial) alone, so that the other worker's load does not skew them
test: $(STAMP)
	$(PY) -m pytest -q --timeout=600 -n 2 --dist loadfile -m 'not serial' tests
	$(PY) -m pytest -q --timeout=600 -m serial tests

# the directory is chosen once (experiments/machine.py) and both steps use it
fig8 fig9 table1 table2 ablation: $(STAMP)
	@dir=$$($(PY) -m experiments results-dir $(RUN_ARGS) $(if $(RESULTS),--results $(RESULTS))) && \
	echo "results in $$dir" && \
	CAVS_FTZ=$(FTZ) $(PY) -m experiments run $@ $(EXP_ARGS) --results $$dir && \
	$(PY) -m plots $@ --results $$dir

all: fig8 fig9 table1 table2 ablation

# SST sentiment trained to accuracy on Cavs, DyNet and PyTorch: results/sst.csv, figures/sst.*
# (like the sweeps: results/<this machine's kind>/, or RESULTS=)
RESULTS_DIR  = $$($(PY) -m experiments results-dir $(if $(RESULTS),--results $(RESULTS)))

sst: $(STAMP)
	@dir=$(RESULTS_DIR) && echo "results in $$dir" && \
	CAVS_FTZ=$(FTZ) $(PY) -m experiments.studies sst $(if $(PROFILE),--profile $(PROFILE)) $(if $(SYSTEMS),--systems $(SYSTEMS)) --results $$dir && \
	$(PY) -m plots.sst --results $$dir

# the engine's speed against DyNet, TensorFlow, PyTorch by level and the GEMM floor
# THREADS=2: every system at one and at two compute threads, in the same run
THREADS     ?= 1
comma       := ,
bench: $(STAMP)
	@dir=$(RESULTS_DIR) && echo "results in $$dir" && \
		CAVS_FTZ=$(FTZ) $(PY) -m experiments.studies bench --native-check --results $$dir \
		$(if $(filter-out 1,$(THREADS)),--threads 1$(comma)$(THREADS))

# the child-sum Tree-LSTM on n-ary trees, on edges and on child slots, against DyNet and the floor: nary.csv
nary: $(STAMP)
	@dir=$(RESULTS_DIR) && echo "results in $$dir" && CAVS_FTZ=$(FTZ) $(PY) -m experiments.studies nary --results $$dir

# engine.step against forward + a torch head + backward + a torch SGD step through cavs.torch: torch_module.csv
torch-bench: $(STAMP)
	@dir=$(RESULTS_DIR) && echo "results in $$dir" && CAVS_FTZ=$(FTZ) $(PY) -m experiments.studies torch_module --results $$dir

# the speed targets against the floor and bound of bench.csv's and nary.csv's run: targets.md
targets: $(STAMP)
	@dir=$(RESULTS_DIR) && $(PY) -m experiments.studies targets --results $$dir

# a Tree-LSTM epoch split into products, construction and the fixed cost per loop task: task_cost.csv
task-cost: $(STAMP)
	@dir=$(RESULTS_DIR) && echo "results in $$dir" && CAVS_FTZ=$(FTZ) $(PY) -m experiments.studies task_cost --results $$dir

# the cpu profile's extrapolated epochs against whole (or 20x longer) measurements: extrapolation.csv
extrapolation: $(STAMP)
	@dir=$(RESULTS_DIR) && echo "results in $$dir" && CAVS_FTZ=$(FTZ) $(PY) -m experiments.studies extrapolation --results $$dir

# HEAD's engine against the baseline commit's (a git worktree), side by side, and Cavs's speedups over
# the reference systems (checked only against a baseline of this machine kind); CI_ARGS: e.g. --rounds 1
CI_ARGS     ?=
bench-ci: $(STAMP)
	$(PY) -m experiments.ci_bench check $(if $(RESULTS),--root $(RESULTS)) $(CI_ARGS)

# records HEAD's commit, this machine's kind and its speedups in results/<kind>/ci/baseline.json
bench-ci-update: $(STAMP)
	$(PY) -m experiments.ci_bench update $(if $(RESULTS),--root $(RESULTS)) $(CI_ARGS)

# on a GPU machine, with its own python3 (CuPy, PyTorch), never .venv: the CuPy tests, then a sweep sized to
# fit 8 minutes (experiments/gpu_check.py; `python3 -m experiments.gpu_check --dry-run` prints the plan),
# then the figures; into results/gpu/ (results/gpu/<kind>/ where it holds another machine's). Goes on past
# any failure; exits 1 if anything failed.
gpu-check:
	@dir=$$(python3 -m experiments.gpu_check --results results/gpu --where); dir=$${dir:-results/gpu}; \
	status=0; python3 -m experiments.gpu_check --results $$dir || status=1; \
	for figure in fig8 ablation; do python3 -m plots $$figure --results $$dir || status=1; done; \
	echo "gpu-check: results in $$dir (gpu_check.md)"; exit $$status

# results/<kind>/REPORT.md for every kind directory (RESULTS=<dir>: that one only)
report: $(STAMP)
	$(PY) -m plots.report $(if $(RESULTS),--results $(RESULTS),--all)

clean-venv:
	rm -rf $(VENV)
