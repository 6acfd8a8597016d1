#!/usr/bin/env bash
# Stops the Ray processes of this machine's node.
set -euo pipefail
source "$(dirname "$0")/env.sh"
ray stop --grace-period 10 >/dev/null || ray stop --force
