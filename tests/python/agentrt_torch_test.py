#!/usr/bin/python3
"""agentrt.torch against Debian's python3-torch: a model, its Adam state, the
RNGs and extra values round-trip through a real Checkpointer bit for bit; the
restore never unpickles (pickle and torch.load are made to fail while it
runs); policy payloads for the bus round-trip and bad ones are refused with a
reason; a DDP agent's checkpoint (real processes, gloo) restores at another
world size. CUDA tensors are checked where torch sees a GPU, else reported
skipped. Skips (exit 77) where /usr/bin/python3 cannot import torch."""
import os
import pickle
import random
import subprocess
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


def make(seed, bf16=True):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 2))
    if bf16:  # gloo cannot broadcast it: not for DDP
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
    # snapshot="fork": the loop trains on at once; the checkpoint holds the state at the call.
    forking = agentrt.Checkpointer(os.path.join(work, "fork"), agent="t", snapshot="fork")
    at_call = {k: v.clone() for k, v in model.state_dict().items()}
    art.save(forking, 40, model=model, optimizer=opt, wait=False)
    train_a_little(model, opt)
    forking.wait()
    check(forking.info["last_snapshot_forked"], "the async save forked: %s" % forking.info)
    third, third_opt = make(3)
    check(art.restore(agentrt.Checkpointer(os.path.join(work, "fork"), agent="t"), model=third,
                      optimizer=third_opt).step == 40, "the forked save restores")
    check(all(torch.equal(third.state_dict()[k], v) for k, v in at_call.items()),
          "it holds the parameters as they were at the call, not after the steps that followed")
    forking.close()


def scenario_tamper(work):
    """A restore reads each chunk once, into the model's own tensors, and a bad chunk sends it to
    the older checkpoint: a flipped byte in a parameter, then a truncated shard."""
    model, opt = make(1)
    ck = agentrt.Checkpointer(os.path.join(work, "ck"), agent="t", interval_s=0, keep_last=5)
    states = {}
    for step in (10, 20, 30):
        train_a_little(model, opt, steps=1)
        art.save(ck, step, model=model, optimizer=opt)
        states[step] = {k: v.clone() for k, v in model.state_dict().items()}
    other, _ = make(2)
    copies = []
    copy_ = torch.Tensor.copy_

    def counted(dst, src, *a, **k):
        if src is not dst:
            copies.append(tuple(dst.shape))
        return copy_(dst, src, *a, **k)
    torch.Tensor.copy_ = counted  # load_state_dict copies each entry with it
    try:
        got = art.restore(ck, model=other)
    finally:
        torch.Tensor.copy_ = copy_
    check(got is not None and got.step == 30 and same_state(model, other), "the newest step restored")
    check(not copies, "read straight into the model's own tensors: no tensor copied (%s)" % copies)
    shard = os.path.join(work, "ck", "step-30", "rank-0.shard")
    with open(shard, "r+b") as f:  # a byte of the first chunk: the parameters' bytes
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0x20]))
    os.truncate(os.path.join(work, "ck", "step-20", "rank-0.shard"), 100)
    third, third_opt = make(3)
    got = art.restore(ck, model=third, optimizer=third_opt)
    check(got is not None and got.step == 10, "fell back past both damaged steps: %r" % art.restore.last)
    state = third.state_dict()
    check(all(torch.equal(state[k], states[10][k]) for k in state), "holds step 10's state bit for bit")
    reasons = {s["step"]: s["reason"] for s in art.restore.last.skipped}
    check(sorted(reasons) == [20, 30], "both named as skipped: %s" % art.restore.last.skipped)
    files = {s["step"]: s["file"] for s in art.restore.last.skipped}
    check("checksum mismatch" in reasons[30] and files[30].endswith("step-30/rank-0.shard"),
          "step 30: the flipped byte's file and chunk: %s: %s" % (files[30], reasons[30]))
    check("size is 100 bytes" in reasons[20], "step 20: the truncated shard: %s" % reasons[20])
    check("skipped step 30" in art.restore.last.describe, art.restore.last.describe)
    os.truncate(os.path.join(work, "ck", "step-10", "rank-0.shard"), 100)
    try:
        art.restore(ck, model=third)
    except agentrt.CheckpointError as e:
        check(e.code == 15 and "already hold part of step 30" in e.message and
              art.restore.last.kind == "corrupt",
              "nothing intact after part of step 30 went into the model: an error, not a fresh start: %s"
              % e.message)
    else:
        raise Failure("a model holding part of a corrupt checkpoint was passed off as a fresh start")
    os.truncate(shard, 100)
    check(art.restore(ck, model=third) is None and art.restore.last.kind == "corrupt",
          "every checkpoint found corrupt before any byte was read: None, and the outcome says corrupt")


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
    cuda_weights(work, model)


CUDA_READER = r"""
import os, sys, torch, agentrt, agentrt.torch as art
bus = agentrt.Bus.connect(os.environ["BUS"], "reader", os.environ["TOKEN"])
torch.manual_seed(9)
model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 2)).cuda()
model.register_buffer("bf16", torch.zeros(3, 4, dtype=torch.bfloat16, device="cuda"))
v = art.load_weights_from(agentrt.WeightStream(bus, "policy"), model, timeout=20)
print(v, " ".join("%.6f" % float(t.double().sum()) for t in model.state_dict().values()), flush=True)
"""


def cuda_weights(work, model):
    """A CUDA model's weights through a weight stream: read back in this process (through
    pinned host memory: CUDA refuses IPC in the allocating process) and by another process
    (GPU to GPU through CUDA IPC), each equal to the publisher's."""
    if "AGENTRT_BIN_DIR" not in os.environ:
        print("cuda weights: skipped: AGENTRT_BIN_DIR names no agentrt-bus")
        return
    from agentrt_testing import StandaloneBus
    with StandaloneBus(os.path.join(work)) as bus:
        pub = agentrt.Bus.connect(bus.address, "pub", bus.token("pub"))
        stream = agentrt.WeightStream(pub, "policy")
        version = art.publish_weights(stream, model, 7)
        check(version == 1, "a CUDA model's weights are version 1 (%s)" % version)
        other, _ = make(3)
        other = other.cuda()
        check(art.load_weights_from(stream, other) == 1 and same_state(model, other),
              "the same process reads them back into another CUDA model")
        sums = " ".join("%.6f" % float(t.double().sum()) for t in model.state_dict().values())
        env = dict(os.environ, BUS=bus.address, TOKEN=bus.token("reader"))
        out = subprocess.run([sys.executable, "-c", CUDA_READER], env=env, capture_output=True,
                             text=True, timeout=120)
        check(out.returncode == 0 and out.stdout.split(None, 1) == ["1", sums + "\n"],
              "another process reads them GPU to GPU (%s / %s)" % (out.stdout.strip(),
                                                                     out.stderr.strip()[-400:]))
        # With delta versions: a second GPU version, 1% of a large tensor
        # changed, also goes out as its delta (publish_device itself: no host
        # fallback).
        big = torch.nn.Linear(1024, 2048).cuda()
        device = big.weight.device.index or 0
        deltas = agentrt.WeightStream(pub, "policy-delta", delta=True)
        stream = art._current_cuda_stream(device)
        check(deltas.publish_device(art._device_tensors(big.state_dict()), 1, device, stream) == 1,
              "a large CUDA model's version 1")
        with torch.no_grad():
            big.weight.view(-1)[::100] += 1.0
        check(deltas.publish_device(art._device_tensors(big.state_dict()), 2, device, stream) == 2,
              "its version 2")
        check(deltas.stats()["deltas_published"] == 1,
              "a GPU version of a delta stream has its delta (%s)" % deltas.stats())
        pub.close()


def reshard_rank(phase, rank, world, work):
    """One rank of a DDP agent (gloo): `save` trains 3 steps and saves at step 30; `resume`
    restores (at another world size) and checks what came back, then trains one more step."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group("gloo", init_method="file://" + os.path.join(work, "store-" + phase),
                            rank=rank, world_size=world)
    model, opt = make(1, bf16=False)  # the same initial weights on every rank
    ddp = DistributedDataParallel(model)
    ck = agentrt.Checkpointer(os.path.join(work, "ck"), agent="ddp", rank=rank, world_size=world,
                              interval_s=0)
    if phase == "save":
        torch.manual_seed(100 + rank)  # each rank its own batches
        train_a_little(ddp, opt)
        art.save(ck, 30, model=model, optimizer=opt, extra={"update": 3})
        flat_opt = {"%s/%s" % (p, k): v for p, st in opt.state_dict()["state"].items()
                    for k, v in st.items()}
        with open(os.path.join(work, "rank%d.bin" % rank), "wb") as f:
            f.write(art.to_bytes(dict(model.state_dict(), **{"opt/" + k: v for k, v in flat_opt.items()},
                                      draw=torch.rand(4))))
        dist.barrier()
        end_rank(ck)
        return
    got = art.restore(ck, model=model, optimizer=opt)
    check(got is not None and got.step == 30 and got.extra == {"update": 3}, "rank %d restored step 30" % rank)
    check(got.restore.world_size != world, "re-sharded: saved by %d ranks, restored by %d"
          % (got.restore.world_size, world))
    with open(os.path.join(work, "rank0.bin"), "rb") as f:
        saved, _ = art.from_bytes(f.read())
    state = model.state_dict()
    check(all(torch.equal(state[k], saved[k]) for k in state),
          "rank %d holds the saved parameters and buffers bit for bit" % rank)
    check(all(torch.equal(v, saved["opt/%s/%s" % (p, k)]) for p, st in opt.state_dict()["state"].items()
              for k, v in st.items()), "rank %d holds the saved Adam state bit for bit" % rank)
    draw = torch.rand(4)
    if os.path.exists(os.path.join(work, "rank%d.bin" % rank)):
        with open(os.path.join(work, "rank%d.bin" % rank), "rb") as f:
            mine, _ = art.from_bytes(f.read())
        check(torch.equal(draw, mine["draw"]), "rank %d's torch RNG goes on where it was saved" % rank)
    else:
        art._derived_rng_state(30, rank)
        check(torch.equal(draw, torch.rand(4)), "new rank %d draws from its derived stream" % rank)
    torch.manual_seed(200 + rank)
    train_a_little(ddp, opt, steps=1)  # DDP's allreduce keeps the ranks equal
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    check(torch.equal(low, high) and not torch.equal(flat, torch.cat(
        [saved[k].reshape(-1) for k in state if k.endswith(("weight", "bias"))])),
          "rank %d trained on in step with the others" % rank)
    dist.barrier()
    end_rank(ck)


def end_rank(ck):
    """Closes the checkpointer and gloo's group before the interpreter exits. With both left
    to the interpreter's teardown, a rank once aborted at exit ('terminate called without an
    active exception') after every check had passed."""
    import torch.distributed as dist
    ck.close()
    dist.destroy_process_group()


def run_ranks(phase, world, work):
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", phase, str(r), str(world),
                               work]) for r in range(world)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=120))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise Failure("%s: a rank of %d did not finish within 120 s" % (phase, world))
    check(codes == [0] * world, "%s with %d ranks: every rank passed (%s)" % (phase, world, codes))


def scenario_reshard(work):
    """A DDP agent saved by 2 ranks resumes with 3, and one saved by 3 with 2."""
    for old, new in ((2, 3), (3, 2)):
        sub = os.path.join(work, "%dto%d" % (old, new))
        os.makedirs(sub)
        run_ranks("save", old, sub)
        run_ranks("resume", new, sub)


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--rank":
        reshard_rank(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return 0
    return scenarios_main(globals(), "agentrt-torch")


if __name__ == "__main__":
    sys.exit(main())
