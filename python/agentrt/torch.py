"""agentrt.torch: PyTorch state as agentrt checkpoints and bus payloads, with
no pickle anywhere (a checkpoint or a message can never run code on load).

    import agentrt.torch as art
    art.save(ck, step, model=model, optimizer=opt, bus=rt.bus, extra={"updates": n}, wait=False)
    ...
    got = art.restore(ck, model=model, optimizer=opt)     # None on a fresh start
    if got:
        step, extra = got.step, got.extra                 # RNG restored too
        sub = rt.bus.subscribe(topic, start=got.bus_offsets.get(topic, 0),
                               incarnation=got.bus_incarnation)

What is saved: the model's state_dict (parameters and buffers), the
optimizer's state_dict, the RNG states (torch CPU, every CUDA device, NumPy's
global, Python's ``random``), the bus positions and ``extra``. Tensors become
named arrays of the checkpoint (CPU tensors are read in place; CUDA tensors
are copied to the host once); everything else (hyperparameters, step counts,
ints keyed dicts, tuples) is JSON in the manifest. Restore reads the arrays
once, each chunk verified as it is read, straight into the model's own
tensors where they are contiguous CPU tensors of the saved shape and dtype
(others, e.g. on a GPU, get one copy from a host array), and rebuilds the
optimizer state on its parameters' devices; a chunk that fails its checksum
sends the restore to the next older checkpoint.

Any world size: the model's parameters and the optimizer's state are the
same on every rank of a data-parallel agent (DDP), so each rank saves only its
1/N part of each, as a slice of a global array (the ranks write in parallel);
buffers (e.g. BatchNorm's running statistics, which DDP takes from rank 0) and
``extra`` are saved whole by rank 0. A restore at another world size reads
whole arrays from whichever shards hold them. The RNG states are each rank's own: a rank
that the saving run did not have seeds torch, NumPy and ``random`` from
SHA-256 of ("agentrt-torch-rng", step, rank), so its streams are defined and
differ from every other rank's. Checkpoints written before this layout restore
at their own world size as before.

``to_bytes(tensors, meta)`` / ``from_bytes(payload)`` do the same for one
bus message of named tensors: a JSON header line and the raw arrays. A policy
for other agents goes on a weight stream instead (``publish_weights``,
``load_weights``: versions, mapped on the broker's node).
"""
import hashlib
import json
import random as _random
import warnings

import numpy as np
import torch as _torch

from . import errors


FORMAT = 1
_GLOBAL = "global"  # metadata "layout": arrays saved as slices of global arrays
_MAGIC = b"AGENTRT-TENSORS 1\n"

_TORCH_TO_NUMPY = {
    _torch.float32: "float32", _torch.float64: "float64", _torch.float16: "float16",
    _torch.int8: "int8", _torch.uint8: "uint8", _torch.int16: "int16", _torch.int32: "int32",
    _torch.int64: "int64", _torch.bool: "bool", _torch.complex64: "complex64",
    _torch.complex128: "complex128",
}
_NUMPY_TO_TORCH = {v: k for k, v in _TORCH_TO_NUMPY.items()}


def tensor_to_array(t):
    """(array, dtype label): a host NumPy array of tensor ``t`` (a view of a
    contiguous CPU tensor, else one copy) and the dtype to record."""
    t = t.detach()
    label = _label_of(t.dtype)
    if label is None:
        raise TypeError("tensors of dtype %s cannot be saved" % t.dtype)
    if t.device.type != "cpu":
        t = t.to("cpu")
    if not t.is_contiguous():
        t = t.contiguous()
    if label == "bfloat16":
        return t.view(_torch.int16).numpy(), label
    return t.numpy(), label


def _label_of(dtype):
    """The dtype label agentrt records for a torch dtype (None: it has none)."""
    return "bfloat16" if dtype == _torch.bfloat16 else _TORCH_TO_NUMPY.get(dtype)


def array_to_tensor(arr, dtype_label, copy=True):
    """The tensor of an array saved by tensor_to_array: its own copy, or with
    copy=False a read-only view of ``arr`` (to be read, e.g. by load_state_dict)."""
    if dtype_label != "bfloat16" and dtype_label not in _NUMPY_TO_TORCH:
        raise ValueError("entry of dtype %r is not a tensor" % dtype_label)
    arr = np.array(arr) if copy else np.asarray(arr)
    if dtype_label == "bfloat16":
        arr = arr.view(np.int16)
    with warnings.catch_warnings():
        # A view of a read-only buffer: torch warns that it could be written; it is not.
        warnings.simplefilter("ignore", UserWarning)
        t = _torch.from_numpy(arr)
    return t.view(_torch.bfloat16) if dtype_label == "bfloat16" else t


class _Encoder:
    """Turns nested Python/PyTorch state into JSON plus named arrays."""

    def __init__(self, prefix, arrays, dtypes):
        self.prefix = prefix
        self.arrays = arrays
        self.dtypes = dtypes

    def array(self, path, arr, label):
        name = "%s/%s" % (self.prefix, path) if path else self.prefix
        if name in self.arrays:
            raise ValueError("two values map to the checkpoint entry %r" % name)
        self.arrays[name] = arr
        self.dtypes[name] = label
        return {"__array__": name, "dtype": label, "shape": list(arr.shape)}

    def encode(self, obj, path=""):
        if isinstance(obj, _torch.Tensor):
            arr, label = tensor_to_array(obj)
            ref = self.array(path, arr, label)
            ref["device"] = str(obj.device)
            ref["tensor"] = True
            return ref
        if isinstance(obj, np.ndarray):
            arr = np.ascontiguousarray(obj)
            return self.array(path, arr, arr.dtype.name)
        if isinstance(obj, np.generic):
            return obj.item()
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, float)):
            if isinstance(obj, float) and not np.isfinite(obj):
                return {"__float__": repr(obj)}
            return obj
        if isinstance(obj, tuple):
            return {"__tuple__": [self.encode(v, "%s/%d" % (path, i)) for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, "%s/%d" % (path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise TypeError("%s: a key of type %s cannot be saved"
                                    % (path or "state", type(k).__name__))
                items.append([k, self.encode(v, "%s/%s" % (path, k) if path else str(k))])
            return {"__dict__": items}
        raise TypeError("%s: a %s cannot be saved without pickle (save tensors, arrays, numbers, "
                        "strings, lists, tuples and dicts)" % (path or "state", type(obj).__name__))


def _decode(obj, resolve, copy=True):
    """The value of an encoded tree; resolve(ref) gives an array reference's
    (array, dtype label)."""
    if isinstance(obj, list):
        return [_decode(v, resolve, copy) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__array__" in obj:
        arr, label = resolve(obj)
        if obj.get("tensor"):
            return array_to_tensor(arr, label, copy)
        return arr.copy() if copy else arr
    if "__tuple__" in obj:
        return tuple(_decode(v, resolve, copy) for v in obj["__tuple__"])
    if "__dict__" in obj:
        return {k: _decode(v, resolve, copy) for k, v in obj["__dict__"]}
    if "__float__" in obj:
        return float(obj["__float__"])
    raise ValueError("unknown value in the checkpoint's metadata: %r" % sorted(obj))


def _shard_entries(restore):
    """Resolves references to this rank's own entries (the per-rank layout)."""
    def resolve(ref):
        name = ref["__array__"]
        if name not in restore:
            raise ValueError("the checkpoint's metadata names entry %r, which it does not hold"
                             % name)
        return restore[name], restore.entries[name]["dtype"]
    return resolve


def _global_arrays(restore):
    """Resolves references to global arrays, read whole from any ranks' shards
    into new arrays (each chunk verified as it is read)."""
    def resolve(ref):
        name, label, shape = ref["__array__"], ref.get("dtype"), tuple(ref.get("shape", ()))
        if name in restore.global_arrays:
            return restore.read(name).reshape(shape), restore.global_arrays[name]["dtype"]
        if label is not None and 0 in shape:  # nothing was saved of an empty array
            return np.empty(shape, dtype=np.int16 if label == "bfloat16" else label), label
        raise ValueError("the checkpoint's metadata names global array %r, which it does not "
                         "hold" % name)
    return resolve


def _rng_name(rank):
    return "rng/rank-%d" % rank


def _derived_rng_state(step, rank):
    """Seeds every RNG for a rank the saving run did not have (see the module doc)."""
    digest = hashlib.sha256(b"agentrt-torch-rng/%d/%d" % (step, rank)).digest()
    seed = int.from_bytes(digest[:8], "little")
    _torch.manual_seed(seed)
    np.random.seed(seed % 2 ** 32)
    _random.seed(seed)


def rng_state():
    """Every RNG this process uses: torch CPU and CUDA, NumPy's global, Python's."""
    return {"torch": _torch.get_rng_state(),
            "cuda": _torch.cuda.get_rng_state_all() if _torch.cuda.is_available() else [],
            "numpy": np.random.get_state(),
            "python": _random.getstate()}


def set_rng_state(state):
    _torch.set_rng_state(state["torch"])
    if state.get("cuda") and _torch.cuda.is_available():
        cuda = state["cuda"][:_torch.cuda.device_count()]
        _torch.cuda.set_rng_state_all(cuda)
    np.random.set_state(state["numpy"])
    py = state["python"]
    _random.setstate((py[0], tuple(py[1]), py[2]))


def state_of(model=None, optimizer=None, rng=True, bus=None, extra=None):
    """(arrays, dtypes, metadata) of one save: what save() hands the checkpointer."""
    arrays, dtypes, meta = {}, {}, {"agentrt_torch": FORMAT}
    if model is not None:
        meta["model"] = _Encoder("model", arrays, dtypes).encode(dict(model.state_dict()))
    if optimizer is not None:
        meta["optimizer"] = _Encoder("optim", arrays, dtypes).encode(optimizer.state_dict())
    if rng:
        meta["rng"] = _Encoder("rng", arrays, dtypes).encode(rng_state())
    if bus is not None:
        offsets, incarnation = bus.positions()
        meta["bus"] = {"offsets": offsets, "incarnation": incarnation}
    if extra is not None:
        meta["extra"] = _Encoder("extra", arrays, dtypes).encode(extra)
    return arrays, dtypes, meta


def save(checkpointer, step, model=None, optimizer=None, rng=True, bus=None, extra=None,
         wait=True):
    """Saves model, optimizer, RNG, bus positions and ``extra`` as ``step``
    through ``checkpointer`` (an agentrt.Checkpointer): this rank's 1/N part
    of every (replicated) array, and its own RNG states. wait=False returns
    once the state is copied (CUDA tensors: after their copy to the host)."""
    info = checkpointer.info
    rank, world = info["rank"], info["world_size"]
    arrays, dtypes, meta = state_of(model, optimizer, False, bus, extra)
    meta["layout"] = _GLOBAL
    split = set()  # the same on every rank: parameters and optimizer state
    if model is not None:
        split.update("model/%s" % k for k, _ in model.named_parameters())
    parts, slices = {}, {}
    for name, arr in arrays.items():
        flat = arr.reshape(-1)
        if name in split or name.startswith("optim/"):
            lo, hi = flat.size * rank // world, flat.size * (rank + 1) // world
        else:  # rank 0's
            lo, hi = 0, flat.size if rank == 0 else 0
        parts[name] = flat[lo:hi]
        slices[name] = (arr.shape, lo)
    if rng:
        rng_arrays, rng_dtypes = {}, {}
        tree = _Encoder("rng", rng_arrays, rng_dtypes).encode(rng_state())
        blob = np.frombuffer(to_bytes(rng_arrays, {"tree": tree, "dtypes": rng_dtypes}),
                             dtype=np.uint8)
        parts[_rng_name(rank)] = blob
        slices[_rng_name(rank)] = (blob.shape, 0)
        meta["rng"] = True
    checkpointer.save(step, parts, metadata=meta, wait=wait, dtypes=dtypes, slices=slices)


def _restore_rng(r, rank):
    """This rank's saved RNG states, or derived ones for a rank the saving run lacked."""
    # Every rank reads (and so verifies) every rank's row: a bad chunk among
    # them then sends all ranks to the same older checkpoint.
    for k in range(r.world_size):
        if k != rank and _rng_name(k) in r.global_arrays:
            r.read(_rng_name(k))
    name = _rng_name(rank)
    if name not in r.global_arrays:
        _derived_rng_state(r.step, rank)
        return
    tensors, meta = from_bytes(r.read(name).tobytes())

    def resolve(ref):
        t = tensors[ref["__array__"]]
        label = meta["dtypes"][ref["__array__"]]
        arr = t.view(_torch.int16).numpy() if label == "bfloat16" else \
            t.numpy() if isinstance(t, _torch.Tensor) else t
        return arr, label
    set_rng_state(_decode(meta["tree"], resolve))


class Restored:
    """What restore() loaded: step, extra, bus_offsets, bus_incarnation, and
    the underlying agentrt.Restore (``restore``: kind, skipped, describe)."""

    def __init__(self, restore, extra, bus):
        self.restore = restore
        self.step = restore.step
        self.extra = extra
        self.bus_offsets = (bus or {}).get("offsets", {})
        self.bus_incarnation = (bus or {}).get("incarnation", 0)

    def __repr__(self):
        return "<agentrt.torch.Restored step %d>" % self.step


def _read_into(r, ref, t):
    """Reads the saved array of ``ref`` straight into tensor ``t`` when ``t``
    can hold it as it is (a contiguous CPU tensor of its shape and dtype);
    False, untouched, otherwise."""
    if not isinstance(ref, dict) or "__array__" not in ref or not ref.get("tensor"):
        return False
    a = r.global_arrays.get(ref["__array__"])  # a scalar's global shape is (1,)
    if a is None or t.device.type != "cpu" or not t.is_contiguous() or \
            tuple(ref.get("shape", ())) != tuple(t.shape) or int(np.prod(a["shape"])) != t.numel():
        return False
    label = _label_of(t.dtype)
    if label != a["dtype"]:
        return False
    data = t.detach()
    r.read(ref["__array__"], out=(data.view(_torch.int16) if label == "bfloat16" else data)
           .numpy().reshape(-1))
    return True


def _model_state(model, tree, r, resolve):
    """The state dict to load into ``model`` from a checkpoint of global arrays:
    where the model's own tensor can hold the saved array, the array is read
    straight into it and the entry is that very tensor (load_state_dict's copy
    of a tensor onto itself is no copy); the rest is decoded into new tensors."""
    own = model.state_dict(keep_vars=True)
    state = {}
    for key, ref in tree.get("__dict__", []):
        t = own.get(key)
        state[key] = t if t is not None and _read_into(r, ref, t) else \
            _decode(ref, resolve, copy=False)
    return state


def _load(r, rank, model, optimizer, rng, strict):
    """Loads restored checkpoint ``r`` into the model, optimizer and RNGs."""
    meta = r.metadata
    if meta.get("agentrt_torch") != FORMAT:
        raise ValueError("checkpoint step %d was not written by agentrt.torch (format %r)"
                         % (r.step, meta.get("agentrt_torch")))
    layout_global = meta.get("layout") == _GLOBAL
    # Global arrays are read into new memory (no copy needed); a shard's
    # entries (the per-rank layout) are views of the Restore's.
    resolve = _global_arrays(r) if layout_global else _shard_entries(r)
    if model is not None:
        if "model" not in meta:
            raise ValueError("checkpoint step %d holds no model" % r.step)
        state = _model_state(model, meta["model"], r, resolve) if layout_global else \
            _decode(meta["model"], resolve, copy=False)  # load_state_dict copies into the params
        model.load_state_dict(state, strict=strict)
    if optimizer is not None:
        if "optimizer" not in meta:
            raise ValueError("checkpoint step %d holds no optimizer" % r.step)
        optimizer.load_state_dict(_decode(meta["optimizer"], resolve, copy=not layout_global))
    if rng and layout_global:
        _restore_rng(r, rank)
    elif rng and "rng" in meta:
        set_rng_state(_decode(meta["rng"], resolve))
    extra = _decode(meta["extra"], resolve, copy=not layout_global) if "extra" in meta else None
    return Restored(r, extra, meta.get("bus"))


_DATA_LOSS = 15  # the status code of a chunk that fails its checksum


def restore(checkpointer, model=None, optimizer=None, rng=True, strict=True):
    """Loads the newest verified checkpoint into ``model`` and ``optimizer``
    (and the RNGs); returns a Restored, or None when there is nothing to
    restore (a fresh start, or every checkpoint corrupt). ``restore.last``
    holds the outcome either way: kind, step, skipped (files and reasons of the
    corrupt checkpoints passed over), describe.

    The bytes are read once, each chunk checked against its CRC32C as it is
    read: straight into the model's parameters and buffers where they are
    contiguous CPU tensors of the saved shape and dtype, else into new arrays.
    A chunk that fails its check makes the restore fall back to the next
    older checkpoint (every rank reads the same bytes, so all ranks do). If
    none is left, the model and optimizer already hold part of the corrupt
    one: that raises CheckpointError (DATA_LOSS) rather than return None,
    since they are no fresh start."""
    rank = checkpointer.info["rank"]
    r = checkpointer.restore(load=False)
    partly = None  # what a corrupt step left in the model, if it left anything
    while True:
        # The outcome without the restored bytes (those go with the Restored, or now).
        restore.last = _Outcome(r.kind, r.step, r.skipped, r.describe)
        if not r.restored:
            if partly is not None:
                raise errors.CheckpointError(_DATA_LOSS, (
                    "%s; the model and optimizer already hold part of step %d, which was corrupt, "
                    "and no older checkpoint is intact: make them anew before training from "
                    "scratch") % (r.describe, partly))
            return None
        try:
            return _load(r, rank, model, optimizer, rng, strict)
        except errors.CheckpointError as e:
            if e.code != _DATA_LOSS:
                raise
            partly = r.step
            r = checkpointer.restore(load=False, before=r.step, why=e.message, skipped=r.skipped)


class _Outcome:
    """What the last restore() found: kind, step, skipped, describe."""

    def __init__(self, kind, step, skipped, describe):
        self.kind, self.step, self.skipped, self.describe = kind, step, skipped, describe

    @property
    def restored(self):
        return self.kind == "restored"

    def __repr__(self):
        return "<agentrt.torch restore outcome: %s>" % self.describe


restore.last = None


def to_bytes(tensors, meta=None):
    """A bus payload of named tensors/arrays ({name: tensor}) and JSON ``meta``:
    a magic line, one JSON header line, then the raw arrays."""
    entries, chunks, offset = [], [], 0
    for name, value in tensors.items():
        if isinstance(value, _torch.Tensor):
            arr, label = tensor_to_array(value)
        else:
            arr = np.ascontiguousarray(value)
            label = arr.dtype.name
        raw = arr.tobytes()
        entries.append({"name": name, "dtype": label, "shape": list(arr.shape), "offset": offset,
                        "bytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    header = json.dumps({"format": FORMAT, "meta": meta or {}, "entries": entries},
                        allow_nan=False).encode()
    return b"".join([_MAGIC, header, b"\n"] + chunks)


def from_bytes(payload):
    """(tensors, meta) of a to_bytes payload. ValueError says what is wrong
    with a payload that is not one (never executes anything from it)."""
    payload = bytes(payload)
    if not payload.startswith(_MAGIC):
        raise ValueError("not an agentrt tensor payload (bad magic)")
    end = payload.find(b"\n", len(_MAGIC))
    if end < 0:
        raise ValueError("tensor payload: no header line")
    try:
        header = json.loads(payload[len(_MAGIC):end])
    except ValueError as e:
        raise ValueError("tensor payload: header is not JSON: %s" % e) from None
    body = memoryview(payload)[end + 1:]
    tensors = {}
    for e in header.get("entries", []):
        label, shape = e["dtype"], tuple(e["shape"])
        lo, n = int(e["offset"]), int(e["bytes"])
        if lo < 0 or n < 0 or lo + n > len(body):
            raise ValueError("tensor payload: entry %r lies outside the payload" % e["name"])
        np_dtype = np.int16 if label == "bfloat16" else np.dtype(label)
        count = int(np.prod(shape)) if shape else 1
        if count * np.dtype(np_dtype).itemsize != n:
            raise ValueError("tensor payload: entry %r has %d bytes for shape %s of %s"
                             % (e["name"], n, shape, label))
        arr = np.frombuffer(body[lo:lo + n], dtype=np_dtype).reshape(shape)
        tensors[e["name"]] = array_to_tensor(arr, label) if label in _NUMPY_TO_TORCH or \
            label == "bfloat16" else arr.copy()
    return tensors, header.get("meta", {})


def publish_weights(stream, model, step, wait=True):
    """Publishes ``model``'s state_dict (parameters and buffers) as a new version
    of ``stream`` (an agentrt.WeightStream); returns its number. CPU tensors are
    read in place (on the broker's node straight into the broker's file). A
    model on one CUDA device publishes through WeightStream.publish_device: its
    readers on this node copy it GPU to GPU (load_weights_from), the others
    read the host copy. Where that path is UNAVAILABLE (agentrt built without
    its GPU library, no driver) the version goes through the host as a CPU
    model's does. ``wait=False``: returns None once the tensors are copied
    (GPU tensors: to the host), the version stored in the background
    (WeightStream.publish, ``stream.flush()``)."""
    state = model.state_dict()
    on_gpu = _one_cuda_device(state)
    if on_gpu is not None and wait:
        # GPU to GPU for this node's readers (CUDA IPC), the host for others.
        version = _unless_unavailable(lambda: stream.publish_device(
            _device_tensors(state), step, on_gpu, _current_cuda_stream(on_gpu)))
        if version is not None:
            return version
    arrays, dtypes = {}, {}
    for name, t in state.items():
        arrays[name], dtypes[name] = tensor_to_array(t)
    return stream.publish(arrays, step, dtypes=dtypes, wait=wait)


def _one_cuda_device(state):
    """The CUDA device every tensor of ``state`` lies on, contiguous, when they
    all do (None otherwise: the host path)."""
    devices = {t.device for t in state.values()}
    if len(devices) != 1 or not state:
        return None
    device = next(iter(devices))
    if device.type != "cuda" or not all(t.is_contiguous() for t in state.values()):
        return None
    return device.index if device.index is not None else _torch.cuda.current_device()


def _device_tensors(state):
    """``state``'s tensors as WeightStream.publish_device takes them: (name,
    dtype label, shape, device pointer, bytes)."""
    return [(name, _dtype_label(t), tuple(t.shape), t.data_ptr(), t.numel() * t.element_size())
            for name, t in state.items()]


def _dtype_label(t):
    label = _label_of(t.dtype)
    if label is None:
        raise TypeError("weights: tensors of %s have no dtype label here" % t.dtype)
    return label


def _unless_unavailable(call):
    """``call()``'s result, or None where the GPU path answers UNAVAILABLE (agentrt
    without its GPU library, no driver): the caller then goes through the host."""
    try:
        return call()
    except errors.BusError as e:
        if e.code_name != "UNAVAILABLE":
            raise
        return None


def _current_cuda_stream(device):
    """The current stream of CUDA device ``device`` as a cudaStream_t (an int)."""
    return _torch.cuda.current_stream(device).cuda_stream


def load_weights_from(stream, model, version=0, timeout=10.0):
    """Loads ``version`` (0: the newest) of ``stream`` into ``model`` and
    returns the version read. A model on one CUDA device gets it GPU to GPU
    through CUDA IPC when the publisher is on this node (else through pinned
    host memory), straight into its tensors; any other model (or where that
    path is UNAVAILABLE: no driver, no GPU library) as load_weights does,
    from the host version."""
    state = model.state_dict()
    on_gpu = _one_cuda_device(state)
    if on_gpu is not None:
        with _torch.no_grad():
            got = _unless_unavailable(lambda: stream.read_device(
                [(name, t.data_ptr(), t.numel() * t.element_size(), _dtype_label(t),
                  tuple(t.shape)) for name, t in state.items()],
                on_gpu, version, _current_cuda_stream(on_gpu), timeout))
        if got is not None:
            return got
    weights = stream.at(version, timeout) if version else stream.latest(timeout)
    load_weights(model, weights)
    return weights.version


def weights_tensors(weights):
    """{name: tensor} of a version (agentrt.Weights): views of its bytes (on
    the broker's node, of the broker's read-only mapping; no copy). PyTorch has
    no read-only tensors: never write to them (a write to the mapping faults);
    copy first, or use load_weights."""
    return {name: array_to_tensor(arr, weights.tensors[name]["dtype"], copy=False)
            for name, arr in weights.arrays.items()}


def load_weights(model, weights, strict=True):
    """Copies a version into ``model``'s own tensors, one copy per tensor from
    the version's bytes (no intermediate buffer; a GPU tensor is filled from
    the mapping directly). ``strict``: the names must match the model's
    state_dict exactly (KeyError names the difference)."""
    views = weights_tensors(weights)
    state = model.state_dict()
    if strict and set(views) != set(state):
        missing, unexpected = sorted(set(state) - set(views)), sorted(set(views) - set(state))
        raise KeyError("weights version %d of %r does not fit the model: missing %s, unexpected %s"
                       % (weights.version, weights.stream, missing, unexpected))
    with _torch.no_grad():
        for name, src in views.items():
            if name not in state:
                continue
            dst = state[name]
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError("weights version %d of %r: %s has shape %s, the model's %s"
                                 % (weights.version, weights.stream, name, tuple(src.shape),
                                    tuple(dst.shape)))
            dst.copy_(src)
    return model
