#!/usr/bin/env python3
"""What happened after one push to the list, for scripts/bench-keda.sh.

Sets, side by side, when hoist sent each activation push (its JSON log,
`activation pushed` at debug level) and when KEDA's operator read each
Deployment's scale, wrote it, and wrote the ScaledObject's status (the
API server's audit log, scripts/controlplane.sh's policy). Prints one
line per kind: how many, and when the first, the median and the last
came, in seconds after the push, with the rate between first and last.

  bench-keda-timeline.py AUDIT_LOG HOIST_LOG NAMESPACE PUSHED_MS
"""
import datetime
import json
import sys


def seconds_after(stamp, pushed_ms):
    at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return at.timestamp() - pushed_ms / 1000


def events(path):
    try:
        lines = open(path, errors="replace")
    except OSError:
        return
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


def main():
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
        elif resource == "scaledobjects" and sub == "status" and verb in ("update", "patch"):
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
