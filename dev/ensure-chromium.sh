#!/usr/bin/env bash
# Makes sure Chromium is installed for the browser tests (web/test),
# installing the Debian package chromium when it is missing and we may;
# otherwise says how to. The tests drive it with playwright-core, whose
# own browser download they do not use. STILLTHERE_CHROMIUM names another
# binary.
set -euo pipefail

chromium=${STILLTHERE_CHROMIUM:-/usr/bin/chromium}
if [ -x "$chromium" ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo"
  fi
fi

if [ "$chromium" = /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; }; then
  echo "chromium is missing: installing the Debian package chromium (a few minutes, once)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! $sudo apt-get install -y --no-install-recommends chromium >/dev/null; then
    $sudo apt-get update -qq
    $sudo apt-get install -y --no-install-recommends chromium >/dev/null
  fi
  [ -x "$chromium" ] && exit 0
fi

cat >&2 <<MSG
Chromium is not at $chromium, and it could not be installed automatically.
Install it, then run the command again:
  Debian/Ubuntu:  sudo apt-get install -y chromium
  elsewhere:      set STILLTHERE_CHROMIUM to a Chromium or Chrome binary
MSG
exit 1
