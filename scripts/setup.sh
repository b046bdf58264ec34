#!/usr/bin/env bash
# Sets up a fresh machine that has Node.js >= 20.18 and npm: redis-server (from Debian's
# packages when this is root with apt; otherwise one line saying what to install), the
# workspace's npm dependencies, and the build. Safe to run again: each step is skipped
# when it is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }
fail() { printf 'setup: %s\n' "$*" >&2; exit 1; }

node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=18)?0:1)' \
  || fail "Node.js >= 20.18 is required (found $(node --version)); install it from your distribution or nodejs.org"

redis_ok() {
  command -v redis-server >/dev/null 2>&1 || return 1
  local v; v=$(redis-server --version | sed -n 's/.*v=\([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$v" ] && awk -v v="$v" 'BEGIN { split(v, p, "."); exit !(p[1] > 6 || (p[1] == 6 && p[2] >= 2)) }'
}
# Debian packages the stack and its tests need, installed when this is root with apt.
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $* from Debian's packages"
    if [ -z "${apt_updated:-}" ]; then DEBIAN_FRONTEND=noninteractive apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  else
    return 1
  fi
}
if ! redis_ok; then
  apt_install redis-server \
    || fail "redis-server >= 6.2 is not on the PATH: install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis) and run this again"
  redis_ok || fail "redis-server >= 6.2 still missing after apt-get install"
fi
# The tests' own tools: promtool and prometheus check the alert rules and the dashboard
# against a live stack; Chromium loads the dispatcher's /status page.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  apt_install prometheus || fail "prometheus and promtool are not on the PATH: install them (Debian/Ubuntu: sudo apt-get install prometheus) and run this again"
  # The package starts a server of its own; the tests run theirs on free ports.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
fi
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium || fail "chromium is not on the PATH: install it (Debian/Ubuntu: sudo apt-get install chromium) and run this again"
fi
# kubectl renders the Kubernetes bundle (kubectl kustomize) in the deploy test.
if ! command -v kubectl >/dev/null 2>&1; then
  fail "kubectl is not on the PATH: install it (https://kubernetes.io/docs/tasks/tools/) and run this again"
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
say "ready: redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), node $(node --version), $(promtool --version 2>&1 | head -1), $(chromium --version 2>/dev/null)"
