#!/bin/bash
# gpufleet Slurm Prolog: tells the gpufleet agent on this node which GPUs a job holds, so that
# an allocated GPU no process of the job uses is held by the job, not parked (docs/agent.md).
#
# Writes $ALLOC_DIR/slurm-$SLURM_JOB_ID.json, e.g.
#   {"kind": "slurm", "id": "4101_3", "job_id": "4104", "user": "alice", "account": "nlp",
#    "name": "sweep", "gpus": [0, 1], "devices": ["/dev/nvidia4", "/dev/nvidia5"]}
# whole or not at all: into a temporary dot file of the same directory, renamed into place
# (the agent reads no dot file). epilog.sh removes it when the job ends.
#
# Install (docs/agent.md, "Slurm"): copy to every GPU node, e.g. /etc/slurm/gpufleet-prolog.sh,
# mode 0755 owned by root, and in slurm.conf
#   Prolog=/etc/slurm/gpufleet-prolog.sh
#   Epilog=/etc/slurm/gpufleet-epilog.sh
#   PrologFlags=Alloc      (run at allocation, so an salloc that starts nothing still counts)
# A site that already runs a prolog calls this one from it before Slurm 24.05, which keeps
# only the last Prolog= line (docs/agent.md).
#
# Settings: /etc/default/gpufleet (shared with the agent's unit), KEY=VALUE lines read with a
# strict pattern, never sourced: GPUFLEET_ALLOC_DIR (default /run/gpufleet/alloc, the agent's
# --alloc-dir), GPUFLEET_PROLOG_LOOKUP (1, the default: ask squeue for the job's name and array
# ids; 0: never), GPUFLEET_LOOKUP_TIMEOUT (seconds per squeue call, default 5),
# GPUFLEET_GRES_CONF (default:
# gres.conf beside slurm.conf). Edit that file, not this script: a package update replaces it.
#
# Slurm runs the node Prolog as root with a small environment of its own (not slurmd's): the
# job id, user, account and GPU indexes, but neither the job's name nor its array ids; squeue
# gives those (two calls per job start, each bounded in time; a controller that does not
# answer costs the name, and the job goes by its raw id).
#
# A prolog that fails drains the node: whatever goes wrong is said on stderr (slurmd logs it
# only for a failing prolog) and to syslog (tag gpufleet-prolog), and the script exits 0.

set -u
export LC_ALL=C
# The prolog has no search path of its own; GPUFLEET_HOOK_PATH only for the tests.
export PATH=${GPUFLEET_HOOK_PATH:-/usr/sbin:/usr/bin:/sbin:/bin}

say() {
	local msg
	printf -v msg 'gpufleet prolog, job %s: %s' "${SLURM_JOB_ID:-?}" "$*"
	printf '%s\n' "$msg" >&2
	# syslog too: slurmd shows a prolog's output only when it fails (a node without logger,
	# or whose syslog does not answer, still runs the job)
	if command -v logger >/dev/null 2>&1; then
		timeout 2 logger -t gpufleet-prolog -p daemon.warning -- "$msg" >/dev/null 2>&1 || true
	fi
}

# /etc/default/gpufleet (GPUFLEET_DEFAULTS only for the tests): KEY=VALUE lines, '#' comments,
# a value optionally in single or double quotes, as systemd's EnvironmentFile= and sh read
# them. This runs as root, so the file is parsed, never sourced, and believed only where root
# owns it and nobody else may write it; each value must match its own pattern. A variable
# already in the environment wins (the tests set them).
read_settings() {
	local file=${GPUFLEET_DEFAULTS:-/etc/default/gpufleet} line key value owner
	[[ -e $file ]] || return 0
	if ! owner=$(stat -L -c '%u %a' -- "$file" 2>/dev/null) || ! [[ $owner =~ ^0\ [0-7]*[0145][0145]$ ]]; then
		say "ignoring $file: not owned by root, or writable by others (${owner:-unreadable})"
		return 0
	fi
	while IFS= read -r line || [[ -n $line ]]; do
		[[ $line =~ ^[[:space:]]*(#.*)?$ ]] && continue
		if ! [[ $line =~ ^[[:space:]]*([A-Z][A-Z0-9_]*)=(\"[^\"]*\"|\'[^\']*\'|[^\"\'[:space:]#]*)[[:space:]]*(#.*)?$ ]]; then
			say "ignoring a line of $file that is not KEY=VALUE: ${line@Q}"
			continue
		fi
		key=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
		[[ $value == [\"\']* ]] && value=${value:1:-1}
		case $key in
		GPUFLEET_ALLOC_DIR | GPUFLEET_GRES_CONF)
			[[ $value =~ ^/[A-Za-z0-9._/+@:-]*$ && $value != *..* ]] ||
				{ say "ignoring $key in $file: ${value@Q} is not an absolute path" && continue; } ;;
		GPUFLEET_PROLOG_LOOKUP)
			[[ $value =~ ^[01]$ ]] || { say "ignoring $key in $file: ${value@Q} is not 0 or 1" && continue; } ;;
		GPUFLEET_LOOKUP_TIMEOUT)
			[[ $value =~ ^[1-9][0-9]?$ ]] ||
				{ say "ignoring $key in $file: ${value@Q} is not 1 to 99 seconds" && continue; } ;;
		*) continue ;; # the agent's settings, or someone else's
		esac
		[[ -z ${!key+set} ]] && printf -v "$key" '%s' "$value"
	done <"$file"
}

read_settings
ALLOC_DIR=${GPUFLEET_ALLOC_DIR:-/run/gpufleet/alloc} # the agent's --alloc-dir
LOOKUP=${GPUFLEET_PROLOG_LOOKUP:-1}
LOOKUP_TIMEOUT=${GPUFLEET_LOOKUP_TIMEOUT:-5}
SQUEUE=${GPUFLEET_SQUEUE:-squeue}
GRES_CONF=${GPUFLEET_GRES_CONF:-$(dirname -- "${SLURM_CONF:-/etc/slurm/slurm.conf}")/gres.conf}

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

# A Slurm hostlist expression, one name per line: "/dev/nvidia[0-3,6]" → /dev/nvidia0 …
# /dev/nvidia3, /dev/nvidia6; "gpu[01-02],login" → gpu01, gpu02, login (zero padding kept).
# Slurm expands gres.conf's File= and NodeName= this way (hostlist_create); a form it does not
# know here ("^", nested brackets) yields nothing, and the caller says so.
hostlist() {
	local expr=$1 item depth=0 i c
	local -a items=()
	item=""
	for ((i = 0; i < ${#expr}; i++)); do # split at the commas outside brackets
		c=${expr:i:1}
		case $c in
		\[) ((depth += 1)) ;;
		\]) ((depth -= 1)) ;;
		,) ((depth == 0)) && { items+=("$item") && item="" && continue; } ;;
		esac
		item+=$c
	done
	items+=("$item")
	for item in "${items[@]}"; do
		hostlist_one "$item" || return 1
	done
}

hostlist_one() {
	local item=$1 prefix ranges rest range a b n width c one
	if [[ $item != *\[* ]]; then
		[[ -n $item && $item != *\]* ]] && printf '%s\n' "$item"
		return
	fi
	[[ $item =~ ^([^][]*)\[([0-9,-]+)\](.*)$ ]] || return 1
	prefix=${BASH_REMATCH[1]} ranges=${BASH_REMATCH[2]} rest=${BASH_REMATCH[3]}
	local -a parts
	IFS=, read -r -a parts <<<"$ranges"
	for range in "${parts[@]}"; do
		[[ $range =~ ^([0-9]+)(-([0-9]+))?$ ]] || return 1
		a=${BASH_REMATCH[1]} b=${BASH_REMATCH[3]:-${BASH_REMATCH[1]}}
		width=${#a}
		((10#$b - 10#$a < 4096)) || return 1
		for ((n = 10#$a; n <= 10#$b; n++)); do
			printf -v c '%s%0*d' "$prefix" "$width" "$n"
			while IFS= read -r one; do printf '%s\n' "$one"; done < <(hostlist_one "$c$rest")
		done
	done
}

# This node's GPU device files in Slurm's order: Slurm numbers a node's GPUs (SLURM_JOB_GPUS)
# by their position in gres.conf, the files of each Name=gpu line that applies to the node
# (NodeName= names it, or is absent) in the order written, whatever their names and minor
# numbers. So File=/dev/nvidia[4-7] listed before [0-3] makes /dev/nvidia4 GPU 0. Prints
# nothing where gres.conf does not list every GPU's file (AutoDetect=nvml alone, Count= only).
gres_files() {
	local line item key value node files name count listed=0
	local -a out=() names=()
	[[ -r $GRES_CONF ]] || return 0
	while IFS= read -r line || [[ -n $line ]]; do
		line=${line%%#*}
		[[ $line =~ [^[:space:]] ]] || continue
		node="" files="" name="" count=""
		for item in $line; do # gres.conf: space-separated Key=Value, keys in any case
			key=${item%%=*} value=${item#*=}
			case ${key,,} in
			nodename) node=$value ;;
			name) name=$value ;;
			file | files) files=$value ;;
			count) count=$value ;;
			esac
		done
		[[ ${name,,} == gpu ]] || continue
		if [[ -n $node ]]; then
			mapfile -t names < <(hostlist "$node")
			[[ " ${names[*]} " == *" ${SLURMD_NODENAME:-$(hostname -s)} "* ]] || continue
		fi
		if [[ -z $files ]]; then
			[[ -n $count ]] && return 0 # GPUs without files: positions cannot be told
			continue
		fi
		mapfile -t -O "${#out[@]}" out < <(hostlist "$files")
		listed=1
	done <"$GRES_CONF"
	((listed == 1)) && printf '%s\n' "${out[@]}"
}

# The job's GPU device files, as a JSON array: SLURM_JOB_GPUS's positions in gres_files.
devices_json() {
	local -a files items
	local item json=""
	[[ -n ${SLURM_JOB_GPUS:-} ]] || return 0
	mapfile -t files < <(gres_files)
	((${#files[@]})) || return 0
	IFS=, read -r -a items <<<"$SLURM_JOB_GPUS"
	for item in "${items[@]}"; do
		item=${item//[[:space:]]/}
		if ! [[ $item =~ ^[0-9]+$ ]] || ((10#$item >= ${#files[@]})); then
			say "GPU ${item@Q} is not in $GRES_CONF (${#files[@]} GPU files for this node); no device files written"
			return 0
		fi
		json+="${json:+, }$(json_str "${files[10#$item]}")"
	done
	[[ -n $json ]] && printf '[%s]' "$json"
}

# The job's array job id, task id and name from squeue, as three lines "array\ntask\nname";
# fails when squeue does not answer within LOOKUP_TIMEOUT seconds (each call) or answers
# something else. Two calls: squeue --jobs=<the array's own id> lists every task of the array,
# and a name may hold newlines, so the first asks for numbers only (%A job id, %F array job id
# or the job id outside arrays, %K task id or N/A) and picks this job's line; the second asks
# for the name (%j) of exactly this job (A_T for a task), one record, whole.
lookup() {
	local job=$1 out line a="" t="" spec
	out=$(timeout "$LOOKUP_TIMEOUT" "$SQUEUE" --noheader --jobs="$job" --format='%A %F %K' 2>/dev/null) || return 1
	while IFS= read -r line; do
		[[ $line =~ ^$job\ ([0-9]+)\ ([0-9]+|N/A)$ ]] && a=${BASH_REMATCH[1]} t=${BASH_REMATCH[2]}
	done <<<"$out"
	[[ -n $a ]] || return 1
	spec=$job
	[[ $t =~ ^[0-9]+$ ]] && spec=${a}_${t}
	out=$(timeout "$LOOKUP_TIMEOUT" "$SQUEUE" --noheader --jobs="$spec" --format='%A %j' 2>/dev/null) || return 1
	[[ $out =~ ^$job\ (.*)$ ]] || return 1
	printf '%s\n%s\n%s' "$a" "$t" "${BASH_REMATCH[1]}"
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
		local got a t n
		if got=$(lookup "$job"); then
			{ read -r a && read -r t && n=$(cat); } <<<"$got"
			[[ -z $array && $t =~ ^[0-9]+$ && $a =~ ^[0-9]+$ ]] && array=$a task=$t
			[[ -z $name ]] && name=$n
		else
			say "squeue gave no answer within ${LOOKUP_TIMEOUT} s; the job goes by its id $job, without a name"
		fi
	fi
	name=${name//[$'\n\r']/ } # a name over several lines reads as one

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
	body+=", \"gpus\": $gpus"
	local devices
	devices=$(devices_json) && [[ -n $devices ]] && body+=", \"devices\": $devices"
	body+="}"

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
