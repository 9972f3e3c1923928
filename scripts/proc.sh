# /proc readings the benchmark scripts share (sourced, not run).

# The given processes and their children (nginx's worker under its master).
with_children() {
  local pid
  for pid in "$@"; do
    echo "$pid"
    pgrep -P "$pid" 2>/dev/null || true
  done
}

# utime and stime (ticks) of exactly the given processes, as "user system".
user_system() {
  local p user=0 system=0 stat fields
  for p in "$@"; do
    stat=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    fields=(${stat##*) })
    user=$((user + fields[11])) system=$((system + fields[12]))
  done
  echo "$user $system"
}

# utime + stime (ticks) of the given processes and their children.
ticks() {
  local split
  split=$(user_system $(with_children "$@"))
  echo $(( ${split% *} + ${split#* } ))
}

# RSS of a process, in MiB.
rss_mib() { awk '/^VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
