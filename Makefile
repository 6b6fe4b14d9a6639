# Event store: run locally, test, build, deploy.
# Every target installs what it needs: Python tools into .venv (pinned below),
# Rust crates through cargo (Cargo.lock), Debian packages with apt-get.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        ?= .venv
BIN         := $(CURDIR)/$(VENV)/bin
MOTO_PIN    := moto[server]==5.2.5
CARGO       ?= cargo
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq

# Local runs: N hits at concurrency C; the stack's settings pass through the environment.
N           ?= 1000
C           ?= 10
PORT        ?= 3000
LOCAL_BIN   := target/release/event-store-local
export PORT EMULATOR_PORT STAGE SCAN_INTERVAL TIME_UNIT IP_MODE
export MOTO_SERVER := $(BIN)/moto_server

.PHONY: help demo local playback load test lint fmt clean local-bin tools-moto tools-ab tools-chromium

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

demo: tools-moto local-bin ## the main job end to end: stack, N pixel hits, playback, check (N=1000 C=10)
	$(LOCAL_BIN) demo --events $(N) --concurrency $(C)

local: tools-moto local-bin ## run the whole pipeline locally until Ctrl-C (pixel on 127.0.0.1:$(PORT))
	$(LOCAL_BIN) local

playback: local-bin ## play back START..END (ISO 8601; default the last 15 min) from the running stack
	$(LOCAL_BIN) playback $(if $(START),--start '$(START)') $(if $(END),--end '$(END)')

load: tools-ab ## ab -n N -c C against the local pixel (start `make local` first)
	@echo "== ab -n $(N) -c $(C) against http://127.0.0.1:$(PORT)/track.gif"
	ab -n $(N) -c $(C) 'http://127.0.0.1:$(PORT)/track.gif?EntityId=ab&page=load-test'

test: tools-moto tools-chromium ## run all tests: unit, integration (moto_server), end to end, browser
	@echo "== cargo test: unit tests, integration tests against moto_server, demo and browser tests"
	@mkdir -p target
	set -o pipefail; $(CARGO) test --workspace --locked 2>&1 | tee target/test.log
	@awk '/^test result:/ {p+=$$4; f+=$$6; s+=$$8} END {printf "%d passed, %d failed, %d skipped\n", p, f, s}' target/test.log

lint: ## rustfmt check and clippy with warnings as errors
	@echo "== cargo fmt --check"
	$(CARGO) fmt --all -- --check
	@echo "== cargo clippy -D warnings"
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt: ## format the code
	$(CARGO) fmt --all

clean: ## remove build output and the venv
	$(CARGO) clean
	rm -rf $(VENV)

local-bin:
	@echo "== building the local stack (release)"
	$(CARGO) build --release --locked -p event-store-local

$(BIN)/python:
	@echo "== creating the Python venv $(VENV)"
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Stamp files carry the pin, so changing a pin reinstalls.
$(VENV)/.moto-$(MOTO_PIN): | $(BIN)/python
	@echo "== installing $(MOTO_PIN) (the local DynamoDB/Kinesis/Lambda emulator)"
	$(BIN)/pip install -q '$(MOTO_PIN)'
	touch '$@'

tools-moto: $(VENV)/.moto-$(MOTO_PIN)

tools-ab:
	@command -v ab >/dev/null || { echo "== installing apache2-utils (ab)"; $(APT_INSTALL) apache2-utils; }

tools-chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "== installing chromium and chromium-driver (for the browser test)"; $(APT_INSTALL) chromium chromium-driver; }
