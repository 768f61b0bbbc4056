"""PyTorch's own distributed tests on innet's backend against gloo (the runner: tests/torch_suite.py).

By default a fixed subset runs on innet (``SUBSET``: the tests innet failed before its fixes, and the contract's
corners), each asserted passed, not skipped. The whole CPU set of torch's distributed_test.py, once on gloo and
once on innet, is the ``torchsuite`` test, which the default run deselects (conftest.py): ``make torch-suite``
runs it and prints the table; innet must pass every test gloo passes but the ``EXCEPTIONS``, which build nothing
for a plugin backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join("tests", "torch_suite.py")
TIMEOUT = 150  # seconds a test's ranks may take (torch's own default, 300, for the few it names)

# the contract's corners, and the tests innet failed before its fixes
SUBSET = [
    "test_barrier_timeout_full_group",  # failed on innet before its fix: a Work's wait() ignored the group's timeout
    "test_all_reduce_product", "test_reduce_product", "test_all_reduce_coalesced_product", "test_sparse_all_reduce_sum",
    "test_all_gather_coalesced_simple", "test_all_reduce_coalesced_sum", "test_get_future", "test_broadcast",
    "test_send_recv_any_source", "test_batch_isend_irecv_gloo", "test_barrier", "test_gather",
    "test_scatter",
]

# the tests gloo passes whose bodies build nothing for a plugin backend: each with the reason
EXCEPTIONS = {
    "test_get_backend": "asserts dist.get_backend(group) == 'gloo' (BACKEND), the backend's name itself",
    "test_monitored_barrier_gloo": "torch's dist.monitored_barrier raises ValueError for any backend not named gloo "
                                   "before it calls the group (innet's group has one: the side plane's)",
    "test_monitored_barrier_gloo_subgroup": "the same: dist.monitored_barrier takes only a backend named gloo",
}

# the same for test_c10d_gloo.py's tests (Class.name; ProcessGroupGlooLazyInitTest runs ProcessGroupGlooTest's bodies)
C10D_EXCEPTIONS = {
    **{f"{cls}.test_set_gloo_pg_timeout": "reads and sets gloo's options object (pg.options._timeout, "
                                           "pg._set_default_timeout)"
       for cls in ("ProcessGroupGlooTest", "ProcessGroupGlooLazyInitTest")},
    **{name: "asks the group's C++ backend for the CPU device (pg._get_backend(cpu)) and makes a gloo transport device "
             "on it (create_device(interface=LOOPBACK))"
       for name in ("DistributedDataParallelTest.test_gloo_backend_cpu_module",
                    "DistributedDataParallelTest.test_gloo_backend_cpu_module_grad_is_view",
                    "CommTest.test_broadcast_coalesced_gloo_cpu")},
    "GlooProcessGroupWithDispatchedCollectivesTests.test_init_process_group_for_all_backends":
        "asserts pg.name() == 'gloo' for the group asked for as gloo",
    "GlooProcessGroupWithDispatchedCollectivesTests.test_monitored_barrier":
        "dist.monitored_barrier takes only a backend named gloo (as test_monitored_barrier_gloo)",
}


def outcomes(xml: str) -> dict[str, str]:
    """Each test's outcome in pytest's junit file (by name, a c10d test's as Class.name): passed, skipped or failed
    (an error is a failure)."""
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "") if cls == "TestDistBackendWithSpawn" else f"{cls}.{case.get('name', '')}"
        found[name] = ("failed" if kinds & {"failure", "error"} else
                                       "skipped" if "skipped" in kinds else "passed")
    return found


def run_suite(backend: str, where: str, names: list[str] | None = None,
              c10d: str | None = None) -> tuple[dict[str, str], float, str]:
    """torch's tests through the runner on ``backend``: distributed_test.py's (``names``, default all), or with
    ``c10d`` (a path to test_c10d_gloo.py) that file's; each test's outcome, the seconds taken, pytest's output."""
    xml = os.path.join(where, f"{backend}.xml")
    env = dict(os.environ, PYTHONPATH=ROOT, INNET_TORCH_SUITE=backend, DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(TIMEOUT))
    if c10d:
        env["INNET_TORCH_SUITE_C10D"] = c10d
        targets = [RUNNER, "-k", "not TestDistBackendWithSpawn"]
    else:
        targets = [f"{RUNNER}::TestDistBackendWithSpawn::{n}" for n in names] if names else [RUNNER]
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:warnings", "-o", "addopts=", "-q",
            f"--junitxml={xml}", *targets]
    start = time.monotonic()
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=6 * 3600)
    took = time.monotonic() - start
    got = outcomes(xml) if os.path.exists(xml) else {}
    return ({n: o for n, o in got.items() if n in names} if names else got), took, out.stdout + out.stderr


def table(gloo: dict[str, str], innet: dict[str, str], exceptions: dict[str, str] = EXCEPTIONS) -> str:
    """The pass/fail table, innet against gloo, and its counts (``exceptions``: the file's)."""
    rows = [f"{'test':70} {'gloo':8} innet"]
    rows += [f"{name:70} {gloo[name]:8} {innet.get(name, 'not run')}" for name in sorted(gloo)]
    passed = [n for n, o in gloo.items() if o == "passed"]
    lost = [n for n in passed if innet.get(n) != "passed"]
    rows.append(f"gloo passed {len(passed)}; innet passed {sum(innet.get(n) == 'passed' for n in passed)} of them, "
                f"failed {len(lost)} ({len([n for n in lost if n in exceptions])} of them exceptions: "
                "the body builds nothing for a plugin backend)")
    return "\n".join(rows)


def test_the_subset_passes_on_innet(tmp_path):
    """innet passes each of ``SUBSET`` (gloo passes each in the full run), none skipped; and fails test_get_backend,
    which asserts the group's backend is named gloo: the groups the bodies use are innet's."""
    got, _, out = run_suite("innet", str(tmp_path), [*SUBSET, "test_get_backend"])
    assert got == {**dict.fromkeys(SUBSET, "passed"), "test_get_backend": "failed"}, out[-3000:]
    assert "String comparison failed: 'innet' != 'gloo'" in out


@pytest.mark.torchsuite
def test_innet_passes_every_test_gloo_passes(tmp_path):
    """The whole CPU set on both backends (``INNET_TORCH_SUITE_K``: only the tests whose names it lists, a space
    between): the table printed; innet passes all gloo passes but the ``EXCEPTIONS``."""
    names = os.environ.get("INNET_TORCH_SUITE_K", "").split() or None
    gloo, gloo_took, gloo_out = run_suite("gloo", str(tmp_path), names)
    innet, innet_took, innet_out = run_suite("innet", str(tmp_path), names)
    print(table(gloo, innet))
    print(f"wall time: gloo {gloo_took:.0f} s, innet {innet_took:.0f} s")
    assert gloo, gloo_out[-3000:]
    lost = {n for n, o in gloo.items() if o == "passed" and innet.get(n) != "passed"} - set(EXCEPTIONS)
    assert not lost, (sorted(lost), re.findall(r"^(?:FAILED|ERROR) .*$", innet_out, re.M))


@pytest.mark.torchsuite
def test_innet_passes_the_c10d_gloo_tests_gloo_passes(tmp_path):
    """torch's test_c10d_gloo.py on both backends, from the path ``INNET_TORCH_SUITE_C10D`` names (not in torch's
    wheel, and never copied here): the table printed; innet passes all gloo passes but the ``C10D_EXCEPTIONS``."""
    path = os.environ.get("INNET_TORCH_SUITE_C10D")
    if not path or not os.path.exists(path):
        pytest.skip("test_c10d_gloo.py is not in torch's wheel: INNET_TORCH_SUITE_C10D=PATH names a copy of it (with "
                    "test_c10d_common.py beside it) from torch 2.13's test/distributed/")
    gloo, gloo_took, gloo_out = run_suite("gloo", str(tmp_path), c10d=path)
    innet, innet_took, innet_out = run_suite("innet", str(tmp_path), c10d=path)
    print(table(gloo, innet, C10D_EXCEPTIONS))
    print(f"wall time: gloo {gloo_took:.0f} s, innet {innet_took:.0f} s")
    assert gloo, gloo_out[-3000:]
    lost = {n for n, o in gloo.items() if o == "passed" and innet.get(n) != "passed"} - set(C10D_EXCEPTIONS)
    assert not lost, (sorted(lost), re.findall(r"^(?:FAILED|ERROR) .*$", innet_out, re.M))


def test_make_torch_suite_runs_the_whole_suite_and_readme_names_it():
    """README's ``make torch-suite`` is the ``torchsuite`` test (its run: ``make torch-suite`` itself, ~10
    minutes here, deselected here); README's counts are docs/torch-suite.md's."""
    dry = subprocess.run(["make", "-n", "--no-print-directory", "torch-suite"], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")}).stdout
    assert dry.splitlines()[-1] == "python3 -m pytest -p no:cacheprovider -m torchsuite -s tests/test_torch_suite.py"
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(ROOT, "docs", "torch-suite.md")) as f:
        doc = f.read()
    said = re.search(r"`make torch-suite` runs them .* of gloo's (\d+) passed, innet passes (\d+); the (\d+) others", readme)
    assert said, "README's torch suite line"
    gloo, innet, lost = map(int, said.groups())
    assert gloo - innet == lost == len(EXCEPTIONS) and f"gloo: {gloo} passed" in doc and f"{innet} passed, {lost} failed" in doc
    assert doc.count("| passed | ") == gloo and doc.count("(exception) |") == lost
