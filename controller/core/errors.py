"""The one error a bad policy raises: its message names the field and says how to fix it."""


class PolicyError(ValueError):
    """A policy that cannot be applied; the message names the field and the fix."""


class StorageError(RuntimeError):
    """The policy could not be saved, so it was not applied; the message says why and what to do."""


class Indeterminate(RuntimeError):
    """A change was asked for but its outcome is unknown (its answer was lost): it may be in force or not."""


class Conflict(RuntimeError):
    """A change conditioned on the policy's revision (If-Match) found another revision in force."""

    def __init__(self, current: int, expected: int):
        if expected < 0:   # If-Match: * (events.ANY_POLICY)
            super().__init__(f"If-Match: *: no policy is in force (revision {current}); send the change without "
                             "If-Match to make one")
        else:
            super().__init__(f"If-Match: the policy in force is at revision {current}, not {expected}; GET it, and "
                             f"send the change again with If-Match: \"{current}\" if it still applies")
        self.current = current
