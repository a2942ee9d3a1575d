# rmem build and test entry points. `make demo` and `make test` are the two
# commands at the top of the README; CI (.ci/run) runs `make test`.

GO       ?= go
BIN      ?= bin
PKGS     := ./...
# Packages whose tests touch the kernel (userfaultfd, mounts, processes).
KERNEL_PKGS := ./userfaultfd/... ./internal/uffddemo/... ./pager/... ./preload/... ./client/... ./traced/...
# A count, not a duration: time-based -fuzztime can end a run with a spurious
# "context deadline exceeded" on a loaded machine.
FUZZTIME ?= 20000x

.PHONY: all build shim demo deb check bench bench-services test fmt-check vet pager-layers shim-layers test-race test-gomaxprocs1 test-ring fuzz clean

all: build

# The version the binaries answer --version with: the commit (git describe),
# stamped at link time (GOFLAGS may say -buildvcs=false).
VERSION ?= $(shell git describe --always --dirty --tags 2>/dev/null || echo dev)
GO_LDFLAGS := -X rmem/internal/version.Version=$(VERSION)

build: shim
	$(GO) build -ldflags "$(GO_LDFLAGS)" -o $(BIN)/ ./cmd/...

# The LD_PRELOAD shim, installed beside the binaries (memagent run finds it
# there). preload/build.sh is its one build (preload's tests use it too): it
# links in jemalloc from libjemalloc-dev's libjemalloc_pic.a, and installs
# that package with apt-get when it is missing and we are root (else it
# says which package to install).
SHIM_CC  ?= gcc
SHIM_SRC := preload/build.sh preload/proto.h $(wildcard preload/src/*.c preload/src/*.h preload/src/*.syms)
shim: $(BIN)/librmem.so

$(BIN)/librmem.so: $(SHIM_SRC)
	@mkdir -p $(BIN)
	CC=$(SHIM_CC) ./preload/build.sh $@

# The Debian package, dist/rmem_VERSION_amd64.deb (scripts/deb.sh says what
# it holds): dpkg -i it, then systemctl enable --now memd memagent.
deb: build
	BIN=$(BIN) ./scripts/deb.sh dist

# The main job, end to end on this host: memd + memagent run on a program
# using 4x its local-memory budget (scripts/demo.sh).
demo: build
	BIN=$(BIN) ./scripts/demo.sh

# The whole test suite: formatting, vet, every test with the race detector
# (kernel tests included, never cached), the kernel tests again with
# GOMAXPROCS=1, and a short run of every fuzzer. The kernel tests and the
# rest run in two lanes at once (scripts/test.sh: about 15 minutes here,
# where the phases one after the other took 24); test-race,
# test-gomaxprocs1 and fuzz run one phase alone.
test: fmt-check vet pager-layers shim-layers
	GO=$(GO) MAKE=$(MAKE) ./scripts/test.sh $(KERNEL_PKGS)

# The fast tier, for the edit-test loop (about a minute with the build
# cache warm; make test stays the whole suite, and CI's): formatting, vet,
# the layers, and the tests of every package but the integration suites
# under tests/ (real daemons, applications, chaos), with -short: the long
# paging workloads (preload's allocators, forks while allocating, Python)
# skip themselves. The kernel tests run, as root.
CHECK_PKGS = $$($(GO) list ./... | grep -v '^rmem/tests')
check: fmt-check vet pager-layers shim-layers
	$(GO) test -short -count=1 $(CHECK_PKGS)

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

# The benchmark reports against the kernel's own swap (root; not part of
# CI): the workloads of bench/workload (docs/bench, about 7 minutes), then
# the services (bench-services).
bench: build
	$(GO) run ./bench -out docs/bench -bin $(BIN)
	$(GO) run ./bench/services -out docs/bench/services -bin $(BIN)
	$(GO) run ./bench/ec -out docs/bench/ec.md -bin $(BIN)

# Redis and memcached at 50% and 25% local, GETs/s and tail latency
# under zram swap and rmem, and under rmem with a budget from a slowdown
# target (rmem-tcp-auto: memagent serve --max-slowdown 5%) with what it
# moved out (docs/bench/services; root, about 20 minutes).
bench-services: build
	$(GO) run ./bench/services -out docs/bench/services -bin $(BIN)

# The pager's files in layers, top to bottom (docs/pager.md, The loop's
# structure): a call from a file to one above it runs back up. Then the
# packages' layers (scripts/pkglayers.sh): no library imports internal/ or
# cmd/, the leaves import no rmem package, the stores under the pager take
# its types from pager/remote.
PAGER_LAYERS = 'agent.go resume.go metrics.go steer.go' 'loop.go' 'events.go fork.go evict.go relocate.go shmowner.go' \
	'fault.go' 'reads.go' 'install.go sample.go shared.go invariants.go' 'pages.go conn.go client.go room.go forkstate.go evictstate.go' \
	'region.go pagetable.go slots.go prefetch.go stats.go kernel.go budget.go slowdown.go journal.go journal_unsafe.go watch.go ring.go ring_unsafe.go'

pager-layers:
	$(GO) run ./scripts/filedeps -q -max 3 ./pager $(PAGER_LAYERS)
	GO=$(GO) ./scripts/pkglayers.sh

# The shim's files in layers, top to bottom (preload/src/rmem.h): a use of a
# symbol defined in a file above runs back up; one is allowed (alloc.c's
# decide registers fork.c's atfork handlers). Shared symbols start with rm_.
SHIM_LAYERS = fork.c spawn.c kcall.c kmisc.c kwait.c sigwrap.c interpose.c alloc.c heap.c region.c sigbus.c helper.c resume.c ring.c pin.c handoff.c conn.c wire.c table.c mode.c util.c

shim-layers:
	CC=$(SHIM_CC) $(GO) run ./scripts/clayers -q -max 1 -prefix rm_ preload/src $(SHIM_LAYERS)

# -p 1: the kernel tests share host-wide state (swap, /run/rmem, CPU time
# that fault latencies depend on); one package at a time keeps them apart.
# (make test runs the kernel packages and the others in two lanes, each
# -p 1: the lanes share CPU time only, scripts/test.sh.) -timeout 20m: the
# preload package alone takes 330 s under -race here, 526 s beside the
# other lane in CI, close to go test's default of 10 minutes; the 30
# minutes of a CI run bound the whole.
test-race:
	$(GO) test -race -count=1 -p 1 -timeout 20m $(PKGS)

# Under GOMAXPROCS=1 the kernel tests look for the agent, the poller and
# the test harness starving each other. preload's allocator workloads
# (TestAllocators, TestPythonDict: 190 s of paging with one P) and the
# fork stress with jemalloc and tcmalloc linked (110 s; glibc's runs here,
# 16 forks instead of 40) are left to test-race, which runs them in full: CI
# has 30 minutes.
GOMAXPROCS1_SKIP := ^(TestAllocators|TestPythonDict)$$|^TestForkWhileAllocating$$/^(jemalloc|tcmalloc)$$
test-gomaxprocs1:
	GOMAXPROCS=1 $(GO) test -count=1 -skip '$(GOMAXPROCS1_SKIP)' $(KERNEL_PKGS)

# The applications again in ring mode (RMEM_IN_THREAD=1: every program with
# the shim takes its misses in its own threads, memagent run --in-thread),
# without the race detector: the real programs' system calls into paged
# buffers, signals and forks on the path that is opt-in today (a 128 MiB
# pread hung there, unseen, until this ran). Shared memory is not paged in
# that mode, and its tests and PostgreSQL's skip there (skipSharedInRing:
# they measure the node, and the race run of the same suite runs beside
# this one). Not part of make test: beside the system lane's run of the
# same suite, its memory server's pages showed in PostgreSQL's node-wide
# figures, and after that lane it would take CI past 26 of its 30 minutes.
test-ring:
	RMEM_IN_THREAD=1 $(GO) test -count=1 -p 1 -timeout 15m ./tests/apps

# Runs each Fuzz function for FUZZTIME (go test -fuzz takes one at a time).
fuzz:
	@./scripts/fuzz.sh $(FUZZTIME)

clean:
	rm -rf $(BIN)
