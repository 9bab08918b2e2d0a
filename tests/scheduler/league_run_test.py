#!/usr/bin/env python3
"""League and population-based training end to end: the real agentctl, the real
agent-worker, the league service on the real bus, the example configs as a user runs them.

    league_run_test.py pbt | pbt_python | league | league_resume
"""
import copy
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrt_testing import (AgentctlRun, check, require_executables, run_example,  # noqa: E402
                             run_processes, scenarios_main, wait_for)

BIN = os.environ.get("AGENTRT_BIN_DIR", "build/bin")
SOURCE = os.environ.get("AGENTRT_SOURCE_DIR", ".")
AGENTCTL = os.path.join(BIN, "agentctl")


def agentctl(*args, timeout=60):
    return subprocess.run([AGENTCTL] + list(args), capture_output=True, text=True, timeout=timeout)


def run_config(work, config, timeout_s):
    return run_example(AGENTCTL, SOURCE, work, config, timeout_s)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def lineage(run_dir):
    path = os.path.join(run_dir, "league", "lineage.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def no_result_lost_or_doubled(state):
    """Each agent numbers its results 1, 2, ... per incarnation and sends them in order, each until
    acknowledged; the league refuses a number it has seen. So results_applied equals the sum of the
    highest numbers exactly when no acknowledged result was lost (a gap) and none was applied twice."""
    return sum(state["applied"].values()) == state["results_applied"]


def scenario_pbt(work):
    """configs/pbt.yaml: four CartPole agents, `slow` starting with lr 1e-6. It is exploited at
    least once (restarted from a better agent's verified checkpoint with a perturbed lr), the
    population's evaluation returns at the end are >= 475 but for one member at most, which is
    still >= 100 (five times what lr 1e-6 alone reaches: a member exploited shortly before the end
    is still tuning its copied policy, and PPO's greedy policy can dip for a while; CI saw 436 and
    277), and lineage, plan and status say so."""
    rc, run_dir, out = run_config(work, "pbt.yaml", 240)
    check(rc == 0 and run_dir, "agentctl run configs/pbt.yaml succeeded\n%s" % out[-3000:])
    lines = lineage(run_dir)
    slow = [l for l in lines if l["recipient"] == "slow" and l["outcome"] == "exploited"]
    check(slow, "slow was exploited at least once: %s" % [(l["recipient"], l["donor"]) for l in lines])
    first = slow[0]
    check(first["old"]["lr"] == 1e-6 and first["donor"] != "slow" and first["donor_metric"] > first["recipient_metric"],
          "its first exploit copied a better agent (%s, %.1f > %.1f) and changed lr 1e-6 -> %g"
          % (first["donor"], first["donor_metric"], first["recipient_metric"], first["new"]["lr"]))
    check(all(1e-6 <= l["new"]["lr"] <= 6e-4 for l in lines), "every new lr is inside [1e-6, 6e-4]")
    check(all(l["donor_step"] >= 0 and os.path.isdir(l["archived"]) for l in lines if l["outcome"] == "exploited"),
          "each recipient's own checkpoints were kept aside (replaced/)")
    plan = read_json(os.path.join(run_dir, "plan.json"))
    lr = {a["name"]: a["args"]["lr"] for a in plan["agents"]}
    last_slow = [l for l in lines if l["recipient"] == "slow"][-1]
    check(lr["slow"] == last_slow["new"]["lr"], "plan.json holds slow's newest lr (%g)" % lr["slow"])
    status = read_json(os.path.join(run_dir, "status.json"))
    # "At the end": each agent's final policy over 20 evaluation episodes (its most likely actions);
    # the training window's mean also counts the exploration of the last episodes.
    returns = {a["name"]: a["metrics"].get("eval_return_mean", 0) for a in status["agents"]}
    # slow alone would end near 20 (lr 1e-6); CartPole's best is 500.
    check(min(returns.values()) >= 100 and sorted(returns.values())[1] >= 475,
          "every member's evaluation return at the end is >= 475 but one, which is >= 100: %s" % returns)
    agents = {a["name"]: a for a in status["agents"]}
    check(agents["slow"]["replacements"] >= 1 and agents["slow"]["replacements"] == agents["slow"]["restarts"],
          "status counts slow's restarts as replacements, not failures")
    shown = agentctl("league", run_dir)
    check(shown.returncode == 0 and "pbt lineage (%d exploit" % len(lines) in shown.stdout
          and "slow (" in shown.stdout, "agentctl league shows the lineage\n" + shown.stdout)
    st = agentctl("status", run_dir)
    check("pbt: %d exploit(s)" % len(lines) in st.stdout, "agentctl status shows the exploits")


# A Python agent through the agentrt package: its "skill" grows by lr * 1000 per step; it reports
# the skill as its score, checkpoints with the runtime's Checkpointer (on SIGUSR2 too) and reads
# lr from its args in the plan at every start.
PYTHON_AGENT = r"""
import sys, time
import numpy as np
import agentrt

with agentrt.Runtime(heartbeat_ms=200) as rt:
    lr = float(rt.args["lr"])
    ck = rt.checkpointer
    restored = ck.restore()
    step, skill = 0, np.zeros(1)
    if restored.restored:
        step, skill = restored.step, restored["skill"].copy()
        print("restored skill %.3f at step %d from %s" % (skill[0], step,
              restored.metadata.get("adopted_from", {}).get("agent", "itself")), flush=True)
    print("lr %g" % lr, flush=True)
    while step < 400 and not rt.should_stop:
        step += 1
        skill += lr * 1000
        rt.report(step, score=float(skill[0]))
        if ck.save_due:
            ck.save(step, {"skill": skill})
        time.sleep(0.005)
    ck.save(step, {"skill": skill}, wait=True)
"""


def scenario_pbt_python(work):
    """PBT of Python agents (the agentrt package): `slow` (lr 1e-6) restarts from a fast agent's
    checkpoint, written through the C API, with a new lr it reads from the plan's args."""
    script = os.path.join(work, "skill.py")
    with open(script, "w") as f:
        f.write(PYTHON_AGENT)
    cmd = json.dumps(["/usr/bin/python3", script])
    text = """run: {name: pypbt, dir: runs}
defaults:
  checkpoint: {interval_s: 0.5, keep_last: 2}
agents:
  - {name: fast, replicas: 2, command: %s, args: {lr: 0.001}}
  - {name: slow, command: %s, args: {lr: 1.0e-6}}
pbt:
  - agents: ["fast-*", slow]
    interval_steps: 50
    metric: score
    fraction: 0.34
    resample_probability: 0
    hyperparameters:
      lr: {min: 1.0e-6, max: 0.01}
""" % (cmd, cmd)
    config = os.path.join(work, "pypbt.yaml")
    with open(config, "w") as f:
        f.write(text)
    p = subprocess.run([AGENTCTL, "run", config, "--no-dashboard", "--quiet"], capture_output=True, text=True,
                       timeout=240, cwd=work)
    runs = os.path.join(work, "runs")
    run_dir = os.path.join(runs, os.listdir(runs)[0])
    check(p.returncode == 0, "the Python population ran to its end\n%s%s" % (p.stdout, p.stderr[-3000:]))
    lines = [l for l in lineage(run_dir) if l["recipient"] == "slow" and l["outcome"] == "exploited"]
    check(lines, "slow was exploited: %s" % lineage(run_dir))
    with open(os.path.join(run_dir, "logs", "slow", "rank0.log")) as f:
        log = f.read()
    check("restored skill" in log and "from fast-" in log, "slow restored a fast agent's checkpoint\n" + log[-2000:])
    check("lr %g" % lines[0]["new"]["lr"] in log, "and started again with the new lr %g from its args" % lines[0]["new"]["lr"])
    status = read_json(os.path.join(run_dir, "status.json"))
    scores = {a["name"]: a["metrics"].get("score", 0) for a in status["agents"]}
    check(scores["slow"] > 0.5 * max(scores.values()), "slow ends near the best: %s" % scores)


def check_league_state(state, keep):
    ratings = state["ratings"]
    order = sorted(ratings, key=ratings.get)
    check(order[0] == "anchor", "the random-policy anchor ends last: %s" % {k: round(v) for k, v in ratings.items()})
    check(all(ratings[h] > ratings["anchor"] + 100 for h in ("hunter-0", "hunter-1")),
          "the trained predators are rated well above the untrained one (same seat)")
    check(no_result_lost_or_doubled(state), "no result lost or applied twice (%d applied)" % state["results_applied"])
    check(all(len(v) <= keep for v in state["frozen"].values()) and len(state["frozen"]) == 4,
          "every member has frozen snapshots, at most keep_snapshots (%d)" % keep)
    p = state["payoff"]
    check(p["hunter-0"]["runner"][0] > 0 and p["runner"]["anchor"][0] > 0, "the payoff table has games both ways")


def scenario_league(work):
    """configs/league.yaml: two predators and a prey learn against each other by PFSP, an untrained
    predator anchors the scale. Ratings separate trained from random; the state file holds each
    result once; agentctl league and status show it."""
    rc, run_dir, out = run_config(work, "league.yaml", 240)
    check(rc == 0 and run_dir, "agentctl run configs/league.yaml succeeded\n%s" % out[-3000:])
    state = read_json(os.path.join(run_dir, "league", "state.json"))
    check_league_state(state, 8)
    shown = agentctl("league", run_dir)
    rows = [line.split()[1] for line in shown.stdout.splitlines()[2:6]]
    ratings = state["ratings"]
    check(shown.returncode == 0 and sorted(rows) == sorted(ratings)
          and [ratings[m] for m in rows] == sorted(ratings.values(), reverse=True),
          "agentctl league ranks the members by rating, highest first\n" + shown.stdout)
    as_json = json.loads(agentctl("league", run_dir, "--json").stdout)
    check(as_json["state"]["results_applied"] == state["results_applied"], "agentctl league --json is the state")
    st = agentctl("status", run_dir)
    check("league (%d results)" % state["results_applied"] in st.stdout, "agentctl status shows the ratings")
    with open(os.path.join(run_dir, "logs", "hunter-0", "rank0.log")) as f:
        log = f.read()
    check("league match 1: against runner@" in log, "a hunter was matched against the runner")


def scenario_league_resume(work):
    """kill -9 of agentctl in the middle of a league run, then agentctl resume: the league starts
    from exactly its last commit (its rating history goes on from there), and in the end no result
    is lost or counted twice."""
    with open(os.path.join(SOURCE, "configs", "league.yaml")) as f:
        text = f.read().replace("steps: 150000", "steps: 600000")
    run = AgentctlRun(AGENTCTL, work, text, ["--no-dashboard"])
    state_path = os.path.join(run.run_dir, "league", "state.json")
    try:
        def enough():
            try:
                return read_json(state_path)["results_applied"] >= 60
            except (OSError, ValueError):
                return False
        wait_for("60 league results", enough, 120)
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
        wait_for("the old agents to die", lambda: not run_processes(run.run_dir) or None, 20)
        committed = read_json(state_path)  # what the killed controller last committed
        check(no_result_lost_or_doubled(committed), "the last commit before the kill is consistent")
        resumed = subprocess.run([AGENTCTL, "resume", run.run_dir, "--quiet", "--no-dashboard"],
                                 capture_output=True, text=True, timeout=240)
        check(resumed.returncode == 0, "the resumed run succeeded\n%s%s" % (resumed.stdout, resumed.stderr[-3000:]))
        final = read_json(state_path)
        # The history is thinned to every other point as it grows: compare the points both kept.
        before = {h["results"]: h for h in committed["history"]}
        kept = [h for h in final["history"] if h["results"] <= committed["results_applied"]]
        check(kept and all(before.get(h["results"]) == h for h in kept),
              "the resumed league went on from its last commit (%d results): its rating history up to "
              "there is unchanged (%d points compared)" % (committed["results_applied"], len(kept)))
        check(all(final["applied"].get(k, 0) >= v for k, v in committed["applied"].items()),
              "every result applied before the kill is still applied")
        check(len(final["applied"]) >= len(committed["applied"]) + 4,
              "the agents' new incarnations reported results of their own")
        check(final["results_applied"] > committed["results_applied"], "results went on after the resume")
        check_league_state(final, 8)
    finally:
        run.kill()


if __name__ == "__main__":
    require_executables(AGENTCTL, os.path.join(BIN, "agent-worker"))
    sys.exit(scenarios_main(globals(), "agentrt-league"))
