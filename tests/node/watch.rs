//! A Deployment's replicas over time, as a user watching `kubectl get
//! deployment -w` would see them: what KEDA and the HPA asked for
//! (`spec.replicas`) and what was Ready, each change with its time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the watch began.
    pub at: f64,
    pub replicas: i32,
    pub ready: i32,
}

pub struct ReplicaWatch {
    samples: Arc<Mutex<Vec<Sample>>>,
    began: Instant,
    task: tokio::task::JoinHandle<()>,
}

impl ReplicaWatch {
    /// Reads the Deployment every 200 ms and keeps each change.
    pub fn start(deployments: Api<Deployment>, name: &str) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let began = Instant::now();
        let name = name.to_string();
        let recorded = Arc::clone(&samples);
        let task = tokio::spawn(async move {
            loop {
                if let Ok(deployment) = deployments.get(&name).await {
                    let replicas = deployment.spec.and_then(|spec| spec.replicas).unwrap_or(0);
                    let ready = deployment
                        .status
                        .and_then(|status| status.ready_replicas)
                        .unwrap_or(0);
                    let mut samples = recorded.lock().unwrap();
                    let changed = samples.last().is_none_or(|last: &Sample| {
                        (last.replicas, last.ready) != (replicas, ready)
                    });
                    if changed {
                        samples.push(Sample {
                            at: began.elapsed().as_secs_f64(),
                            replicas,
                            ready,
                        });
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self {
            samples,
            began,
            task,
        }
    }

    pub fn elapsed(&self) -> f64 {
        self.began.elapsed().as_secs_f64()
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// The distinct values `spec.replicas` went through, in order.
    pub fn trajectory(&self) -> Vec<i32> {
        let mut trajectory: Vec<i32> = Vec::new();
        for sample in self.samples() {
            if trajectory.last() != Some(&sample.replicas) {
                trajectory.push(sample.replicas);
            }
        }
        trajectory
    }

    /// When `spec.replicas` first met `wanted`.
    pub fn first(&self, wanted: impl Fn(&Sample) -> bool) -> Option<Sample> {
        self.samples().into_iter().find(|sample| wanted(sample))
    }

    /// Waits until the samples so far satisfy `done`, or fails after
    /// `limit` with what was seen.
    pub async fn wait(&self, limit: Duration, what: &str, done: impl Fn(&[Sample]) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            if done(&self.samples()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                self.samples()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for ReplicaWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// True when the trajectory never rises again once it has fallen: no
/// oscillation.
pub fn rises_then_falls(trajectory: &[i32]) -> bool {
    let mut falling = false;
    trajectory.windows(2).all(|pair| {
        if pair[1] < pair[0] {
            falling = true;
            true
        } else {
            !falling
        }
    })
}
