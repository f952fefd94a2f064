# One entry point for everything: run, test, sanitize, fuzz, bench, soak, lint, format.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Langflow from PyPI lives in its own venv (`make run`, tests/e2e); never in $(VENV).
VENV_LANGFLOW ?= .venv-langflow
LANGFLOW_VERSION ?= 1.13.0
LANGFLOW_STAMP := $(VENV_LANGFLOW)/.installed
UV := $(VENV)/bin/uv
NATIVE_SRC := $(wildcard csrc/*.c csrc/*.h) setup.py pyproject.toml
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 20
comma := ,
space := $(subst ,, )

.PHONY: run langflow dist wheel-manylinux check-wheels bench-abi3 bench-server prove-wheels test test-fast mutations sanitize fuzz native-oldlibs format-c bench soak lint format typecheck deps native clean

deps:
	@scripts/install-system-deps.sh

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel

# Editable install; re-run whenever the C sources or the metadata change.
$(STAMP): $(VPY) $(NATIVE_SRC)
	@scripts/install-system-deps.sh
	$(VPY) -m pip install -q --no-build-isolation -e '.[test]'
	$(VPY) setup.py -q build_ext --inplace
	@touch $@

native: $(STAMP)

$(UV): $(VPY)
	$(VPY) -m pip install -q uv

# uv resolves langflow in ~2 min where pip backtracks for much longer. The plugin goes in
# from its sdist, as users get it: a clean build of the extension against the system
# libraries (never the in-tree .so, which `make sanitize` swaps for an ASan build, nor a
# stale build/). Reinstalled whenever a package file changes.
PKG_SRC := $(shell find langflow_sandbox_createos -name '*.py' -o -name '*.json' -o -name '*.pyi' | grep -v __pycache__)
$(LANGFLOW_STAMP): $(STAMP) $(UV) $(NATIVE_SRC) $(PKG_SRC) MANIFEST.in
	$(UV) venv -q --allow-existing --python $(PYTHON) $(VENV_LANGFLOW)
	rm -rf $(VENV_LANGFLOW)/sdist && $(UV) build -q --sdist --out-dir $(VENV_LANGFLOW)/sdist .
	$(UV) pip install -q --python $(VENV_LANGFLOW)/bin/python --reinstall-package langflow-sandbox-createos \
	  'langflow==$(LANGFLOW_VERSION)' $(VENV_LANGFLOW)/sdist/*.tar.gz
	@touch $@

langflow: $(LANGFLOW_STAMP)

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
# PYTEST_WORKERS pytest-xdist workers (0: one process), a test file to a worker (tests/conftest.py).
PYTEST_WORKERS ?= 2
test: $(STAMP) $(LANGFLOW_STAMP)
	$(VPY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --durations=25 $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# Break the product on purpose (tests/mutations/mutations.toml: file, anchor, replacement, the
# test that must fail and why), one break at a time in a scratch copy, each running only its
# test; then each test on an unmutated copy, where it must pass. Fails if a break's test passes.
# Sequential (2-core friendly). MUTATIONS_ARGS=--ci: the CI subset; names: some of them;
# --list, --check. Times: docs/operations.md, "Mutations".
MUTATIONS_ARGS ?=
mutations: $(STAMP)
	$(VPY) tests/mutations/run.py $(MUTATIONS_ARGS)

# The native client's tests again, with ASan + UBSan (msgspec's recipe), in PYTEST_WORKERS workers; the binding fuzzer
# (tests/native/test_binding_fuzz.py) runs 1000 hostile calls there (BINDING_FUZZ_EXAMPLES); the
# 64-thread run_program test runs 64 x 5 instead of make test's 64 x 10 (STRESS_PER_THREAD).
# allocator_may_return_null: a huge allocation is MemoryError, as with glibc's malloc.
sanitize: $(STAMP)
	rm -rf build/sanitize && CREATEOS_SANITIZE=1 $(VPY) setup.py -q build_ext --inplace --build-temp build/sanitize --force
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	  PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  BINDING_FUZZ_EXAMPLES=$${BINDING_FUZZ_EXAMPLES:-1000} STRESS_PER_THREAD=$${STRESS_PER_THREAD:-5} \
	  $(VPY) -m pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadscope tests/native $(PYTEST_ARGS); rc=$$?; \
	  $(VPY) setup.py -q build_ext --inplace --force >/dev/null; exit $$rc

fuzz: deps
	$(MAKE) -C csrc/fuzz run FUZZ_SECONDS=$(FUZZ_SECONDS)

# csrc/ in the style of .clang-format (clang-format 14: apt-get install clang-format).
format-c:
	clang-format -i csrc/*.c csrc/*.h csrc/fuzz/*.c csrc/fuzz/*.h

# The oldest libcurl and jansson supported (csrc/compat.h): Debian 11's 7.74.0 and 2.13.1,
# headers and libraries, fetched from Debian's mirror and verified by
# scripts/fetch-debian-libs.sh (cached in build/oldlibs). The extension is built against
# them (-Werror) and finds them at run time through its own DT_RPATH (which also serves what
# they load, OpenSSL 1.1 and OpenLDAP 2.4; nothing else in the process or its children sees
# them), tests/native runs (test_versions.py checks which libraries were loaded), then the
# normal build is restored. About 3 min.
OLDLIBS := build/oldlibs
OLDLIBS_LIB := $(abspath $(OLDLIBS))/root/usr/lib/x86_64-linux-gnu
OLDLIBS_INC := $(abspath $(OLDLIBS))/root/usr/include
native-oldlibs: $(STAMP)
	scripts/fetch-debian-libs.sh $(OLDLIBS)
	CFLAGS=-Werror CREATEOS_CFLAGS="-I$(OLDLIBS_INC)/x86_64-linux-gnu -I$(OLDLIBS_INC)" \
	  CREATEOS_LIBS="-L$(OLDLIBS_LIB) -Wl,-rpath,$(OLDLIBS_LIB),--disable-new-dtags -lcurl -ljansson" \
	  $(VPY) setup.py -q build_ext --inplace --build-temp build/oldlibs-obj --force
	CREATEOS_EXPECT_LIBS="libcurl 7.74.0, jansson 2.13.1" \
	  $(VPY) -m pytest -p no:cacheprovider tests/native $(PYTEST_ARGS); rc=$$?; \
	  $(VPY) setup.py -q build_ext --inplace --force >/dev/null; exit $$rc

# Side by side with the peer plugin 0.2.0 (its own venv, benchmarks/.peer-venv); ~10 min.
# Then S8 in its short form (10 s cells; ~17 min on the loaded machine): a real Langflow
# server from .venv-langflow under 16 and 64 concurrent runs per surface
# (benchmarks/server_bench.py, docs/performance.md), its table added to results/latest.md.
bench: $(STAMP) $(LANGFLOW_STAMP)
	$(VPY) -m pip install -q --no-build-isolation -e '.[bench]'
	$(VPY) benchmarks/run.py
	VENV_LANGFLOW=$(VENV_LANGFLOW) $(VPY) benchmarks/server_bench.py

# S8 alone, long form: S8_SECONDS (60) per cell, S8_CAPACITY_RUNS (16) cold runs for the bed's
# capacity; about 18 min on the 2 shared cores (1,050 s on 2026-12-03). Results in benchmarks/results/s8.{json,md,png}.
# S8_ARGS adds server_bench.py's options, e.g. "--flow work" (results s8-work.*), "--workers 2
# --servers 2", "--surfaces inprocess,executor,executor-reuse" (docs/performance.md, S8).
S8_SECONDS ?= 60
S8_CAPACITY_RUNS ?= 16
S8_ARGS ?=
bench-server: $(STAMP) $(LANGFLOW_STAMP)
	$(VPY) -m pip install -q --no-build-isolation -e '.[bench]'
	VENV_LANGFLOW=$(VENV_LANGFLOW) $(VPY) benchmarks/server_bench.py --seconds $(S8_SECONDS) --capacity-runs $(S8_CAPACITY_RUNS) $(S8_ARGS)

# S2 (client CPU per backend run) for the abi3 build and the version-specific build of the
# same sources, interleaved on one createos-local: docs/performance.md. About 3 min.
bench-abi3: $(STAMP)
	$(VPY) benchmarks/abi3_s2.py

soak: $(STAMP)
	SOAK_SECONDS=$${SOAK_SECONDS:-1800} $(VPY) -m pytest -o addopts=-ra tests/reliability/test_soak.py -s $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	$(VENV)/bin/mypy langflow_sandbox_createos

# `make run EXECUTOR=createos` also runs whole flows (/api/v1/run, lfx run) in CreateOS guests.
run: $(STAMP) $(LANGFLOW_STAMP)
	VENV=$(VENV) VENV_LANGFLOW=$(VENV_LANGFLOW) EXECUTOR=$(EXECUTOR) scripts/run-langflow.sh

# What a user installs (docs/operations.md, "Packaging"): dist/ gets the sdist and one
# self-contained wheel per Linux architecture, each cp310-abi3 (CPython 3.10 and later, the
# Limited API) and manylinux_2_28 (glibc 2.28 and later): x86_64 and aarch64, cross-compiled with
# zig cc from PyPI's ziglang, libcurl + nghttp2 + OpenSSL + jansson built from Debian 13's
# sources (verified downloads from Debian's mirror, cached in build/deps) and linked in
# statically. Each wheel is built from the sdist, then checked (make check-wheels). With nothing
# in build/ 35 min on the 2 shared cores (the static libraries: OpenSSL more than half); 26 s
# when build/deps is cached (docs/operations.md, "Packaging"). Not in .ci/run: too long.
DIST_ARCHES ?= x86_64 aarch64
DIST_TOOLS := $(VENV)/.dist-tools
$(DIST_TOOLS): $(VPY)
	$(VPY) -m pip install -q 'ziglang>=0.13' 'cmake>=3.20' 'abi3audit>=0.0.20' 'auditwheel>=6' 'build>=1.2' 'setuptools>=77' wheel
	@touch $@

dist: $(STAMP) $(UV) $(DIST_TOOLS)
	rm -rf dist
	$(VPY) -m build --installer uv --sdist --outdir dist .
	for arch in $(DIST_ARCHES); do \
	  PYTHON=$(abspath $(VPY)) nice -n 10 scripts/build-wheel.sh $$arch dist/*.tar.gz dist || exit 1; \
	done
	$(MAKE) --no-print-directory check-wheels
	@ls -l dist

wheel-manylinux: dist

# Every wheel in dist/: abi3audit (no symbol outside the 3.10 stable ABI), auditwheel show
# (the manylinux tag of the file name is one its symbols allow, nothing outside the manylinux
# policy is linked), the tag and the architecture each wheel must have. Fails on any mismatch.
# The release check (make dist ends with it); CI runs the same script, and abi3audit, on the
# wheel the sdist builds and on wrongly named copies of it (tests/packaging/test_wheel.py).
check-wheels: $(DIST_TOOLS)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VPY) scripts/check-wheels.py --expect $(subst $(space),$(comma),$(DIST_ARCHES)) dist/*.whl

# The wheels of dist/ (make dist first) where nothing else helps them: the x86_64 one in a
# Debian 13 root (CPython 3.13), a backend run and a component run on createos-local; the
# aarch64 one in a Debian 12 arm64 root under qemu-user-static, tests/native. Roots made with
# debootstrap, cached in build/proof-roots. Needs root; about 20 min with the roots cached
# (most of it pip installing the wheel's dependencies under emulation), plus debootstrap the
# first time. Not in .ci/run: too long. tests/packaging/test_foreign_roots.py.
prove-wheels: $(STAMP) $(DIST_TOOLS)
	@ls dist/*-cp310-abi3-manylinux_2_28_*.whl >/dev/null || { echo "no wheels in dist/: make dist" >&2; exit 1; }
	apt-get install -y -q debootstrap qemu-user-static binfmt-support >/dev/null
	CREATEOS_PROVE_ROOTS=1 $(VPY) -m pytest -p no:cacheprovider -s -v tests/packaging/test_foreign_roots.py $(PYTEST_ARGS)

clean:
	rm -rf build dist *.egg-info langflow_sandbox_createos/*.so csrc/fuzz/bin
