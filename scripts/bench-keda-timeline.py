#!/usr/bin/env python3
"""What happened after one push to the list, for scripts/bench-keda.sh.

Sets, side by side, when hoist sent each activation push (its JSON log,
`activation pushed` at debug level) and when KEDA's operator read each
Deployment's scale, wrote it, and wrote the ScaledObject's status (the
API server's audit log, scripts/controlplane.sh's policy). Prints one
line per kind: how many, and when the first, the median and the last
came, in seconds after the push, with the rate between first and last.

  bench-keda-timeline.py AUDIT_LOG HOIST_LOG NAMESPACE PUSHED_MS

With --status-writes-since, prints instead how many ScaledObject status
writes of NAMESPACE the audit log holds from byte OFFSET on, in the last
SECONDS seconds (the bench waits for 0: KEDA's set-up writes done):

  bench-keda-timeline.py --status-writes-since AUDIT_LOG OFFSET NAMESPACE SECONDS
"""
import datetime
import json
import sys


def seconds_after(stamp, pushed_ms):
    at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return at.timestamp() - pushed_ms / 1000


def events(path, offset=0):
    try:
        lines = open(path, errors="replace")
    except OSError:
        return
    lines.seek(offset)
    for line in lines:
        try:
            yield json.loads(line)
        except ValueError:
            continue


def summary(name, times):
    if not times:
        return f"{name}: none"
    times.sort()
    first, median, last = times[0], times[len(times) // 2], times[-1]
    span = last - first
    rate = f", {(len(times) - 1) / span:.1f}/s" if span > 0 and len(times) > 1 else ""
    return f"{name}: {len(times)}, first {first:.1f} s, median {median:.1f} s, last {last:.1f} s{rate}"


def is_status_write(event, namespace):
    ref = event.get("objectRef", {})
    return (
        ref.get("namespace") == namespace
        and ref.get("resource") == "scaledobjects"
        and ref.get("subresource") == "status"
        and event.get("verb") in ("update", "patch")
        and event.get("user", {}).get("username") == "admin"
    )


def recent_status_writes(audit_log, offset, namespace, seconds):
    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    count = 0
    for event in events(audit_log, int(offset)):
        if is_status_write(event, namespace):
            at = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if now - at.timestamp() <= float(seconds):
                count += 1
    print(count)


def main():
    if sys.argv[1] == "--status-writes-since":
        recent_status_writes(*sys.argv[2:6])
        return
    audit_log, hoist_log, namespace, pushed_ms = sys.argv[1:5]
    pushed_ms = int(pushed_ms)
    pushes, reads, writes, statuses = [], [], [], []
    for event in events(hoist_log):
        if event.get("message") != "activation pushed" or event.get("namespace") != namespace:
            continue
        at = seconds_after(event["timestamp"], pushed_ms)
        if at >= 0:
            pushes.append(at)
    for event in events(audit_log):
        ref = event.get("objectRef", {})
        if ref.get("namespace") != namespace or event.get("stage") != "ResponseComplete":
            continue
        if event.get("user", {}).get("username") != "admin":
            continue
        at = seconds_after(event["requestReceivedTimestamp"], pushed_ms)
        if at < 0:
            continue
        verb, resource, sub = event.get("verb"), ref.get("resource"), ref.get("subresource")
        if resource == "deployments" and sub == "scale" and verb == "get":
            reads.append(at)
        elif resource == "deployments" and verb in ("update", "patch"):
            writes.append(at)
        elif is_status_write(event, namespace):
            statuses.append(at)
    print(
        "; ".join(
            [
                summary("hoist's pushes", pushes),
                summary("KEDA's reads of a scale", reads),
                summary("its scale writes", writes),
                summary("its status writes", statuses),
            ]
        )
    )


if __name__ == "__main__":
    main()
