#!/bin/bash
# Starts one herd job inside a Slurm allocation: the coordinator here (the
# batch script's node), then the servers and the workers as two job steps
# (srun), each process taking its rank from SLURM_PROCID and the step's
# size from SLURM_NTASKS; GPU workers pick their device from SLURM_LOCALID.
# Called by herd_ps.sbatch and herd_allreduce.sbatch; see them for use.
#
#   herd_job.sh CONFIG [--set path=value ...] [--resume | --overwrite] [--stop-at STEP]
#
# HERD_BIN: the directory holding herd, herd-server and herd-worker
# (default: where `herd` is on PATH). HERD_SERVERS_PER_NODE and
# HERD_WORKERS_PER_NODE place each step (srun --ntasks-per-node), e.g. one
# worker per GPU on GPU nodes; HERD_SERVER_NODES and HERD_WORKER_NODES
# (srun --nodelist) put servers on CPU nodes of their own, BytePS's layout. The job token lives in the submit
# directory (a filesystem every node sees), readable by you alone, and is
# removed when the job ends. Exits with the first failing process's code.
set -euo pipefail

CONFIG=${1:?usage: herd_job.sh CONFIG [--set path=value ...] [--resume | --overwrite] [--stop-at STEP]}
shift
BIN=${HERD_BIN:-$(dirname "$(command -v herd)")}
# The coordinator takes the config and its overrides; every process takes all.
COORD_ARGS=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == --set ]]; then COORD_ARGS+=(--set "${args[i + 1]}"); fi
done

# How many of each the job has: the config's, as herd reads it.
read -r SERVERS WORKERS < <("$BIN/herd" plan "$CONFIG" "${COORD_ARGS[@]}" --json |
  python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["servers"], d["workers"])')
if [[ $WORKERS -lt 1 ]]; then echo "herd_job.sh: $CONFIG has no workers (cluster.sync NONE? use herd launch)" >&2; exit 2; fi

RUN_DIR=${SLURM_SUBMIT_DIR:-$PWD}
TOKEN="$RUN_DIR/.herd-${SLURM_JOB_ID:-$$}.token"
PORT_FILE="$RUN_DIR/.herd-${SLURM_JOB_ID:-$$}.port"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$TOKEN")
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$TOKEN" "$PORT_FILE"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# One coordinator per job, on this node, on a port the kernel picks.
"$BIN/herd" coordinator "$CONFIG" "${COORD_ARGS[@]}" --listen 0.0.0.0:0 --token-file "$TOKEN" \
  --port-file "$PORT_FILE" &
PIDS+=($!)
for _ in $(seq 100); do [[ -s $PORT_FILE ]] && break; sleep 0.1; done
[[ -s $PORT_FILE ]] || { echo "herd_job.sh: the coordinator did not start" >&2; exit 1; }
export HERD_COORDINATOR="$(hostname):$(cat "$PORT_FILE")"
export HERD_JOB_TOKEN_FILE="$TOKEN"

# Steps share the allocation's CPUs (--overlap): servers, then workers.
place() {  # PER_NODE NODES: srun's placement options
  [[ -z $1 ]] || printf -- '--ntasks-per-node=%s\n' "$1"
  [[ -z $2 ]] || printf -- '--nodelist=%s\n' "$2"
}
mapfile -t SERVER_PLACE < <(place "${HERD_SERVERS_PER_NODE:-}" "${HERD_SERVER_NODES:-}")
mapfile -t WORKER_PLACE < <(place "${HERD_WORKERS_PER_NODE:-}" "${HERD_WORKER_NODES:-}")
if [[ $SERVERS -gt 0 ]]; then
  srun --overlap --kill-on-bad-exit=0 --ntasks="$SERVERS" "${SERVER_PLACE[@]}" "$BIN/herd-server" "$CONFIG" "$@" &
  PIDS+=($!)
fi
srun --overlap --kill-on-bad-exit=0 --ntasks="$WORKERS" "${WORKER_PLACE[@]}" "$BIN/herd-worker" "$CONFIG" "$@" &
PIDS+=($!)

# The coordinator tells every process when one fails, so all steps end;
# the first non-zero exit is the job's.
# The steps end together when the job does. A step that fails first (its
# processes were refused, or could not start), or a coordinator that
# stopped the job, leaves a job that cannot finish: the rest are stopped at
# once (the EXIT trap) rather than left waiting out cluster.join_timeout_s
# with the allocation held.
rc=0
coordinator=${PIDS[0]}
steps=("${PIDS[@]:1}")
while [[ ${#steps[@]} -gt 0 && $rc -eq 0 ]]; do
  running=()
  for pid in "${steps[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then running+=("$pid"); continue; fi
    if wait "$pid"; then st=0; else st=$?; fi
    [[ $st -eq 0 || $rc -ne 0 ]] || rc=$st
  done
  steps=("${running[@]}")
  if [[ -n $coordinator ]] && ! kill -0 "$coordinator" 2>/dev/null; then
    if wait "$coordinator"; then st=0; else st=$?; fi
    coordinator=""
    [[ $st -eq 0 || $rc -ne 0 ]] || rc=$st
  fi
  [[ ${#steps[@]} -eq 0 || $rc -ne 0 ]] || sleep 0.5
done
if [[ $rc -ne 0 ]]; then
  echo "herd_job.sh: the job failed (exit $rc); stopping what is left of it" >&2
  exit "$rc"
fi
if [[ -n $coordinator ]]; then wait "$coordinator" || { st=$?; [[ $rc -ne 0 ]] || rc=$st; }; fi
PIDS=()
exit "$rc"
