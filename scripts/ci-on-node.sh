#!/usr/bin/env bash
# Runs what CI runs (.ci/run) on another Node.js version: the official binary from npm's
# node-linux-<arch> package (the registry these machines reach), in a fresh clone of HEAD
# (committed work only), so the README's "runs on Node 20, 22 and 24" can be checked anywhere
# npm can install. Usage: scripts/ci-on-node.sh 24.22.3
set -euo pipefail
version=${1:?usage: scripts/ci-on-node.sh <Node.js version, e.g. 24.22.3>}
case "$(uname -m)" in
  x86_64) arch=x64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "ci-on-node: no node-linux package for $(uname -m)" >&2; exit 1 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-node-$version-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/node"
(cd "$work" && npm pack --silent "node-linux-$arch@$version" > /dev/null)
tar xzf "$work/node-linux-$arch-$version.tgz" -C "$work/node" --strip-components=1
git clone -q "$root" "$work/clone"
cd "$work/clone"
# npm and every process the tests start (process.execPath) run on this node.
PATH="$work/node/bin:$PATH"
echo "ci-on-node: $(node --version) on $(git log -1 --format='%h %s' | cut -c1-72)"
bash .ci/run
