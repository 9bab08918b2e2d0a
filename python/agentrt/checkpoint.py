"""agentrt.Checkpointer: sharded, atomic, verified checkpoints of named arrays
(agent_runtime/checkpointer.h), saved from the caller's own buffers.

A save names its arrays (NumPy arrays, or anything with the buffer protocol,
e.g. ``tensor.numpy()`` of a CPU tensor); their memory is read by the C side
directly, never copied in Python. ``wait=False`` returns once it is copied
into the checkpointer's memory; writing, fsync and commit then happen on the
checkpointer's thread. Restore picks the newest checkpoint whose manifest and
checksums verify (falling back past corrupt ones, which it names) and hands
out NumPy views of the restored bytes: no pickle anywhere, so a checkpoint
file can never run code.

Any world size: an array saved as a slice of a global array (``slices=``:
each rank its part) restores at any world size: ``r.read(name, out=...)``
copies any element range into the caller's buffer, from whichever ranks'
shards hold it.
"""
import ctypes
import json

from . import _lib, errors
from ._handle import Handle

_NUMPY_DTYPES = {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float16", "float32", "float64", "complex64", "complex128"}


def _as_array(name, value, holder="checkpoints", odd_as_bytes=True):
    """`value` as a C-contiguous, native-endian NumPy array sharing its memory;
    with ``odd_as_bytes``, a dtype NumPy does not name (bfloat16 of ml_dtypes,
    structured ones) as its raw bytes. ``holder`` names what keeps it, for errors."""
    import numpy as np
    if isinstance(value, np.ndarray):
        arr = value
    else:
        try:
            arr = np.asarray(memoryview(value))
        except TypeError:
            raise TypeError("entry %r: %s has no buffer (pass a NumPy array, bytes, or a CPU "
                            "tensor's .numpy())" % (name, type(value).__name__)) from None
    if not arr.flags.c_contiguous:
        raise ValueError("entry %r is not C-contiguous (np.ascontiguousarray it first)" % name)
    if arr.dtype.byteorder == ">":
        raise ValueError("entry %r is big-endian; %s hold native little-endian arrays"
                         % (name, holder))
    if odd_as_bytes and arr.dtype.name not in _NUMPY_DTYPES:
        arr = arr.view(np.uint8)  # structured or odd dtypes: their raw bytes
    return arr


class State(Handle):
    """What one save holds: named arrays (views, read at save time) and JSON
    metadata. Built by Checkpointer.save; usable on its own for repeated saves
    of the same buffers."""

    _what = "checkpoint state"

    def __init__(self, arrays, metadata=None, dtypes=None, slices=None):
        lib = _lib.lib()
        ptr = ctypes.c_void_p()
        _lib.check(lib.agentrt_state_create(ctypes.byref(ptr)), errors.CheckpointError)
        super().__init__(ptr, lib.agentrt_state_free)
        self._keep = []  # the arrays must outlive every save of this state
        if not hasattr(arrays, "items"):
            raise TypeError("arrays must be a mapping of names to arrays, not %s"
                            % type(arrays).__name__)
        for name, value in arrays.items():
            if not isinstance(name, str):
                raise TypeError("entry names must be str, not %s" % type(name).__name__)
            arr = _as_array(name, value)
            dtype = (dtypes or {}).get(name, arr.dtype.name)
            if slices and name in slices:
                global_shape, begin = slices[name]
                dims = (ctypes.c_int64 * max(1, len(global_shape)))(*global_shape)
                _lib.check(lib.agentrt_state_add_slice(
                    ptr, _lib.encode(name, "entry name"), ctypes.c_void_p(arr.ctypes.data),
                    dtype.encode(), dims, len(global_shape), int(begin), arr.size),
                    errors.CheckpointError)
            else:
                shape = (ctypes.c_int64 * max(1, arr.ndim))(*arr.shape)
                _lib.check(lib.agentrt_state_add(ptr, _lib.encode(name, "entry name"),
                                                 ctypes.c_void_p(arr.ctypes.data), arr.nbytes,
                                                 dtype.encode(), shape, arr.ndim),
                           errors.CheckpointError)
            self._keep.append(arr)
        if metadata is not None:
            try:
                text = json.dumps(metadata, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise TypeError("metadata must be JSON-serialisable: %s" % e) from None
            _lib.check(lib.agentrt_state_set_metadata(ptr, text.encode()), errors.CheckpointError)


class Restore(Handle):
    """The outcome of Checkpointer.restore().

    kind: "restored", "fresh" (no checkpoint yet) or "corrupt" (checkpoints
    exist, none verifies). step, time, world_size, path (the step's
    directory), metadata (the dict saved),
    skipped ([{"step", "file", "reason"}] passed over as corrupt), describe
    (one line for the log), entries ({name: {"dtype", "shape", "bytes"}}: this
    rank's own), global_arrays ({name: {"dtype", "shape", "element_bytes"}}:
    saved as slices, by any ranks).
    ``r[name]`` is a NumPy view of that entry's restored bytes (alive as long as
    the view is); ``r.arrays()`` all of them. ``r.read(name, ...)`` copies
    (part of) a global array.
    """

    _what = "restore"

    def __init__(self, ptr):
        lib = _lib.lib()
        super().__init__(ptr, lib.agentrt_restore_free)
        out = ctypes.c_void_p()
        _lib.check(lib.agentrt_restore_info(ptr, ctypes.byref(out)), errors.CheckpointError)
        info = _lib.take_json(out)
        self.kind = info["kind"]
        self.step = info["step"]
        self.time = info["time"]
        self.world_size = info["world_size"]
        self.path = info["path"]
        self.metadata = info["metadata"]
        self.skipped = info["skipped"]
        self.describe = info["describe"]
        self.entries = {e["name"]: {"dtype": e["dtype"], "shape": tuple(e["shape"]),
                                    "bytes": e["bytes"]} for e in info["entries"]}
        self.global_arrays = {a["name"]: {"dtype": a["dtype"], "shape": tuple(a["shape"]),
                                          "element_bytes": a["element_bytes"]}
                              for a in info["arrays"]}

    def read(self, name, out=None, begin=0, count=None):
        """Elements [begin, begin + count) of global array ``name`` (flat,
        row-major), read from whichever shards hold them and verified. Into
        ``out`` (a writable C-contiguous buffer of exactly those bytes, e.g. a
        CPU tensor's ``.numpy()``: no other copy), returned; else into a new
        NumPy array (the global shape when it is the whole array; bfloat16
        comes back as its int16 bits)."""
        import numpy as np
        if name not in self.global_arrays:
            raise KeyError("no global array %r in the restored checkpoint (it has %s)"
                           % (name, ", ".join(sorted(self.global_arrays)) or "none"))
        a = self.global_arrays[name]
        total = 1
        for d in a["shape"]:
            total *= d
        if out is None:
            if count is None:
                count = total - begin
            dtype = "int16" if a["dtype"] == "bfloat16" else \
                a["dtype"] if a["dtype"] in _NUMPY_DTYPES else "uint8"
            out = np.empty(count * a["element_bytes"] // np.dtype(dtype).itemsize, dtype=dtype)
            if begin == 0 and count == total and dtype != "uint8":
                out = out.reshape(a["shape"])
        target = out if isinstance(out, np.ndarray) else np.asarray(memoryview(out))
        if not target.flags.c_contiguous or not target.flags.writeable:
            raise ValueError("read %r: out must be a writable C-contiguous buffer" % name)
        if count is None:
            count = target.nbytes // a["element_bytes"]
        _lib.check(_lib.lib().agentrt_restore_read(self._p(), _lib.encode(name, "name"),
                                                   int(begin), int(count),
                                                   ctypes.c_void_p(target.ctypes.data),
                                                   target.nbytes),
                   errors.CheckpointError)
        return out

    @property
    def restored(self):
        return self.kind == "restored"

    def __contains__(self, name):
        return name in self.entries

    def __getitem__(self, name):
        import numpy as np
        if name not in self.entries:
            raise KeyError("no entry %r in the restored checkpoint (it has %s)"
                           % (name, ", ".join(sorted(self.entries)) or "none"))
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        _lib.check(_lib.lib().agentrt_restore_entry(self._p(), _lib.encode(name, "name"),
                                                    ctypes.byref(data), ctypes.byref(size)),
                   errors.CheckpointError)
        e = self.entries[name]
        buf = (ctypes.c_uint8 * size.value).from_address(data.value or 0)
        buf._owner = self  # the view keeps the restored memory alive
        # bfloat16 (no NumPy dtype) comes back as its bits, int16, in its shape.
        dtype = "int16" if e["dtype"] == "bfloat16" else \
            e["dtype"] if e["dtype"] in _NUMPY_DTYPES else "uint8"
        arr = np.frombuffer(buf, dtype=dtype) if size.value else np.zeros(0, dtype=dtype)
        if dtype != "uint8" or e["dtype"] == "uint8":
            arr = arr.reshape(e["shape"])
        return arr

    def arrays(self):
        return {name: self[name] for name in self.entries}

    def close(self):
        # Views handed out keep the memory (their buffer references self): only
        # the last of them lets it go. Explicit close() with live views is a no-op.
        pass

    def __del__(self):
        Handle.close(self)

    def __repr__(self):
        return "<agentrt.Restore %s>" % self.describe


class Checkpointer(Handle):
    """Sharded, atomic, verified checkpoints of one rank.

    Made by the runtime (``rt.checkpointer``: the agent's directory and policy)
    or on its own: ``Checkpointer(dir, agent="a", rank=0, world_size=1,
    interval_s=1800, keep_last=3)``. Every rank of an agent saves the same
    steps; rank 0 commits when all shards are durable.

        r = ck.restore()
        if r.restored:
            w[...] = r["w"]
        ...
        if ck.save_due:
            ck.save(step, {"w": w}, metadata={"lr": lr}, wait=False)
    """

    _what = "checkpointer"

    def __init__(self, dir, agent="agent", rank=0, world_size=1, interval_s=1800.0, keep_last=3,
                 snapshot=None):
        lib = _lib.lib()
        ptr = ctypes.c_void_p()
        _lib.check(lib.agentrt_checkpointer_create(_lib.encode(str(dir), "dir"),
                                                   _lib.encode(agent, "agent"), int(rank),
                                                   int(world_size), float(interval_s),
                                                   int(keep_last), ctypes.byref(ptr)),
                   errors.CheckpointError)
        super().__init__(ptr, lib.agentrt_checkpointer_close)
        self._owner = None
        self._last_state = None
        if snapshot is not None:
            self.snapshot = snapshot

    @property
    def snapshot(self):
        """How ``save(..., wait=False)`` takes the arrays: "copy" (it returns
        after copying them) or "fork" (after a fork of this process: pages
        changed while the save is written are copied then, by the kernel; it
        pays when the arrays are only read for a while after the save, as in
        a rollout). Under agentctl, agents.yaml's checkpoint.snapshot."""
        return self.info["snapshot"]

    @snapshot.setter
    def snapshot(self, how):
        _lib.check(_lib.lib().agentrt_checkpointer_set_snapshot(self._p(),
                                                                _lib.encode(how, "snapshot")),
                   errors.CheckpointError)

    @classmethod
    def _borrowed(cls, ptr, owner):
        self = cls.__new__(cls)
        Handle.__init__(self, ptr, _lib.lib().agentrt_checkpointer_close)
        self._owner = owner
        self._last_state = None
        return self

    @property
    def save_due(self):
        """True when a save was requested (SIGUSR2, SIGTERM, request_save) or
        interval_s has passed, and no save is in progress."""
        due = ctypes.c_int()
        _lib.check(_lib.lib().agentrt_checkpointer_save_due(self._p(), ctypes.byref(due)))
        return bool(due.value)

    def request_save(self):
        _lib.check(_lib.lib().agentrt_checkpointer_request_save(self._p()))

    def save(self, step, arrays, metadata=None, wait=True, dtypes=None, slices=None):
        """Saves ``arrays`` ({name: array}) and ``metadata`` (JSON) as ``step``.
        wait=True: returns once committed (durable). wait=False: returns once the
        arrays are copied (or, with snapshot "fork", once the process is forked); the caller
        may change them at once. ``dtypes``
        overrides the recorded dtype of some entries (e.g. "bfloat16").
        ``slices`` ({name: (global_shape, begin)}) saves those arrays as the
        elements [begin, begin + size) of a global array, which restores at any
        world size (Restore.read)."""
        state = arrays if isinstance(arrays, State) else State(arrays, metadata, dtypes, slices)
        try:
            _lib.check(_lib.lib().agentrt_checkpointer_save(self._p(), int(step), state._p(),
                                                            0 if wait else 1),
                       errors.CheckpointError)
        finally:
            if state is not arrays:
                state.close()

    def wait(self):
        """Waits for the save in progress; raises CheckpointError if it failed."""
        _lib.check(_lib.lib().agentrt_checkpointer_wait(self._p()), errors.CheckpointError)

    def restore(self, load=True, before=None, why=None, skipped=None):
        """The newest verified checkpoint (or a fresh start): a Restore. A
        checkpoint written by another world size that holds entries of single
        ranks (not slices) raises CheckpointShapeError (a ConfigurationError:
        uncaught under agentctl, exit code 78).

        load=False: a checkpoint of global arrays only (saved with ``slices``)
        is not read now; ``r.read(name, out=...)`` verifies each chunk as it
        reads it into the caller's memory. A CheckpointError with code
        DATA_LOSS (15) from such a read means that step is corrupt: call
        ``restore(load=False, before=r.step, why=e.message, skipped=r.skipped)``
        for an older one (its ``skipped`` then lists r.step, naming the file
        ``why`` names). Every rank must read the same arrays to agree on the
        step."""
        out = ctypes.c_void_p()
        try:
            if load and before is None and why is None and not skipped:
                code = _lib.lib().agentrt_checkpointer_restore(self._p(), ctypes.byref(out))
            else:
                if load:
                    raise ValueError("restore: before=, why= and skipped= go with load=False")
                code = _lib.lib().agentrt_checkpointer_restore_lazy(
                    self._p(), -1 if before is None else int(before),
                    None if why is None else str(why).encode(),
                    None if skipped is None else json.dumps(list(skipped)).encode(),
                    ctypes.byref(out))
            _lib.check(code, errors.CheckpointError)
        except errors.CheckpointError as e:
            if e.code == 9:  # FAILED_PRECONDITION: saved by another world size
                raise errors.CheckpointShapeError(e.code, e.message) from None
            raise
        return Restore(out)

    @property
    def info(self):
        """{"dir", "rank", "world_size", "interval_s", "keep_last", "last_saved_step",
        "saving", "saves_started", "saves_committed", "snapshot", "last_snapshot_s",
        "last_snapshot_forked", "last_snapshot_fallback", "last_write_s"}."""
        out = ctypes.c_void_p()
        _lib.check(_lib.lib().agentrt_checkpointer_info(self._p(), ctypes.byref(out)))
        return _lib.take_json(out)

    def __repr__(self):
        return "<agentrt.Checkpointer %s>" % ("closed" if self.closed else self.info["dir"])
