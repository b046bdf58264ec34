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
if ! redis_ok; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing redis-server from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
    redis_ok || fail "redis-server >= 6.2 still missing after apt-get install"
  else
    fail "redis-server >= 6.2 is not on the PATH: install it (Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis) and run this again"
  fi
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
say "ready: redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), node $(node --version)"
