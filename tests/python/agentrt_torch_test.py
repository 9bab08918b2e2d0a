#!/usr/bin/python3
"""agentrt.torch against Debian's python3-torch: a model, its Adam state, the
RNGs and extra values round-trip through a real Checkpointer bit for bit; the
restore never unpickles (pickle and torch.load are made to fail while it
runs); policy payloads for the bus round-trip and bad ones are refused with a
reason. CUDA tensors are checked where torch sees a GPU, else reported skipped.
Skips (exit 77) where /usr/bin/python3 cannot import torch."""
import os
import pickle
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import Failure, check, scenarios_main  # noqa: E402

try:
    import torch
except ImportError:
    print("agentrt_torch_test: skipped: /usr/bin/python3 cannot import torch (apt-get install python3-torch)")
    sys.exit(77)
import numpy as np  # noqa: E402

import agentrt  # noqa: E402
import agentrt.torch as art  # noqa: E402


def make(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 2))
    model.register_buffer("bf16", torch.randn(3, 4).to(torch.bfloat16))  # a dtype NumPy lacks
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return model, opt


def train_a_little(model, opt, steps=3):
    for _ in range(steps):
        loss = model(torch.randn(16, 5)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def scenario_roundtrip(work):
    model, opt = make(1)
    train_a_little(model, opt)
    ck = agentrt.Checkpointer(os.path.join(work, "ck"), agent="t", interval_s=0)
    np.random.seed(5)
    random.seed(6)
    torch.manual_seed(7)
    art.save(ck, 30, model=model, optimizer=opt, extra={"update": 3, "lrs": (0.1, 0.2), "ids": {1: "a"},
                                                        "table": torch.arange(4)}, wait=False)
    ck.wait()
    expect = (torch.rand(3), np.random.rand(), random.random())
    other, other_opt = make(2)
    check(not same_state(model, other), "a second model starts different")
    blocked = []

    def refuse(*a, **k):
        blocked.append(a)
        raise AssertionError("restore must not unpickle")
    saved = (pickle.loads, pickle.load, torch.load)
    pickle.loads = pickle.load = torch.load = refuse
    try:
        got = art.restore(ck, model=other, optimizer=other_opt)
    finally:
        pickle.loads, pickle.load, torch.load = saved
    check(not blocked, "restore called neither pickle nor torch.load")
    check(got is not None and got.step == 30, "restored step 30: %r" % got)
    check(same_state(model, other), "parameters and BatchNorm buffers bit for bit")
    check(got.extra["update"] == 3 and list(got.extra["lrs"]) == [0.1, 0.2] and
          torch.equal(got.extra["table"], torch.arange(4)), "extra values: %s" % got.extra)
    now = (torch.rand(3), np.random.rand(), random.random())
    check(torch.equal(now[0], expect[0]) and now[1:] == expect[1:],
          "torch, NumPy and Python RNGs continue where the save left them")
    # The optimizer goes on identically: one more step on the same batch agrees.
    batch = torch.randn(16, 5)
    for m, o in ((model, opt), (other, other_opt)):
        o.zero_grad()
        m(batch).pow(2).mean().backward()
        o.step()
    check(same_state(model, other), "Adam's moments came back: the next step agrees")
    wrong = torch.nn.Linear(3, 3)
    try:
        art.restore(ck, model=wrong)
    except RuntimeError as e:
        check("size mismatch" in str(e) or "Missing key" in str(e) or "Unexpected key" in str(e),
              "a model of another shape is refused by load_state_dict: %s" % str(e).splitlines()[0])
    else:
        raise Failure("a model of another shape was restored")
    fresh = agentrt.Checkpointer(os.path.join(work, "empty"), agent="t")
    check(art.restore(fresh, model=other) is None and art.restore.last.kind == "fresh",
          "nothing to restore: None, and the outcome says fresh")


def scenario_payload(work):
    model, _ = make(3)
    payload = art.to_bytes(model.state_dict(), meta={"agent": "a", "update": 9})
    tensors, meta = art.from_bytes(payload)
    clone, _ = make(4)
    clone.load_state_dict(tensors)
    check(meta == {"agent": "a", "update": 9} and same_state(model, clone), "a snapshot round-trips")
    check(b"pickle" not in payload and not payload.startswith(b"\x80"), "the payload is not a pickle")
    for bad, why in ((pickle.dumps(model.state_dict()), "bad magic"),
                     (payload[:-10], "outside the payload"),
                     (payload.replace(b'"entries"', b'"entrie"', 1)[:40], "header")):
        try:
            art.from_bytes(bad)
        except ValueError as e:
            check(why in str(e), "refused (%s): %s" % (why, e))
        else:
            raise Failure("a bad payload (%s) was accepted" % why)


def scenario_cuda(work):
    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device here (the CUDA path runs on the GPU machine)")
        return 77
    model, opt = make(1)
    model, opt = model.cuda(), torch.optim.Adam(model.cuda().parameters(), lr=1e-3)
    train_a_little(model, opt)
    ck = agentrt.Checkpointer(os.path.join(work, "ck"), agent="t", interval_s=0)
    art.save(ck, 1, model=model, optimizer=opt)
    other, other_opt = make(2)
    other, other_opt = other.cuda(), torch.optim.Adam(other.cuda().parameters(), lr=1e-3)
    art.restore(ck, model=other, optimizer=other_opt)
    check(same_state(model, other), "CUDA parameters round-trip")
    check(all(v.is_cuda for s in other_opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()),
          "optimizer state lives on the parameters' device")


def main():
    return scenarios_main(globals(), "agentrt-torch")


if __name__ == "__main__":
    sys.exit(main())
