//! The ScaledObject watch's changes taken in batches: who follows the
//! store does its work once per batch (KEDA writes an active
//! ScaledObject's status on every poll, so with thousands of them the
//! changes come in hundreds a second), never on a timer.

use std::collections::BTreeSet;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::ObjectChange;

/// A ScaledObject by (namespace, name).
pub type ObjectKey = (String, String);

/// Which ScaledObjects changed in one batch of watch events.
#[derive(Debug, PartialEq, Eq)]
pub enum Changed {
    Some(BTreeSet<ObjectKey>),
    /// The watch listed everything anew (or the follower fell behind).
    All,
}

/// Waits for the next change, then takes every change already queued
/// behind it. None once the watch has ended.
pub async fn next_batch(changes: &mut broadcast::Receiver<ObjectChange>) -> Option<Changed> {
    let mut changed = Changed::Some(BTreeSet::new());
    let mut next = Some(changes.recv().await);
    while let Some(change) = next.take() {
        match change {
            Ok(ObjectChange::Object { namespace, name }) => {
                if let Changed::Some(keys) = &mut changed {
                    keys.insert((namespace, name));
                }
            }
            Ok(ObjectChange::Relisted) | Err(RecvError::Lagged(_)) => changed = Changed::All,
            Err(RecvError::Closed) => return None,
        }
        next = match changes.try_recv() {
            Ok(change) => Some(Ok(change)),
            Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Closed) => Some(Err(RecvError::Closed)),
        };
    }
    Some(changed)
}
