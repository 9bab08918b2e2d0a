"""agentrt.WeightStream: an agent's policy weights as numbered versions on the
bus (comms/weight_stream.h), for league opponents and self-play.

    out = agentrt.WeightStream(rt.bus, "prey-0")       # topic "weights/prey-0"
    version = out.publish({"fc.weight": w, "fc.bias": b}, step=1000)
    w = agentrt.WeightStream(rt.bus, "prey-0").latest()
    w.version, w.step, w.agent, w.arrays["fc.weight"]  # read-only NumPy views

On the broker's node a version is written once, straight from the arrays,
into a file the broker takes over, and a reader maps that file: its arrays
are views of the mapping (``w.mapped``), and they keep it alive. Elsewhere
the bytes are streamed. ``publish`` returns once the version is stored; it
never waits for subscribers. Failures raise BusError (``e.code_name``:
NOT_FOUND for a version not kept or not there yet, DEADLINE_EXCEEDED for
``wait_newer``, PERMISSION_DENIED outside the plan's channels).
"""
import ctypes
import json
import os

from . import _lib, checkpoint, errors

_LATEST, _NEWER, _AT = 0, 1, 2


class _Owned:
    """Frees one agentrt_weights handle when the last view of it goes."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        ptr, self.ptr = self.ptr, None
        if ptr:
            try:
                _lib.lib().agentrt_weights_free(ptr)
            except Exception:  # noqa: BLE001 (interpreter shutdown)
                pass


class Weights:
    """One version: ``version``, ``stream``, ``agent`` (the publisher), ``step``,
    ``incarnation`` (the publisher's restart count), ``mapped``, ``path``,
    ``tensors`` ({name: {"dtype", "shape", "offset", "bytes"}}) and ``arrays``
    ({name: read-only NumPy array}; a "bfloat16" tensor is its raw int16s)."""

    def __init__(self, ptr):
        self._owned = _Owned(ptr)
        info = _lib.take_json(_json_out(_lib.lib().agentrt_weights_info, ptr))
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        _lib.check(_lib.lib().agentrt_weights_data(ptr, ctypes.byref(data), ctypes.byref(size)),
                   errors.BusError)
        for key in ("version", "stream", "agent", "step", "incarnation", "mapped", "path"):
            setattr(self, key, info[key])
        self.size = size.value
        self.tensors = {t["name"]: {k: t[k] for k in ("dtype", "shape", "offset", "bytes")}
                        for t in info["tensors"]}
        # The payload as a read-only buffer that keeps this version (and its
        # mapping) alive: the arrays are views of it, and cannot be made writable.
        self.buffer = b""
        if self.size:
            raw = (ctypes.c_char * self.size).from_address(data.value)
            raw._owned = self._owned
            self.buffer = memoryview(raw).cast("B").toreadonly()
        self._arrays = None

    @property
    def arrays(self):
        if self._arrays is None:
            import numpy as np
            out = {}
            for name, t in self.tensors.items():
                dtype = np.dtype("int16" if t["dtype"] == "bfloat16" else t["dtype"])
                count = t["bytes"] // dtype.itemsize if dtype.itemsize else 0
                arr = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=t["offset"])
                out[name] = arr.reshape(t["shape"])  # shape []: a 0-d array (a scalar buffer)
            self._arrays = out
        return self._arrays

    def __repr__(self):
        return "Weights(stream=%r, version=%d, step=%d, agent=%r, %d tensors, %s)" % (
            self.stream, self.version, self.step, self.agent, len(self.tensors),
            "mapped" if self.mapped else "streamed")


def _pointers(pointers, sizes):
    """The C arrays of one call's buffers: their addresses (None for an empty one) and sizes."""
    return (ctypes.c_void_p * len(pointers))(*pointers), (ctypes.c_size_t * len(sizes))(*sizes)


def _json_out(fn, ptr):
    out = ctypes.c_void_p()
    _lib.check(fn(ptr, ctypes.byref(out)), errors.BusError)
    return out


class WeightStream:
    """Stream ``name`` on ``bus`` (an agentrt.Bus). ``incarnation`` is what
    published versions say of this publisher (default: the agent's restart
    count, AGENTRT_RESTART_COUNT).

    ``delta=True``: delta versions. Publishing, each version's difference to
    the one before (XOR, then zstd) is published too; reading, once this
    stream holds version N, it reads N + 1 from that difference when it can
    (it is checked against the version's CRC32C; otherwise read whole).
    ``stats()`` counts the bytes either way. The bus keeps this state per
    stream name until ``close()``."""

    def __init__(self, bus, name, incarnation=None, delta=False):
        self.bus = bus
        self.name = name
        if incarnation is None:
            incarnation = int(os.environ.get("AGENTRT_RESTART_COUNT", "0") or 0)
        self.incarnation = int(incarnation)
        if delta:
            with bus._in_flight():
                _lib.check(_lib.lib().agentrt_weights_open(
                    bus._p(), _lib.encode(name, "name"), self.incarnation, 1), errors.BusError)

    def stats(self):
        """{"deltas_published", "delta_bytes_published", "deltas_not_published",
        "versions_from_delta", "delta_bytes_read", "delta_mismatches",
        "whole_bytes_read", "versions_from_node_cache"} of this stream on its
        bus."""
        out = ctypes.c_void_p()
        with self.bus._in_flight():
            _lib.check(_lib.lib().agentrt_weights_stats(
                self.bus._p(), _lib.encode(self.name, "name"), ctypes.byref(out)), errors.BusError)
        return json.loads(_lib.take_string(out))

    @property
    def topic(self):
        return "weights/" + self.name

    def publish(self, arrays, step, dtypes=None, wait=True):
        """Stores a new version of ``arrays`` ({name: array}); returns its number.
        ``dtypes`` ({name: label}) overrides a tensor's dtype label (e.g.
        "bfloat16" for raw int16s).

        ``wait=False`` returns once the bytes are copied into the stream's next
        slot (made ready in the background after the version before, so the
        copy is one memcpy) and returns None; the version is stored in the
        background and ``flush()`` says its number. One version is in flight
        at a time: a call while one is waits for it, and raises its error if
        it was not stored (publishing nothing)."""
        names, described, keep = list(arrays), [], []
        for name in names:
            # Its own dtype label and shape (a bfloat16 stays one), its bytes as they are.
            arr = checkpoint._as_array(name, arrays[name], "weight versions", odd_as_bytes=False)
            label = (dtypes or {}).get(name, arr.dtype.name)
            described.append({"name": name, "dtype": label, "shape": list(arr.shape)})
            keep.append(arr)
        ptrs, sizes = _pointers([a.ctypes.data if a.nbytes else None for a in keep],
                                [a.nbytes for a in keep])
        with self.bus._in_flight():  # Bus.close() waits for this call to return
            args = (self.bus._p(), _lib.encode(self.name, "name"), json.dumps(described).encode(),
                    ptrs, sizes, len(names), int(step), self.incarnation)
            if not wait:
                _lib.check(_lib.lib().agentrt_weights_publish_async(*args), errors.BusError)
                return None
            version = ctypes.c_int64()
            _lib.check(_lib.lib().agentrt_weights_publish(*args, ctypes.byref(version)),
                       errors.BusError)
        del keep
        return version.value

    def publish_device(self, tensors, step, device, cuda_stream=None):
        """Stores a new version of GPU tensors; returns its number once stored.
        ``tensors``: a list of (name, dtype label, shape, device pointer, bytes),
        memory of CUDA device ``device``, read after the work enqueued on
        ``cuda_stream`` (a cudaStream_t as an int; None: the legacy default
        stream). A reader on this node copies it GPU to GPU through CUDA IPC
        (read_device); others read it as any version. BusError UNAVAILABLE
        without an NVIDIA driver."""
        n = len(tensors)
        described = [{"name": t[0], "dtype": t[1], "shape": list(t[2])} for t in tensors]
        ptrs, sizes = _pointers([t[3] for t in tensors], [t[4] for t in tensors])
        version = ctypes.c_int64()
        with self.bus._in_flight():
            _lib.check(_lib.lib().agentrt_weights_publish_device(
                self.bus._p(), _lib.encode(self.name, "name"), json.dumps(described).encode(), ptrs,
                sizes, n, int(step), self.incarnation, int(device), cuda_stream,
                ctypes.byref(version)), errors.BusError)
        return version.value

    def read_device(self, targets, device, version=0, cuda_stream=None, timeout=10.0):
        """Copies ``version`` (0: the newest) into GPU memory and returns the
        version read, the copies complete: ``targets`` a list of (name, device
        pointer, bytes[, dtype label, shape]), one per tensor of the version,
        each exactly its size, dtype and shape when given (BusError
        INVALID_ARGUMENT, nothing copied, otherwise). GPU to GPU
        through CUDA IPC when the publisher is on this node, else through
        pinned host memory."""
        n = len(targets)
        ptrs, sizes = _pointers([t[1] for t in targets], [t[2] for t in targets])
        got = ctypes.c_int64()
        timeout = _lib.timeout_ms(timeout)
        with self.bus._in_flight():
            _lib.check(_lib.lib().agentrt_weights_read_device(
                self.bus._p(), _lib.encode(self.name, "name"), int(version),
                json.dumps([t[0] if len(t) < 5 else {"name": t[0], "dtype": t[3], "shape": list(t[4])}
                            for t in targets]).encode(), ptrs, sizes, n, int(device),
                cuda_stream, timeout, ctypes.byref(got)), errors.BusError)
        return got.value

    def _finish(self, fn, timeout):
        timeout = _lib.timeout_ms(timeout)
        version = ctypes.c_int64()
        with self.bus._in_flight():
            _lib.check(fn(self.bus._p(), _lib.encode(self.name, "name"), self.incarnation, timeout,
                          ctypes.byref(version)), errors.BusError)
        return version.value

    def flush(self, timeout=60.0):
        """Waits until the version ``publish(..., wait=False)`` has in flight is
        stored; returns its number (0 before the first). Raises why it was not
        stored, or BusError (DEADLINE_EXCEEDED) after ``timeout`` seconds."""
        return self._finish(_lib.lib().agentrt_weights_flush, timeout)

    def close(self, timeout=60.0):
        """flush(), then the bus lets go of this stream's background thread and
        of the memory readied for a next version (a later publish(wait=False)
        starts afresh). Returns what flush() returns. The bus's close() does
        this for every stream."""
        return self._finish(_lib.lib().agentrt_weights_close, timeout)

    def _get(self, mode, version, timeout):
        timeout = _lib.timeout_ms(timeout)
        out = ctypes.c_void_p()
        with self.bus._in_flight():
            _lib.check(_lib.lib().agentrt_weights_get(
                self.bus._p(), _lib.encode(self.name, "name"), mode, int(version), timeout,
                ctypes.byref(out)), errors.BusError)
        return Weights(out)

    def latest(self, timeout=10.0):
        """The newest version (BusError NOT_FOUND when there is none yet)."""
        return self._get(_LATEST, 0, timeout)

    def wait_newer(self, version, timeout=10.0):
        """The newest version after ``version``, waiting up to ``timeout`` s."""
        return self._get(_NEWER, version, timeout)

    def at(self, version, timeout=10.0):
        """Exactly ``version`` (a league's frozen snapshot)."""
        return self._get(_AT, version, timeout)

    def __repr__(self):
        return "WeightStream(%r)" % self.name
