"""agentrt.EnvPool: a batch of the runtime's C++ environments stepped by its
own threads, with NumPy *views* of the pool's buffers (envs/env_pool.h,
envs/multi_agent_env_pool.h).

Zero-copy: ``observations``, ``rewards``, ... are views onto the pool's own
memory (``numpy.shares_memory`` with every later step's result holds): a step
rewrites them in place, so copy what you keep (``obs.copy()``). Write actions
into ``pool.actions`` (a writable view), or pass them to ``step(actions)``,
which copies them there once.

Single-agent envs (cartpole, dummy): observations [num_envs, obs_size],
actions [num_envs, act_size], rewards/terminated/truncated [num_envs].
Multi-agent envs (pursuit): every seat, observations [num_envs, num_agents,
obs_size], actions [num_envs, num_agents, act_size], rewards and active
[num_envs, num_agents], terminated/truncated [num_envs]. Discrete actions are
one float holding the index. Ended episodes are reset automatically: their
last observation is in ``final_observations``, their return and length in
``episode_returns`` / ``episode_lengths``.
"""
import ctypes
import json

from . import _lib, errors
from ._handle import Handle, Memory

_BUFFERS = {  # name: (enum agentrt_buffer, dtype, per-seat)
    "observations": (0, "float32", True),
    "final_observations": (1, "float32", True),
    "actions": (2, "float32", True),
    "rewards": (3, "float32", True),
    "terminated": (4, "bool", False),  # uint8 0/1 in C: NumPy bool views
    "truncated": (5, "bool", False),
    "episode_returns": (6, "float32", True),
    "episode_lengths": (7, "int32", False),
    "active": (8, "bool", True),
}


class EnvPool(Handle):
    """``EnvPool("cartpole", num_envs=64, num_threads=1, seed=0, **params)``:
    ``num_envs`` copies of a registered env (``params`` are its settings, e.g.
    ``grid=7`` for pursuit). EnvError names the known envs for an unknown name.
    Not thread-safe: one thread steps a pool."""

    _what = "env pool"

    def __init__(self, name, num_envs=8, num_threads=1, seed=0, **params):
        import numpy as np
        lib = _lib.lib()
        for what, v in (("num_envs", num_envs), ("num_threads", num_threads), ("seed", seed)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError("%s must be an int, not %s" % (what, type(v).__name__))
        if seed < 0:
            raise ValueError("seed must be >= 0")
        ptr = ctypes.c_void_p()
        _lib.check(lib.agentrt_envpool_create(_lib.encode(name, "env name"),
                                              json.dumps(params).encode() if params else None,
                                              num_envs, num_threads, seed, ctypes.byref(ptr)),
                   errors.EnvError)
        # The pool's memory lives as long as the pool or any view of it.
        self._memory = Memory(ptr, lib.agentrt_envpool_close)
        super().__init__(ptr, lambda _ptr: None)
        out = ctypes.c_void_p()
        _lib.check(lib.agentrt_envpool_spec(ptr, ctypes.byref(out)), errors.EnvError)
        self.spec = _lib.take_json(out)
        self.name = name
        self.num_envs = self.spec["num_envs"]
        self.num_agents = self.spec["num_agents"]
        self.agent_names = self.spec["agent_names"]
        self.obs_size = self.spec["obs_size"]
        self.act_size = self.spec["act_size"]
        self.observation_space = self.spec["observation_space"]
        self.action_space = self.spec["action_space"]
        self._views = {}
        for key, (which, dtype, per_seat) in _BUFFERS.items():
            if key == "active" and not self.num_agents:
                continue
            data, count = ctypes.c_void_p(), ctypes.c_size_t()
            _lib.check(lib.agentrt_envpool_buffer(ptr, which, ctypes.byref(data),
                                                  ctypes.byref(count)), errors.EnvError)
            itemsize = np.dtype(dtype).itemsize
            raw = (ctypes.c_uint8 * (count.value * itemsize)).from_address(data.value)
            raw._owner = self._memory  # a view keeps the pool's memory alive
            shape = [self.num_envs]
            if per_seat and self.num_agents:
                shape.append(self.num_agents)
            if key in ("observations", "final_observations"):
                shape.append(self.obs_size)
            elif key == "actions":
                shape.append(self.act_size)
            view = np.frombuffer(raw, dtype=dtype).reshape(shape)
            if key != "actions":
                view.flags.writeable = False
            self._views[key] = view

    def __getattr__(self, key):
        if key in _BUFFERS and self.__dict__.get("_ptr") is None:
            raise errors.ClosedError(self._what)
        views = self.__dict__.get("_views")
        if views is not None and key in views:
            return views[key]
        raise AttributeError("%s has no attribute %r" % (type(self).__name__, key))

    def reset(self, seed=None):
        """Resets every env (env i with seed + i; the pool's seed when None);
        returns the observations view."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise TypeError("seed must be a non-negative int or None")
        _lib.check(_lib.lib().agentrt_envpool_reset(self._p(), 0 if seed is None else 1,
                                                    seed or 0), errors.EnvError)
        return self._views["observations"]

    def step(self, actions=None):
        """Steps every env with ``actions`` (copied into ``self.actions``, whose
        shape it must have) or with what ``self.actions`` holds; returns the
        views (observations, rewards, terminated, truncated)."""
        ptr = self._p()  # ClosedError once closed
        target = self._views["actions"] if actions is not None else None
        if target is not None and getattr(actions, "dtype", None) == target.dtype and \
                getattr(actions, "shape", None) == target.shape:
            target[...] = actions  # the common case, without the checks below
        elif target is not None:
            import numpy as np
            a = np.asarray(actions)
            if a.shape != target.shape:
                if a.size == target.size and a.ndim <= 1 + bool(self.num_agents):
                    a = a.reshape(target.shape)  # e.g. [num_envs] discrete indices
                else:
                    raise ValueError("actions have shape %s; this pool takes %s"
                                     % (a.shape, target.shape))
            if not np.can_cast(a.dtype, np.float32, casting="same_kind"):
                raise TypeError("actions of dtype %s cannot be float32" % a.dtype)
            np.copyto(target, a, casting="same_kind")
        _lib.check(_lib.lib().agentrt_envpool_step(ptr), errors.EnvError)
        v = self._views
        return v["observations"], v["rewards"], v["terminated"], v["truncated"]

    def _before_close(self):
        # Views already handed out keep the memory until they go.
        self._views = {}
        self._memory = None

    def __repr__(self):
        return "<agentrt.EnvPool %s x%d%s>" % (self.name, self.num_envs,
                                               " (%d seats)" % self.num_agents
                                               if self.num_agents else "")
