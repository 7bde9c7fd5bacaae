#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine, installing and starting one if needed,
# and that the tools the unit tests run for real are here (HAProxy's and nginx's own config
# checks and live runs on loopback; Prometheus and its promtool for the monitor's rules and
# config, curl, headless Chromium for the `rigfleet status --html` page, and sqv, Debian 13's
# apt verifier, for `rigfleet check --online`). CI machines have no systemd as PID 1, so
# dockerd is started by hand there (TESTBED-FACTS.md).
#
#   sudo bash scripts/ensure-docker.sh     # make demo and make test run it (idempotent)
set -euo pipefail
case "${1:-}" in
    -h|--help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    "") ;;
    *) echo "ensure-docker.sh: unknown argument: $1 (allowed: --help)" >&2; exit 2 ;;
esac

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v gpg >/dev/null || need_pkgs+=(gnupg)
command -v sqv >/dev/null || need_pkgs+=(sqv)
command -v apt-ftparchive >/dev/null || need_pkgs+=(apt-utils)
command -v dpkg-deb >/dev/null || need_pkgs+=(dpkg-dev)
command -v git >/dev/null || need_pkgs+=(git)
command -v ssh-keygen >/dev/null || need_pkgs+=(openssh-client)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need_pkgs+=(haproxy)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_pkgs+=(nginx-light)
command -v promtool >/dev/null || need_pkgs+=(prometheus)
command -v curl >/dev/null || need_pkgs+=(curl)
command -v chromium >/dev/null || need_pkgs+=(chromium)
if ((${#need_pkgs[@]})); then
  echo "installing: ${need_pkgs[*]}"
  # The tests start their own HAProxy, nginx and Prometheus on loopback: keep the packages'
  # services from starting (policy-rc.d, removed again afterwards when it was ours).
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
  if [ -n "$own_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

docker_ok() { timeout 10 docker info >/dev/null 2>&1; }
if docker_ok; then exit 0; fi

if [ -d /run/systemd/system ]; then
  systemctl start docker
else
  mkdir -p /var/log
  nohup dockerd >/var/log/rigfleet-dockerd.log 2>&1 &
fi
for _ in $(seq 1 60); do
  if docker_ok; then echo "docker engine ready"; exit 0; fi
  sleep 1
done
echo "dockerd did not start; see /var/log/rigfleet-dockerd.log" >&2
tail -20 /var/log/rigfleet-dockerd.log >&2 || true
exit 1
