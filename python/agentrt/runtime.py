"""agentrt.Runtime: an agent rank's assignment, heartbeats, metrics and stop
signals, and its checkpointer and bus (agent_runtime/runtime.h)."""
import ctypes
import json

from . import _lib, errors
from ._handle import Handle


class Runtime(Handle):
    """The runtime of a rank started by ``agentctl run``.

    ``Runtime()`` reads the agent's assignment from its environment and the
    run's plan.json, starts heartbeats to the controller (every
    ``heartbeat_ms``) and, with ``signals=True``, turns SIGTERM/SIGINT into a
    stop request (see ``should_stop``) and SIGUSR2 into a checkpoint request.
    Outside ``agentctl run`` it raises AssignmentError naming the missing
    variable.

    Attributes (from the assignment): agent, rank, world_size, local_rank,
    local_world_size, master_addr, master_port, ports, gpus (the devices this
    rank sees: an index as a number, a GPU/MIG UUID as a string), backend,
    restart_count, ckpt_dir, workdir, args (the agent's ``args:`` dict),
    agents (every agent of the run: name, index, ranks, gpus, args),
    assignment (all of it, a dict).

        with agentrt.Runtime() as rt:
            ck = rt.checkpointer
            while not rt.should_stop:
                ...
                rt.report(step, loss=loss)
    """

    _what = "runtime"

    def __init__(self, heartbeat_ms=1000, signals=True):
        lib = _lib.lib()
        ptr = ctypes.c_void_p()
        _lib.check(lib.agentrt_runtime_open(int(heartbeat_ms), 1 if signals else 0,
                                            ctypes.byref(ptr)), errors.AssignmentError)
        super().__init__(ptr, lib.agentrt_runtime_close)
        out = ctypes.c_void_p()
        _lib.check(lib.agentrt_runtime_assignment(ptr, ctypes.byref(out)), errors.AssignmentError)
        self.assignment = _lib.take_json(out)
        for key in ("agent", "rank", "world_size", "local_rank", "local_world_size", "master_addr",
                    "master_port", "ports", "gpus", "backend", "restart_count", "ckpt_dir",
                    "workdir", "args", "agents", "run", "run_dir"):
            setattr(self, key, self.assignment[key])
        self._checkpointer = None
        self._bus = None

    def report(self, step, metrics=None, **more):
        """Sends metrics (numbers or strings) for ``step`` to the controller
        (shown by ``agentctl status``, written to metrics.jsonl); heartbeats carry
        ``step`` from now on. Never blocks."""
        values = dict(metrics or {}, **more)
        try:
            text = json.dumps(values, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError("metrics must be finite numbers or strings: %s" % e) from None
        _lib.check(_lib.lib().agentrt_runtime_report(self._p(), int(step), text.encode()))

    def set_step(self, step):
        """The step heartbeats carry, without sending metrics."""
        _lib.check(_lib.lib().agentrt_runtime_set_step(self._p(), int(step)))

    def set_flops_per_sample(self, flops):
        """The floating-point operations of one sample (forward + backward; a sample is what
        one step of `report` counts): `agentctl status` then shows achieved FLOP/s against
        the partition's peak."""
        _lib.check(_lib.lib().agentrt_runtime_set_flops_per_sample(self._p(), float(flops)))

    @property
    def should_stop(self):
        """True once a stop was requested (SIGTERM, SIGINT, request_stop)."""
        stop = ctypes.c_int()
        _lib.check(_lib.lib().agentrt_runtime_should_stop(self._p(), ctypes.byref(stop), None))
        return bool(stop.value)

    @property
    def stop_reason(self):
        """Why the stop was requested ("SIGTERM", ...); "" while running."""
        stop, reason = ctypes.c_int(), ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_runtime_should_stop(self._p(), ctypes.byref(stop),
                                                          ctypes.byref(reason)))
        return _lib.take_string(reason)

    def request_stop(self, reason="requested"):
        _lib.check(_lib.lib().agentrt_runtime_request_stop(self._p(), _lib.encode(reason, "reason")))

    @property
    def counters(self):
        """{"heartbeats_sent", "telemetry_sent", "telemetry_dropped"}."""
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_runtime_counters(self._p(), ctypes.byref(out)))
        return _lib.take_json(out)

    @property
    def checkpointer(self):
        """The agent's Checkpointer: its directory and policy (interval_s,
        keep_last) from the plan; commits are reported to the controller."""
        if self._checkpointer is None or self._checkpointer.closed:
            from .checkpoint import Checkpointer
            out = ctypes.c_void_p()
            _lib.check(_lib.lib().agentrt_runtime_checkpointer(self._p(), ctypes.byref(out)),
                       errors.CheckpointError)
            self._checkpointer = Checkpointer._borrowed(out, self)
        return self._checkpointer

    @property
    def bus(self):
        """The agent's bus connection (its own credential). BusError
        FAILED_PRECONDITION when the run has no bus."""
        if self._bus is None or self._bus.closed:
            from .bus import Bus
            out = ctypes.c_void_p()
            _lib.check(_lib.lib().agentrt_runtime_bus(self._p(), ctypes.byref(out)), errors.BusError)
            self._bus = Bus._borrowed(out, self)
        return self._bus

    def _before_close(self):
        for h in (self._bus, self._checkpointer):
            if h is not None:
                h.close()

    def __repr__(self):
        if self.closed:
            return "<agentrt.Runtime closed>"
        return "<agentrt.Runtime agent=%s rank=%d/%d restart=%d>" % (
            self.agent, self.rank, self.world_size, self.restart_count)
