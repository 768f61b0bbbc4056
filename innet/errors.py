"""Errors a user can cause: shown as one clear line, never a traceback."""


class UserError(Exception):
    """Bad input or an impossible request; the message says what and how to fix it."""


class AllreduceTimeout(Exception):
    """An all-reduce made no progress within its deadline."""


class AllreduceAborted(Exception):
    """A switch or the PBox gave up on the job because a contributor went silent."""
