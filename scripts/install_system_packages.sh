#!/usr/bin/env bash
# Debian packages for the tests that drive real components: chromium + chromium-driver (the report in a real
# browser) and slurm-wlm + munge (a one-host SLURM cluster). Installs only what is missing, only as root, and
# says what it does first (apt takes one to three minutes). Never fails the caller: a test that lacks a package
# skips with the reason.
set -u
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system packages missing (${need[*]}); not root or no apt-get, so the tests that need them will skip" >&2
    exit 0
fi
echo "installing Debian packages ${need[*]} for the browser and SLURM tests (usually 1-3 minutes)..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/ddpbench-apt.log 2>&1; then
    echo "apt-get failed (log: /tmp/ddpbench-apt.log); the tests that need ${need[*]} will skip" >&2
fi
exit 0
