from typing import Any, Dict, Mapping, Optional

from .bus import Bus

class Weights:
    version: int
    stream: str
    agent: str
    step: int
    incarnation: int
    mapped: bool
    path: str
    size: int
    tensors: Dict[str, Dict[str, Any]]
    buffer: memoryview
    @property
    def arrays(self) -> Dict[str, Any]: ...

class WeightStream:
    bus: Bus
    name: str
    incarnation: int
    def __init__(self, bus: Bus, name: str, incarnation: Optional[int] = ...,
                 delta: bool = ...) -> None: ...
    def stats(self) -> Dict[str, int]: ...
    @property
    def topic(self) -> str: ...
    def publish(self, arrays: Mapping[str, Any], step: int,
                dtypes: Optional[Mapping[str, str]] = ..., wait: bool = ...) -> Optional[int]: ...
    def flush(self, timeout: float = ...) -> int: ...
    def close(self, timeout: float = ...) -> int: ...
    def latest(self, timeout: float = ...) -> Weights: ...
    def wait_newer(self, version: int, timeout: float = ...) -> Weights: ...
    def at(self, version: int, timeout: float = ...) -> Weights: ...
