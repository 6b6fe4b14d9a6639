# Event store: run locally, test, build, deploy.
# Every target installs what it needs: Python tools into .venv (pinned below),
# Rust crates through cargo (Cargo.lock), Debian packages with apt-get.
SHELL := /bin/bash
space := $(subst ,, )
.DEFAULT_GOAL := help

VENV        ?= .venv
BIN         := $(CURDIR)/$(VENV)/bin
MOTO_PIN    := moto[server]==5.2.5
# Build and deploy tools (PyPI): cargo-lambda with zig for the arm64 cross build,
# the SAM CLI (with its translator), cfn-lint, pytest for the deployment tests, and
# AWS's KPL deaggregator (with its protobuf) to read the playback stream as a consumer would,
# pyarrow to read the archive's Parquet objects as a user's tools would, DuckDB to query them in SQL,
# and OpenTelemetry's API, whose context the Python client sends (tests/client_scenario.py).
TOOLS_PINS  := cargo-lambda==1.9.2 ziglang==0.17.0 aws-sam-cli==1.170.0 cfn-lint==1.58.0 pytest==9.2.0 aws-kinesis-agg==1.2.3 protobuf==7.36.2 pyarrow==26.0.1 duckdb==2.0.1 opentelemetry-api==1.45.2
# The stricter second pair of emulators, the IAM policy simulator the tests evaluate the
# functions' requests with against their roles (tests/iam/simulate.cjs), and the tracker script's
# compiler and bundler (clients/web): npm, installed into .node.
NODE_PINS   := dynalite@4.0.0 kinesalite@3.3.3 @cloud-copilot/iam-simulate@0.1.173 typescript@5.9.3 esbuild@0.28.2
FUNCTIONS   := load pump scan playback subscriptions streams relay archive privacy keys
STACK       ?= event-store-prod
CARGO       ?= cargo
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq

# Local runs: N hits at concurrency C (make demo: at RATE hits a second, a steady pace whose
# latency is the one a deployment gets; RATE= for as fast as C allows); the stack's settings
# pass through the environment.
N           ?= 1000
C           ?= 10
RATE        ?= 40
PORT        ?= 3000
# The local tools' own profile (Cargo.toml says why): built as the tests are, without debug info.
LOCAL_BIN   := target/tools/event-store-local
CLI_BIN     := target/tools/event-store
export PORT EMULATOR_PORT STAGE SCAN_INTERVAL ARCHIVE_INTERVAL HOT_RETENTION_SECONDS TIME_UNIT IP_MODE
export MOTO_SERVER ?= $(BIN)/moto-server
export SAM_CLI_TELEMETRY := 0

# `make invoke`: the deployed arm64 artefacts in a container under `sam local invoke`. Without
# DOCKER_HOST the engine is podman (Debian's), with runc; the Lambda base image SAM expects is built
# locally from a Debian root filesystem, so nothing is pulled from a registry.
FN          ?= playback
CONTAINER_PACKAGES := podman runc debootstrap qemu-user-static binfmt-support
LAMBDA_BASE := public.ecr.aws/lambda/provided:al2023-arm64
# debootstrap's mirror: the plain http(s)/ftp source of Debian's own bookworm that this machine's apt
# already uses (so a machine set up behind a mirror keeps using it); empty, so debootstrap's own
# default, when apt names none (no apt, lists not fetched yet, a mirror+file: or cdrom: source).
DEBIAN_MIRROR ?= $(shell apt-get indextargets --format '$$(REPO_URI) $$(RELEASE) $$(ORIGIN)' 2>/dev/null \
  | awk '$$2 == "bookworm" && $$3 == "Debian" && $$1 ~ /^(https?|ftp):\/\// {print $$1; exit}')
SAM         ?= $(BIN)/sam
export SAM

.PHONY: help demo local status playback tail subscription redrive load invoke api check test web bench bench-entity bench-archive bench-delivery bench-privacy bench-projection bench-trace build lint fuzz deploy destroy fmt template clean local-bin tools-moto tools tools-node tools-ab tools-chromium tools-container tools-faketime tools-clients

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

demo: tools-moto local-bin ## the main job end to end: stack, N pixel hits at RATE a second, playback, check (N=1000 C=10 RATE=40)
	$(LOCAL_BIN) demo --events $(N) --concurrency $(C) $(if $(RATE),--rate $(RATE))

local: tools-moto local-bin ## run the whole pipeline locally until Ctrl-C (pixel on 127.0.0.1:$(PORT))
	$(LOCAL_BIN) local

status: local-bin ## the store at a glance: watermark, pump, subscriptions, playbacks, queues, verdict (the local stack; STACK=<name> for a deployed one)
	$(CLI_BIN) $(if $(filter command line environment,$(origin STACK)),--stack '$(STACK)') status

playback: local-bin ## play back START..END (ISO 8601; default the 15 complete minutes before the watermark) [WAIT= RATE= FILTER= RESTART=true] (STACK=<name> for a deployed one)
	$(CLI_BIN) $(if $(filter command line environment,$(origin STACK)),--stack '$(STACK)') playback $(if $(START),--start '$(START)') $(if $(END),--end '$(END)') $(if $(WAIT),--wait '$(WAIT)') $(if $(RATE),--rate '$(RATE)') $(if $(FILTER),--filter '$(FILTER)') $(if $(filter-out false 0,$(RESTART)),--restart)

tail: local-bin ## print the complete log's events as their slots complete: FROM=now|beginning|<time> [FILTER=/path=/track.gif] (STACK=<name> for a deployed one)
	$(CLI_BIN) $(if $(filter command line environment,$(origin STACK)),--stack '$(STACK)') tail --from '$(or $(FROM),now)' $(if $(FILTER),--filter '$(FILTER)')

subscription: local-bin ## manage subscriptions: ARGS='list' | ARGS='create NAME --target kinesis:S --start beginning' | pause/resume/reset/delete/parked/redrive (STACK=<name> for a deployed one)
	$(CLI_BIN) $(if $(filter command line environment,$(origin STACK)),--stack '$(STACK)') subscription $(or $(ARGS),list)

redrive: local-bin ## drain the dead-letter queues (re-buffer, re-relay): STACK=<name> (both, from its outputs; PUMP=1 or RELAY=1 for one), or QUEUE=<url> with PUMP=1 or RELAY=1
	$(CLI_BIN) $(if $(filter command line environment,$(origin STACK)),--stack '$(STACK)') redrive $(if $(PUMP),--pump) $(if $(RELAY),--relay) $(if $(QUEUE),--queue '$(QUEUE)')

invoke: tools tools-container build local-bin ## run FN's deployed artefact in a container (sam local invoke) against `make local`: FN=playback|load|... [EVENT=events/FN.json]
	$(LOCAL_BIN) invoke $(FN) $(if $(EVENT),--event '$(EVENT)')

api: tools tools-container build local-bin ## serve the HTTP API from the deployed artefacts in warm containers (sam local start-api) on 127.0.0.1:API_PORT (3001), against `make local`
	$(LOCAL_BIN) api $(if $(API_PORT),--port $(API_PORT))

load: tools-ab ## ab -n N -c C against the local pixel (start `make local` first)
	@echo "== ab -n $(N) -c $(C) against http://127.0.0.1:$(PORT)/track.gif"
	ab -n $(N) -c $(C) 'http://127.0.0.1:$(PORT)/track.gif?EntityId=ab&page=load-test'

check: ## the edit-compile-test loop: clippy -D warnings and the unit tests (no emulator, no arm64 build)
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) test --workspace --lib --bins --locked

# Every suite runs even when one fails (cargo's --no-fail-fast; a failed suite is remembered in
# target/failed-suites, not fatal); the last lines count the tests and name what failed.
TEST_CARGO  := $(if $(CI),CARGO_INCREMENTAL=0 )$(CARGO)
# The unit tests once more under a clock ten years ahead (libfaketime as cargo's runner, in front of
# each unit-test binary; monotonic clocks left alone): a test that reads the wall clock where it
# should take its "now" as an argument fails here, years before it would in CI.
FUTURE      := +10y
FUTURE_RUN  := FAKETIME_DONT_FAKE_MONOTONIC=1 $(TEST_CARGO) --config "target.'cfg(all())'.runner = ['faketime', '-f', '$(FUTURE)']"
suite = set -o pipefail; { $(2); } 2>&1 | tee -a $(3) || { echo '$(1)' >> target/failed-suites; echo "== FAILED: $(1)"; }
# The counts of cargo's `test result:` lines and pytest's summary in the logs $(2), after the words $(1).
count = cat $(2) 2>/dev/null | awk '/^test result:/ {p+=$$4; f+=$$6; s+=$$8} \
	  / passed/ && !/^test result:/ {for (i = 1; i < NF; i++) { if ($$(i+1) ~ /^passed/) p += $$i; if ($$(i+1) ~ /^failed/) f += $$i; if ($$(i+1) ~ /^skipped/) s += $$i }} \
	  END {printf "$(1)%d passed, %d failed, %d skipped\n", p, f, s}'

test: lint tools-moto tools tools-node tools-clients tools-chromium tools-container tools-faketime ## lints, then all tests: unit (also under a clock 10 years ahead), integration (moto and dynalite/kinesalite), faults, end to end, browser, container, template
	@mkdir -p target && rm -f target/failed-suites target/build-test.log target/test.log target/future.log target/pytest.log
	@echo "== cargo lambda build --profile tools --arm64: the bootstraps the tests deploy (all ten) and run in a container (playback's)"
	@$(call suite,arm64 bootstraps,$(call lambda_build,--profile tools),target/build-test.log)
	@df -Ph . | awk 'NR == 2 {print "   disk free before the test build: " $$4}'
	@echo "== cargo test: unit tests, integration tests against moto_server, faults, demo, browser and container tests"
	@$(call suite,cargo test --workspace,$(TEST_CARGO) test --workspace --locked --no-fail-fast,target/test.log)
	@df -Ph . | awk 'NR == 2 {print "   disk free after it: " $$4}'
	@echo "== the unit tests of every crate again under a clock $(FUTURE) ahead: $$(faketime -f $(FUTURE) date -u +%F)"
	@$(call suite,unit tests at $(FUTURE),$(FUTURE_RUN) test --workspace --locked --no-fail-fast --lib --bins,target/future.log)
	@echo "== the integration suite again, against dynalite + kinesalite (strict about AWS limits)"
	@$(call suite,strict emulators,EMULATOR=strict $(TEST_CARGO) test --locked --no-fail-fast -p event-store --test load --test pump --test scan --test playback,target/test.log)
	@echo "== pytest: template translated, linted, deployed into moto's CloudFormation, functions under cargo lambda watch"
	@$(call suite,pytest,PATH=$(BIN):$$PATH $(BIN)/pytest -q tests clients/python/tests,target/pytest.log)
	@$(call count,,target/test.log target/pytest.log)
	@$(call count,unit tests again at $(FUTURE): ,target/future.log)
	@if [ -s target/failed-suites ]; then echo "FAILED suites: $$(paste -sd, target/failed-suites)"; \
	  grep -h -E '^test .* FAILED$$|^FAILED |^ERROR |^error: [0-9]+ targets? failed|^    `-p ' \
	    target/build-test.log target/test.log target/future.log target/pytest.log | sort -u; exit 1; fi

# cargo lambda build for arm64 (zig cross-linker from .venv) of the ten functions, in the profile $(1).
lambda_build = { command -v rustup >/dev/null && rustup target list --installed | grep -q aarch64-unknown-linux-gnu \
	  || rustup target add aarch64-unknown-linux-gnu; } && \
	PATH=$(BIN):$$PATH $(BIN)/cargo-lambda lambda build $(1) --arm64 --locked $(addprefix -p ,$(FUNCTIONS)) && \
	for f in $(FUNCTIONS); do ls -l target/lambda/$$f/bootstrap | awk '{printf "   %-13s %6.1f MB\n", "'$$f'", $$5 / 1048576}'; done

build: tools ## arm64 bootstraps of the ten functions, fully optimized (fat LTO): target/lambda/<fn>/bootstrap
	@echo "== cargo lambda build --release --arm64 (zig cross-linker from .venv)"
	@$(call lambda_build,--release)

lint: tools ## rustfmt, clippy -D warnings, cfn-lint and sam validate --lint on template.yaml
	@echo "== cargo fmt --check"
	$(CARGO) fmt --all -- --check
	@echo "== cargo clippy -D warnings"
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	@echo "== cfn-lint template.yaml"
	$(BIN)/cfn-lint template.yaml
	@echo "== sam validate --lint"
	AWS_DEFAULT_REGION=us-east-1 $(BIN)/sam validate --lint --template template.yaml

template: ## regenerate template.yaml from template/
	python3 template/generate.py

BENCH_EVENTS ?= 20000
export BENCH_EVENTS
bench: tools-moto tools-node build ## throughput per stage vs the emulator's raw capacity, requests per event -> bench/results.{md,json}
	@echo "== cargo run --release -p event-store-bench ($(BENCH_EVENTS) events per payload size)"
	$(CARGO) build --release --locked $(addprefix -p ,$(FUNCTIONS)) -p event-store-local -p event-store-bench
	./target/release/event-store-bench

bench-entity: tools-moto ## the entity-stream figures only (requests per append and load, appends/s vs raw, a hot stream, the metadata cleanup's write units per event removed) -> bench/entity.md, results.json's entity
	$(CARGO) build --release --locked -p event-store-bench
	BENCH_ONLY=entity ./target/release/event-store-bench

bench-delivery: tools-moto tools-node ## delivery's figures only (write units by slice count, read units per delivered event by partitions) -> bench/delivery.md, results.json's delivery
	$(CARGO) build --release --locked -p event-store-bench
	BENCH_ONLY=delivery ./target/release/event-store-bench

bench-projection: tools-moto ## projections' figures only (a count projection vs a subscription, write units per event, a rebuild's read side from each tier) -> bench/projection.md, results.json's projection
	$(CARGO) build --release --locked -p event-store-bench
	BENCH_ONLY=projection ./target/release/event-store-bench

bench-archive: tools-moto ## the cold tier's figures only (replay from each tier, archiving, storage cost) -> bench/archive.md, results.json's archive, docs/capacity.md
	$(CARGO) build --release --locked -p event-store-bench
	BENCH_ONLY=archive ./target/release/event-store-bench

bench-trace: tools-moto ## the trace context's cost only (bytes and write units an event's traceparent adds, as stored) -> bench/trace.md, results.json's trace
	$(CARGO) build --release --locked -p event-store-bench
	BENCH_ONLY=trace ./target/release/event-store-bench

bench-privacy: tools-moto ## per-subject encryption's figures only (load, pump, playback sealed vs not, KMS requests, $) -> bench/privacy.md, results.json's encryption
	$(CARGO) build --release --locked -p event-store-bench
	BENCH_ONLY=privacy ./target/release/event-store-bench

FUZZ_SECONDS ?= 30
fuzz: ## run each fuzz target for FUZZ_SECONDS (cargo fuzz on nightly; not part of make test)
	@command -v cargo-fuzz >/dev/null || { echo "== installing cargo-fuzz"; $(CARGO) install cargo-fuzz --version 0.13.2 --locked; }
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@for target in load_request buffer_item; do \
	  echo "== cargo fuzz run $$target ($(FUZZ_SECONDS) s)"; \
	  $(CARGO) +nightly fuzz run $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; done

deploy: build ## build, then sam deploy (guided the first time, when the stack does not exist yet)
	@if $(BIN)/sam list stack-outputs --stack-name $(STACK) >/dev/null 2>&1; then \
	  echo "== sam deploy ($(STACK))"; $(BIN)/sam deploy --stack-name $(STACK); \
	else \
	  echo "== first deploy: sam deploy --guided"; $(BIN)/sam deploy --guided --stack-name $(STACK); fi
	$(BIN)/sam list stack-outputs --stack-name $(STACK)

destroy: tools ## delete the deployed stack (the event table is retained)
	$(BIN)/sam delete --stack-name $(STACK)

fmt: ## format the code
	$(CARGO) fmt --all

clean: ## remove build output, the venv and .node
	$(CARGO) clean
	rm -rf $(VENV) .node clients/typescript/node_modules clients/typescript/dist

local-bin:
	@echo "== building the local stack and the event-store command (the tools profile)"
	$(CARGO) build --profile tools --locked -p event-store-local -p event-store-cli

$(BIN)/python:
	@echo "== creating the Python venv $(VENV)"
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Stamp files carry the pin, so changing a pin reinstalls.
$(VENV)/.moto-$(MOTO_PIN): | $(BIN)/python
	@echo "== installing $(MOTO_PIN) (the local DynamoDB/Kinesis/Lambda emulator)"
	$(BIN)/pip install -q '$(MOTO_PIN)'
	touch '$@'

# moto's server with Kinesis puts made atomic (crates/emulator/moto_server.py says why).
$(BIN)/moto-server: crates/emulator/moto_server.py $(VENV)/.moto-$(MOTO_PIN)
	{ echo '#!$(BIN)/python'; cat $<; } > '$@.tmp' && chmod +x '$@.tmp' && mv '$@.tmp' '$@'

tools-moto: $(BIN)/moto-server

$(VENV)/.tools-$(subst $(space),_,$(TOOLS_PINS)): | $(BIN)/python
	@echo "== installing $(TOOLS_PINS)"
	$(BIN)/pip install -q $(TOOLS_PINS)
	touch '$@'

tools: tools-moto $(VENV)/.tools-$(subst $(space),_,$(TOOLS_PINS))

$(CURDIR)/.node/.pins-$(subst /,_,$(subst $(space),_,$(NODE_PINS))):
	@echo "== installing $(NODE_PINS) into .node"
	npm install --prefix .node --no-save --no-package-lock --no-audit --no-fund $(NODE_PINS)
	touch '$@'

tools-node: $(CURDIR)/.node/.pins-$(subst /,_,$(subst $(space),_,$(NODE_PINS)))

# The tracker script (clients/web): type-checked, bundled and minified into its committed
# dist/ file, which the stack serves and tests/test_web_client.py rebuilds and compares.
WEB_VERSION := $(shell sed -n 's/^  "version": "\(.*\)",/\1/p' clients/web/package.json)
web: tools-node ## the tracker script: clients/web/src -> clients/web/dist/et-<version>.js
	.node/node_modules/.bin/tsc -p clients/web
	.node/node_modules/.bin/esbuild clients/web/src/tracker.ts --bundle --minify --format=iife --target=es2020 --legal-comments=none --outfile=clients/web/dist/et-$(WEB_VERSION).js

# The TypeScript client's own dependencies (pinned in its package.json: AWS's signer, the SDK's
# credential chain, tsc), into clients/typescript/node_modules, so it builds as its users build it.
# (The Python client needs boto3, which moto already brings into .venv.)
clients/typescript/node_modules/.installed: clients/typescript/package.json
	@echo "== installing the TypeScript client's dependencies (clients/typescript/package.json)"
	npm install --prefix clients/typescript --no-save --no-package-lock --no-audit --no-fund
	touch '$@'

tools-clients: clients/typescript/node_modules/.installed

tools-ab:
	@command -v ab >/dev/null || { echo "== installing apache2-utils (ab)"; $(APT_INSTALL) apache2-utils; }

# The container engine (podman, unless DOCKER_HOST names one; rootful, so root), arm64 emulation on
# other hosts (qemu through binfmt_misc), and, for podman, the base image SAM runs functions on.
tools-container:
	@if [ -z "$$DOCKER_HOST" ] && [ "$$(id -u)" != 0 ]; then \
	  echo "make invoke/api run containers with rootful podman: run as root, or set DOCKER_HOST to a Docker engine's socket"; exit 1; fi
	@if [ -z "$$DOCKER_HOST" ]; then command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null \
	  || { echo "== installing $(CONTAINER_PACKAGES)"; $(APT_INSTALL) $(CONTAINER_PACKAGES); }; fi
	@if [ "$$(uname -m)" != aarch64 ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then \
	  echo "== registering qemu-aarch64 with binfmt_misc (arm64 binaries on this $$(uname -m) host)"; \
	  command -v qemu-aarch64-static >/dev/null && command -v update-binfmts >/dev/null || $(APT_INSTALL) qemu-user-static binfmt-support; \
	  [ -e /proc/sys/fs/binfmt_misc/register ] || $(SUDO) mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; \
	  $(SUDO) update-binfmts --enable qemu-aarch64; fi
	@if [ -z "$$DOCKER_HOST" ] && ! podman image exists $(LAMBDA_BASE); then \
	  echo "== building $(LAMBDA_BASE) from Debian bookworm (debootstrap, once per machine)"; \
	  $(SUDO) rm -rf target/lambda-base && mkdir -p target && \
	  $(SUDO) debootstrap --arch=arm64 --variant=minbase bookworm target/lambda-base $(DEBIAN_MIRROR) >target/lambda-base.log 2>&1 \
	    || { tail -20 target/lambda-base.log; exit 1; }; \
	  $(SUDO) tar -C target/lambda-base -c . | podman import -q --arch arm64 - $(LAMBDA_BASE) && $(SUDO) rm -rf target/lambda-base; fi

tools-faketime:
	@command -v faketime >/dev/null || { echo "== installing faketime (the unit tests under a clock years ahead)"; $(APT_INSTALL) faketime; }

tools-chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "== installing chromium and chromium-driver (for the browser test)"; $(APT_INSTALL) chromium chromium-driver; }
