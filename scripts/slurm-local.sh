#!/usr/bin/env bash
# A single-node SLURM cluster on this host, for trying the cluster profile and for CI
# (docs/cluster.md). Needs root and Debian's packages: apt-get install slurm-wlm munge.
#
#   scripts/slurm-local.sh start    # idempotent: a running cluster is left as it is
#   scripts/slurm-local.sh status   # sinfo, or exit 1 when it is not running
#   scripts/slurm-local.sh stop     # stops the daemons by their pid files
#
# What it starts: munged, slurmctld and slurmd as root on 127.0.0.1, without systemd or
# cgroups (proctrack/linuxproc), without an accounting database (so the profile's status
# command is squeue, not sacct), and with SERVELAB_SLURM_GPUS fake GPUs (default 2) declared
# as a generic resource, so that a rule requesting GPUs can be scheduled on a host without any.
# State, logs and pid files live in SERVELAB_SLURM_DIR (default /tmp/servelab-slurm); the
# configuration is written to /etc/slurm/slurm.conf, which is only ever replaced when this
# script wrote it.
set -euo pipefail

DIR=${SERVELAB_SLURM_DIR:-/tmp/servelab-slurm}
GPUS=${SERVELAB_SLURM_GPUS:-2}
CONF=/etc/slurm/slurm.conf
GRES=/etc/slurm/gres.conf
MARK="# written by servelab scripts/slurm-local.sh"

die() {
	echo "slurm-local: $*" >&2
	exit 1
}

alive() { # alive PIDFILE: the process named in PIDFILE is running (a zombie is not)
	local pid
	[[ -s $1 ]] || return 1
	pid=$(cat "$1")
	[[ -r /proc/$pid/stat ]] && [[ $(cut -d ')' -f 2 "/proc/$pid/stat" | cut -d ' ' -f 2) != Z ]]
}

write_conf() {
	local host node
	host=$(hostname -s)
	for f in "$CONF" "$GRES"; do
		if [[ -e $f ]] && ! grep -qF "$MARK" "$f"; then
			die "$f exists and was not written by this script: move it away or use that cluster"
		fi
	done
	# the node as slurmd sees it (CPUs, sockets, cores, threads, memory), minus its own name
	node=$(slurmd -C | head -n 1 | sed -E 's/^NodeName=[^ ]+ //')
	mkdir -p /etc/slurm "$DIR/state" "$DIR/spool"
	cat >"$CONF" <<EOF
$MARK
ClusterName=servelab
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MailProg=/bin/true
# finished jobs stay visible to squeue for 10 minutes: the profile's status checks read them
MinJobAge=600
ReturnToService=2
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 $node Gres=gpu:$GPUS State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
	# slurmd wants a device file per GPU: the terminals stand in for them (nothing opens them)
	printf '%s\nNodeName=%s Name=gpu File=/dev/tty[0-%s]\n' "$MARK" "$host" "$((GPUS - 1))" >"$GRES"
}

start_munge() {
	[[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key is missing: apt-get install munge"
	if alive /run/munge/munged.pid; then
		return
	fi
	# munged refuses to start without its run directory, owned by its user
	mkdir -p /run/munge /var/log/munge /var/lib/munge
	chown munge:munge /run/munge /var/log/munge /var/lib/munge
	chmod 0755 /run/munge
	if [[ $(id -u) == 0 ]] && id munge >/dev/null 2>&1; then
		runuser -u munge -- /usr/sbin/munged
	else
		/usr/sbin/munged
	fi
}

wait_ready() {
	local i
	for i in $(seq 1 60); do
		if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
			return
		fi
		sleep 0.5
	done
	tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 || true
	die "the node did not come up within 30 s (logs above, in $DIR)"
}

case "${1:-}" in
start)
	command -v slurmctld >/dev/null || die "slurmctld not found: apt-get install slurm-wlm munge"
	[[ $(id -u) == 0 ]] || die "start needs root (slurmd runs jobs as their users)"
	if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
		wait_ready
		echo "slurm-local: already running (state in $DIR)"
		exit 0
	fi
	# one cluster per host: daemons this state folder did not start are another cluster's
	for daemon in slurmctld slurmd; do
		if ! alive "$DIR/$daemon.pid" && other=$(pgrep -x "$daemon"); then
			die "a $daemon (pid ${other//$'\n'/ }) already runs on this host, not started with $DIR: stop that cluster first (scripts/slurm-local.sh stop, with its SERVELAB_SLURM_DIR)"
		fi
	done
	write_conf
	start_munge
	alive "$DIR/slurmctld.pid" || slurmctld -c # -c: from clean state, no jobs of an old run
	alive "$DIR/slurmd.pid" || slurmd
	wait_ready
	echo "slurm-local: running (state in $DIR):"
	sinfo -N -o '%N %P %c CPUs, %m MB, %G, %T'
	;;
status)
	alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" || die "not running (state in $DIR)"
	sinfo -N -o '%N %P %c CPUs, %m MB, %G, %T'
	;;
stop)
	for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" /run/munge/munged.pid; do
		if alive "$pidfile"; then
			pid=$(cat "$pidfile")
			kill "$pid"
			for _ in $(seq 1 40); do
				alive "$pidfile" || break
				sleep 0.25
			done
			kill -9 "$pid" 2>/dev/null || true
		fi
	done
	echo "slurm-local: stopped"
	;;
*)
	die "usage: scripts/slurm-local.sh start|status|stop"
	;;
esac
