from typing import Any, Dict, List, Optional, Tuple

import numpy as np

class EnvPool:
    name: str
    num_envs: int
    num_agents: int
    agent_names: List[str]
    obs_size: int
    act_size: int
    observation_space: Dict[str, Any]
    action_space: Dict[str, Any]
    spec: Dict[str, Any]
    observations: np.ndarray
    final_observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    active: np.ndarray
    def __init__(self, name: str, num_envs: int = ..., num_threads: int = ..., seed: int = ...,
                 **params: Any) -> None: ...
    def reset(self, seed: Optional[int] = ...) -> np.ndarray: ...
    def step(self, actions: Optional[Any] = ...) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "EnvPool": ...
    def __exit__(self, *exc: object) -> None: ...
