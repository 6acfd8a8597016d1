#!/usr/bin/env bash
# Installs bubblewrap (`bwrap`), which jails the code env's candidate programs, where it is missing: with apt-get as
# root or through passwordless sudo. Elsewhere it only says so (the code env then stops with the same advice).
command -v bwrap >/dev/null && exit 0
as_root=""
[ "$(id -u)" = 0 ] || as_root="sudo -n"
if command -v apt-get >/dev/null && { [ -z "$as_root" ] || sudo -n true 2>/dev/null; }; then
  export DEBIAN_FRONTEND=noninteractive
  $as_root apt-get install -y -qq bubblewrap >/dev/null 2>&1 ||
    { $as_root apt-get update -qq && $as_root apt-get install -y -qq bubblewrap >/dev/null; } && exit 0
fi
echo "bubblewrap is not installed (sudo apt-get install bubblewrap): the code env needs it" >&2
