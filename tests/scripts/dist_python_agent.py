"""The Python agent of dist_test.sh, run by `agentctl run` from the unpacked
tarball inside a bare Debian root: it imports agentrt from the tarball's
python/ (agentctl puts it on the PYTHONPATH), reads the C++ agent's policy
from its weight stream, publishes a note, reports metrics, and saves and restores a
verified checkpoint. Prints "py agent: ok" last; any failure exits non-zero."""
import json
import sys

import numpy as np

import agentrt


def main():
    with agentrt.Runtime() as rt:
        ck, bus = rt.checkpointer, rt.bus
        if ck.restore().restored:
            sys.exit("py agent: a fresh run found a checkpoint to restore")
        try:
            policy = agentrt.WeightStream(bus, "cpp").wait_newer(0, timeout=120)
        except agentrt.BusError as e:
            sys.exit("py agent: no policy of the C++ agent on weights/cpp within 120 s: %s" % e)
        described = json.loads(policy.arrays["snapshot"].tobytes())
        params = policy.arrays["policy"]
        if policy.agent != "cpp" or described["policy_params"] != params.size:
            sys.exit("py agent: the C++ agent's snapshot does not hold what it describes: %r %r" %
                     (policy, described))
        print("py agent: policy of %s, version %d, %d parameters at step %d" %
              (policy.agent, policy.version, params.size, policy.step))
        for step in range(1, 11):
            rt.report(step, loss=1.0 / step, policy_bytes=policy.size)
        bus.publish("notes", b"py read the policy of cpp")
        weights = np.arange(4096, dtype=np.float32) * 0.5
        ck.save(10, {"weights": weights}, metadata={"agent": rt.agent})
        back = ck.restore()
        if not (back.restored and back.step == 10 and np.array_equal(back["weights"], weights)):
            sys.exit("py agent: the checkpoint did not restore what was saved: %s" % back.describe)
        print("py agent: ok")


if __name__ == "__main__":
    main()
