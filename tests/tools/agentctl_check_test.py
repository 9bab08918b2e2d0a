#!/usr/bin/python3
"""`agentctl check` (preflight) end to end, with the real agentctl, agentrt-preflight and mpirun.

    agentctl_check_test.py SCENARIO     (sweep | busy_port | strict)

Every wait is bounded; ports come from a block probed free by the test.
"""
import json
import os
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import check, free_port_block, scenarios_main  # noqa: E402

BIN = os.path.abspath(os.environ.get("AGENTRT_BIN_DIR", "build/bin"))
AGENTCTL = os.path.join(BIN, "agentctl")
FACTOR = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
          "all_gather": lambda n: (n - 1) / n}


def config(work, first, extra=""):
    path = os.path.join(work, "agents.yaml")
    with open(path, "w") as f:
        f.write("""run: {name: pf, dir: %s/runs}
cluster:
  ports: {first: %d, last: %d, per_agent: 8}
  links: {shm_gbps: 4}
preflight: {max_bytes: 1048576, checkpoint_probe_bytes: 1048576%s}
agents:
  - {name: pair, gpus: 0, ranks: 2, command: [agent-worker], args: {env: cartpole}}
  - {name: solo, gpus: 0, ranks: 1, command: [agent-worker], args: {env: cartpole}}
""" % (work, first, first + 63, extra))
    return path


def agentctl_check(cfg, *args):
    out = subprocess.run([AGENTCTL, "check", cfg] + list(args), capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(cfg))
    return out.returncode, out.stdout, out.stderr


def scenario_sweep(work):
    """Every agent checked on its own partition: the sweep's busbw follows nccl-tests' formulas,
    efficiency against cluster.links, the checkpoint dir and bus probed; the table and --json."""
    cfg = config(work, free_port_block(64))
    rc, out, err = agentctl_check(cfg, "--json")
    check(rc == 0, "check passes (rc %d)\n%s%s" % (rc, out, err))
    report = json.loads(out)
    rows = {r["agent"]: r for r in report["agents"]}
    pair, solo = rows["pair"], rows["solo"]
    check(pair["ranks"] == 2 and pair["link"] == "shm" and pair["expected_gbps"] == 4,
          "pair: 2 ranks over shared memory, expected 4 GB/s: %s" % pair)
    ops = {p["op"] for p in pair["sweep"]}
    check(ops == set(FACTOR), "all three collectives were swept: %s" % ops)
    sizes = sorted({p["bytes"] for p in pair["sweep"] if p["op"] == "all_reduce"})
    check(sizes[0] == 8 and sizes[-1] == 1048576, "8 B .. max_bytes: %s" % sizes)
    for p in pair["sweep"]:
        algbw = p["bytes"] / (p["time_us"] / 1e6) / 1e9
        check(abs(algbw - p["algbw_gbps"]) <= 1e-6 * max(1.0, algbw) and
              abs(p["busbw_gbps"] - algbw * FACTOR[p["op"]](2)) <= 1e-6 * max(1.0, algbw),
              "algbw = bytes/time and busbw = algbw x nccl-tests' factor: %s" % p)
    check(pair["largest_busbw_gbps"] > 0 and
          abs(pair["efficiency"] - pair["largest_busbw_gbps"] / 4) < 1e-9, "efficiency = busbw / 4")
    check(pair["checkpoint"]["write_mb_s"] > 0 and pair["bus"]["ok"], "checkpoint dir and bus probed")
    check(solo["ranks"] == 1 and solo["sweep"] == [] and solo["verdict"] == "ok",
          "a one-rank agent has nothing to sweep and passes: %s" % solo)
    rc, out, err = agentctl_check(cfg)
    check(rc == 0 and "AGENT" in out and "BUSBW GB/s" in out and
          any(line.startswith("pair ") and line.rstrip().endswith(("ok", "warn")) for line in out.splitlines()),
          "the table has a row per agent:\n%s%s" % (out, err))
    print(out)


def scenario_busy_port(work):
    """A port of an agent's block held by a program outside agentrt fails the check, naming it."""
    first = free_port_block(64)
    cfg = config(work, first)
    plan = subprocess.run([AGENTCTL, "plan", cfg, "--json"], capture_output=True, text=True, timeout=30,
                          cwd=work)
    check(plan.returncode == 0, "plan: %s" % plan.stderr)
    pair = next(a for a in json.loads(plan.stdout)["agents"] if a["name"] == "pair")
    busy = pair["ports"]["last"]
    squatter = socket.socket()
    squatter.bind(("0.0.0.0", busy))
    squatter.listen(1)
    try:
        rc, out, err = agentctl_check(cfg)
        run = subprocess.run([AGENTCTL, "run", "--preflight", "--quiet", cfg], capture_output=True, text=True,
                             timeout=120, cwd=work)
    finally:
        squatter.close()
    check(rc == 1 and ("error: pair: port %d of the agent's block" % busy) in out and "fail" in out,
          "the busy port %d fails pair's check, by number (rc %d):\n%s%s" % (busy, rc, out, err))
    runs = os.listdir(os.path.join(work, "runs"))
    check(run.returncode == 1 and "the preflight check failed; nothing was started" in run.stderr and
          all(r.startswith("pf-check-") for r in runs),
          "run --preflight starts nothing after a failed check (rc %d, runs %s):\n%s%s"
          % (run.returncode, runs, run.stdout, run.stderr))


def scenario_strict(work):
    """Below preflight.min_efficiency is a warning; with --strict it fails the check."""
    cfg = config(work, free_port_block(64), extra=", min_efficiency: 1.0")
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace("shm_gbps: 4", "shm_gbps: 100000"))  # unreachable
    rc, out, err = agentctl_check(cfg)
    check(rc == 0 and "warning: pair: all_reduce busbw" in out and "of the shm link's expected 100000 GB/s"
          in out, "a warning, rc 0 (rc %d):\n%s%s" % (rc, out, err))
    rc, out, err = agentctl_check(cfg, "--strict")
    check(rc == 1 and " fail" in out, "--strict: rc 1 (rc %d):\n%s" % (rc, out))


if __name__ == "__main__":
    sys.exit(scenarios_main(globals(), "agentctl_check"))
