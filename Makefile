# Every target installs what it needs first, so each works on a fresh machine. lint and test-fast need only the
# Python packages: pip runs when one of them is missing, and nothing else (no apt-get, no sudo). The others also
# install the Debian packages; as a non-root user apt-get and Mininet use sudo.
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
APT_PACKAGES := mininet bridge-utils ethtool iproute2 tcpdump tshark openssh-server clang libbpf-dev bpftool  # the last three: --data-plane ebpf
PY_MODULES := numpy scapy networkx mininet matplotlib sklearn tqdm pytest hypothesis ruff mypy torch expecttest  # pyproject's [dev,torch]
STAMP := .deps.stamp

.PHONY: deps pydeps demo test test-fast test-slow torch-suite bench lint clean

deps: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(PYTHON) -m pip install -q -e '.[dev,torch]'
	@touch $(STAMP)

pydeps:
	@$(PYTHON) -c 'import importlib.util as u, sys; missing = [m for m in sys.argv[1:] if u.find_spec(m) is None]; \
		missing and print("installing the Python packages of:", *missing); sys.exit(bool(missing))' $(PY_MODULES) \
	|| $(PYTHON) -m pip install -q -e '.[dev,torch]'

demo: deps
	$(SUDO) $(PYTHON) run_topology.py

lint: pydeps
	$(PYTHON) -m ruff check innet topologies switch_programs tests scripts examples run_topology.py
	$(PYTHON) -m mypy innet

test: deps lint
	$(SUDO) $(PYTHON) -m pytest

test-fast: lint
	$(PYTHON) -m pytest -m 'not mininet'

# The suite as a machine three times slower runs it: one core kept busy by a burner the whole time
# (stopped however pytest ends). TESTS=... runs a part, e.g. TESTS=tests/test_emulation.py
test-slow: deps lint
	@$(PYTHON) -c 'while True: pass' & burner=$$!; trap 'kill $$burner' EXIT INT TERM; \
	taskset -cp 0 $$burner >/dev/null; echo "burner $$burner keeps core 0 busy"; \
	$(SUDO) $(PYTHON) -m pytest $(TESTS)

# PyTorch's own distributed tests (torch's distributed_test.py, its bodies unmodified), all of the CPU set once on gloo
# and once on innet's backend, and the table of both; INNET_TORCH_SUITE_K="test_a test_b" runs only those
torch-suite: pydeps
	$(PYTHON) -m pytest -p no:cacheprovider -m torchsuite -s tests/test_torch_suite.py

bench: deps
	$(SUDO) $(PYTHON) scripts/bench_switch.py
	$(SUDO) $(PYTHON) scripts/bench_allreduce.py
	$(SUDO) $(PYTHON) scripts/bench_allreduce.py --rates 50,200 --packet-elements 256
	$(SUDO) $(PYTHON) scripts/bench_scale.py
	$(SUDO) $(PYTHON) scripts/bench_dilation.py
	$(SUDO) $(PYTHON) scripts/bench_fabric.py
	$(PYTHON) scripts/bench_loss.py
	$(PYTHON) scripts/bench_blocks.py
	$(SUDO) $(PYTHON) scripts/bench_fidelity.py
	$(PYTHON) scripts/bench_torch_calls.py
	$(PYTHON) scripts/plot_performance.py

clean:
	$(SUDO) $(PYTHON) run_topology.py --clean
