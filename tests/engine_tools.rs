//! `hoist simulate` and `hoist decide` as a user runs them.

use std::process::Command;

use serde_json::{Value, json};

fn hoist(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hoist"));
    command.args(args);
    let output = match stdin {
        None => command.output().unwrap(),
        Some(input) => {
            use std::io::Write;
            let mut child = command
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        }
    };
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn simulate_replays_acas_worked_example() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("aca.svg");
    let (ok, timeline, stderr) = hoist(
        &[
            "simulate",
            "--rules",
            "docs/examples/aca-servicebus.rules.toml",
            "--trace",
            "docs/examples/aca-servicebus.trace.csv",
            "--svg",
            svg.to_str().unwrap(),
        ],
        None,
    );
    assert!(ok, "{stderr}");

    // ACA's documented behaviour: 1, 4, 8, 10 replicas while the queue
    // holds 50 messages, zero once 300 s have passed since the last active
    // reading: strictly passed, as KEDA checks, so at the poll after.
    let replicas: Vec<(u64, u32)> = timeline
        .lines()
        .skip(1)
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            (cells[0].parse().unwrap(), cells[3].parse().unwrap())
        })
        .collect();
    let at = |t: u64| replicas.iter().find(|(time, _)| *time == t).unwrap().1;
    assert_eq!([at(0), at(30), at(60), at(90)], [1, 4, 8, 10]);
    let last_active = 150;
    assert_eq!(at(last_active + 270), 10, "still in the cooldown");
    assert_eq!(at(last_active + 300), 10, "the cooldown is not yet past");
    assert_eq!(at(last_active + 330), 0, "zero once the cooldown is past");

    // And the whole timeline is the one reviewed into tests/data.
    assert_eq!(timeline, include_str!("data/aca-servicebus.timeline.txt"));

    let drawing = std::fs::read_to_string(&svg).unwrap();
    assert!(drawing.starts_with("<svg"), "{drawing}");
    assert!(drawing.contains("queue (target 5)"));
    assert!(
        drawing.contains("<path d=\"M"),
        "the replica steps are drawn"
    );
}

#[test]
fn simulate_rejects_bad_input_with_the_line_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    let trace = dir.path().join("trace.csv");
    std::fs::write(
        &rules,
        "[rules]\nmaxReplicaCount = 5\n[[triggers]]\nname = \"q\"\ntarget = 5\n",
    )
    .unwrap();
    let run = |trace_text: &str| {
        std::fs::write(&trace, trace_text).unwrap();
        hoist(
            &[
                "simulate",
                "--rules",
                rules.to_str().unwrap(),
                "--trace",
                trace.to_str().unwrap(),
            ],
            None,
        )
    };
    let (ok, _, stderr) = run("time,q\n0,1\n30,lots\n");
    assert!(!ok);
    assert!(
        stderr.contains("line 3") && stderr.contains("lots"),
        "{stderr}"
    );
    let (ok, _, stderr) = run("time,other\n0,1\n");
    assert!(!ok);
    assert!(stderr.contains("no column for trigger `q`"), "{stderr}");
    let (ok, _, stderr) = run("time,q\n30,1\n0,1\n");
    assert!(!ok);
    assert!(stderr.contains("backwards"), "{stderr}");

    std::fs::write(&rules, "[rules]\nminReplicaCount = 9\nmaxReplicaCount = 5\n[[triggers]]\nname = \"q\"\ntarget = 5\n").unwrap();
    let (ok, _, stderr) = run("time,q\n0,1\n");
    assert!(!ok);
    assert!(stderr.contains("`minReplicaCount`"), "{stderr}");
    assert_eq!(
        stderr.matches("`minReplicaCount`").count(),
        1,
        "said once: {stderr}"
    );
}

#[test]
fn decide_evaluates_a_saved_state_and_its_output_replays() {
    let t0: u64 = 1_700_000_000_000;
    let reading = |value: Value, at: u64| {
        let mut reading = json!({"trigger": "queue", "target": 5, "at": at});
        reading
            .as_object_mut()
            .unwrap()
            .extend(value.as_object().unwrap().clone());
        reading
    };
    let first = json!({
        "rules": {"maxReplicaCount": 20},
        "readings": [reading(json!({"value": 50}), t0)],
        "now": t0,
    });
    let (ok, out, stderr) = hoist(&["decide", "--input", "-"], Some(&first.to_string()));
    assert!(ok, "{stderr}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["decision"]["replicas"], 1);
    assert_eq!(out["decision"]["reason"], "Activated");
    assert_eq!(out["state"]["currentReplicas"], 1);

    // Feed the printed state back: the engine continues where it was.
    let second = json!({
        "rules": {"maxReplicaCount": 20},
        "state": out["state"],
        "readings": [reading(json!({"value": 50}), t0 + 30_000)],
        "now": t0 + 30_000,
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.json");
    std::fs::write(&file, second.to_string()).unwrap();
    let (ok, out, stderr) = hoist(&["decide", "--input", file.to_str().unwrap()], None);
    assert!(ok, "{stderr}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["decision"]["replicas"], 4);
    assert_eq!(out["decision"]["reason"], "ScaleUpLimit");
    assert_eq!(out["decision"]["rawDesired"], 10);

    // A failing reading holds the count.
    let third = json!({
        "rules": {"maxReplicaCount": 20},
        "state": out["state"],
        "readings": [reading(json!({"error": "connection refused"}), t0 + 60_000)],
        "now": t0 + 60_000,
    });
    let (ok, out, _) = hoist(&["decide", "--input", "-"], Some(&third.to_string()));
    assert!(ok);
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["decision"]["replicas"], 4);
    assert_eq!(out["decision"]["reason"], "TriggerError");
    assert_eq!(out["state"]["triggers"]["queue"]["consecutiveFailures"], 1);

    let (ok, _, stderr) = hoist(
        &["decide", "--input", "-"],
        Some(r#"{"readings": [], "now": "soon"}"#),
    );
    assert!(!ok);
    assert!(stderr.contains("at `now`"), "{stderr}");
    assert_eq!(
        stderr.matches("expected u64").count(),
        1,
        "said once: {stderr}"
    );
}

#[test]
fn decide_divides_milli_values_and_refuses_numbers_the_hpa_cannot_use() {
    let t0: u64 = 1_700_000_000_000;
    let input = |reading: Value| {
        json!({
            "rules": {"maxReplicaCount": 20},
            "state": {"currentReplicas": 5, "active": true},
            "readings": [reading],
            "now": t0,
        })
        .to_string()
    };

    // KEDA writes 2.7 and 0.3 as 2700m and 300m: 9 replicas, where the
    // f64 quotient (9.000000000000002) would round up to 10.
    let (ok, out, stderr) = hoist(
        &["decide", "--input", "-"],
        Some(&input(
            json!({"trigger": "q", "target": 0.3, "value": 2.7, "at": t0}),
        )),
    );
    assert!(ok, "{stderr}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["decision"]["rawDesired"], 9);
    assert_eq!(out["decision"]["replicas"], 9);

    for (reading, path, reason) in [
        (
            json!({"trigger": "q", "target": 0, "value": 1, "at": t0}),
            "readings[0].target",
            "at least 0.001",
        ),
        (
            json!({"trigger": "q", "target": -5, "value": 1, "at": t0}),
            "readings[0].target",
            "at least 0.001",
        ),
        (
            json!({"trigger": "q", "target": 0.0004, "value": 1, "at": t0}),
            "readings[0].target",
            "at least 0.001",
        ),
        (
            json!({"trigger": "q", "target": 5, "value": -1, "at": t0}),
            "readings[0].value",
            "at least 0",
        ),
        (
            json!({"trigger": "q", "target": 5, "value": 1, "activity": -1, "at": t0}),
            "readings[0].activity",
            "at least 0",
        ),
    ] {
        let (ok, out, stderr) = hoist(&["decide", "--input", "-"], Some(&input(reading)));
        assert!(!ok, "{path}: accepted: {out}");
        assert!(
            stderr.contains(&format!("`{path}`")) && stderr.contains(reason),
            "{path}: {stderr}"
        );
    }
}
