# /proc readings the benchmark scripts share (sourced, not run).

# utime + stime (ticks) of the given processes and their children.
ticks() {
  local total=0 pid p stat fields
  for pid in "$@"; do
    for p in "$pid" $(pgrep -P "$pid" 2>/dev/null || true); do
      stat=$(cat "/proc/$p/stat" 2>/dev/null) || continue
      fields=(${stat##*) })
      total=$((total + fields[11] + fields[12]))
    done
  done
  echo "$total"
}

# RSS of a process, in MiB.
rss_mib() { awk '/^VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
