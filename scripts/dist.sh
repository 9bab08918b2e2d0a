#!/usr/bin/env bash
# `make dist`: agentrt-<version>-linux-<arch>.tar.gz, agentrt for any x86_64
# Linux with a recent enough glibc and libstdc++, none of the build's packages
# needed there. Layout of the tarball's one top folder:
#
#   bin/       the programs `cmake --install` installs (cmake/install.cmake)
#   lib/       libagentrt_c.so, libagentrt_cuda.so (CUDA builds) and every shared
#              library they and the programs need that a plain glibc system lacks
#              (gRPC, protobuf, ZeroMQ, yaml-cpp, Open MPI, ISA-L, fmt, OpenSSL, ...),
#              each found through RUNPATH ($ORIGIN/../lib for programs, $ORIGIN for
#              libraries); glibc, libstdc++, libgcc_s, NCCL, cudart and libcuda are
#              the machine's own
#   python/    the package `agentrt` (agentctl puts it on its agents' PYTHONPATH)
#   configs/, examples/   the sample configurations and the PyTorch examples
#   check/     scripts/gpu_check.sh and, in a CUDA build, the `gpu` test programs
#              and the GPU benchmark it runs
#   README.md  what the tarball needs from the host, measured from its files
#
# Usage: scripts/dist.sh BUILD [OUT_DIR]   (prints the tarball's path last)
set -euo pipefail
build=${1:-build}
out=${2:-.}
src=$(cd "$(dirname "$0")/.." && pwd)
fail() {
  echo "dist: $*" >&2
  exit 1
}
[ -x "$build/bin/agentctl" ] || fail "$build/bin/agentctl not found: build first (make build)"
for tool in patchelf objdump readelf ldd; do
  command -v "$tool" >/dev/null || fail "$tool not found (scripts/setup.sh installs it)"
done
version=$("$build/bin/agentctl" --version | awk '{print $2}')
[ -n "$version" ] || fail "agentctl --version printed no version"
name=agentrt-$version-linux-$(uname -m)
stage=$(mktemp -d /tmp/agentrt-dist.XXXXXX)
trap 'rm -rf "$stage"' EXIT
top=$stage/$name
mkdir -p "$top"/{bin,lib,python,check}

# What a user gets is what cmake/install.cmake installs: take it from there.
cmake --install "$build" --prefix "$stage/install" >/dev/null
cp -a "$stage/install/bin/." "$top/bin/"
find "$stage/install" -path "$stage/install/include" -prune -o -name '*.so*' -print |
  while read -r f; do cp -P "$f" "$top/lib/"; done
python_pkg=$(find "$stage/install" -type d -path '*/agentrt/python/agentrt' | head -1)
[ -n "$python_pkg" ] || fail "the install holds no Python package (agentrt/python/agentrt)"
cp -a "$python_pkg" "$top/python/"
cp -a "$src/configs" "$src/examples" "$top/"
rm -rf "$top/examples/CMakeLists.txt" "$top/examples/custom_env"  # needs the build's headers

# The GPU check and what it runs (the `gpu` programs only exist in a CUDA build).
cp "$src/scripts/gpu_check.sh" "$top/check/"
for program in "$build/tests/group_nccl_test" "$build/bench/bench_collectives"; do
  [ -x "$program" ] && cp "$program" "$top/check/"
done
mkdir -p "$top/check/python"
cp "$src/tests/python/agentrt_torch_test.py" "$top/check/python/"
cp "$src/bench/python/python_bench.py" "$top/check/python/"
cp "$src/tests/agentrt_testing.py" "$top/check/"

# The libraries the programs and libraries need, less those the host provides.
host_provided='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libpthread|libdl\.so|librt\.so|libutil|libresolv|libanl|libstdc\+\+|libgcc_s|libnccl|libcudart|libcuda\.so|libnvidia)'
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elf_files() { find "$top/bin" "$top/lib" "$top/check" -type f -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print; }
missing=""
while read -r f; do
  while read -r soname path; do
    if [ "$path" = "not" ]; then
      [[ $soname =~ $host_provided ]] || missing+=" $soname (needed by ${f#"$top"/})"
    elif ! [[ $soname =~ $host_provided ]] && [ ! -e "$top/lib/$soname" ]; then
      cp -L "$path" "$top/lib/$soname"
    fi
  done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" {print $1, $3}')
done < <(elf_files)
[ -z "$missing" ] || fail "libraries not found:$missing"
mapfile -t elves < <(elf_files)  # the bundle's programs and libraries, complete now

# Programs find lib/ through RUNPATH $ORIGIN/../lib, libraries their neighbours
# through $ORIGIN; GPU support also looks where CUDA installs itself.
while read -r f; do
  case "$f" in
    "$top"/lib/libagentrt_cuda.so*) rpath='$ORIGIN:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib' ;;
    "$top"/lib/*) rpath='$ORIGIN' ;;
    *) rpath='$ORIGIN/../lib' ;;
  esac
  chmod u+w "$f"
  strip --strip-unneeded "$f" 2>/dev/null || true
  patchelf --set-rpath "$rpath" "$f"
done < <(printf '%s\n' "${elves[@]}")

# What the host must provide: the newest symbol versions any file asks for.
versions=$({ objdump -T "${elves[@]}" 2>/dev/null || true; } | { grep -oE 'GLIBC(XX)?_[0-9.]*[0-9]' || true; } | sort -uV)
glibc=$(grep '^GLIBC_' <<<"$versions" | tail -1 || true)
glibcxx=$(grep '^GLIBCXX_' <<<"$versions" | tail -1 || true)
[ -n "$glibc" ] && [ -n "$glibcxx" ] || fail "objdump -T found no GLIBC/GLIBCXX symbol versions in the bundle"
bundled=$(find "$top/lib" -maxdepth 1 -type f -printf '%f\n' | sed 's/\.so.*//' | sort -u | tr '\n' ' ')
sed -e "s/@VERSION@/$version/g" -e "s/@GLIBC@/${glibc#GLIBC_}/g" -e "s/@GLIBCXX@/${glibcxx#GLIBCXX_}/g" \
  -e "s/@BUNDLED@/$bundled/g" -e "s/@NAME@/$name/g" "$src/scripts/dist_readme.md" >"$top/README.md"

mkdir -p "$out"
tarball=$(cd "$out" && pwd)/$name.tar.gz
tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name -czf "$tarball" "$name"
echo "dist: $(du -h "$tarball" | cut -f1) ($(du -sh "$top" | cut -f1) unpacked), needs glibc ${glibc#GLIBC_}, libstdc++ ${glibcxx#GLIBCXX_}" >&2
echo "$tarball"
