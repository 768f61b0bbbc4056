"""PyTorch's own distributed tests, the bodies unmodified, on gloo or on innet's backend: the module
tests/test_torch_suite.py and ``make torch-suite`` hand to pytest (``python -m pytest tests/torch_suite.py``).

It is torch's test/distributed/test_distributed_spawn.py for the wheel's
torch/testing/_internal/distributed/distributed_test.py: ``TestDistBackendWithSpawn(TestDistBackend,
DistributedTest._DistTestBase)``, whose setUp starts ``WORLD_SIZE`` ranks, each running one test body (forked
from this process, ``START``, where torch spawns them: the bodies run the same, in a fraction of the time). The
environment is gloo's as torch's CI sets it for CPU (BACKEND=gloo, WORLD_SIZE=3, a TEMP_DIR), so every skip
decision and every ``BACKEND == "gloo"`` branch stays gloo's. With ``INNET_TORCH_SUITE=innet`` the one thing
swapped is where each process group is made: in every rank, ``dist.init_process_group`` and
``dist.new_group`` (also as ``distributed_c10d`` calls them, e.g. from ``new_subgroups``) are wrapped so that a
backend of "gloo" (however spelled: "gloo", ``Backend.GLOO``, "cpu:gloo") becomes "innet"; a group made without
a backend takes the default group's, innet's. Nothing else of torch is touched.

``INNET_TORCH_SUITE_C10D=PATH`` adds torch's test/distributed/test_c10d_gloo.py from PATH (not in the wheel; its
folder must also hold test_c10d_common.py, which it imports; never copied into this repository): its test classes
run here too, a multi-process one's ranks forked as above, and on innet its ``c10d.ProcessGroupGloo(store, rank,
size, opts)`` makes innet's group instead (the module's own name ``c10d`` and ``dist`` see ``GlooAsInnet``; ``opts``'
timeout kept). Without it those tests are not there (tests/test_torch_suite.py says so in its skip).

Run it with ``-p no:warnings``: a forked rank keeps the filters it was forked under, and pytest's (this repo's
``error``) would turn torch's own deprecation warnings into failures a fresh rank never sees.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import re
import shutil
import sys
import tempfile
import types
import unittest
from datetime import timedelta
from typing import Any

os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "3")  # torch's run_test.py for gloo without two GPUs
if "TEMP_DIR" not in os.environ:  # read at import by test_distributed_spawn; each test's setUp makes its own
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="innet-torch-suite-")
    os.makedirs(os.path.join(os.environ["TEMP_DIR"], "barrier"), exist_ok=True)
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)  # the ranks leave by os._exit: this process's

import torch  # noqa: E402 (after the environment distributed_test reads at import)
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402
from torch.testing._internal.common_distributed import MultiProcessTestCase  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

ON = os.environ.get("INNET_TORCH_SUITE", "gloo")
if ON not in ("gloo", "innet"):
    raise SystemExit(f"INNET_TORCH_SUITE={ON!r}: expected gloo or innet")


def on_innet(backend: Any) -> Any:
    """``backend`` with gloo replaced by innet (a device map's gloo too); anything else as it is."""
    if backend is None:
        return None
    return re.sub(r"\bgloo\b", "innet", str(backend))


def swapped(make: Any) -> Any:
    """``make`` (init_process_group or new_group), its ``backend`` argument passed through ``on_innet``."""

    @functools.wraps(make)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = on_innet(kwargs["backend"])
        elif make.__name__ == "init_process_group" and args:
            args = (on_innet(args[0]), *args[1:])
        elif make.__name__ == "new_group" and len(args) >= 3:
            args = (*args[:2], on_innet(args[2]), *args[3:])
        return make(*args, **kwargs)

    return call


if ON == "innet":
    import innet.torch  # noqa: F401 (registers the backend)

    for name in ("init_process_group", "new_group"):
        wrapped = swapped(getattr(c10d, name))
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)


START = os.environ.get("INNET_TORCH_SUITE_START", "fork")  # spawn: as torch does, ~20x slower on a loaded machine


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """As torch's test_distributed_spawn.py makes it."""

    def setUp(self) -> None:
        super().setUp()
        self._start_processes(torch.multiprocessing.get_context(START).Process)  # torch's: _spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class GlooAsInnet:
    """``c10d.ProcessGroupGloo`` as test_c10d_gloo.py's bodies call it, making innet's group on the same store."""

    _Options = dist.ProcessGroupGloo._Options
    create_device = staticmethod(dist.ProcessGroupGloo.create_device)

    def __new__(cls, store: dist.Store, rank: int, size: int, opts: Any = None, timeout: Any = None) -> Any:
        from innet.integrations.torch.group import create

        wait = getattr(opts, "_timeout", None) or timeout or timedelta(seconds=1800)
        return create(store, rank, size, wait if isinstance(wait, timedelta) else timedelta(seconds=float(wait)))


class SwappedDist(types.ModuleType):
    """torch.distributed, but its ``ProcessGroupGloo`` is ``GlooAsInnet``: the test module's view of it on innet."""

    ProcessGroupGloo = GlooAsInnet

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)


def forked(cls: type[MultiProcessTestCase]) -> type[MultiProcessTestCase]:
    """``cls`` with its ranks forked (``START``) where its setUp spawned them (its own setUp kept: e.g.
    ProcessGroupGlooLazyInitTest's sets TORCH_GLOO_LAZY_INIT before it starts the ranks)."""

    def _spawn_processes(self: Any) -> None:
        self._start_processes(torch.multiprocessing.get_context(START).Process)

    return type(cls.__name__, (cls,), {"_spawn_processes": _spawn_processes, "__module__": __name__,
                                       "__qualname__": cls.__name__})


C10D = os.environ.get("INNET_TORCH_SUITE_C10D")
if C10D:
    sys.path.insert(0, os.path.dirname(os.path.abspath(C10D)))
    gloo_tests = importlib.import_module(os.path.basename(C10D).removesuffix(".py"))
    if ON == "innet":
        gloo_tests.c10d = gloo_tests.dist = SwappedDist("torch.distributed")
    for _name, _cls in list(vars(gloo_tests).items()):
        if isinstance(_cls, type) and issubclass(_cls, unittest.TestCase) and _cls.__module__ == gloo_tests.__name__:
            globals()[_name] = forked(_cls) if issubclass(_cls, MultiProcessTestCase) else _cls
    del _name, _cls  # else pytest collects the last class twice, as ``_cls``
