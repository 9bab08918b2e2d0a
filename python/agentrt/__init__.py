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
from .errors import (AssignmentError, BusError, CheckpointError, ClosedError, EnvError, Error,
                     InvalidArgumentError, LibraryError)
from .runtime import Runtime
from .checkpoint import Checkpointer, Restore
from .bus import Bus, Message, Subscription
from .envs import EnvPool

__version__ = "0.1.0"

__all__ = ["AssignmentError", "Bus", "BusError", "CheckpointError", "Checkpointer", "ClosedError",
           "EnvError", "EnvPool", "Error", "InvalidArgumentError", "LibraryError", "Message",
           "Restore", "Runtime", "Subscription", "library_path"]


def library_path():
    """The path of the libagentrt_c.so in use (loading it if needed)."""
    from . import _lib
    return _lib.lib().path
