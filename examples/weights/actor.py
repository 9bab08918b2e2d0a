"""Follows weights/learner: each newer version, read in place, until the learner's step 5."""
import agentrt

with agentrt.Runtime() as rt:
    stream = agentrt.WeightStream(rt.bus, "learner")
    w = stream.wait_newer(0, timeout=60)
    while True:
        b = w.arrays["b"]
        print("version %d of %s (step %d, %s): b[0] = %.1f, w[1] = %.1f"
              % (w.version, w.agent, w.step, "mapped" if w.mapped else "streamed",
                 b[0], w.arrays["w"][1]))
        rt.report(w.step, version=w.version)
        if w.step >= 5:
            break
        w = stream.wait_newer(w.version, timeout=60)
