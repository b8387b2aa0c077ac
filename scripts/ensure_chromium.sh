#!/usr/bin/env bash
# The browser tests drive Debian's Chromium through Playwright; `playwright install` cannot
# download a browser here, so take the distribution package when it is missing.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "Chromium is missing and this is not root: run 'apt-get install -y chromium' as root." >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
