#!/bin/bash
# gpufleet Slurm Epilog: removes the allocation file prolog.sh wrote for the job, so the agent
# stops counting its GPUs as held (docs/agent.md). Install beside prolog.sh (docs/agent.md):
#   Epilog=/etc/slurm/gpufleet-epilog.sh
# It reads GPUFLEET_ALLOC_DIR from /etc/default/gpufleet as prolog.sh does.
#
# An epilog that fails drains the node: whatever goes wrong is said on stderr and to syslog
# (tag gpufleet-epilog), and the script exits 0. A file left behind (a node that crashed) goes
# with /run at the next boot, or by hand.

set -u
export LC_ALL=C
export PATH=${GPUFLEET_HOOK_PATH:-/usr/sbin:/usr/bin:/sbin:/bin}

say() {
	local msg
	printf -v msg 'gpufleet epilog, job %s: %s' "${SLURM_JOB_ID:-?}" "$*"
	printf '%s\n' "$msg" >&2
	if command -v logger >/dev/null 2>&1; then
		timeout 2 logger -t gpufleet-epilog -p daemon.warning -- "$msg" >/dev/null 2>&1 || true
	fi
}

# GPUFLEET_ALLOC_DIR from /etc/default/gpufleet, parsed as prolog.sh parses it (never sourced:
# this runs as root), believed only where root owns the file and nobody else may write it.
read_settings() {
	local file=${GPUFLEET_DEFAULTS:-/etc/default/gpufleet} line value owner
	[[ -e $file ]] || return 0
	if ! owner=$(stat -L -c '%u %a' -- "$file" 2>/dev/null) || ! [[ $owner =~ ^0\ [0-7]*[0145][0145]$ ]]; then
		say "ignoring $file: not owned by root, or writable by others (${owner:-unreadable})"
		return 0
	fi
	while IFS= read -r line || [[ -n $line ]]; do
		[[ $line =~ ^[[:space:]]*GPUFLEET_ALLOC_DIR=(\"[^\"]*\"|\'[^\']*\'|[^\"\'[:space:]#]*)[[:space:]]*(#.*)?$ ]] || continue
		value=${BASH_REMATCH[1]}
		[[ $value == [\"\']* ]] && value=${value:1:-1}
		if [[ $value =~ ^/[A-Za-z0-9._/+@:-]*$ && $value != *..* ]]; then
			[[ -z ${GPUFLEET_ALLOC_DIR+set} ]] && GPUFLEET_ALLOC_DIR=$value
		else
			say "ignoring GPUFLEET_ALLOC_DIR in $file: ${value@Q} is not an absolute path"
		fi
	done <"$file"
}

read_settings
ALLOC_DIR=${GPUFLEET_ALLOC_DIR:-/run/gpufleet/alloc}

job=${SLURM_JOB_ID:-}
if ! [[ $job =~ ^[0-9]+$ ]]; then
	say "SLURM_JOB_ID ${job@Q} is not a job id; nothing removed"
	exit 0
fi
# the file, and what a prolog killed while writing it may have left
rm -f -- "$ALLOC_DIR/slurm-$job.json" "$ALLOC_DIR/.slurm-$job".* ||
	say "cannot remove $ALLOC_DIR/slurm-$job.json; the agent counts the job's GPUs as held until it goes"
exit 0
