# kiln — the two commands: `make serve` and `make test`. Everything else is a helper.
BUILD ?= build
JOBS ?= $(shell nproc)
.PHONY: setup build test test-cpp test-py serve fuzz bench bench-compare test-compat clean

setup:
	@scripts/setup.sh

build: setup
	@scripts/build.sh $(BUILD)

test: build
	@scripts/test.sh $(BUILD)

test-cpp:
	@scripts/build.sh $(BUILD) && KILN_ONLY=cpp scripts/test.sh $(BUILD)

test-py:
	@scripts/build.sh $(BUILD) && KILN_ONLY=py scripts/test.sh $(BUILD)

serve: build
	@scripts/serve.sh $(BUILD)

fuzz: setup
	@scripts/fuzz.sh $(FUZZ_SECONDS)

bench: build
	@scripts/bench.sh $(BUILD)

# kiln vs llama.cpp on the same GGUF files (bench/compare.sh; docs/bench.md)
bench-compare: build
	@BUILD=$(BUILD) bench/compare.sh

# kiln's server API tests against llama.cpp's server (llama-cpp-python) on the same GGUF; docs/compat.md
test-compat: setup
	@scripts/compat.sh

clean:
	rm -rf $(BUILD) build-fuzz
