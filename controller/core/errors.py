"""The one error a bad policy raises: its message names the field and says how to fix it."""


class PolicyError(ValueError):
    """A policy that cannot be applied; the message names the field and the fix."""


class StorageError(RuntimeError):
    """The policy could not be saved, so it was not applied; the message says why and what to do."""
