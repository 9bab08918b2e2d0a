#!/usr/bin/python3
"""A 256 MiB policy snapshot to 4 subscribers through a real agentrt-bus, while small messages flow
on another topic: every subscriber receives it whole, the small messages keep arriving in order
meanwhile, and the broker's memory stays bounded (its peak RSS, VmHWM, grows by far less than the
snapshot: the payload sits once in a file, and each stream holds one chunk of it). Scenario
`streamed`: the broker sends the chunks (the default); `local`: the subscribers, on the broker's
node, read the file themselves (AGENTRT_BUS_LOCAL_FILES=1)."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import StandaloneBus, check, scenarios_main  # noqa: E402

import agentrt  # noqa: E402  (PYTHONPATH: <build>/python, set by CTest)

SNAPSHOT = 256 << 20
SUBSCRIBERS = 4
# What the broker may add to its peak RSS for the whole transfer: the
# snapshot itself is 256 MiB (and 1 GiB as one copy per subscriber).
RSS_BOUND = 96 << 20


def rss(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


def scenario_streamed(work):
    os.environ.pop("AGENTRT_BUS_LOCAL_FILES", None)
    return fanout(work)


def scenario_local(work):
    os.environ["AGENTRT_BUS_LOCAL_FILES"] = "1"
    return fanout(work)


def fanout(work):
    log_dir = os.path.join(work, "buslog")
    flags = ["--max-message-bytes", str(SNAPSHOT), "--log-dir", log_dir, "--durability", "batch"]
    with StandaloneBus(work, flags=flags) as bus:
        pub = agentrt.Bus.connect(bus.address, "learner", bus.token("learner"))
        pub.wait_ready(10)
        chatter_in = agentrt.Bus.connect(bus.address, "listener", bus.token("listener"))
        subs = [agentrt.Bus.connect(bus.address, "actor-%d" % i, bus.token("actor-%d" % i))
                for i in range(SUBSCRIBERS)]
        # Warm up every path (small messages both ways, streams open) before the baseline.
        streams = [s.subscribe("policies/learner", start="earliest") for s in subs]
        chatter = chatter_in.subscribe("chatter", start="earliest", capacity=1 << 16)
        for i in range(2000):
            pub.publish("chatter", b"%d" % i)
        warm = [chatter.next(10) for _ in range(2000)]
        check(all(m is not None for m in warm), "the small messages of the warm-up arrived")
        baseline = rss(bus.proc.pid, "VmHWM")

        stop = threading.Event()
        sent = [2000]
        small_errors = []

        def small_publisher():
            while not stop.is_set():
                try:
                    pub.publish("chatter", b"%d" % sent[0])
                except agentrt.BusError as e:
                    small_errors.append(str(e))
                    return
                sent[0] += 1
                time.sleep(0.001)

        peak_rss = [0]

        def sampler():
            while not stop.is_set():
                peak_rss[0] = max(peak_rss[0], rss(bus.proc.pid, "VmRSS"))
                time.sleep(0.01)

        threads = [threading.Thread(target=small_publisher), threading.Thread(target=sampler)]
        for t in threads:
            t.start()
        snapshot = os.urandom(1 << 20) * (SNAPSHOT >> 20)
        started = time.monotonic()
        offset = pub.publish("policies/learner", snapshot, content_type="application/x-torch")
        published = time.monotonic()
        received = [None] * SUBSCRIBERS
        during = [0]

        def receive(i):
            m = streams[i].next(120)
            received[i] = m

        readers = [threading.Thread(target=receive, args=(i,)) for i in range(SUBSCRIBERS)]
        for t in readers:
            t.start()
        # The small topic keeps moving while the snapshot is in flight.
        small_offsets = []
        while any(t.is_alive() for t in readers):
            m = chatter.next(0.2)
            if m is not None:
                small_offsets.append(m.offset)
        for t in readers:
            t.join(120)
        delivered = time.monotonic()
        stop.set()
        for t in threads:
            t.join(30)
        during[0] = len(small_offsets)
        check(not small_errors, "small publishes went on (%s)" % small_errors[:1])
        for i, m in enumerate(received):
            check(m is not None, "actor-%d received the snapshot" % i)
            check(m.offset == offset and len(m.payload) == SNAPSHOT and m.payload == snapshot,
                  "actor-%d received it whole (%d bytes at offset %d)" % (i, len(m.payload), m.offset))
            check(m.content_type == "application/x-torch", "with its content type")
        if os.environ.get("AGENTRT_BUS_LOCAL_FILES") == "1":
            fell_back = [e for st in streams for e in st.events() if e["kind"] == "reconnecting"]
            check(not fell_back, "every subscriber read the file itself (no fall-back: %s)" %
                  fell_back[:1])
        check(during[0] > 0, "small messages arrived while the snapshot was in flight (%d)" % during[0])
        check(small_offsets == list(range(2000, 2000 + len(small_offsets))),
              "in order with no gap (offsets %s...)" % small_offsets[:3])
        hwm = rss(bus.proc.pid, "VmHWM")
        grew = max(hwm, peak_rss[0]) - baseline
        print("[%s] broker peak RSS grew by %.1f MiB for a %d MiB snapshot to %d subscribers "
              "(baseline %.1f MiB); publish %.2f s, delivered to all %.2f s after it; "
              "%d small messages meanwhile" % (os.environ.get("AGENTRT_BUS_LOCAL_FILES") and "local"
                                               or "streamed", grew / 2**20, SNAPSHOT >> 20, SUBSCRIBERS,
                                               baseline / 2**20, published - started,
                                               delivered - published, during[0]))
        check(grew < RSS_BOUND, "the broker's peak RSS grew by %.1f MiB, under %d MiB" %
              (grew / 2**20, RSS_BOUND >> 20))
        # Stored once: one payload file in the topic's log folder.
        topic_dir = os.path.join(log_dir, "logs", "policies%2Flearner")
        blobs = [f for f in os.listdir(topic_dir) if f.endswith(".blob")]
        check(len(blobs) == 1 and os.path.getsize(os.path.join(topic_dir, blobs[0])) == SNAPSHOT,
              "the snapshot is stored once, in one file of %d bytes (%s)" % (SNAPSHOT, blobs))
        for s in subs + [pub, chatter_in]:
            s.close()


if __name__ == "__main__":
    sys.exit(scenarios_main(globals(), "agentrt-bus-large"))
