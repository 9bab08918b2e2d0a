"""The exceptions of agentrt: every failure of the C side is an agentrt.Error
carrying its status code (gRPC's canonical numbering) and message."""

CODE_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED")


class Error(Exception):
    """A call into agentrt failed.

    Attributes:
      code: the status code (an int, gRPC's canonical numbering: 3 INVALID_ARGUMENT,
            14 UNAVAILABLE, ...).
      code_name: its name ("UNAVAILABLE").
      message: what failed, and where.
    """

    def __init__(self, code, message):
        self.code = int(code)
        self.code_name = CODE_NAMES[self.code] if 0 <= self.code < len(CODE_NAMES) else "UNKNOWN"
        self.message = message
        super().__init__("%s: %s" % (self.code_name, message))


class LibraryError(Error):
    """libagentrt_c.so could not be loaded, or is of another API version."""

    def __init__(self, message):
        super().__init__(9, message)


class AssignmentError(Error):
    """The agent's assignment cannot be read: not started by `agentctl run` (an
    AGENTRT_* variable is missing), or its plan.json is unreadable."""


class BusError(Error):
    """A message-bus call failed; `code` is the gRPC status code of the call
    (e.g. 14 UNAVAILABLE, 7 PERMISSION_DENIED, 4 DEADLINE_EXCEEDED)."""

    @property
    def grpc_code(self):
        return self.code


class CheckpointError(Error):
    """A checkpoint could not be saved or restored."""


class ConfigurationError(Error):
    """The agent's own configuration is wrong (a bad argument, a checkpoint it
    cannot restore as configured): trying again cannot help. Raise it from an
    agent's code too. Left uncaught in a process started by `agentctl run`, it
    ends the process with exit code 78 (EX_CONFIG) after its traceback: the
    agent is failed at once, not restarted, and the run summary quotes it."""


class CheckpointShapeError(CheckpointError, ConfigurationError):
    """A checkpoint this agent cannot restore as configured: written by another
    world size (a CheckpointError and a ConfigurationError)."""


class EnvError(Error):
    """An env pool could not be made or used."""


class ClosedError(Error, ValueError):
    """The handle was closed."""

    def __init__(self, what):
        super().__init__(9, "%s is closed" % what)


class InvalidArgumentError(Error, ValueError):
    """An argument the C side refused (also a ValueError)."""


_invalid_of = {}


def error_for(code, message, error_class=None):
    """The exception for `code` in the call's domain (`error_class`, e.g.
    BusError). INVALID_ARGUMENT is also an InvalidArgumentError (a ValueError)."""
    cls = error_class or Error
    if code == 3:
        if cls is Error:
            cls = InvalidArgumentError
        else:
            if cls not in _invalid_of:
                _invalid_of[cls] = type("Invalid" + cls.__name__, (cls, InvalidArgumentError),
                                        {"__module__": __name__, "__doc__": cls.__doc__})
            cls = _invalid_of[cls]
    return cls(code, message)
