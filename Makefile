# Event store: build, run locally, test, deploy.
# Every target installs what it needs: Python tools into .venv (pinned below),
# Rust crates through cargo (Cargo.lock), Debian packages with apt-get.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        ?= .venv
BIN         := $(CURDIR)/$(VENV)/bin
MOTO_PIN    := moto[server]==5.2.5
CARGO       ?= cargo

.PHONY: help test lint fmt clean tools-moto

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

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

test: tools-moto ## run all tests (unit + integration against moto_server)
	@echo "== cargo test: unit tests, then integration tests that start moto_server on 127.0.0.1"
	@mkdir -p target
	set -o pipefail; MOTO_SERVER=$(BIN)/moto_server $(CARGO) test --workspace --locked 2>&1 | tee target/test.log
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
