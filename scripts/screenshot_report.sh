#!/usr/bin/env bash
# A report page as a browser draws it: scripts/screenshot_report.sh PAGE.html [OUT.png] [HEIGHT]
# (python -m lopd_ray.report RUN [RUN ...] --html PAGE.html writes the page; headless Chromium takes the picture:
# apt-get install chromium).
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: scripts/screenshot_report.sh PAGE.html [OUT.png] [HEIGHT]" >&2; exit 2; }
page="$(realpath "$1")"
out="$(realpath -m "${2:-${page%.html}.png}")"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[ -n "$browser" ] || { echo "screenshot: no Chromium on this machine: apt-get install chromium" >&2; exit 2; }
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="1280,${3:-2400}" \
  --screenshot="$out" "file://$page" >/dev/null 2>&1
echo "Wrote $out"
