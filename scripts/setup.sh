#!/usr/bin/env bash
# Installs the Debian 12 packages agentrt needs to build, test and run.
# Idempotent and quiet when nothing is missing. Uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev
  libzmq3-dev cppzmq-dev libyaml-cpp-dev libopenmpi-dev openmpi-bin
  catch2 nlohmann-json3-dev libcli11-dev libfmt-dev libeigen3-dev libisal-dev libsimdjson-dev libzstd-dev
  libcpp-httplib-dev python3-prometheus-client chromium python3-websocket python3-matplotlib
  python3 python3-grpcio python3-grpc-tools python3-numpy python3-torch
  slurm-wlm munge
  patchelf debootstrap tcpdump
)
if [ "${AGENTRT_SETUP_EXTRA:-}" != "" ]; then
  read -r -a extra <<<"$AGENTRT_SETUP_EXTRA"
  packages+=("${extra[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
