#!/usr/bin/env bash
# Install (Debian, as root) and start a Docker engine, plus debootstrap (sandbox image builds) and bubblewrap
# (sandboxed code execution). Safe to run again: it skips whatever is already there.
set -euo pipefail

if docker info >/dev/null 2>&1 && command -v debootstrap >/dev/null && command -v bwrap >/dev/null; then
    echo "docker: engine reachable; debootstrap and bubblewrap installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "docker: installing packages and starting dockerd needs root; run: sudo $0" >&2
    exit 1
fi

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v bwrap >/dev/null || missing+=(bubblewrap)
if [ ${#missing[@]} -gt 0 ]; then
    echo "docker: apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    log=/var/log/skyrl-dockerd.log
    echo "docker: starting dockerd in the background (log: $log)"
    nohup dockerd >"$log" 2>&1 &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    if ! docker info >/dev/null 2>&1; then
        echo "docker: dockerd did not come up within 30 s; last lines of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
fi
echo "docker: engine reachable ($(docker version --format '{{.Server.Version}}'))"
