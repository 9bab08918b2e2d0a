"""Publishes 5 versions of a 16 MiB "policy" on weights/learner, one every half second."""
import time

import numpy as np

import agentrt

with agentrt.Runtime() as rt:
    stream = agentrt.WeightStream(rt.bus, "learner")
    weights = np.arange(4 << 20, dtype=np.float32)  # 16 MiB: written once, into the broker's spool
    for step in range(1, 6):
        version = stream.publish({"w": weights * step, "b": np.full(8, step, np.float32)}, step=step)
        print("published version %d (step %d)" % (version, step))
        rt.report(step, version=version)
        time.sleep(0.5)
    stats = rt.bus.stats()
    print("bus: %d large payloads taken over from the spool, %d received in chunks"
          % (stats["large_adopted"], stats["large_streamed"]))
