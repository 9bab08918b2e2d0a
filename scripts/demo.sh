#!/usr/bin/env bash
# `make demo`: runs the quickstart config (configs/demo.yaml) on this machine,
# then prints a per-agent summary and writes one learning-curve SVG per agent.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
export PATH="$PWD/$build/bin:$PATH"   # agent-worker is the agents' default command
before=$(ls -d runs/demo-*/ 2>/dev/null | sort || true)
rc=0
"$build/bin/agentctl" run configs/demo.yaml || rc=$?
run_dir=$(comm -13 <(echo "$before") <(ls -d runs/demo-*/ 2>/dev/null | sort) | tail -n 1)
if [ -z "$run_dir" ]; then
  echo "demo: agentctl run made no run directory" >&2
  exit 1
fi
/usr/bin/python3 scripts/plot_curves.py "$run_dir"
exit $rc
