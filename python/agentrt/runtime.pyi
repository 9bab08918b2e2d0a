from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from .bus import Bus
from .checkpoint import Checkpointer

Metric = Union[int, float, str]

class Runtime:
    agent: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    ports: Tuple[int, int]
    gpus: List[int]
    backend: str
    restart_count: int
    ckpt_dir: str
    workdir: str
    args: Dict[str, Any]
    agents: List[Dict[str, Any]]
    run: str
    run_dir: str
    assignment: Dict[str, Any]
    def __init__(self, heartbeat_ms: int = ..., signals: bool = ...) -> None: ...
    def report(self, step: int, metrics: Optional[Mapping[str, Metric]] = ..., **more: Metric) -> None: ...
    def set_step(self, step: int) -> None: ...
    @property
    def should_stop(self) -> bool: ...
    @property
    def stop_reason(self) -> str: ...
    def request_stop(self, reason: str = ...) -> None: ...
    @property
    def counters(self) -> Dict[str, int]: ...
    @property
    def checkpointer(self) -> Checkpointer: ...
    @property
    def bus(self) -> Bus: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Runtime": ...
    def __exit__(self, *exc: object) -> None: ...
