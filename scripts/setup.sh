#!/usr/bin/env bash
# Sets up a fresh machine that has Node.js >= 20.18.1 and npm: redis-server (from Debian's
# packages when this is root with apt), the tools some tests need (prometheus and promtool,
# chromium, from Debian's packages likewise; kubectl is never installed, only looked for),
# the workspace's npm dependencies, and the build. Safe to run again: each step is skipped
# when it is already done.
#
# The npm install and the build always run: `sluice up` needs neither the test tools nor
# kubectl. Exit status: 1 when Node.js is too old, or redis-server is missing (the stack and
# nearly every test need it); a missing test tool is a warning that names the tests needing
# it, exit 0, except under CI (the CI variable set, as .ci/run does), where the whole test
# run follows and needs every tool, so a missing one is exit 1, after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: warning: %s\n' "$*" >&2; }
fail() { printf 'setup: %s\n' "$*" >&2; exit 1; }

# 20.18.1: undici 7's own floor (its package.json engines).
node -e 'const [a,b,c]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&(b>18||(b===18&&c>=1)))?0:1)' \
  || fail "Node.js >= 20.18.1 is required (found $(node --version)); install it from your distribution or nodejs.org"

redis_ok() {
  command -v redis-server >/dev/null 2>&1 || return 1
  local v; v=$(redis-server --version | sed -n 's/.*v=\([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$v" ] && awk -v v="$v" 'BEGIN { split(v, p, "."); exit !(p[1] > 6 || (p[1] == 6 && p[2] >= 2)) }'
}
# Debian packages the stack and its tests need, installed when this is root with apt. A failed
# install is reported and set-up goes on: what is still missing is named at the end.
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $* from Debian's packages"
    if [ -z "${apt_updated:-}" ]; then
      DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
      apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  else
    return 1
  fi
}
have() { command -v "$1" >/dev/null 2>&1; }

# What is still missing once set-up has tried: one line each, printed after the build.
missing_stack=''
missing_tests=()

if ! redis_ok; then
  apt_install redis-server || true
  redis_ok || missing_stack="redis-server >= 6.2 is not on the PATH: install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis) and run this again; \`sluice up\` needs it unless REDIS_URL names a Redis, and so do nearly all tests"
fi
# The tests' own tools: promtool and prometheus check the alert rules and the dashboard
# against a live stack; Chromium loads the dispatcher's /status page.
if ! have promtool || ! have prometheus; then
  if apt_install prometheus; then
    # The package starts a server of its own; the tests run theirs on free ports.
    if have systemctl; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
  fi
  have promtool || missing_tests+=("promtool is not on the PATH (Debian/Ubuntu: sudo apt-get install prometheus): test/e2e/prometheus-rules.test.ts, prometheus-live.test.ts and deploy-bundle.test.ts need it")
  have prometheus || missing_tests+=("prometheus is not on the PATH (Debian/Ubuntu: sudo apt-get install prometheus): test/e2e/prometheus-live.test.ts needs it")
fi
if ! have chromium && [ -z "${CHROMIUM_BIN:-}" ]; then
  apt_install chromium || true
  have chromium || missing_tests+=("chromium is not on the PATH (Debian/Ubuntu: sudo apt-get install chromium; or set CHROMIUM_BIN): test/e2e/status-page.test.ts needs it")
fi
# kubectl renders the Kubernetes bundle (kubectl kustomize) in the deploy test. Debian's
# kubernetes-client is too old for the bundle's kustomize, so it is not installed here.
if ! have kubectl; then
  missing_tests+=("kubectl is not on the PATH (https://kubernetes.io/docs/tasks/tools/): test/e2e/deploy-bundle.test.ts needs it")
fi

# npm ci only when the lockfile changed since the last install.
stamp=node_modules/.sluice-lock
lock_hash=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_hash" ]; then
  say "installing npm dependencies"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$lock_hash" > "$stamp"
fi

say "building"
npm run --silent build

# (The `+` form: bash before 4.4 calls an empty array unbound under `set -u`.)
for line in ${missing_tests[@]+"${missing_tests[@]}"}; do warn "$line"; done
[ -z "$missing_stack" ] || fail "$missing_stack"
if [ "${#missing_tests[@]}" -gt 0 ]; then
  # CI runs every test next: a missing tool would fail it later, less clearly.
  [ -z "${CI:-}" ] || fail "CI is set and ${#missing_tests[@]} test tool(s) are missing (above)"
  say "ready for \`sluice up\` and the tests that need none of the tools above"
  exit 0
fi
say "ready: redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), node $(node --version), $(promtool --version 2>&1 | head -1), $(chromium --version 2>/dev/null || echo "chromium at $CHROMIUM_BIN")"
