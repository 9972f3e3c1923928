# What the scripts that start test services (controlplane.sh, kafka.sh)
# share: stopping a process group, and a watcher that stops everything
# when the process that asked ends (sourced, not run).

# stop_group PID [SECONDS]: the whole process group PID leads, politely
# first (SIGTERM, then SIGKILL after SECONDS, default 5).
stop_group() {
  local pid="$1" seconds="${2:-5}"
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq $((seconds * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
}

# watch_parent PARENT SCRIPT VAR DIR: when process PARENT ends, however it
# ends (a test binary has no teardown of its own), runs `VAR=DIR SCRIPT down`.
watch_parent() {
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; env "$3=$4" "$2" down' \
    watcher "$1" "$2" "$3" "$4" >/dev/null 2>&1 </dev/null &
}
