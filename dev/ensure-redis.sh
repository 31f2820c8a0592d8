#!/usr/bin/env bash
# Makes sure redis-server (7.0 or newer) is installed, installing the Debian
# package when it is missing and we may; otherwise says how to.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo"
  fi
fi

if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
  echo "redis-server is missing: installing the Debian package redis-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y --no-install-recommends redis-server >/dev/null; then
    $sudo apt-get update -qq
    $sudo apt-get install -y --no-install-recommends redis-server >/dev/null
  fi
  # The package may start a system-wide server on 6379; stillthere starts
  # its own on a free port and needs none.
  command -v redis-server >/dev/null 2>&1 && exit 0
fi

cat >&2 <<'MSG'
redis-server is not installed, and it could not be installed automatically.
Install it, then run the command again:
  Debian/Ubuntu:  sudo apt-get install -y redis-server
  macOS:          brew install redis
MSG
exit 1
