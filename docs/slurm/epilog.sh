#!/bin/bash
# gpufleet Slurm Epilog: removes the allocation file prolog.sh wrote for the job, so the agent
# stops counting its GPUs as held (docs/agent.md). Install beside prolog.sh (docs/agent.md):
#   Epilog=/etc/slurm/gpufleet-epilog.sh
#
# An epilog that fails drains the node: whatever goes wrong is said on stderr (slurmd's log)
# and the script exits 0. A file left behind (a node that crashed) goes with /run at the next
# boot, or by hand.

set -u
export LC_ALL=C
export PATH=${GPUFLEET_HOOK_PATH:-/usr/sbin:/usr/bin:/sbin:/bin}

ALLOC_DIR=${GPUFLEET_ALLOC_DIR:-/run/gpufleet/alloc}

job=${SLURM_JOB_ID:-}
if ! [[ $job =~ ^[0-9]+$ ]]; then
	printf 'gpufleet epilog: SLURM_JOB_ID %s is not a job id; nothing removed\n' "${job@Q}" >&2
	exit 0
fi
# the file, and what a prolog killed while writing it may have left
rm -f -- "$ALLOC_DIR/slurm-$job.json" "$ALLOC_DIR/.slurm-$job".* ||
	printf 'gpufleet epilog, job %s: cannot remove %s/slurm-%s.json\n' "$job" "$ALLOC_DIR" "$job" >&2
exit 0
