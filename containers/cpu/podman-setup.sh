#!/usr/bin/env bash
# Make this host run containers with podman (Debian or Ubuntu, as root): install podman, runc and
# debootstrap when missing, and write /etc/containers/containers.conf when this host needs it.
#
#   containers/cpu/podman-setup.sh
#
# What a host may need, each checked here rather than assumed:
# - no CAP_SYS_RESOURCE (a container or VM without it): podman's default nofile/nproc limits
#   (1048576) cannot be set ("setrlimit RLIMIT_NOFILE: Operation not permitted"), so lower
#   default limits (nproc above 32768 still fails under runc there);
# - cgroups in hybrid mode (v1 with a unified hierarchy beside it): crun refuses ("cgroups in
#   hybrid mode not supported"), so runc;
# - no systemd: cgroupfs as the cgroup manager.
# An existing containers.conf is left as it is (the script says so).
set -euo pipefail
conf=/etc/containers/containers.conf
missing=()
for cmd in podman runc debootstrap; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "podman-setup.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cap_eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
no_sys_resource=$(( (16#$cap_eff >> 24) & 1 ? 0 : 1 ))
hybrid=0; [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || hybrid=1
no_systemd=0; [ -d /run/systemd/system ] || no_systemd=1
if [ $(( no_sys_resource + hybrid + no_systemd )) -eq 0 ]; then
    echo "podman-setup.sh: podman $(podman --version | awk '{print $3}'), no configuration needed" >&2
    exit 0
fi
if [ -e "$conf" ] && ! grep -q '^# written by servelab' "$conf"; then
    echo "podman-setup.sh: $conf exists and is not servelab's; left as it is" >&2
    exit 0
fi
mkdir -p /etc/containers
{
    echo "# written by servelab's containers/cpu/podman-setup.sh for this host:"
    echo "# no CAP_SYS_RESOURCE=$no_sys_resource, cgroups not v2-only=$hybrid, no systemd=$no_systemd"
    echo "[containers]"
    [ "$no_sys_resource" = 1 ] && echo 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]'
    echo "[engine]"
    [ "$hybrid" = 1 ] && echo 'runtime = "runc"'
    [ "$no_systemd" = 1 ] && { echo 'cgroup_manager = "cgroupfs"'; echo 'events_logger = "file"'; }
} > "$conf"
echo "podman-setup.sh: podman $(podman --version | awk '{print $3}'), wrote $conf" >&2
