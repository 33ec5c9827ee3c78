#!/bin/bash
# gpufleet Slurm Prolog: tells the gpufleet agent on this node which GPUs a job holds, so that
# an allocated GPU no process of the job uses is held by the job, not parked (docs/agent.md).
#
# Writes $ALLOC_DIR/slurm-$SLURM_JOB_ID.json, e.g.
#   {"kind": "slurm", "id": "48213", "user": "alice", "account": "nlp", "gpus": [0, 1]}
# whole or not at all: into a temporary dot file of the same directory, renamed into place
# (the agent reads no dot file). epilog.sh removes it when the job ends.
#
# Install (docs/agent.md, "Slurm"): copy to every GPU node, e.g. /etc/slurm/gpufleet-prolog.sh,
# mode 0755 owned by root, and in slurm.conf
#   Prolog=/etc/slurm/gpufleet-prolog.sh
#   Epilog=/etc/slurm/gpufleet-epilog.sh
#   PrologFlags=Alloc      (run at allocation, so an salloc that starts nothing still counts)
# Sites that already run a prolog call this one from theirs (or list both in a Prolog= glob).
#
# Slurm runs the node Prolog as root with a small environment of its own (not slurmd's): the
# job id, user, account and GPUs, but neither the job's name nor its array task id (see
# Slurm's prolog_epilog guide). The agent learns those from the job's processes where it may
# read their environment; set LOOKUP=1 below to ask the controller instead (one squeue call per
# job start, which Slurm's documentation advises against in a prolog).
#
# A prolog that fails drains the node: whatever goes wrong is said on stderr (slurmd's log)
# and the script exits 0.

set -u
export LC_ALL=C
# The prolog has no search path of its own; GPUFLEET_HOOK_PATH only for the tests.
export PATH=${GPUFLEET_HOOK_PATH:-/usr/sbin:/usr/bin:/sbin:/bin}

ALLOC_DIR=${GPUFLEET_ALLOC_DIR:-/run/gpufleet/alloc}  # the agent's --alloc-dir
LOOKUP=${GPUFLEET_PROLOG_LOOKUP:-0}
SQUEUE=${GPUFLEET_SQUEUE:-squeue}

say() {
	printf 'gpufleet prolog, job %s: %s\n' "${SLURM_JOB_ID:-?}" "$*" >&2
}

# A JSON string of any bytes: Slurm passes names as the user typed them, in any encoding, and
# under LC_ALL=C bash sees bytes. Valid UTF-8 is kept; each stretch of bytes that is not (a
# Latin-1 "\xe9", a lone "\xff") becomes one U+FFFD, as decoders replace them (the Unicode
# standard's "maximal subpart" rule); '"', '\' and control characters are escaped. At most
# 1,024 bytes of the value are written, so the file stays far below the agent's 64 KiB.
json_str() {
	local s=${1:0:1024}
	if [[ $s != *[!\ -~]* ]]; then # printable ASCII only: the common case, without the loop
		s=${s//\\/\\\\}
		printf '"%s"' "${s//\"/\\\"}"
		return
	fi
	local out="" c n i=0 len=${#s} need lo hi k m
	while ((i < len)); do
		c=${s:i:1}
		printf -v n '%d' "'$c"
		((n = (n + 256) % 256, i += 1)) # some bash versions give bytes above 127 a sign
		if ((n < 0x80)); then
			if ((n == 0x22 || n == 0x5c)); then # '"' and '\'
				out+="\\$c"
			elif ((n < 0x20 || n == 0x7f)); then
				printf -v c '\\u%04x' "$n"
				out+=$c
			else
				out+=$c
			fi
			continue
		fi
		# RFC 3629: the sequence's length after its lead byte, and its second byte's range
		need=0 lo=0x80 hi=0xbf
		if ((n >= 0xc2 && n <= 0xdf)); then
			need=1
		elif ((n == 0xe0)); then
			need=2 lo=0xa0
		elif ((n >= 0xe1 && n <= 0xef)); then
			need=2
			((n == 0xed)) && hi=0x9f # no UTF-16 surrogates
		elif ((n == 0xf0)); then
			need=3 lo=0x90
		elif ((n >= 0xf1 && n <= 0xf3)); then
			need=3
		elif ((n == 0xf4)); then
			need=3 hi=0x8f # nothing above U+10FFFF
		fi
		for ((k = 0; k < need && i + k < len; k++)); do
			printf -v m '%d' "'${s:i+k:1}"
			((m = (m + 256) % 256))
			((m >= lo && m <= hi)) || break
			lo=0x80 hi=0xbf
		done
		if ((need > 0 && k == need)); then
			out+=${s:i-1:need+1}
		else
			out+='\ufffd' # the lead byte and the continuation bytes that did fit
		fi
		((i += k))
	done
	printf '"%s"' "$out"
}

# The job's GPUs on this node as a JSON array, from the first of these that is set:
# CUDA_VISIBLE_DEVICES when it holds GPU UUIDs (gres.conf's AutoDetect=nvml gives them, and a
# UUID cannot be misread); else SLURM_JOB_GPUS, Slurm's GPU indexes, which follow PCI bus order
# as NVML's indexes do; else CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS as indexes.
gpus_json() {
	local list=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${SLURM_STEP_GPUS:-}}}
	case ${CUDA_VISIBLE_DEVICES:-} in GPU-*) list=$CUDA_VISIBLE_DEVICES ;; esac
	local out="" item
	local -a items
	IFS=, read -r -a items <<<"$list"
	for item in "${items[@]}"; do
		item=${item//[[:space:]]/}
		if [[ $item =~ ^[0-9]+$ ]]; then
			out+="${out:+, }$((10#$item))"
		elif [[ $item =~ ^(GPU|MIG)-[0-9A-Za-z/-]+$ ]]; then
			out+="${out:+, }$(json_str "$item")"
		elif [[ -n $item ]]; then
			say "ignoring GPU ${item@Q}: neither an index nor a UUID"
		fi
	done
	[[ -n $out ]] && printf '[%s]' "$out"
}

main() {
	local job=${SLURM_JOB_ID:-}
	if ! [[ $job =~ ^[0-9]+$ ]]; then
		say "SLURM_JOB_ID ${job@Q} is not a job id; nothing written"
		return 0
	fi
	local gpus
	gpus=$(gpus_json) || return 0 # a job without GPUs here holds none: nothing to write

	local id=$job name=${SLURM_JOB_NAME:-}
	local array=${SLURM_ARRAY_JOB_ID:-} task=${SLURM_ARRAY_TASK_ID:-}
	if [[ $LOOKUP == 1 && (-z $name || -z $array) ]]; then
		local a="" t="" n=""
		# %F array job id (the job id outside arrays), %K task id (N/A outside), %j the name,
		# last because it may hold spaces
		read -r a t n < <(timeout 5 "$SQUEUE" --noheader --jobs="$job" --format='%F %K %j' 2>/dev/null) ||
			say "squeue did not answer; name and array id left out"
		[[ -z $array && $t =~ ^[0-9]+$ && $a =~ ^[0-9]+$ ]] && array=$a task=$t
		[[ -z $name ]] && name=$n
	fi

	local body='{"kind": "slurm"'
	if [[ $array =~ ^[0-9]+$ && $task =~ ^[0-9]+$ ]]; then
		id=${array}_${task}
		body+=", \"id\": \"$id\", \"job_id\": \"$job\""
	else
		body+=", \"id\": \"$id\""
	fi
	[[ -n ${SLURM_JOB_USER:-} ]] && body+=", \"user\": $(json_str "$SLURM_JOB_USER")"
	[[ -n ${SLURM_JOB_ACCOUNT:-} ]] && body+=", \"account\": $(json_str "$SLURM_JOB_ACCOUNT")"
	[[ -n $name ]] && body+=", \"name\": $(json_str "$name")"
	body+=", \"gpus\": $gpus}"

	local tmp
	if ! mkdir -p -- "$ALLOC_DIR" || ! tmp=$(mktemp -- "$ALLOC_DIR/.slurm-$job.XXXXXX"); then
		say "cannot write into $ALLOC_DIR; the agent will not see this job's idle GPUs"
		return 0
	fi
	if printf '%s\n' "$body" >"$tmp" && chmod 0644 -- "$tmp" && mv -f -- "$tmp" "$ALLOC_DIR/slurm-$job.json"; then
		return 0
	fi
	rm -f -- "$tmp"
	say "cannot write $ALLOC_DIR/slurm-$job.json; the agent will not see this job's idle GPUs"
}

main
exit 0
