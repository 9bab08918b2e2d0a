#!/usr/bin/python3
"""agentrt.WeightStream through a real agentrt-bus with a plan's ACL.

torch:  a learner publishes a PyTorch policy (versions of ~24 MiB, so through the broker's spool);
        two actor processes each load the newest into their own model with
        agentrt.torch.load_weights (views of the broker's file, one copy per tensor) and find the
        learner's parameters; one waits for the next version with wait_newer; an agent outside
        the channel is refused by every path; a channel's keep_last bounds the files.
faults: kill -9 of a publisher half-way through writing leaves no visible version (its spool
        file goes with the broker); a subscriber killed while it maps a version releases the
        mapping, and once retention removed that version no process maps its bytes; nothing is
        left in the spool or beyond keep_last after the run.
device: the C API's GPU calls over the fake device (a stand-in for libagentrt_cuda.so): a delta
        stream's GPU versions go through the stream it keeps (even where an earlier read left a
        device stream over a plain one), so their host copies are deltas too; a reader of the
        node copies a version device to device.
Skips (77) where /usr/bin/python3 cannot import torch (scenario torch)."""
import ctypes
import glob
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import StandaloneBus, check, die_with_parent, scenarios_main, test_plan, wait_for  # noqa: E402

import agentrt  # noqa: E402  (PYTHONPATH: <build>/python, set by CTest)

AGENTS = ["learner", "actor-0", "actor-1", "outsider"]
KEEP_LAST = 2


def plan():
    p = test_plan("weights", AGENTS, channels=[("weights/learner", ["learner"], ["actor-0", "actor-1"]),
                                               ("weights/odd", ["learner"], ["actor-0"])])
    p["channels"][0]["keep_last"] = KEEP_LAST
    return p


def start_bus(work):
    log_dir = os.path.join(work, "buslog")
    return StandaloneBus(work, plan=plan(), flags=["--log-dir", log_dir, "--durability", "batch",
                                                   "--max-message-bytes", str(1 << 30)]), log_dir


def connect(bus, agent):
    b = agentrt.Bus.connect(bus.address, agent, bus.token(agent))
    b.wait_ready(10)
    return b


def child(code, bus, agent, **env):
    e = dict(os.environ, BUS=bus.address, AGENT=agent, TOKEN=bus.token(agent), **env)
    return subprocess.Popen([sys.executable, "-c", code], env=e, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=die_with_parent)


ACTOR = r"""
import os, sys, torch, agentrt, agentrt.torch as art
torch.manual_seed(0)
bus = agentrt.Bus.connect(os.environ["BUS"], os.environ["AGENT"], os.environ["TOKEN"])
stream = agentrt.WeightStream(bus, "learner")
model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024))
w = stream.latest(timeout=20)
art.load_weights(model, w)
total = sum(float(p.double().sum()) for p in model.parameters())
print("version %d step %d mapped %s sum %.6f" % (w.version, w.step, w.mapped, total), flush=True)
if os.environ.get("WAIT") == "1":
    print("waiting", flush=True)
    nxt = stream.wait_newer(w.version, timeout=60)
    art.load_weights(model, nxt)
    total = sum(float(p.double().sum()) for p in model.parameters())
    print("version %d step %d mapped %s sum %.6f" % (nxt.version, nxt.step, nxt.mapped, total), flush=True)
"""


def scenario_torch(work):
    try:
        import torch
        import agentrt.torch as art
    except ImportError:
        print("skipped: /usr/bin/python3 cannot import torch (apt-get install python3-torch)")
        return 77
    bus, log_dir = start_bus(work)
    with bus:
        learner = connect(bus, "learner")
        out = agentrt.WeightStream(learner, "learner")
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024))

        def total():
            return sum(float(p.double().sum()) for p in model.parameters())

        v1 = art.publish_weights(out, model, step=100)
        check(v1 == 1, "the first version is 1 (%d)" % v1)
        sums = {1: total()}
        check(not glob.glob(os.path.join(log_dir, "incoming", "*.part")),
              "the spool holds no file once the version is stored")
        actors = [child(ACTOR, bus, "actor-0", WAIT="1"), child(ACTOR, bus, "actor-1")]
        first = [a.stdout.readline().split() for a in actors]
        for name, words in zip(("actor-0", "actor-1"), first):
            check(words[:6] == ["version", "1", "step", "100", "mapped", "True"],
                  "%s loaded version 1 (step 100) mapped from the broker's file: %s" % (name, words))
            check(abs(float(words[7]) - sums[1]) < 1e-6 * max(1.0, abs(sums[1])),
                  "%s's model holds the learner's parameters (sum %s vs %.6f)" % (name, words[7], sums[1]))
        check(actors[0].stdout.readline().strip() == "waiting", "actor-0 waits for a newer version")
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
        sums[2] = total()
        v2 = art.publish_weights(out, model, step=200)
        check(v2 == 2, "the second version is 2")
        # load_weights_from: a CPU model reads the newest version (the host path).
        reader = connect(bus, "actor-1")
        torch.manual_seed(5)
        other = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024))
        got = art.load_weights_from(agentrt.WeightStream(reader, "learner"), other)
        check(got == 2 and all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                                  other.state_dict().values())),
              "load_weights_from loaded version 2 into a CPU model (version %d)" % got)
        # GPU tensors without a GPU: refused at once, saying why (nothing published).
        for call in (lambda: out.publish_device([("w", "float32", (2,), 4096, 8)], 300, 0),
                     lambda: agentrt.WeightStream(reader, "learner").read_device([("w", 4096, 8)], 0)):
            if nvidia_driver():
                print("skip: the calls without a driver (this machine has one)")
                break
            try:
                call()
                raise AssertionError("a GPU weights call succeeded without a GPU")
            except agentrt.BusError as e:
                check(e.code_name == "UNAVAILABLE" and "NVIDIA driver" in str(e),
                      "a GPU weights call without a driver is UNAVAILABLE and says why: %s" % e)
        reader.close()
        words = actors[0].stdout.readline().split()
        check(words[:4] == ["version", "2", "step", "200"] and
              abs(float(words[7]) - sums[2]) < 1e-6 * max(1.0, abs(sums[2])),
              "wait_newer brought version 2 and actor-0 loaded it: %s" % words)
        for a in actors:
            check(a.wait(60) == 0, "the actor process succeeded: %s" % a.stdout.read())

        # The views: read-only tensors of the version's bytes.
        got = agentrt.WeightStream(connect(bus, "actor-1"), "learner").at(1)
        views = art.weights_tensors(got)
        check(set(views) == set(model.state_dict()), "weights_tensors names every state_dict entry")
        check(not got.arrays["0.weight"].flags.writeable, "the NumPy views are read-only")
        v1_sum = sum(float(views[k].double().sum()) for k in ("0.weight", "0.bias", "2.weight", "2.bias"))
        check(abs(v1_sum - sums[1]) < 1e-6 * max(1.0, abs(sums[1])),
              "the tensor views hold version 1 (sum %.6f)" % v1_sum)

        # Outside the channel: no version by any path.
        outsider = connect(bus, "outsider")
        for what, call in (("latest", lambda: agentrt.WeightStream(outsider, "learner").at(2)),
                           ("publish", lambda: art.publish_weights(agentrt.WeightStream(outsider, "learner"), model, 1)),
                           ("publish without waiting",
                            lambda: art.publish_weights(agentrt.WeightStream(outsider, "learner"), model, 1,
                                                        wait=False))):
            try:
                call()
                check(False, "outsider's %s was refused" % what)
            except agentrt.BusError as e:
                check(e.code_name == "PERMISSION_DENIED", "outsider's %s: PERMISSION_DENIED (%s)" % (what, e))
        for step in (300, 400):
            art.publish_weights(out, model, step=step)
        try:
            agentrt.WeightStream(connect(bus, "actor-0"), "learner").at(2)
            check(False, "version 2 is gone after keep_last 2")
        except agentrt.BusError as e:
            check(e.code_name == "NOT_FOUND" and "no longer kept" in str(e),
                  "a version keep_last dropped is NOT_FOUND, said so: %s" % e)
        blobs = glob.glob(os.path.join(log_dir, "logs", "**", "*.blob"), recursive=True)
        check(len(blobs) == KEEP_LAST, "keep_last 2 leaves 2 payload files (%d)" % len(blobs))

        # wait=False: back once the tensors are copied, and the loop trains on at once.
        check(out.flush(10) == 0, "flush before any publish without waiting says 0")
        reader = agentrt.WeightStream(connect(bus, "actor-0"), "learner")
        for step, version in ((500, 5), (600, 6)):
            sums[version] = total()
            check(art.publish_weights(out, model, step=step, wait=False) is None,
                  "publish_weights(wait=False) returns before the version has a number")
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(2.0)
            check(out.flush(60) == version, "flush says the version stored: %d" % version)
            got = reader.at(version)
            stored = sum(float(t.double().sum()) for t in art.weights_tensors(got).values())
            check(got.step == step and got.mapped and
                  abs(stored - sums[version]) < 1e-6 * max(1.0, abs(sums[version])),
                  "version %d holds the parameters at the call, not those trained after (%.6f vs %.6f)"
                  % (version, stored, sums[version]))
            check(len(glob.glob(os.path.join(log_dir, "incoming", "*.part"))) == 1,
                  "the next version's slot waits in the spool, made ready in the background")
        check(out.close(10) == 6, "closing the stream says its last version")
        check(not glob.glob(os.path.join(log_dir, "incoming", "*.part")),
              "closing the stream removes the slot made ready for a next version")
        check(art.publish_weights(out, model, step=700, wait=False) is None and out.flush(60) == 7,
              "a closed stream publishes afresh")
        learner.close()
        check(not glob.glob(os.path.join(log_dir, "incoming", "*.part")),
              "closing the bus removes the slot made ready for a next version")

        # Delta versions, to an actor that reads every byte over the socket.
        learner = connect(bus, "learner")
        out = agentrt.WeightStream(learner, "learner", delta=True)
        os.environ["AGENTRT_BUS_LOCAL_FILES"] = "0"
        try:
            far = agentrt.WeightStream(connect(bus, "actor-1"), "learner", delta=True)
        finally:
            del os.environ["AGENTRT_BUS_LOCAL_FILES"]
        base = art.publish_weights(out, model, step=800)
        whole = far.at(base)
        with torch.no_grad():
            model[0].weight[0, :10] += 1.0  # a few values change
        sums[base + 1] = total()
        nxt = art.publish_weights(out, model, step=900)
        got = far.wait_newer(base, timeout=20)
        stored = sum(float(t.double().sum()) for t in art.weights_tensors(got).values())
        sent, read = out.stats(), far.stats()
        check(got.version == nxt and not got.mapped and
              abs(stored - sums[nxt]) < 1e-6 * max(1.0, abs(sums[nxt])),
              "version %d rebuilt from its delta holds the model (%.6f vs %.6f)" % (nxt, stored, sums[nxt]))
        check(sent["deltas_published"] == 1 and read["versions_from_delta"] == 1 and
              read["delta_bytes_read"] == sent["delta_bytes_published"] and
              read["delta_bytes_read"] * 100 < whole.size,
              "the delta's bytes, not the version's, reached the reader: %s / %s (whole: %d)"
              % (sent, read, whole.size))
        del whole, got

        # A 0-d buffer (BatchNorm's num_batches_tracked, a normaliser's count) keeps its shape.
        norm = torch.nn.BatchNorm1d(4)
        norm(torch.randn(8, 4))
        v = art.publish_weights(agentrt.WeightStream(learner, "odd"), norm, step=1)
        back = torch.nn.BatchNorm1d(4)
        got = agentrt.WeightStream(connect(bus, "actor-0"), "odd").at(v)
        check(got.arrays["num_batches_tracked"].shape == (), "a 0-d tensor reads back 0-d: %s"
              % (got.arrays["num_batches_tracked"].shape,))
        art.load_weights(back, got)
        check(int(back.num_batches_tracked) == 1 and torch.equal(back.running_mean, norm.running_mean),
              "and loads into a model's scalar buffer")

        # A model on one GPU where the GPU path is UNAVAILABLE (here: no driver) goes
        # through the host. No GPU here to hold one: the model is taken for one on device 0.
        if nvidia_driver():
            print("skip: the host fallback without a driver (this machine has one)")
        else:
            on_device, current = art._one_cuda_device, art._current_cuda_stream
            art._one_cuda_device, art._current_cuda_stream = (lambda state: 0), (lambda device: None)
            try:
                norm(torch.randn(8, 4))
                v = art.publish_weights(agentrt.WeightStream(learner, "odd"), norm, step=2)
                back = torch.nn.BatchNorm1d(4)
                got = art.load_weights_from(agentrt.WeightStream(connect(bus, "actor-0"), "odd"), back)
            finally:
                art._one_cuda_device, art._current_cuda_stream = on_device, current
            check(v == 2 and got == 2 and int(back.num_batches_tracked) == 2 and
                  torch.equal(back.running_mean, norm.running_mean),
                  "publish_weights and load_weights_from fall back to the host path (version %d)" % got)
    check(not os.path.exists(os.path.join(log_dir, "incoming")), "the spool is gone with the broker")


PUBLISHER = r"""
import os, numpy as np, agentrt
bus = agentrt.Bus.connect(os.environ["BUS"], os.environ["AGENT"], os.environ["TOKEN"])
w = np.ones(int(os.environ["FLOATS"]), dtype=np.float32)
print("publishing", flush=True)
agentrt.WeightStream(bus, "learner").publish({"w": w}, step=int(os.environ["STEP"]))
print("published", flush=True)
"""

ASYNC_PUBLISHER = r"""
import os, sys, numpy as np, agentrt
bus = agentrt.Bus.connect(os.environ["BUS"], os.environ["AGENT"], os.environ["TOKEN"])
out = agentrt.WeightStream(bus, "learner")
n = int(os.environ["FLOATS"])
out.publish({"w": np.full(n, 4.0, dtype=np.float32)}, step=4, wait=False)
print("stored", out.flush(60), flush=True)
sys.stdin.readline()
out.publish({"w": np.full(n, 5.0, dtype=np.float32)}, step=5, wait=False)
print("queued", flush=True)
sys.stdin.read()
"""

HOLDER = r"""
import os, sys, agentrt
bus = agentrt.Bus.connect(os.environ["BUS"], os.environ["AGENT"], os.environ["TOKEN"])
w = agentrt.WeightStream(bus, "learner").at(int(os.environ["VERSION"]))
a = w.arrays["w"]
print("holding %s %d" % (w.path, int(a[:1024].sum())), flush=True)
sys.stdin.read()
"""


def nvidia_driver():
    """Whether the NVIDIA driver's library loads here (as agentrt's GPU path loads it)."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def mapped_by_anyone(path):
    """The pids whose memory maps `path` (deleted or not)."""
    pids = []
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                if path in f.read():
                    pids.append(int(maps.split("/")[2]))
        except OSError:
            pass
    return pids


def scenario_faults(work):
    bus, log_dir = start_bus(work)
    spool = os.path.join(log_dir, "incoming")
    with bus:
        learner = connect(bus, "learner")
        out = agentrt.WeightStream(learner, "learner")
        import numpy as np
        v1 = out.publish({"w": np.full(4 << 20, 1.0, dtype=np.float32)}, step=1)
        check(v1 == 1, "version 1 stored")
        # A dtype NumPy has no name for keeps its label and shape (its bytes as they are).
        pairs = np.zeros((3, 2), dtype=[("a", "<i4"), ("b", "<f4")])
        side = agentrt.WeightStream(learner, "odd")
        side.publish({"p": pairs}, step=1)
        odd = agentrt.WeightStream(connect(bus, "actor-0"), "odd").latest()
        check(odd.tensors["p"]["shape"] == [3, 2] and odd.tensors["p"]["bytes"] == 48,
              "a structured array keeps its shape: %s" % odd.tensors["p"])
        del odd

        # kill -9 of a publisher while it writes 800 MiB into the spool.
        pub = child(PUBLISHER, bus, "learner", FLOATS=str(200 << 20), STEP="2")
        check(pub.stdout.readline().strip() == "publishing", "the publisher started")
        wait_for("the publisher's spool file", lambda: glob.glob(os.path.join(spool, "learner.*.part")), 30)
        os.kill(pub.pid, signal.SIGKILL)
        pub.wait(10)
        parts = glob.glob(os.path.join(spool, "learner.*.part"))
        check(len(parts) == 1 and os.path.getsize(parts[0]) < (200 << 22),
              "it was killed half-way: %s" % [(p, os.path.getsize(p)) for p in parts])
        reader = agentrt.WeightStream(connect(bus, "actor-0"), "learner")
        latest = reader.latest()
        check(latest.version == 1, "no version appeared from the killed publisher (newest: %d)" % latest.version)
        check(os.path.exists(parts[0]),
              "its unfinished file stays in the spool (removed when the broker stops), never adopted")
        del latest

        # A subscriber killed while it maps version 1 releases the mapping.
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent,
                                  env=dict(os.environ, BUS=bus.address, AGENT="actor-1",
                                           TOKEN=bus.token("actor-1"), VERSION="1"))
        words = holder.stdout.readline().split()
        check(words[:1] == ["holding"] and words[2] == "1024", "the holder maps version 1: %s" % words)
        path = words[1]
        check(holder.pid in mapped_by_anyone(path), "the holder's memory maps %s" % path)
        for step in (3, 4):  # keep_last 2: version 1 goes
            out.publish({"w": np.full(4 << 20, float(step), dtype=np.float32)}, step=step)
        check(not os.path.exists(path), "retention removed version 1's file name")
        check(holder.pid in mapped_by_anyone(path), "the holder still reads version 1's bytes")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        wait_for("no process to map version 1", lambda: not mapped_by_anyone(path), 10)
        try:
            reader.at(1)
            check(False, "version 1 is no longer readable")
        except agentrt.BusError as e:
            check(e.code_name == "NOT_FOUND", "version 1 is NOT_FOUND: %s" % e)
        check(reader.latest().version == 3, "the newest version is 3 (versions 1, 2, 3: the killed one took no number)")

        # kill -9 of a publisher using wait=False: once while it holds the
        # slot readied for its next version, once with a version in flight.
        # Whole or nothing: a version that appears holds every byte.
        before = set(glob.glob(os.path.join(spool, "learner.*.part")))
        pub = child(ASYNC_PUBLISHER, bus, "learner", FLOATS=str(4 << 20))
        check(pub.stdout.readline().split() == ["stored", "4"], "the async publisher stored version 4")
        slots = set(glob.glob(os.path.join(spool, "learner.*.part"))) - before
        check(len(slots) == 1, "its next version's slot waits in the spool: %s" % slots)
        pub.stdin.write("go\n")
        pub.stdin.flush()
        check(pub.stdout.readline().strip() == "queued", "version 5 is in flight")
        os.kill(pub.pid, signal.SIGKILL)
        pub.wait(10)
        newest = reader.latest()
        check(newest.version in (4, 5), "the newest version is 4 or 5 (%d)" % newest.version)
        values = newest.arrays["w"]
        check(float(values.min()) == float(values.max()) == float(newest.step),
              "version %d is whole: every value is its step's (%s..%s)"
              % (newest.version, values.min(), values.max()))
        del values, newest
    check(not os.path.exists(spool), "the spool (with the killed publisher's file) is gone with the broker")
    blobs = glob.glob(os.path.join(log_dir, "logs", "**", "*.blob"), recursive=True)
    check(len(blobs) == KEEP_LAST, "keep_last payload files remain in the durable log (%d)" % len(blobs))


# A process whose C API runs over the fake device (scenario_device's folder):
# "device memory" from agentrt_fake_device_malloc is host memory it fills and reads.
FAKE_DEVICE = r"""
import ctypes, json, os, sys, numpy as np, agentrt
fake = ctypes.CDLL(os.path.join(os.path.dirname(os.environ["AGENTRT_C_LIBRARY"]), "libagentrt_cuda.so"))
fake.agentrt_fake_device_malloc.restype = ctypes.c_void_p
fake.agentrt_fake_device_malloc.argtypes = [ctypes.c_size_t]
bus = agentrt.Bus.connect(os.environ["BUS"], os.environ["AGENT"], os.environ["TOKEN"])
n = int(os.environ["FLOATS"])
memory = fake.agentrt_fake_device_malloc(4 * n)
values = np.ctypeslib.as_array((ctypes.c_float * n).from_address(memory))
if os.environ["AGENT"] == "learner":
    # A read first (refused: nothing published yet) leaves the bus handle a device
    # stream over a plain stream; the delta stream opened next must replace it.
    try:
        agentrt.WeightStream(bus, "learner").read_device([("w", memory, 4 * n)], device=0, timeout=0.1)
    except agentrt.BusError as e:
        print("a read before any version: %s" % e.code_name, flush=True)
    out = agentrt.WeightStream(bus, "learner", delta=True)
    values[:] = (np.arange(n) % 1000).astype(np.float32) / 7
    for step in (1, 2):
        if step == 2:
            values[::100] += 1  # 1% of the values
        v = out.publish_device([("w", "float32", (n,), memory, 4 * n)], step, device=0)
        print(json.dumps({"version": v, "sum": float(values.astype(np.float64).sum())}), flush=True)
    print(json.dumps(out.stats()), flush=True)
    sys.stdin.read()  # its device memory stays until the readers are done
else:
    got = agentrt.WeightStream(bus, "learner").read_device(
        [("w", memory, 4 * n, "float32", (n,))], device=0, version=int(os.environ["VERSION"]),
        timeout=20)
    counts = {}
    for name in ("ipc_opens", "ipc_open_now", "copies_d2d", "copies_h2d"):
        fn = getattr(fake, "agentrt_fake_device_" + name)
        fn.restype = ctypes.c_int64
        counts[name] = fn()
    print(json.dumps(dict(counts, version=got, sum=float(values.astype(np.float64).sum()))), flush=True)
"""


def scenario_device(work):
    """The C API's GPU calls (agentrt_weights_publish_device, _read_device) over the
    fake device: libagentrt_c.so copied into a folder beside the stand-in for
    libagentrt_cuda.so and an empty libcuda.so.1 (FAKE_CUDA_DIR, built with the
    tests). A stream opened with delta=True publishes its GPU versions' host copies
    through the stream agentrt_weights_open keeps: the second is a delta, which a
    reader on another node reads; a reader of the node copies the version device to
    device."""
    import shutil
    fake_dir = os.environ.get("FAKE_CUDA_DIR", "")
    for name in ("libagentrt_cuda.so", "libcuda.so.1"):
        check(os.path.exists(os.path.join(fake_dir, name)),
              "FAKE_CUDA_DIR (%r) holds the test build's %s" % (fake_dir, name))
    gpu = os.path.join(work, "fake-gpu")
    os.mkdir(gpu)
    # A file of its own, not a symbolic link: agentrt looks for libagentrt_cuda.so
    # beside the library's real path (a link would lead back to the real one).
    library = os.path.join(gpu, "libagentrt_c.so")
    try:
        os.link(os.path.realpath(agentrt.library_path()), library)
    except OSError:  # another file system
        shutil.copy(agentrt.library_path(), library)
    for name in ("libagentrt_cuda.so", "libcuda.so.1"):
        os.symlink(os.path.join(fake_dir, name), os.path.join(gpu, name))
    floats = 2 << 20  # 8 MiB: larger than a message carries inline, so its delta is read
    fake = dict(AGENTRT_C_LIBRARY=library, FLOATS=str(floats),
                LD_LIBRARY_PATH=os.pathsep.join(p for p in (gpu, os.environ.get("LD_LIBRARY_PATH")) if p))
    bus, _ = start_bus(work)
    children = []
    # Every wait below ends: the children are killed after two minutes.
    watchdog = threading.Timer(120, lambda: [c.kill() for c in children])
    watchdog.start()
    with bus:
        try:
            _device_run(bus, fake, floats, children)
        finally:
            watchdog.cancel()
            for c in children:
                c.kill()
                c.wait()


def _device_run(bus, fake, floats, children):
    import json
    import numpy as np
    pub = child(FAKE_DEVICE, bus, "learner", **fake)
    children.append(pub)
    printed = []

    def line():  # the publisher's next JSON line (its other lines kept for the failure)
        while True:
            text = pub.stdout.readline()
            if not text:
                check(False, "the fake GPU publisher ended early: %r" % "".join(printed))
            if text.startswith("{"):
                return json.loads(text)
            printed.append(text)

    published = [line(), line()]
    sent = line()
    check(len(printed) == 1 and printed[0].startswith("a read before any version: "),
          "the publisher's read before any version was refused: %r" % printed)
    check([p["version"] for p in published] == [1, 2], "the fake GPU published versions 1 and 2: %s"
          % published)
    check(sent["deltas_published"] == 1 and sent["delta_bytes_published"] * 20 < 4 * floats,
          "the kept delta stream sent version 2's host copy as a delta under 1/20 of it: %s" % sent)
    # Another node's reader: every byte over the socket, version 2 from its delta.
    os.environ["AGENTRT_BUS_LOCAL_FILES"] = "0"
    try:
        far = agentrt.WeightStream(connect(bus, "actor-1"), "learner", delta=True)
    finally:
        del os.environ["AGENTRT_BUS_LOCAL_FILES"]
    for p in published:
        got = far.at(p["version"])
        total = float(got.arrays["w"].astype(np.float64).sum())
        check(abs(total - p["sum"]) < 1e-9 * p["sum"],
              "a host reader on another node reads version %d (sum %.6f vs %.6f)"
              % (p["version"], total, p["sum"]))
        del got
    read = far.stats()
    check(read["versions_from_delta"] == 1 and read["delta_mismatches"] == 0 and
          read["versions_from_node_cache"] == 0 and
          read["delta_bytes_read"] == sent["delta_bytes_published"],
          "version 2 was rebuilt from its delta: %s" % read)
    # A reader of the node: into its own fake device memory.
    reader = child(FAKE_DEVICE, bus, "actor-0", VERSION="2", **fake)
    children.append(reader)
    out, _ = reader.communicate(timeout=60)
    check(reader.returncode == 0, "the device reader succeeded: %s" % out)
    got = json.loads(out.splitlines()[-1])
    check(got["version"] == 2 and abs(got["sum"] - published[1]["sum"]) < 1e-9 * got["sum"],
          "the device reader holds version 2 in its device memory: %s" % got)
    check(got["ipc_opens"] == 1 and got["ipc_open_now"] == 0 and got["copies_d2d"] == 1 and
          got["copies_h2d"] == 0,
          "it copied device to device through the publisher's IPC handle (nothing from the host), "
          "and closed it: %s" % got)
    pub.stdin.close()
    check(pub.wait(30) == 0, "the fake GPU publisher ended cleanly: %s" % pub.stdout.read())


def main():
    return scenarios_main(globals(), "weights")


if __name__ == "__main__":
    sys.exit(main())
