#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine, installing and starting one if needed.
# CI machines have no systemd as PID 1, so dockerd is started by hand there (TESTBED-FACTS.md).
set -euo pipefail

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v gpg >/dev/null || need_pkgs+=(gnupg)
command -v apt-ftparchive >/dev/null || need_pkgs+=(apt-utils)
command -v dpkg-deb >/dev/null || need_pkgs+=(dpkg-dev)
command -v git >/dev/null || need_pkgs+=(git)
command -v ssh-keygen >/dev/null || need_pkgs+=(openssh-client)
if ((${#need_pkgs[@]})); then
  echo "installing: ${need_pkgs[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
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
