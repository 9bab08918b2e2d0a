"""The Python agent of dist_test.sh, run by `agentctl run` from the unpacked
tarball inside a bare Debian root: it imports agentrt from the tarball's
python/ (agentctl puts it on the PYTHONPATH), reads the C++ agent's policy
from the bus, publishes a note, reports metrics, and saves and restores a
verified checkpoint. Prints "py agent: ok" last; any failure exits non-zero."""
import sys

import numpy as np

import agentrt


def main():
    with agentrt.Runtime() as rt:
        ck, bus = rt.checkpointer, rt.bus
        if ck.restore().restored:
            sys.exit("py agent: a fresh run found a checkpoint to restore")
        sub = bus.subscribe("policies/cpp", start="earliest")
        policy = sub.next(timeout=120)
        if policy is None:
            sys.exit("py agent: no policy of the C++ agent on policies/cpp within 120 s")
        print("py agent: policy of %s, %d bytes at offset %d" %
              (policy.publisher, len(policy.payload), policy.offset))
        for step in range(1, 11):
            rt.report(step, loss=1.0 / step, policy_bytes=len(policy.payload))
        bus.publish("notes", b"py read the policy of cpp")
        weights = np.arange(4096, dtype=np.float32) * 0.5
        ck.save(10, {"weights": weights}, metadata={"agent": rt.agent})
        back = ck.restore()
        if not (back.restored and back.step == 10 and np.array_equal(back["weights"], weights)):
            sys.exit("py agent: the checkpoint did not restore what was saved: %s" % back.describe)
        print("py agent: ok")


if __name__ == "__main__":
    main()
