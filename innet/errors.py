"""Errors a user can cause: shown as one clear line, never a traceback."""

import re
from collections.abc import Callable


class UserError(Exception):
    """Bad input or an impossible request; the message says what and how to fix it.

    A parameter the user set is named in braces, ``{pool_slots}``: the library's message says the
    parameter's name (a ``RunSpec`` field), and the command line renders it as the flag it came from
    (``render``), so only the CLI knows about flags."""

    def __str__(self) -> str:
        return self.render(lambda name: name)

    def render(self, name_of: Callable[[str], str]) -> str:
        """The message with each ``{name}`` replaced by ``name_of(name)``."""
        return re.sub(r"\{(\w+)\}", lambda m: name_of(m.group(1)), str(self.args[0]) if self.args else "")


class Unfinished(UserError):
    """A run that did not finish within its time limit (gloo's TCP under heavy loss): ``--mode all`` goes on
    without it, a run of that mode alone ends with its line."""


class AllreduceTimeout(Exception):
    """An all-reduce made no progress within its deadline."""


class AllreduceAborted(Exception):
    """A switch or the PBox gave up on the job because a contributor went silent."""
