# The start every example test shares (sourced, not run):
#   source "$AGENTRT_SOURCE_DIR/tests/examples/lib.sh"
#   example_test NAME BUILD_DIR [MODULE...]
# sets `build` (BUILD_DIR, absolute), `src` (the source tree) and `tmp` (a
# fresh directory, removed on exit), defines `fail MESSAGE`, and skips the test
# (exit 77) when /usr/bin/python3 cannot import one of the MODULEs, naming the
# Debian package to install.
example_test() {
  test_name=$1
  build=$(cd "$2" && pwd)
  src=${AGENTRT_SOURCE_DIR:?}
  shift 2
  local module
  for module in "$@"; do
    if ! /usr/bin/python3 -c "import $module" >/dev/null 2>&1; then
      echo "$test_name: skipped: /usr/bin/python3 cannot import $module (apt-get install python3-${module%%.*})"
      exit 77
    fi
  done
  tmp=$(mktemp -d "/tmp/agentrt-$test_name.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
}

fail() { echo "$test_name: FAIL: $*" >&2; exit 1; }
