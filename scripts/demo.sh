#!/usr/bin/env bash
# `make demo`: runs the quickstart config on this machine.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
exec "$build/bin/agentctl" plan configs/demo.yaml
