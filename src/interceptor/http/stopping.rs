//! Whether hoist is shutting down, as the direct path asks it: once or
//! twice per request, and while it waits for a connection's next one.
//!
//! A `CancellationToken` answers both under locks (its node's mutex, and
//! its `Notify`'s for a wait), locks every connection of the proxy
//! shares: each request took four, on whichever core served it. Here a
//! flag answers, and a connection puts its task's waker in the `Notify`
//! once, the first time it waits; the flag is set before anyone is woken.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// Set once, by the proxy's accept loop when hoist shuts down.
#[derive(Clone, Default)]
pub struct Stopping(Arc<Shared>);

#[derive(Default)]
struct Shared {
    stopped: AtomicBool,
    wake: Notify,
}

impl Stopping {
    /// Every connection waiting for its next request wakes, and sees it.
    pub fn set(&self) {
        self.0.stopped.store(true, Ordering::Release);
        self.0.wake.notify_waiters();
    }

    pub fn is_set(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }

    /// A connection's wait for it, kept for the connection's life.
    pub fn waiter(&self) -> Waiter<'_> {
        Waiter {
            stopping: self,
            // Boxed once per connection: `Notified` must not move once
            // polled, and the waiter is kept across requests.
            notified: Box::pin(self.0.wake.notified()),
            registered: None,
        }
    }
}

pub struct Waiter<'a> {
    stopping: &'a Stopping,
    notified: Pin<Box<Notified<'a>>>,
    /// The waker the `Notify` holds (a task's is the same at every poll).
    registered: Option<Waker>,
}

impl Waiter<'_> {
    /// Resolves once hoist is stopping.
    pub async fn stopped(&mut self) {
        poll_fn(|cx| self.poll_stopped(cx)).await;
    }

    fn poll_stopped(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.stopping.is_set() {
            return Poll::Ready(());
        }
        if self
            .registered
            .as_ref()
            .is_none_or(|waker| !waker.will_wake(cx.waker()))
        {
            // Polling puts (or replaces) the waker in the `Notify`'s list.
            // The future was made before the flag was read, so a `set` in
            // between makes it ready.
            if self.notified.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            self.registered = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiting_connection_wakes_when_hoist_stops() {
        let stopping = Stopping::default();
        let waiting = {
            let stopping = stopping.clone();
            tokio::spawn(async move {
                let mut waiter = stopping.waiter();
                // Waits more than once, as a connection does between
                // requests: the waker goes in once, and still works.
                for _ in 0..3 {
                    let waited =
                        tokio::time::timeout(Duration::from_millis(20), waiter.stopped()).await;
                    assert!(waited.is_err(), "not stopping yet");
                }
                waiter.stopped().await;
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished());
        stopping.set();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("no panic");
        assert!(stopping.is_set());
    }

    struct Woken(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wait_polled_with_another_waker_wakes_that_one() {
        let stopping = Stopping::default();
        let mut waiter = stopping.waiter();
        let first = Arc::new(Woken(AtomicBool::new(false)));
        let second = Arc::new(Woken(AtomicBool::new(false)));
        let first_waker = Waker::from(first.clone());
        let second_waker = Waker::from(second.clone());
        for _ in 0..2 {
            let polled = waiter.poll_stopped(&mut Context::from_waker(&first_waker));
            assert!(polled.is_pending());
        }
        let polled = waiter.poll_stopped(&mut Context::from_waker(&second_waker));
        assert!(polled.is_pending());
        stopping.set();
        assert!(
            second.0.load(Ordering::SeqCst),
            "the last poll's waker is woken"
        );
        assert!(
            !first.0.load(Ordering::SeqCst),
            "the one it replaced is not"
        );
        let polled = waiter.poll_stopped(&mut Context::from_waker(&second_waker));
        assert!(polled.is_ready());
    }

    #[tokio::test]
    async fn a_wait_begun_after_the_stop_ends_at_once() {
        let stopping = Stopping::default();
        let mut waiter = stopping.waiter();
        stopping.set();
        tokio::time::timeout(Duration::from_secs(5), waiter.stopped())
            .await
            .expect("ready");
    }
}
