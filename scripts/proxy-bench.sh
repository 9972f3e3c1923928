# What the benchmark scripts that measure proxies share (sourced, not run):
# a wrk point with the proxy's own CPU, and the nginx they compare
# against. Uses from the caller: `work` (a directory), SECONDS_PER_POINT,
# CLIENT (a command prefix, may be empty), `ticks` (scripts/proc.sh) and,
# when set, WRK_BENCH (the record's "bench"; default "interceptor").

# wrk's report: one JSON line (BENCHJSON ...) at the end of a run.
wrk_report_script() {
  [ -f "$work/report.lua" ] && return 0
  cat >"$work/report.lua" <<'EOF'
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('BENCHJSON "requests":%d,"seconds":%.3f,"rps":%.1f,"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d,"errors":%d\n',
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
    e.connect + e.read + e.write + e.status + e.timeout))
end
EOF
}

# wrk_point PROTOCOL VIA CONNECTIONS ADDRESS PROXY-PIDS...: one wrk run of
# SECONDS_PER_POINT with `Host: web.bench` at http://ADDRESS/; prints a
# JSON record with the proxies' CPU over it (utime + stime of the PIDs and
# their children), per second and per request.
wrk_point() {
  local protocol="$1" via="$2" connections="$3" address="$4"
  shift 4
  local before after out cpu
  wrk_report_script
  before=$( [ $# -gt 0 ] && ticks "$@" || echo 0)
  out=$("${CLIENT[@]}" wrk -t1 -c"$connections" -d"${SECONDS_PER_POINT}s" --latency -H 'Host: web.bench' \
    -s "$work/report.lua" "http://$address/" | grep '^BENCHJSON' | sed 's/^BENCHJSON //') || true
  after=$( [ $# -gt 0 ] && ticks "$@" || echo 0)
  if [ -z "$out" ]; then
    echo "   $protocol via $via c=$connections: wrk failed" >&2
    return 0
  fi
  cpu=$(awk -v t=$((after - before)) -v s="$SECONDS_PER_POINT" -v o="$out" 'BEGIN {
    match(o, /"requests":[0-9]+/); r = substr(o, RSTART + 11, RLENGTH - 11);
    printf "\"proxy_cpu_pct\":%.1f,\"proxy_cpu_us_per_request\":%.2f", t / s, (r > 0 ? t * 10000 / r : 0) }')
  echo "{\"bench\":\"${WRK_BENCH:-interceptor}\",\"protocol\":\"$protocol\",\"via\":\"$via\",\"connections\":$connections,$cpu,$out}"
  echo "   $protocol via $via c=$connections: $out" >&2
}

# nginx_stream_module: the path of nginx's stream module to load, empty
# when it is built in or missing (then installed, if Debian has it).
nginx_stream_module() {
  local candidate
  for candidate in /usr/lib/nginx/modules/ngx_stream_module.so /usr/lib64/nginx/modules/ngx_stream_module.so; do
    [ -f "$candidate" ] && { echo "$candidate"; return 0; }
  done
  # Built in is `--with-stream`; `--with-stream=dynamic` (Debian's) needs
  # the module's package.
  if ! nginx -V 2>&1 | grep -qE -- '--with-stream( |$)'; then
    scripts/deps.sh libnginx-mod-stream >&2 || true
    [ -f /usr/lib/nginx/modules/ngx_stream_module.so ] && echo /usr/lib/nginx/modules/ngx_stream_module.so
  fi
  return 0
}

# nginx_config DIR STREAM-MODULE HTTP-LISTEN TCP-LISTEN UPSTREAM: nginx as
# a keep-alive reverse proxy to UPSTREAM (host:port), one worker, in DIR
# (its config is DIR/nginx.conf); with the stream module also a TCP relay
# on TCP-LISTEN.
nginx_config() {
  local dir="$1" stream_module="$2" http_listen="$3" tcp_listen="$4" upstream="$5"
  mkdir -p "$dir"
  {
    [ -n "$stream_module" ] && echo "load_module $stream_module;"
    cat <<EOF
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  keepalive_requests 1000000;
  upstream app {
    server $upstream;
    keepalive 128;
    keepalive_requests 1000000;
  }
  server {
    listen $http_listen;
    location / {
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
EOF
    if [ -n "$stream_module" ] || nginx -V 2>&1 | grep -qE -- '--with-stream( |$)'; then
      echo "stream { server { listen $tcp_listen; proxy_pass $upstream; } }"
    fi
  } >"$dir/nginx.conf"
}
