#!/usr/bin/env python3
"""PPO in PyTorch on agentrt's `pursuit` world, as a league through the bus.

One agent = one torch.distributed group of its ranks (gloo on CPU, NCCL when
the agent has GPUs), rendezvous on the agent's own MASTER_PORT; gradients are
averaged only inside that group. Each rank steps its own batch of pursuit
worlds through agentrt.EnvPool and plays the agent's seat in every world; the
other seats are played by the newest policy snapshots the other agents publish
on the bus (`weights/<agent>`), or at random until one arrives.

From the runtime (`agentrt.Runtime()`): the assignment (rank, ports, GPUs,
args from the plan), heartbeats (a hung rank is noticed), metrics for
`agentctl status`, stop requests (SIGTERM), and verified async checkpoints of
model, optimizer, RNG and bus positions (agentrt.torch, no pickle). A
restarted rank resumes from the newest checkpoint that verifies, and plays
first against the versions it played against at that checkpoint.

Arguments come from the agent's `args:` in the config (see
configs/torch_demo.yaml): role (predator | prey), steps, num_envs,
rollout_steps, lr, ent_coef, epochs, minibatches, hidden, snapshot_every,
eval_episodes, seed, env_args. Predators evaluate at the end: captures per
episode with the trained policy against the prey's newest snapshot, and with
random predators against the same prey (`eval ...` line, and metrics).
"""
import datetime
import hashlib
import json
import os
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

import agentrt
import agentrt.torch as art

ENV = "pursuit"
DEFAULTS = {
    "role": None, "steps": 200000, "num_envs": 16, "rollout_steps": 64, "lr": 1e-3,
    "ent_coef": 0.01, "epochs": 4, "minibatches": 4, "hidden": 64, "gamma": 0.99, "lam": 0.95,
    "clip": 0.2, "vf_coef": 0.5, "max_grad_norm": 0.5, "snapshot_every": 2, "eval_episodes": 0,
    "seed": 0, "env_args": {}, "timeout_s": 300,
}


def log(rt, fmt, *a):
    print("[%s rank %d] %s" % (rt.agent, rt.rank, fmt % a if a else fmt), flush=True)


def settings_of(rt):
    """The agent's args with their defaults; a wrong one fails naming the agent and key."""
    args = dict(rt.args or {})
    unknown = sorted(set(args) - set(DEFAULTS) - {"env"})
    if unknown:
        raise SystemExit("agent %s: unknown args %s (known: %s)"
                         % (rt.agent, ", ".join(unknown), ", ".join(sorted(DEFAULTS))))
    s = dict(DEFAULTS, **args)
    if s.get("env", ENV) != ENV:
        raise SystemExit("agent %s: args.env is %r; this agent trains %s" % (rt.agent, s["env"], ENV))
    if s["role"] not in ("predator", "prey"):
        raise SystemExit("agent %s: args.role must be predator or prey, got %r" % (rt.agent, s["role"]))
    for key in ("steps", "num_envs", "rollout_steps", "epochs", "minibatches", "hidden",
                "snapshot_every"):
        if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < 1:
            raise SystemExit("agent %s: args.%s must be a positive integer, got %r"
                             % (rt.agent, key, s[key]))
    if (s["num_envs"] * s["rollout_steps"]) % s["minibatches"]:
        raise SystemExit("agent %s: args.minibatches (%d) must divide num_envs * rollout_steps (%d)"
                         % (rt.agent, s["minibatches"], s["num_envs"] * s["rollout_steps"]))
    return s


def seating(rt, s):
    """(world_args, my seat, {seat: agent}) from every pursuit agent of the run,
    predators first in config order, then prey — as agent-worker seats them."""
    sides = {"predator": [], "prey": []}
    for a in rt.agents:
        args = a.get("args") or {}
        if args.get("env", ENV) == ENV and args.get("role") in sides:
            sides[args["role"]].append(a["name"])
    world = dict(s["env_args"])
    world.setdefault("predators", max(world.get("capture_k", 2), len(sides["predator"])))
    world.setdefault("prey", max(1, len(sides["prey"])))
    seats, mine = {}, None
    for first, side, count in ((0, sides["predator"], world["predators"]),
                               (world["predators"], sides["prey"], world["prey"])):
        for i, name in enumerate(side[:count]):
            if name == rt.agent:
                mine = first + i
            else:
                seats[first + i] = name
    if mine is None:
        raise SystemExit("agent %s: no %s seat left in a world of %d predators and %d prey"
                         % (rt.agent, s["role"], world["predators"], world["prey"]))
    return world, mine, seats


class Policy(nn.Module):
    """Separate actor and critic MLPs over running-normalised observations. The
    normaliser's statistics are buffers: checkpoints and snapshots carry them."""

    def __init__(self, obs_size, num_actions, hidden):
        super().__init__()

        def mlp(out):
            return nn.Sequential(nn.Linear(obs_size, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                 nn.Tanh(), nn.Linear(hidden, out))
        self.actor, self.critic = mlp(num_actions), mlp(1)
        self.register_buffer("obs_mean", torch.zeros(obs_size))
        self.register_buffer("obs_var", torch.ones(obs_size))
        self.register_buffer("obs_count", torch.tensor(1e-4))

    def forward(self, obs):
        x = ((obs - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8)).clamp(-10, 10)
        return self.actor(x), self.critic(x).squeeze(-1)

    @torch.no_grad()
    def observe(self, batch_sum, batch_sumsq, n):
        """Folds a batch's moments (summed over the agent's ranks) into the statistics."""
        mean = batch_sum / n
        var = (batch_sumsq / n - mean ** 2).clamp(min=0)
        delta, total = mean - self.obs_mean, self.obs_count + n
        m2 = self.obs_var * self.obs_count + var * n + delta ** 2 * self.obs_count * n / total
        self.obs_mean += delta * n / total
        self.obs_var.copy_(m2 / total)
        self.obs_count.fill_(total)


class League:
    """The newest version of every other seat's agent's weight stream
    (`weights/<agent>`), read by the training loop between updates, and this
    agent's own versions (rank 0 publishes). Rank 0 picks the versions and the
    group plays the same ones (`device`: the group's tensors' device)."""

    def __init__(self, rt, seats, restored, make_policy, device):
        self.rt, self.seats, self.device = rt, seats, device
        self.played = hashlib.sha256()  # every (agent, version) installed, in order
        self.changes = 0
        self.players, self.held, self.seen = {}, {}, {}  # held: agent -> [version, step]
        self.received, self.publish_failures = 0, 0
        self.said = set()  # (agent, error code) already logged
        self.pinned = False  # the next install() keeps the checkpoint's versions
        self.bus = None
        self.streams, self.own = {}, None
        self.make_policy = make_policy
        # The streams the group's broadcast covers: the same list on every rank,
        # with a bus or without.
        self.agents = sorted(set(seats.values()))
        try:
            self.bus = rt.bus
        except agentrt.BusError as e:
            log(rt, "no bus (%s): other seats play at random", e)
            return
        self.streams = {a: agentrt.WeightStream(self.bus, a) for a in self.agents}
        self.own = agentrt.WeightStream(self.bus, rt.agent)
        log(rt, "bus: reading the weight streams of %s", ", ".join(sorted(self.streams)))
        # A restored rank plays first against the versions in play at its checkpoint
        # (pinned: a version's number and step; not the same after a bus that lost its log).
        pinned = restored.extra.get("league_versions", {}) if restored else {}
        back = []
        for agent, (version, step) in sorted(pinned.items()):
            if agent not in self.streams:
                continue
            try:
                got = self.streams[agent].at(version, timeout=5)
            except agentrt.BusError as e:
                log(rt, "league: %s version %d of the checkpoint cannot be read (%s): its newest "
                    "plays instead", agent, version, e)
                continue
            if got.step != step:  # the bus lost its log: the number is another version's now
                log(rt, "league: %s version %d is of step %d, the checkpoint's was of step %d: its "
                    "newest plays instead", agent, version, got.step, step)
            elif self._load(agent, got):
                back.append("%s v%d" % (agent, version))
        if back:
            self.pinned = True
            log(rt, "league: the checkpoint's versions came back: %s", ", ".join(back))

    def _load(self, agent, weights):
        self.seen[agent] = weights.version  # loaded or refused: not read again
        player = self.players.get(agent) or self.make_policy()
        try:
            art.load_weights(player, weights)
        except (RuntimeError, KeyError, ValueError) as e:
            log(self.rt, "weights of %s version %d refused: %s", agent, weights.version, e)
            return False
        self.players[agent] = player
        self.held[agent] = [weights.version, weights.step]
        self.received += 1
        self.changes += 1
        self.played.update(("%s v%d;" % (agent, weights.version)).encode())
        return True

    def install(self, together=True):
        """Loads the versions published since the last call (one bus round
        trip per stream when there is none). `together` (every rank calls it):
        rank 0 reads the newest and the others load the versions it plays,
        broadcast over the group, so that every rank of an update plays the
        same ones. After a restore, the first call keeps the checkpoint's
        versions for one more update (rank 0's, which every rank then plays:
        a rank's own restore may have brought back fewer)."""
        pinned, self.pinned = self.pinned, False
        together = together and self.rt.world_size > 1
        if together and self.rt.rank != 0:
            self._follow_rank0()
            return
        if not pinned:
            self._read_newest()
        if together:
            self._follow_rank0()

    def _follow_rank0(self):
        """Rank 0 sends the version it plays of each stream (0: none); another
        rank loads those it does not play yet, by number. Every rank of the
        group takes part, whatever it holds, so the broadcast pairs up."""
        agents = self.agents
        if not agents:
            return
        versions = torch.tensor([self.held.get(a, [0])[0] for a in agents], dtype=torch.int64,
                                device=self.device)
        dist.broadcast(versions, 0)
        if self.rt.rank == 0:
            return
        for agent, version in zip(agents, versions.tolist()):
            if version == 0:  # rank 0 plays none of it: neither does this rank
                self.players.pop(agent, None)
                self.held.pop(agent, None)
                continue
            if self.held.get(agent, [0])[0] == version or agent not in self.streams:
                continue
            try:
                self._load(agent, self.streams[agent].at(version, timeout=10))
            except agentrt.BusError as e:  # gone meanwhile (keep_last): keep the one held
                log(self.rt, "league: %s version %d that rank 0 plays cannot be read: %s",
                    agent, version, e)

    def _read_newest(self):
        for agent, stream in self.streams.items():
            try:
                got = stream.wait_newer(self.seen.get(agent, 0), timeout=0)
            except agentrt.BusError as e:
                # Nothing newer, or none yet; another error is said once per kind.
                if e.code_name not in ("DEADLINE_EXCEEDED", "NOT_FOUND") and \
                        (agent, e.code_name) not in self.said:
                    self.said.add((agent, e.code_name))
                    log(self.rt, "weights of %s: %s (said once)", agent, e)
                continue
            self._load(agent, got)

    def act(self, seat, obs, gen, num_actions):
        """Actions of `seat` in every world: its agent's newest snapshot, or random."""
        player = self.players.get(self.seats.get(seat))  # a seat no agent plays: random
        if player is None:
            return torch.randint(num_actions, (obs.shape[0],), generator=gen)
        with torch.no_grad():
            logits, _ = player(torch.from_numpy(obs))
        return sample(logits, gen)

    def publish(self, env_steps, model):
        """A new version of this agent's stream; returns once the tensors are
        copied (stored in the background)."""
        if self.own is None:
            return
        try:
            art.publish_weights(self.own, model, env_steps, wait=False)
        except agentrt.BusError as e:
            # Refused now (the channel, the size), or the version before was not
            # stored: training goes on; the others play the versions they have.
            self.publish_failures += 1
            if self.publish_failures <= 5:
                log(self.rt, "bus: a version of %s was not published: %s", self.rt.agent, e)

    def say_played(self):
        """Says which versions this rank played in training: the same on every
        rank of the group."""
        log(self.rt, "league: %d version changes played, digest %s", self.changes,
            self.played.hexdigest()[:16])

    def close(self):
        """Waits for the version in flight; a failure is said, not raised."""
        if self.own is None:
            return
        try:
            self.own.close(30)
        except agentrt.BusError as e:  # the training is done and saved: say it, do not fail
            log(self.rt, "bus: the last version was not stored: %s", e)


def sample(logits, gen):
    """One action per row of `logits`, drawn with generator `gen`."""
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1)


def captures(pool, policy_of_seat, episodes, prey_seats, num_actions, gen):
    """Prey caught per episode over `episodes` episodes of `pool` (reset first)."""
    pool.reset()
    done, caught = 0, 0
    actions = np.zeros(pool.actions.shape, dtype=np.float32)
    while done < episodes:
        obs = pool.observations.copy()
        for seat in range(pool.num_agents):
            actions[:, seat, 0] = policy_of_seat(seat, obs[:, seat]).numpy()
        before = pool.active[:, prey_seats].copy()
        _, _, term, trunc = pool.step(actions)
        after = pool.active[:, prey_seats]
        ended = term | trunc
        # A prey leaves when caught; a world whose prey are all caught terminates (and resets).
        caught += int((before & ~after & ~ended[:, None]).sum()) + int(before[term].sum())
        done += int(ended.sum())
    return caught / done


def main():
    rt = agentrt.Runtime()
    s = settings_of(rt)
    torch.set_num_threads(1)
    use_cuda = bool(rt.gpus)
    if use_cuda and not torch.cuda.is_available():
        raise SystemExit("agent %s rank %d: assigned GPUs %s but torch sees no CUDA device"
                         % (rt.agent, rt.rank, rt.gpus))
    if use_cuda and rt.local_rank >= torch.cuda.device_count():
        # Two ranks on one GPU: NCCL refuses them ("Duplicate GPU detected").
        raise SystemExit("agent %s rank %d: local rank %d needs a GPU of its own but this rank "
                         "sees %d; give the agent one GPU per rank"
                         % (rt.agent, rt.rank, rt.local_rank, torch.cuda.device_count()))
    device = torch.device("cuda", rt.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    # A collective a peer never joins fails after timeout_s instead of hanging.
    dist.init_process_group(backend=backend, init_method="env://", rank=rt.rank,
                            world_size=rt.world_size,
                            timeout=datetime.timedelta(seconds=float(s["timeout_s"])))
    world_args, seat, others = seating(rt, s)
    predators = world_args["predators"]
    prey_seats = list(range(predators, predators + world_args["prey"]))
    log(rt, "%s group of %d (%s on %s, MASTER_PORT %d); pursuit %d predators %d prey; "
        "plays seat %d; others: %s", rt.agent, rt.world_size, backend, device, rt.master_port,
        predators, world_args["prey"], seat, others or "none")

    seed = int(s["seed"]) + 1000 * rt.rank + 7919 * rt.restart_count
    pool = agentrt.EnvPool(ENV, num_envs=s["num_envs"], seed=seed, **world_args)
    obs_size, num_actions = pool.obs_size, pool.action_space["n"]
    torch.manual_seed(int(s["seed"]))  # the same initial weights on every rank
    model = Policy(obs_size, num_actions, s["hidden"]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=s["lr"], eps=1e-5)
    # The work of one env step, for `agentctl status`'s efficiency: a forward pass
    # to act (2 FLOPs per weight) and `epochs` forward+backward passes (6 per weight).
    weights = sum(p.numel() for p in model.parameters())
    rt.set_flops_per_sample(weights * (2 + 6 * s["epochs"]))
    ck = rt.checkpointer

    restored = art.restore(ck, model=model, optimizer=opt)
    outcome = art.restore.last
    log(rt, "checkpoint: %s", outcome.describe)
    for skipped in outcome.skipped:
        log(rt, "checkpoint step %d skipped: %s: %s", skipped["step"], skipped["file"],
            skipped["reason"])
    update, env_steps = 0, 0
    if restored:
        update, env_steps = restored.extra["update"], restored.extra["env_steps"]
        log(rt, "resumed at step %d (update %d) after %d restart(s)", env_steps, update,
            rt.restart_count)
    torch.manual_seed(seed)  # each rank its own sampling stream from here on
    gen = torch.Generator().manual_seed(seed)
    league = League(rt, others, restored, lambda: Policy(obs_size, num_actions, s["hidden"]),
                    device)

    T, N = s["rollout_steps"], s["num_envs"]
    per_update = T * N * rt.world_size
    buf_obs = torch.zeros(T, N, obs_size, device=device)
    buf_act = torch.zeros(T, N, dtype=torch.long, device=device)
    buf_logp = torch.zeros(T, N, device=device)
    buf_val = torch.zeros(T, N, device=device)
    buf_rew = torch.zeros(T, N, device=device)
    buf_done = torch.zeros(T, N, device=device)
    buf_mask = torch.zeros(T, N, device=device)
    actions = np.zeros(pool.actions.shape, dtype=np.float32)
    ep_return = np.zeros(N)
    recent_returns, recent_captures, recent_ends = [], 0, 0
    params = [p for p in model.parameters()]

    def save(wait=True):
        art.save(ck, env_steps, model=model, optimizer=opt, wait=wait,
                 extra={"update": update, "env_steps": env_steps,
                        "league_versions": dict(league.held)})

    pool.reset()
    started = time.monotonic()
    stopped = None
    while env_steps < s["steps"]:
        league.install()
        # Rollout: this rank's worlds, T steps.
        for t in range(T):
            obs = pool.observations.copy()
            mine = torch.from_numpy(obs[:, seat]).to(device)
            with torch.no_grad():
                logits, value = model(mine)
            dist_a = torch.distributions.Categorical(logits=logits)
            a = dist_a.sample()
            buf_obs[t], buf_act[t], buf_logp[t], buf_val[t] = mine, a, dist_a.log_prob(a), value
            buf_mask[t] = torch.from_numpy(pool.active[:, seat].astype(np.float32)).to(device)
            actions[:, seat, 0] = a.cpu().numpy()
            for other in range(pool.num_agents):  # seats no agent plays act at random
                if other != seat:
                    actions[:, other, 0] = league.act(other, obs[:, other], gen, num_actions).numpy()
            before = pool.active[:, prey_seats].copy()
            _, rew, term, trunc = pool.step(actions)
            ended = term | trunc
            buf_rew[t] = torch.from_numpy(rew[:, seat].copy()).to(device)
            # Done for this seat: its world ended, or it left the episode (a caught prey).
            left = ~pool.active[:, seat] & ~ended
            buf_done[t] = torch.from_numpy((ended | left).astype(np.float32)).to(device)
            ep_return += rew[:, seat]
            recent_captures += int(before[term].sum())  # worlds whose last prey was caught
            recent_ends += int(ended.sum())
            for i in np.flatnonzero(ended):
                recent_returns.append(ep_return[i])
                ep_return[i] = 0.0
        with torch.no_grad():
            _, last_value = model(torch.from_numpy(pool.observations[:, seat].copy()).to(device))
        # GAE; an ended world, or a seat that left it (a caught prey), does not bootstrap.
        adv = torch.zeros(T, N, device=device)
        gae = torch.zeros(N, device=device)
        for t in reversed(range(T)):
            next_value = last_value if t == T - 1 else buf_val[t + 1]
            not_done = 1.0 - buf_done[t]
            delta = buf_rew[t] + s["gamma"] * next_value * not_done - buf_val[t]
            gae = delta + s["gamma"] * s["lam"] * not_done * gae
            adv[t] = gae
        ret = adv + buf_val
        b_obs, b_act, b_logp = buf_obs.view(T * N, -1), buf_act.view(-1), buf_logp.view(-1)
        b_adv, b_ret, b_mask = adv.view(-1), ret.view(-1), buf_mask.view(-1)
        mb = T * N // s["minibatches"]
        for _ in range(s["epochs"]):
            order = torch.randperm(T * N, generator=gen).to(device)
            for k in range(s["minibatches"]):
                idx = order[k * mb:(k + 1) * mb]
                mb_adv = b_adv[idx]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                logits, value = model(b_obs[idx])
                d = torch.distributions.Categorical(logits=logits)
                ratio = torch.exp(d.log_prob(b_act[idx]) - b_logp[idx])
                m = b_mask[idx]
                count = m.sum().clamp(min=1.0)
                pg = -torch.min(ratio * mb_adv, ratio.clamp(1 - s["clip"], 1 + s["clip"]) * mb_adv)
                loss = ((pg + s["vf_coef"] * 0.5 * (value - b_ret[idx]) ** 2
                         - s["ent_coef"] * d.entropy()) * m).sum() / count
                opt.zero_grad(set_to_none=False)
                loss.backward()
                # Gradients are averaged inside this agent's group only.
                flat = torch.cat([p.grad.view(-1) for p in params])
                if rt.world_size > 1:
                    dist.all_reduce(flat)
                    flat /= rt.world_size
                offset = 0
                for p in params:
                    n = p.numel()
                    p.grad.copy_(flat[offset:offset + n].view_as(p))
                    offset += n
                nn.utils.clip_grad_norm_(params, s["max_grad_norm"])
                opt.step()
        # The rollout's observation moments, over every rank of the agent, update the
        # normaliser once the update is done (so the update saw the rollout's own
        # normalisation; the same on every replica).
        moments = torch.cat([buf_obs.sum((0, 1)), (buf_obs ** 2).sum((0, 1)),
                             torch.tensor([float(T * N)], device=device)])
        if rt.world_size > 1:
            dist.all_reduce(moments)
        model.observe(moments[:obs_size], moments[obs_size:2 * obs_size], moments[-1])
        update += 1
        env_steps += per_update
        if rt.rank == 0 and update % s["snapshot_every"] == 0:
            league.publish(env_steps, model)
        if rt.rank == 0 and recent_returns:
            rt.report(env_steps, update=update,
                      episode_return_mean=float(np.mean(recent_returns[-100:])),
                      capture_rate=recent_captures / max(1, recent_ends),
                      steps_per_s=env_steps / max(1e-9, time.monotonic() - started),
                      snapshots_received=league.received, loss=float(loss))
            recent_captures = recent_ends = 0
            del recent_returns[:-100]
        rt.set_step(env_steps)
        # Every rank saves its shard of the same step, or none does: agree on it.
        flags = torch.tensor([float(ck.save_due), float(rt.should_stop)], device=device)
        if rt.world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[1] > 0:
            stopped = rt.stop_reason or "stop requested"
            save()
            log(rt, "stopping at step %d (%s): checkpoint saved", env_steps, stopped)
            break
        if flags[0] > 0:
            save(wait=False)
            log(rt, "checkpoint at step %d (update %d)", env_steps, update)
    league.say_played()
    if stopped is None:
        save()
        if rt.rank == 0:
            league.publish(env_steps, model)
        log(rt, "done at step %d (update %d, %.1f s)", env_steps, update,
            time.monotonic() - started)
        if rt.rank == 0 and s["role"] == "predator" and s["eval_episodes"] > 0:
            evaluate(rt, s, model, league, world_args, seat, prey_seats, num_actions, env_steps)
    league.close()
    dist.destroy_process_group()
    rt.close()
    return 0


def evaluate(rt, s, model, league, world_args, seat, prey_seats, num_actions, step):
    """Captures per episode: this policy (plus the other predators' snapshots)
    against the prey's newest snapshot, and random predators against the same."""
    # Wait (bounded) for the prey's snapshot: the evaluation is against a trained prey.
    prey_agents = {league.seats[p] for p in prey_seats if p in league.seats}
    deadline = time.monotonic() + 30
    while league.bus is not None and time.monotonic() < deadline and \
            not prey_agents <= set(league.players):
        league.install(together=False)  # rank 0 alone
        time.sleep(0.1)
    league.install(together=False)
    model = model.cpu()
    predators = world_args["predators"]

    def trained(seat_, obs):
        if seat_ == seat:
            with torch.no_grad():
                logits, _ = model(torch.from_numpy(obs))
            return sample(logits, gen)
        return league.act(seat_, obs, gen, num_actions)

    def random_predators(seat_, obs):
        if seat_ < predators:
            return torch.randint(num_actions, (obs.shape[0],), generator=gen)
        return league.act(seat_, obs, gen, num_actions)

    results = {}
    for name, policy in (("trained", trained), ("random", random_predators)):
        gen = torch.Generator().manual_seed(424242)
        torch.manual_seed(424242)
        pool = agentrt.EnvPool(ENV, num_envs=20, seed=424242, **world_args)
        results[name] = captures(pool, policy, s["eval_episodes"], prey_seats, num_actions, gen)
        pool.close()
    ratio = results["trained"] / results["random"] if results["random"] > 0 else float("inf")
    versions = {a: league.held.get(a, [0])[0] for a in sorted(prey_agents)}
    print("eval " + json.dumps({"agent": rt.agent, "episodes": s["eval_episodes"],
                                "capture_rate": results["trained"],
                                "random_capture_rate": results["random"],
                                "ratio": ratio if ratio != float("inf") else 1e9,
                                "prey_snapshots": versions}), flush=True)
    rt.report(step, eval_capture_rate=results["trained"],
              eval_random_capture_rate=results["random"],
              eval_capture_ratio=ratio if ratio != float("inf") else 1e9)


if __name__ == "__main__":
    sys.exit(main())
