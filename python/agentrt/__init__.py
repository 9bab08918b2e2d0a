"""agentrt for Python: an agent's runtime, checkpoints, message bus and env
pools, over agentrt's C API (libagentrt_c.so) with ctypes, so it imports
under any Python 3 without being compiled for it.

    import agentrt
    with agentrt.Runtime() as rt:                 # inside `agentctl run`
        ck, bus = rt.checkpointer, rt.bus
        pool = agentrt.EnvPool("cartpole", num_envs=64)
        ...
        rt.report(step, loss=loss)

Modules: agentrt.Runtime (assignment, heartbeats, metrics, stop), agentrt.Checkpointer
(verified sharded checkpoints of named arrays), agentrt.Bus (publish/subscribe,
direct messages, request/reply), agentrt.EnvPool (batched C++ envs, NumPy views),
agentrt.torch (PyTorch state without pickle). Errors are agentrt.Error subclasses
with the status code and message.
"""
import os as _os
import sys as _sys

from .errors import (AssignmentError, BusError, CheckpointError, CheckpointShapeError, ClosedError,
                     ConfigurationError, EnvError, Error, InvalidArgumentError, LibraryError)
from .runtime import Runtime
from .checkpoint import Checkpointer, Restore
from .bus import Bus, Message, Subscription
from .weights import WeightStream, Weights
from .envs import EnvPool

__version__ = "0.1.0"

__all__ = ["AssignmentError", "Bus", "BusError", "CheckpointError", "CheckpointShapeError",
           "Checkpointer", "ClosedError", "ConfigurationError", "EnvError", "EnvPool", "Error",
           "InvalidArgumentError", "LibraryError", "Message", "Restore", "Runtime", "Subscription",
           "WeightStream", "Weights", "library_path"]


def _exit_78_on_configuration_error():
    """Under `agentctl run`: a ConfigurationError nobody caught ends the
    process with 78 (EX_CONFIG, plan/agent_env.h), after its traceback, so the
    agent is failed, not restarted, and the run summary quotes it."""
    previous = _sys.excepthook

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        if isinstance(value, ConfigurationError):
            for stream in (_sys.stdout, _sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            _os._exit(78)
    _sys.excepthook = hook


if _os.environ.get("AGENTRT_RUN_DIR"):
    _exit_78_on_configuration_error()


def library_path():
    """The path of the libagentrt_c.so in use (loading it if needed)."""
    from . import _lib
    return _lib.lib().path
