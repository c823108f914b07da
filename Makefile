# raftlog — a Kafka-style streaming log in Python.
# `make demo` and `make test` work from a fresh clone with Python 3.11, make and apt.

PYTHON  ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# Debian packages the suite needs, as "command:package" (or "file:package") pairs; installed only
# when missing, before the venv: pyfuse3 (chaos.lazyfs, the forgetful filesystem) is built
# against libfuse3-dev with pkg-config, and mounts need fusermount3 (fuse3).
DEB_NEEDS := iptables:iptables kcat:kcat perf:linux-perf fusermount3:fuse3 pkg-config:pkg-config \
  /usr/include/fuse3/fuse_lowlevel.h:libfuse3-dev
PYTEST_WORKERS ?= 2
# Every node, command, Spark worker and test worker is a new interpreter: with
# PYTHONDONTWRITEBYTECODE set (as in some CI images) each one compiled raftlog's ~300 modules
# from source again, ~0.7 s of CPU a start, and each xdist worker its test modules (collection
# 17 s against 9). The clone's bytecode is cached as Python does by default, and compiled once
# up front so parallel first imports do not each compile it.
unexport PYTHONDONTWRITEBYTECODE
PACKAGES := raftlog metadata_quorum dataplane protos spark connect chaos bench tests

.PHONY: help venv debs deps lint docs test test-fast fuzz demo demo-storage pipeline bench chaos soak clean protos cluster-up cluster-down cluster-status

help:
	@echo "make demo   - set up, start 3 nodes, produce with acks=all through a leader SIGKILL, verify, stop;"
	@echo "             then the Spark pipeline (make pipeline)"
	@echo "make pipeline - 3 nodes + Spark: click counts per 10 s window, job stopped and restarted, checked"
	@echo "make demo-storage - the storage engine alone: SIGKILL a writer, recover, verify"
	@echo "make test   - set up, lint, build the manual, run the whole test suite"
	@echo "make lint   - ruff, mypy (strict on raftlog/, metadata_quorum/, spark/, connect/), import-linter,"
	@echo "             buf lint and buf breaking on protos/ (the gRPC API)"
	@echo "make docs   - the manual (docs/, MkDocs) built strictly into .site/; regenerates docs/performance.md"
	@echo "make bench  - benchmarks; figures in bench/results/latest.json and docs/performance.md"
	@echo "make fuzz   - every fuzz target (tests/fuzz/) for FUZZ_SECONDS=600 each; crashes in .raftlog/fuzz"
	@echo "make chaos  - 10-minute chaos run (3 nodes, NODES=5 for splits; every fault kind); report in .raftlog/chaos/report"
	@echo "make soak   - SOAK_MINUTES (120) of mixed workload and faults on 3 nodes, sampled every 10 s; report in bench/results/soak/"
	@echo "make cluster-up / cluster-down / cluster-status - the local 3-node cluster"

$(STAMP): pyproject.toml | debs
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

debs:
	@for need in $(DEB_NEEDS); do \
	  cmd=$${need%%:*}; pkg=$${need##*:}; \
	  [ -e "$$cmd" ] || command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

deps: debs venv
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES)

# buf lints protos/*.proto and checks them against the last released API (buf.yaml, docs/api.md);
# it is the npm package protos/buf/package-lock.json pins (a native binary, nothing fetched at run).
BUF := protos/buf/node_modules/.bin/buf
lint: DEB_NEEDS += node:nodejs npm:npm
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	[ protos/buf/node_modules/.installed -nt protos/buf/package-lock.json ] || \
	  { npm ci --prefix protos/buf --no-audit --no-fund && touch protos/buf/node_modules/.installed; }
	$(BUF) lint
	$(BUF) breaking --against protos/released/raftlog-v1.binpb

# The manual. docs/performance.md is generated from bench/results/latest.json and
# bench/performance_notes.md, docs/compatibility.md from the code that decides
# (dataplane/tools/compatibility_page.py); on CI (CI=true) both are only checked, so a stale
# committed page fails.
DOCS_SITE := .site
docs: venv
	$(BIN)/python -m bench.performance_page $(if $(CI),--check)
	$(BIN)/python -m dataplane.tools.compatibility_page $(if $(CI),--check)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

# kafkajs, a Node.js client, judges the KAFKA listener too (tests/dataplane/kafka/test_kafkajs.py):
# node and npm are Debian packages only the tests need; kafkajs is the version
# tests/js/package-lock.json pins, installed into tests/js/node_modules.
JS_STAMP := tests/js/node_modules/.installed
test test-fast: DEB_NEEDS += node:nodejs npm:npm
# the web console's browser test (tests/dataplane/console/test_console_browser.py): Selenium
# drives Debian's Chromium through its chromedriver, never a downloaded one
test test-fast: DEB_NEEDS += chromium:chromium chromedriver:chromium-driver
$(JS_STAMP): tests/js/package.json tests/js/package-lock.json | debs
	npm ci --prefix tests/js --no-audit --no-fund
	touch $(JS_STAMP)

# The Node.js gRPC client example (docs/api.md; tests/dataplane/server/test_node_grpc_client.py
# runs it): @grpc/grpc-js, @grpc/proto-loader and crc-32 as examples/node/package-lock.json pins.
NODE_EXAMPLE_STAMP := examples/node/node_modules/.installed
$(NODE_EXAMPLE_STAMP): examples/node/package.json examples/node/package-lock.json | debs
	npm ci --prefix examples/node --no-audit --no-fund
	touch $(NODE_EXAMPLE_STAMP)

test: deps $(JS_STAMP) $(NODE_EXAMPLE_STAMP) lint docs
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup

test-fast: deps $(JS_STAMP) $(NODE_EXAMPLE_STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow"

demo: deps
	$(BIN)/raftlog demo cluster
	$(BIN)/python -m spark.pipeline

pipeline: deps
	$(BIN)/python -m spark.pipeline

demo-storage: deps
	$(BIN)/raftlog demo storage

# The benchmark peer (NATS JetStream) and the limit tools (fio, iperf3) are Debian packages: only `make bench` needs them;
# bench.netem's namespaces and delays need iproute2 (ip, tc) and root (without root it says so and is skipped).
bench: DEB_NEEDS += nats-server:nats-server fio:fio iperf3:iperf3 ip:iproute2 tc:iproute2
bench: deps
	$(BIN)/python -m bench.storage_bench --out bench/results/latest.json
	$(BIN)/python -m bench.quorum_bench --out bench/results/latest.json
	$(BIN)/python -m bench.metadata_scale --partitions 10000 --out bench/results/latest.json
	$(BIN)/python -m bench.dataplane_bench --out bench/results/latest.json
	$(BIN)/python -m bench.groups_bench --out bench/results/latest.json
	$(BIN)/python -m bench.elastic_bench --out bench/results/latest.json
	$(BIN)/python -m bench.spark_bench --out bench/results/latest.json
	$(BIN)/python -m bench.kafka_protocol_bench --out bench/results/latest.json
	$(BIN)/python -m bench.peer_bench --out bench/results/latest.json
	$(BIN)/python -m bench.grpc_bench --out bench/results/latest.json
	$(BIN)/python -m bench.fetch_stream_bench --out bench/results/latest.json
	$(BIN)/python -m bench.e2e_latency --out bench/results/latest.json
	$(BIN)/python -m bench.netem --out bench/results/latest.json
	$(BIN)/python -m bench.connect_bench --out bench/results/latest.json
	$(BIN)/python -m bench.txn_bench --out bench/results/latest.json
	$(BIN)/python -m bench.security_bench --out bench/results/latest.json
	$(BIN)/python -m bench.performance_page

# The 10-minute chaos run: SEED=N NODES=3|5 DURATION=10m DURABILITY=default|fsync override; needs
# root (node users, iptables, FUSE). With DURABILITY=fsync every node also loses power at once.
SEED       ?= 1
NODES      ?= 3
DURATION   ?= 10m
DURABILITY ?= default
CHAOS_FAULTS = kill,pause,partition,controller-kill,leader-kill,disk-full,reassign,membership,power-loss$(if $(filter fsync,$(DURABILITY)),$(comma)power-loss-all)
comma := ,
chaos: deps
	$(BIN)/raftlog chaos run --seed $(SEED) --duration $(DURATION) --nodes $(NODES) \
	  --durability $(DURABILITY) --faults $(CHAOS_FAULTS) --report .raftlog/chaos/report

# The soak run (issue 30): SOAK_MINUTES of produce, consume, group churn, topic churn, the Spark
# job and a mirror on 3 nodes (127.0.0.67-69, the mirror's REST API on .70), a fault every few
# minutes, every node's RSS, descriptors, threads, disk and metadata log sampled every 10 s and
# judged (bench/soak_rules.py); report in bench/results/soak/<time>/. Needs root, as chaos does;
# the Spark job needs a JVM (Debian's default-jre-headless when `java` is missing).
SOAK_MINUTES ?= 120
soak: DEB_NEEDS += java:default-jre-headless
soak: deps
	$(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES) --seed $(SEED)

# Coverage-guided fuzzing (tests/fuzz/, atheris): every target for FUZZ_SECONDS each; crashes and
# the grown corpora are kept in FUZZ_OUT. `make test` runs each for its share of three minutes.
FUZZ_SECONDS ?= 600
FUZZ_OUT     ?= .raftlog/fuzz
fuzz: deps
	$(BIN)/python -m tests.fuzz.runner --seconds $(FUZZ_SECONDS) --out $(FUZZ_OUT)

# Generated modules are committed; tests/protos checks that regenerating changes nothing.
PROTO_SOURCES := $(wildcard protos/*.proto)
protos: venv
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m grpc_tools.protoc -I. \
	  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $(PROTO_SOURCES)

cluster-up: venv
	$(BIN)/raftlog cluster up

cluster-down: venv
	$(BIN)/raftlog cluster down

cluster-status: venv
	$(BIN)/raftlog cluster status

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .import_linter_cache $(DOCS_SITE)
