#!/usr/bin/env python3
"""`agentctl run --backend slurm` against the live SLURM test cluster (label slurm).

Scenarios (one ctest each, argv[1]):
  complete    while another job holds 2 GPUs, 3 agents (a: 2 ranks, 2 GPUs; b: 1 GPU; c: CPU)
              run to completion; every rank saw exactly the plan's GPUs (as mapped onto the
              job's), pairwise disjoint between agents and none of the other job's; each agent ran as its
              own job step (one step id per agent launch); the allocation script holds no secret.
  preempt     `scancel --signal=USR2 --batch JOB`: agents checkpoint, the job requeues
              (Restarts=1), every agent resumes from its checkpoint with SLURM_RESTART_COUNT=1.
  kill_rank   SIGKILL to one rank inside agent a's step: only a is restarted, as a new step;
              b and c keep their first steps.
  interrupt   SIGINT to the following `agentctl run`: scancel --signal=TERM --batch, every agent
              stops (single-rank ones checkpoint), the job ends, agentctl exits 130.
  infeasible  a plan that cannot fit the live cluster: exit 2, no run dir, nothing submitted.
  pbt         configs/pbt.yaml in an allocation: `slow` is exploited (a new srun step restarts it
              from a better agent's checkpoint with a new lr), the lineage and plan say so.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import Failure, check, free_port_block, wait_for  # noqa: E402

BIN = os.environ.get("AGENTRT_BIN_DIR", "")
AGENTCTL = os.path.join(BIN, "agentctl")
AGENT = os.path.join(BIN, "agentrt-test-agent")


def fail(msg):
    raise Failure(msg)


def config(work, steps, gpus_a=2, gpus_b=1, extra_args=(), channels=""):
    first = free_port_block(64)
    env_dir = os.path.join(work, "env")
    os.makedirs(env_dir, exist_ok=True)

    def agent(name, gpus, ranks):
        cmd = [AGENT, "--steps", str(steps), "--step-ms", "50", "--ckpt-interval-s", "0.3",
               "--dump-env", env_dir] + list(extra_args)
        return ("  - name: %s\n    gpus: %d\n    ranks: %d\n    command: %s\n"
                % (name, gpus, ranks, json.dumps(cmd)))

    text = ("run: {name: alloc, dir: %s}\n"
            "cluster:\n  ports: {first: %d, last: %d, per_agent: 8}\n"
            "defaults:\n  restart: {max_restarts: 3, backoff_s: 0.5, heartbeat_timeout_s: 60, grace_s: 10}\n"
            "slurm: {time: \"00:10:00\", signal_grace_s: 30}\n"
            "agents:\n" % (os.path.join(work, "runs"), first, first + 63))
    text += agent("a", gpus_a, 2) + agent("b", gpus_b, gpus_b) + agent("c", 0, 1) + channels
    path = os.path.join(work, "agents.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run_dir(work):
    dirs = glob.glob(os.path.join(work, "runs", "alloc-*"))
    check(len(dirs) == 1, "expected one run dir, got %s" % dirs)
    return dirs[0]


def job_fields(job):
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True,
                         timeout=30)
    fields = {}
    for word in out.stdout.split():
        k, _, v = word.partition("=")
        fields.setdefault(k, v)
    return fields


def wait_job_done(job, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        f = job_fields(job)
        if f.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return f
        time.sleep(0.5)
    fail("job %s did not end within %ds: %s" % (job, timeout_s, job_fields(job)))


def dumps(work):
    out = {}
    for path in glob.glob(os.path.join(work, "env", "*.json")):
        with open(path) as f:
            d = json.load(f)
        out[(d["agent"], int(d["rank"]))] = d
    return out


def logs(rdir):
    text = ""
    for p in sorted(glob.glob(os.path.join(rdir, "logs", "*", "*")) +
                    glob.glob(os.path.join(rdir, "slurm-*.out"))):
        with open(p, errors="replace") as f:
            text += "---- %s\n%s" % (p, f.read())
    return text


def plan_gpus(rdir):
    with open(os.path.join(rdir, "plan.json")) as f:
        plan = json.load(f)
    return {a["name"]: sorted(g for p in a["placement"] for g in p.get("gpus", []))
            for a in plan["agents"]}


def scenario_complete(work):
    cfg = config(work, steps=40)
    # Another job holds some GPUs first: the run must use only the ones SLURM gave it.
    held = os.path.join(work, "held")
    blocker = subprocess.run(["sbatch", "--parsable", "--gres=gpu:2", "--time=00:05:00",
                              "--output=/dev/null", "--wrap",
                              'echo "$SLURM_JOB_GPUS" >%s.tmp && mv %s.tmp %s && sleep 120'
                              % (held, held, held)],
                             capture_output=True, text=True, timeout=30)
    check(blocker.returncode == 0, "blocker sbatch: " + blocker.stderr)
    try:
        wait_for("the blocker job to start", lambda: os.path.exists(held), 90, 0.2)
        held_gpus = {int(g) for g in open(held).read().strip().split(",")}
        out = subprocess.run([AGENTCTL, "run", "--backend", "slurm", cfg, "--status-interval-s", "5"],
                             capture_output=True, text=True, timeout=150)
    finally:
        subprocess.run(["scancel", blocker.stdout.strip()], timeout=30)
    rdir = run_dir(work)
    check(out.returncode == 0, "agentctl run exited %d\n%s%s%s" % (out.returncode, out.stdout,
                                                                 out.stderr, logs(rdir)))
    d = dumps(work)
    check(sorted(d) == [("a", 0), ("a", 1), ("b", 0), ("c", 0)], "ranks seen: %s" % sorted(d))
    planned = plan_gpus(rdir)
    seen = {}
    for (agent, rank), x in d.items():
        cvd = x["env"].get("CUDA_VISIBLE_DEVICES", "")
        gpus = sorted(int(g) for g in cvd.split(",") if g != "")
        check(gpus == planned[agent], "%s rank %d saw GPUs %s, plan says %s" % (agent, rank, gpus,
                                                                               planned[agent]))
        check(x["env"]["RANK"] == str(rank), "%s rank %d has RANK=%s" % (agent, rank, x["env"]["RANK"]))
        seen.setdefault(agent, set()).update(gpus)
    check(seen["c"] == set(), "CPU agent c saw GPUs %s" % seen["c"])
    check(not (seen["a"] & seen["b"]), "a and b share GPUs: %s %s" % (seen["a"], seen["b"]))
    check(len(seen["a"]) == 2 and len(seen["b"]) == 1, "GPU counts: %s" % seen)
    check(not ((seen["a"] | seen["b"]) & held_gpus),
          "the run used GPUs %s of another job (%s)" % (seen["a"] | seen["b"], held_gpus))
    # One job step per agent launch: ranks of an agent share a step id, agents differ.
    steps = {}
    for (agent, rank), x in d.items():
        env = x["env"]
        steps.setdefault(agent, set()).add((env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")))
    for agent, s in steps.items():
        check(len(s) == 1 and None not in list(s)[0], "agent %s ran in steps %s" % (agent, s))
    ids = [list(s)[0] for s in steps.values()]
    check(len(set(ids)) == 3 and len({j for j, _ in ids}) == 1,
          "agents did not run as three steps of one job: %s" % ids)
    # No secret in the allocation script or in any rank's environment.
    with open(os.path.join(rdir, "secrets", "run.secret"), "rb") as f:
        secret = f.read()
    with open(os.path.join(rdir, "alloc.sbatch"), "rb") as f:
        script = f.read()
    check(secret not in script and b"#SBATCH --signal=B:USR2@30" in script and b"--requeue" in script,
          "allocation script:\n" + script.decode())
    for x in d.values():
        check(secret.hex() not in json.dumps(x), "secret in a rank's environment")
    print("ok: 4 ranks, GPUs %s as planned, disjoint, not the other job's %s; 3 steps of job %s"
          % (sorted(seen["a"] | seen["b"]), sorted(held_gpus), ids[0][0]))


def checkpointed(rdir, agents):
    return all(glob.glob(os.path.join(rdir, "checkpoints", a, "step-*", "manifest.json"))
               for a in agents)


def submit_detached(work, cfg):
    """`agentctl run --backend slurm --detach cfg`: the run directory and the job id."""
    out = subprocess.run([AGENTCTL, "run", "--backend", "slurm", "--detach", cfg],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, "agentctl run --detach exited %d\n%s%s"
          % (out.returncode, out.stdout, out.stderr))
    rdir = run_dir(work)
    return rdir, open(os.path.join(rdir, "slurm.job_id")).read().strip()


def scenario_preempt(work):
    # Every incarnation of every rank publishes once to probe/<agent> and says at which offset.
    cfg = config(work, steps=300, extra_args=["--bus-connections", "1"],
                 channels='channels:\n  - {topic: "probe/*", publishers: ["*"], subscribers: ["*"]}\n')
    rdir, job = submit_detached(work, cfg)
    try:
        wait_for("every agent's first checkpoint", lambda: checkpointed(rdir, "abc"), 90, 0.2)
        subprocess.run(["scancel", "--signal=USR2", "--batch", job], check=True, timeout=30)
        f = wait_job_done(job, 150)
    finally:
        subprocess.run(["scancel", job], timeout=30)
    text = logs(rdir)
    check(f["JobState"] == "COMPLETED", "job ended %s\n%s" % (f, text))
    check(f.get("Restarts") == "1", "Restarts=%s\n%s" % (f.get("Restarts"), text))
    check("requeueing job " + job in text, "no requeue in the controller output\n" + text)
    for a in "abc":
        with open(os.path.join(rdir, "logs", a, "rank0.log")) as fh:
            check("resumed from step" in fh.read(), "agent %s did not resume\n%s" % (a, text))
    for (agent, rank), x in dumps(work).items():
        check(x["env"].get("SLURM_RESTART_COUNT") == "1",
              "%s rank %d: SLURM_RESTART_COUNT=%s" % (agent, rank, x["env"].get("SLURM_RESTART_COUNT")))
    print("ok: job %s requeued once; every agent resumed from its checkpoint" % job)
    # The bus came back with its log after the requeue: the second incarnation's messages follow
    # the first's (offsets 0..2n-1 of probe/<agent>, each once), they do not start again at 0.
    ranks = {"a": 2, "b": 1, "c": 1}
    for a, n in ranks.items():
        offsets = []
        for r in range(n):
            with open(os.path.join(rdir, "logs", a, "rank%d.log" % r)) as fh:
                offsets += [int(x) for x in re.findall(r"published probe/%s at offset (\d+)" % a, fh.read())]
        check(sorted(offsets) == list(range(2 * n)),
              "agent %s: offsets of probe/%s over both incarnations %s, expected 0..%d once each"
              % (a, a, sorted(offsets), 2 * n - 1))
    print("ok: bus offsets continued across the requeue")


def scenario_kill_rank(work):
    cfg = config(work, steps=400)
    rdir, job = submit_detached(work, cfg)
    try:
        first = wait_for("all four ranks", lambda: (lambda d: d if len(d) == 4 else None)(dumps(work)),
                         90, 0.2)
        steps_before = {a: first[(a, 0)]["env"]["SLURM_STEP_ID"] for a in "abc"}
        try:
            os.kill(int(first[("a", 1)]["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            fail("rank 1 of agent a (pid %s) was gone before the kill\n%s" % (first[("a", 1)]["pid"],
                                                                             logs(rdir)))
        f = wait_job_done(job, 150)
    finally:
        subprocess.run(["scancel", job], timeout=30)
    text = logs(rdir)
    check(f["JobState"] == "COMPLETED", "job ended %s\n%s" % (f, text))
    after = dumps(work)
    check(after[("a", 0)]["env"]["SLURM_STEP_ID"] != steps_before["a"],
          "agent a was not relaunched as a new step\n" + text)
    check(after[("a", 0)]["env"]["AGENTRT_RESTART_COUNT"] == "1", "a restart count\n" + text)
    for a in "bc":
        check(after[(a, 0)]["env"]["SLURM_STEP_ID"] == steps_before[a] and
              after[(a, 0)]["env"]["AGENTRT_RESTART_COUNT"] == "0", "agent %s was restarted\n%s" % (a, text))
    with open(os.path.join(rdir, "status.json")) as fh:
        status = json.load(fh)
    restarts = {a["name"]: a.get("restarts") for a in status["agents"]}
    check(restarts == {"a": 1, "b": 0, "c": 0}, "restarts %s" % restarts)
    print("ok: only agent a restarted, as step %s (was %s)" % (after[("a", 0)]["env"]["SLURM_STEP_ID"],
                                                              steps_before["a"]))


def scenario_interrupt(work):
    cfg = config(work, steps=2000)
    proc = subprocess.Popen([AGENTCTL, "run", "--backend", "slurm", cfg, "--status-interval-s", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("every agent's first checkpoint", lambda: glob.glob(os.path.join(work, "runs", "alloc-*")) and
                 checkpointed(run_dir(work), "abc"), 90, 0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        jid = os.path.join(run_dir(work), "slurm.job_id")
        if os.path.exists(jid):
            subprocess.run(["scancel", open(jid).read().strip()], timeout=30)
    rdir = run_dir(work)
    check(proc.returncode == 130, "agentctl run exited %d\n%s%s" % (proc.returncode, out, logs(rdir)))
    with open(os.path.join(rdir, "status.json")) as fh:
        states = {a["name"]: a["state"] for a in json.load(fh)["agents"]}
    check(states == {"a": "stopped", "b": "stopped", "c": "stopped"}, "states %s" % states)
    # Single-rank agents checkpoint on a stop request (the test agent's ranks of a
    # group stand at different steps, so a group keeps its periodic checkpoints).
    for a in "bc":
        with open(os.path.join(rdir, "logs", a, "rank0.log")) as fh:
            check("before exit" in fh.read(), "agent %s did not checkpoint on stop\n%s" % (a, logs(rdir)))
    print("ok: Ctrl-C stopped every agent with a checkpoint; exit 130")


def scenario_stop(work):
    cfg = config(work, steps=2000)
    rdir, job = submit_detached(work, cfg)
    try:
        wait_for("every agent's first checkpoint", lambda: checkpointed(rdir, "abc"), 90, 0.2)
        stop = subprocess.run([AGENTCTL, "stop", rdir, "--timeout-s", "90"],
                              capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["scancel", job], timeout=30)
    check(stop.returncode == 0, "agentctl stop exited %d\n%s%s" % (stop.returncode, stop.stdout, stop.stderr))
    check("SLURM job " + job in stop.stdout, "stop did not go through SLURM:\n" + stop.stdout)
    with open(os.path.join(rdir, "status.json")) as fh:
        states = {a["name"]: a["state"] for a in json.load(fh)["agents"]}
    check(states == {"a": "stopped", "b": "stopped", "c": "stopped"}, "states %s\n%s" % (states, logs(rdir)))
    again = subprocess.run([AGENTCTL, "stop", rdir], capture_output=True, text=True, timeout=60)
    check(again.returncode == 0 and "not running" in again.stdout,
          "stop of an ended SLURM run: %d %s%s" % (again.returncode, again.stdout, again.stderr))
    print("ok: agentctl stop ended a --backend slurm run through scancel --signal=TERM --batch")


def scenario_infeasible(work):
    cfg = config(work, steps=10, gpus_b=7)  # 2 + 7 GPUs (b: 7 ranks); the test cluster has 8
    out = subprocess.run([AGENTCTL, "run", "--backend", "slurm", cfg], capture_output=True, text=True,
                         timeout=60)
    check(out.returncode == 2, "exit %d, want 2: %s%s" % (out.returncode, out.stdout, out.stderr))
    check("infeasible" in out.stderr and "nothing submitted" in out.stderr, out.stderr)
    check(not os.path.exists(os.path.join(work, "runs")), "a run dir was created")
    print("ok: " + out.stderr.strip().splitlines()[-1])


def scenario_pbt(work):
    source = os.environ.get("AGENTRT_SOURCE_DIR", ".")
    out = subprocess.run([AGENTCTL, "run", "--backend", "slurm", os.path.join(source, "configs", "pbt.yaml"),
                          "--set", "run.dir=" + os.path.join(work, "runs"), "--set", "slurm.time=00:10:00"],
                         capture_output=True, text=True, timeout=200)
    dirs = glob.glob(os.path.join(work, "runs", "pbt-*"))
    check(len(dirs) == 1, "one run dir: %s" % dirs)
    rdir = dirs[0]
    check(out.returncode == 0, "agentctl run --backend slurm configs/pbt.yaml exited %d\n%s%s%s"
          % (out.returncode, out.stdout, out.stderr, logs(rdir)[-4000:]))
    with open(os.path.join(rdir, "league", "lineage.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    slow = [x for x in lines if x["recipient"] == "slow" and x["outcome"] == "exploited"]
    check(slow and slow[0]["old"]["lr"] == 1e-6, "slow was exploited: %s" % [(x["recipient"], x["donor"]) for x in lines])
    with open(os.path.join(rdir, "plan.json")) as f:
        lr = {a["name"]: a["args"]["lr"] for a in json.load(f)["agents"]}
    check(lr["slow"] == [x for x in lines if x["recipient"] == "slow"][-1]["new"]["lr"], "plan.json has slow's new lr")
    batch = "".join(open(p, errors="replace").read() for p in glob.glob(os.path.join(rdir, "slurm-*.out")))
    check("slow restarting: pbt: restarting from" in batch and "slow running (restart 1" in batch,
          "the allocation relaunched slow as a new step after the exploit")
    print("ok: %d exploits in the allocation, slow's lr 1e-06 -> %g" % (len(lines), lr["slow"]))


def main():
    if not os.environ.get("SLURM_CONF"):
        print("SLURM_CONF is not set: start the test cluster (slurm/testcluster/start.sh DIR; "
              "source DIR/env.sh)", file=sys.stderr)
        return 1
    scenario = sys.argv[1]
    work = tempfile.mkdtemp(prefix="alloc-%s-" % scenario)
    try:
        globals()["scenario_" + scenario](work)
    except Failure as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 1
    finally:
        if not os.environ.get("ALLOC_KEEP"):  # set it to keep the run dirs for a look
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
