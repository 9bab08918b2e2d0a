from .bus import Bus as Bus, Message as Message, Subscription as Subscription
from .checkpoint import Checkpointer as Checkpointer, Restore as Restore
from .envs import EnvPool as EnvPool
from .errors import (AssignmentError as AssignmentError, BusError as BusError,
                     CheckpointError as CheckpointError,
                     CheckpointShapeError as CheckpointShapeError, ClosedError as ClosedError,
                     ConfigurationError as ConfigurationError,
                     EnvError as EnvError, Error as Error,
                     InvalidArgumentError as InvalidArgumentError, LibraryError as LibraryError)
from .runtime import Runtime as Runtime
from .weights import WeightStream as WeightStream, Weights as Weights

__version__: str

def library_path() -> str: ...
