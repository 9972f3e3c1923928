//! A timer for a deadline that mostly moves later: a connection's next
//! idle deadline, each request's response deadline.
//!
//! Why: the proxies move these deadlines at every request. Moving a tokio
//! timer costs a trip through its entry (and usually a read of the clock
//! just before); at tens of thousands of requests a second, on one core,
//! that was a measurable share of a request's own work. Here moving the
//! deadline later only notes it: the registered timer stays where it was,
//! and if it fires before the deadline then in force, it is moved there
//! and waited on again. A deadline moved earlier moves the timer at once,
//! so the timer never fires late.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::time::{Instant, Sleep};

pub struct LazyTimer {
    timer: Pin<Box<Sleep>>,
    due: Instant,
}

impl LazyTimer {
    pub fn new(due: Instant) -> Self {
        Self {
            timer: Box::pin(tokio::time::sleep_until(due)),
            due,
        }
    }

    /// Sets the deadline: an earlier one moves the timer now, a later one
    /// when the timer fires.
    pub fn set(&mut self, due: Instant) {
        if due < self.timer.deadline() {
            self.timer.as_mut().reset(due);
        }
        self.due = due;
    }

    /// `Ready` once the deadline in force has passed.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            ready!(self.timer.as_mut().poll(cx));
            if self.timer.deadline() >= self.due {
                return Poll::Ready(());
            }
            let due = self.due;
            self.timer.as_mut().reset(due);
        }
    }

    /// Resolves once the deadline in force has passed.
    pub async fn expired(&mut self) {
        poll_fn(|cx| self.poll_expired(cx)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_later_fires_then_and_not_at_the_first() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(start + Duration::from_secs(10));
        timer.set(start + Duration::from_secs(25));
        timer.expired().await;
        assert_eq!(start.elapsed(), Duration::from_secs(25));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_earlier_fires_at_once_then() {
        let start = Instant::now();
        let mut timer = LazyTimer::new(start + Duration::from_secs(60));
        timer.set(start + Duration::from_secs(3));
        timer.expired().await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        // Waited on again after it fired: set later, it waits again.
        timer.set(start + Duration::from_secs(7));
        timer.expired().await;
        assert_eq!(start.elapsed(), Duration::from_secs(7));
    }
}
