# gpufeed — every target is idempotent on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# `make run` gets its own venv with the runtime dependencies only (no torch, mypy, pytest,
# grafanalib): what a node needs, and what tests/test_packaging.py checks it installs.
RUN_VENV ?= .venv-run
RUN_STAMP := $(RUN_VENV)/.installed
ARGS ?=

.PHONY: install runtime run promtool test lint typecheck unit bench bench-correlator soak lab lab-multinode lab-parity dlio-venv dashboards alerts docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

runtime: $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(RUN_VENV)/bin/python || $(PYTHON) -m venv $(RUN_VENV)
	$(RUN_VENV)/bin/python -m pip install -q --upgrade pip
	$(RUN_VENV)/bin/python -m pip install -q -e .
	touch $(RUN_STAMP)

# Starts the agent in the foreground. On a host without NVIDIA GPUs the agent runs the
# built-in simulated node (and says so); pass flags with ARGS="...".
run: runtime
	@if [ -e /dev/nvidiactl ] || nvidia-smi -L >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: starting the agent on NVML"; \
	  $(RUN_VENV)/bin/gpufeed agent $(ARGS); \
	else \
	  echo "no NVIDIA GPU on this host: starting the SIMULATED node (built-in scenario)"; \
	  $(RUN_VENV)/bin/gpufeed agent --simulate $(ARGS); \
	fi

# The real servers the tests run: Debian's prometheus (promtool), alertmanager (amtool),
# node_exporter (the benchmark's reference), e2fsprogs for the loop-mounted tiers, iproute2
# (ip netns, tc) for the multi-node lab,
# systemd for systemd-analyze (the unit's verify and security checks), python3-seccomp (the
# agent run under the unit's system-call filter), python3-fusepy (lab/capacity_fs.py: a
# lab tier's shared read capacity), openssl for the certificates of the
# TLS tests, victoria-metrics (the streamed `analyze --prometheus` test and benchmark),
# slurmctld, slurmd, slurm-client (the real Slurm of tests/test_scheduler_slurm.py), and
# nginx-light (the tenant gateway of tests/test_fleet_servers.py, started by the test with
# its own config; on a host without a policy-rc.d the package also starts its default site).
# DPkg::Lock::Timeout: two fresh `make test` runs on one host wait for each other's
# apt-get instead of failing on the dpkg lock.
promtool:
	@missing=""; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v amtool >/dev/null 2>&1 || missing="$$missing prometheus-alertmanager"; \
	command -v prometheus-node-exporter >/dev/null 2>&1 || missing="$$missing prometheus-node-exporter"; \
	command -v mkfs.ext4 >/dev/null 2>&1 || missing="$$missing e2fsprogs"; \
	command -v tc >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
	command -v victoria-metrics >/dev/null 2>&1 || missing="$$missing victoria-metrics"; \
	command -v slurmctld >/dev/null 2>&1 || missing="$$missing slurmctld"; \
	command -v slurmd >/dev/null 2>&1 || missing="$$missing slurmd"; \
	command -v squeue >/dev/null 2>&1 || missing="$$missing slurm-client"; \
	command -v nginx >/dev/null 2>&1 || missing="$$missing nginx-light"; \
	/usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1 || missing="$$missing python3-seccomp"; \
	/usr/bin/python3 -c 'import fusepy' >/dev/null 2>&1 || missing="$$missing python3-fusepy"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing >/dev/null; \
	fi

lint: install
	$(VENV)/bin/ruff check exporter tests bench dashboards alerts lab
	$(VENV)/bin/ruff format --check exporter tests bench dashboards alerts lab

typecheck: install
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest -q -m "not slow"

# The suite in TEST_WORKERS processes (pytest-xdist): much of its wall time is waiting on
# real servers, subprocesses and the lab's fixed schedules, which 2 processes overlap, one
# per core, so that no test gets less than the core it had when the suite ran alone
# (docs/benchmarks.md, "Test suite"). Tests that bound a latency or a CPU share (marker
# `serial`) run afterwards, alone. --dist loadgroup: the tests of one xdist_group (two that
# build the package in this checkout) share one process.
TEST_WORKERS ?= 2
test: install promtool lint typecheck
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not serial"
	$(PY) -m pytest -q -m serial

bench: install promtool
	$(PY) -m bench.run_all

bench-correlator: install
	$(PY) -m bench.correlator_accuracy --simulated
	$(PY) -m bench.culprit_accuracy
	$(PY) -m bench.culprit_accuracy --guise compute_only
	$(PY) -m bench.network_accuracy
	$(PY) -m bench.never_healthy_accuracy

# One hour of a real agent under scrapes, /api/windows, SDK jobs and idle connections;
# fails if RSS grows >= 5 MB/h after warm-up, fds or threads rise, or /metrics p99 >= 10 ms.
# Not part of `make test`. ARGS="--minutes 10 --warmup-minutes 3" for a short one.
soak: install
	$(PY) -m bench.soak $(ARGS)

# The fault lab (docs/lab.md), root, two tracks at once (docs/lab.md, "Time budget"):
# A: the "lab" suite's single-node scenarios (lab/scenarios/*.yaml; ARGS go here), each under
#    `gpufeed run` and with the SDK AT THE SAME TIME, real faults against the real agent, in
#    LAB_JOBS lanes side by side (lab.run --jobs: single-node 630 s beside startup-idle 290 s
#    then s3-slow 220 s, each + 35 s tail + setup: ~12 min; one lane ~23 min);
# B: DLIO's agreement with gpufeed (lab/dlio_check.py, ~3 min; its venv once: dlio-venv),
#    then the multi-node scenarios one at a time (~1.5 min each on 2 cores; LAB_MULTINODE_JOBS=2
#    runs two at once, quicker but their ranks then share the CPU).
# Each track's faults stay on its own loop devices, cgroups, processes and namespaces; they
# share the host's CPU and the disk under the loop images. About 17 min on 2 cores. Writes
# lab-results/report.md (+ .json, a timeline PNG per run, every run's wall time),
# lab-results/dlio/, lab-results/multinode/; exit 1 when a scenario misses its targets.
# ARGS="single-node --launcher sdk" runs a part of track A. The short forms run inside
# `make test` (tests/test_lab_short.py, tests/test_lab_multinode.py).
LAB_MULTINODE_JOBS ?= 1
LAB_JOBS ?= 2
lab: install promtool dlio-venv
	@mkdir -p lab-results; status=0; \
	  ( s=0; $(PY) -m lab.dlio_check --out lab-results --venv $(DLIO_VENV) || s=$$?; \
	    $(PY) -m lab.multinode.run --suite lab --live-fleet --jobs $(LAB_MULTINODE_JOBS) \
	      --results lab-results/multinode || s=$$?; exit $$s ) > lab-results/track-b.log 2>&1 & \
	  b=$$!; \
	  $(PY) -m lab.run --suite lab --jobs $(LAB_JOBS) --out lab-results $(ARGS) || status=$$?; \
	  wait $$b || status=$$?; cat lab-results/track-b.log; \
	  exit $$status

# The fault lab's multi-node scenarios (root; docs/lab.md, "Multi-node on one host"): 2-4
# network-namespace "nodes", one DDP job, a fault on one node; what every node's agent said
# goes to lab-results/multinode/ (report.md, per scenario run.json, score.json, recordings).
# About 2 minutes a scenario on 2 cores. Part of `make lab`.
# DLIO (MLPerf Storage's dlio_benchmark) for the lab's agreement check (lab/dlio_check.py),
# in a venv of its own: torch==2.13.0 (the local CPU wheel) first, DLIO's runtime
# dependencies (lab/dlio-requirements.txt says why each), then DLIO without its dependency
# list, which asks for unpinned torch/torchvision/torchaudio (the CUDA build) and
# nvidia-dali-cuda110 (cannot install without a GPU). mpi4py builds against Debian's Open MPI.
DLIO_VENV := .venv-dlio
dlio-venv: $(DLIO_VENV)/.installed

$(DLIO_VENV)/.installed: lab/dlio-requirements.txt
	@command -v mpicc >/dev/null 2>&1 || { echo "installing Debian packages: libopenmpi-dev openmpi-bin"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq libopenmpi-dev openmpi-bin >/dev/null; }
	test -x $(DLIO_VENV)/bin/python || $(PYTHON) -m venv $(DLIO_VENV)
	$(DLIO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DLIO_VENV)/bin/python -m pip install -q torch==2.13.0
	$(DLIO_VENV)/bin/python -m pip install -q -r lab/dlio-requirements.txt
	$(DLIO_VENV)/bin/python -m pip install -q --no-deps dlio_benchmark==2.0.0
	touch $@

lab-multinode: install promtool
	$(PY) -m lab.multinode.run --suite lab --live-fleet --results lab-results/multinode $(ARGS)

# The four-feed parity harness on real runs (docs/correlator.md, "The same run through every
# feed"): a CPU-only PyTorch job under `gpufeed run` with a stalled input pipeline, the agent
# recording, a real Prometheus scraping it, `analyze` of both, one fleet cycle; about 4
# minutes a scenario. ARGS="--keep-trace tests/fixtures/lab/parity" re-records the fixtures
# tests/test_feed_parity.py replays.
lab-parity: install
	$(PY) -m lab.parity --out lab-results/parity $(ARGS)

# Regenerate the committed dashboards/json/*.json, alerts/gpufeed.rules.yml and
# deploy/kubernetes/prometheusrule.yaml from code (tests fail when they drift).
dashboards: install
	$(PY) -m dashboards.build

# A site's selector, thresholds and runbook URL: make alerts ALERTS_CONFIG=site.yml
# (see alerts/config.example.yml; ARGS="--out FILE" writes elsewhere).
ALERTS_CONFIG ?=
alerts: install
	$(PY) -m alerts.build $(if $(ALERTS_CONFIG),--config $(ALERTS_CONFIG)) $(ARGS)

# Regenerate docs/metrics.md's tables from the metric catalogue and docs/configuration.md
# from the config dataclasses (tests fail when they drift).
docs: install
	$(PY) -m gpufeed.catalogue_doc docs/metrics.md
	$(PY) -m gpufeed.config_reference > docs/configuration.md

clean:
	rm -rf $(VENV) $(RUN_VENV) .pytest_cache .mypy_cache .ruff_cache
