"""Plain ``torchrun`` on gloo, the baseline the launch tests compare innet with, and the one known way it fails
that is not the script's: gloo's teardown abort.

Under torchrun with gloo, the interpreter's finalization races gloo's C++ worker threads (pytorch/pytorch PR
179291, abandoned): after a rank printed everything and destroyed its group, it may die with "terminate called
without an active exception" and SIGABRT, and torchrun exits 1 ("exitcode: -6"). The examples leave without
finalizing (examples/digits.py, ``leave``), so a script of ours should never show it; a run that does, having
printed its whole result, is recognised by that signature (not by the exit code alone), counted, reported at the
end of the session (conftest.py) and tried again, up to ``TRIES`` times. Any other failure is the test's.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIES = 5
SIGNATURE = "terminate called without an active exception"
ABORTS: list[str] = []  # one line per teardown abort recognised this session, for the terminal summary


def teardown_abort(out: subprocess.CompletedProcess[str], finished: str) -> bool:
    """Whether ``out`` is gloo's teardown abort: its result line (matching ``finished``) printed in full, then
    a rank aborted with the signature."""
    return (out.returncode != 0 and SIGNATURE in out.stderr + out.stdout and "exitcode: -6" in out.stderr
            and re.search(finished, out.stdout) is not None)


@functools.cache
def torchrun(*args: str, ranks: int = 2, finished: str = r"test accuracy [\d.]+") -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --nproc-per-node RANKS --standalone --no-python python ARGS`` from the repo's
    root: the first run that is not a teardown abort (after ``TRIES``, the last one). Once a session for the same arguments: the
    examples seed everything, so a second run prints the same (two launch tests each compare the FSDP example's
    2 epochs, and two the pipeline example's 3 steps, with gloo's)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    # the ranks share torchrun's stdout. torchrun starts them with ``python -u`` (its own), where a print's text and its
    # newline are two writes, and one rank's line can land inside another's ("losses ... 0.555pipeline_p2p: stage 0
    # ..."; CI saw it, PYTHONUNBUFFERED unset); started here as plain commands (--no-python), buffered, each flushed
    # line is one write, whole
    env.pop("PYTHONUNBUFFERED", None)
    for attempt in range(1, TRIES + 1):
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone",
                              "--no-python", sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                             timeout=600)
        if not teardown_abort(out, finished):
            return out
        ABORTS.append(f"torchrun {' '.join(args)}: gloo's teardown abort after the result, try {attempt} of {TRIES}")
    return out
