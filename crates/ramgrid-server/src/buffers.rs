//! The memory of connection buffers, across all connections and both protocols: one budget
//! (`--buffer-memory`) that read buffers and replies beyond a connection's small fixed base draw on.
//!
//! Rules (docs/memory.md):
//! 1. Each connection has a fixed base (one read chunk and one reply chunk), not charged: it is what
//!    any connection costs, bounded by `--max-conns`.
//! 2. A read buffer grows past its base only after the budget granted the whole growth at once (a
//!    native frame's announced length; for the memcached protocols, the largest request the parser
//!    accepts). A connection that holds a grant never waits for another, and one that waits holds
//!    none beyond its base, so waiting connections cannot deadlock each other. The grant is given
//!    back when the buffer shrinks to its base.
//! 3. A reply larger than the base is charged while it is held: a native GET reserves its reply's
//!    bound before composing it (waiting briefly when the budget is short, then composing only what
//!    fits, so the client asks for fewer keys), and a memcached reply (at most one part of a
//!    multi-key get) is charged as it grows. Both are given back when the reply is written and the
//!    buffer shrinks. A buffer may instead keep what it grew to (up to an eighth of the budget and
//!    8 MiB) while half the budget is free: still charged, it serves the next reply without the
//!    allocator mapping and faulting in its pages again (a scan's pages come one after another).
//! 4. Memory given back wakes the connections waiting for it.

use std::pin::pin;
use std::time::Duration;

use ramgrid_store::Budget;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Most a reply buffer keeps beyond its base between replies ([`ConnMemory::may_keep`]).
const KEEP_MAX: usize = 8 << 20;

/// How often a waiting connection looks at the budget again even without a wake-up.
const RECHECK: Duration = Duration::from_millis(20);

/// The server-wide budget of connection buffers.
#[derive(Debug)]
pub struct BufferMemory {
    budget: Budget,
    freed: Notify,
}

impl BufferMemory {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> BufferMemory {
        BufferMemory {
            budget: Budget::new(limit),
            freed: Notify::new(),
        }
    }

    /// The budget, for stats.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    fn release(&self, n: usize) {
        if n > 0 {
            self.budget.release(n);
            self.freed.notify_waiters();
        }
    }

    /// Takes `n` bytes, waiting for other connections to give memory back until `deadline`.
    async fn take(&self, n: usize, deadline: Instant) -> bool {
        loop {
            let mut woken = pin!(self.freed.notified());
            // Registered before the check, so a release between the check and the wait wakes us.
            woken.as_mut().enable();
            if self.budget.try_charge(n) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let _ = tokio::time::timeout_at(deadline.min(now + RECHECK), woken).await;
        }
    }
}

/// What one connection holds beyond its base, charged to the shared budget. Dropping it gives
/// everything back.
#[derive(Debug)]
pub struct ConnMemory<'a> {
    pool: &'a BufferMemory,
    read: usize,
    reply: usize,
}

impl<'a> ConnMemory<'a> {
    /// A connection holding nothing beyond its base.
    pub fn new(pool: &'a BufferMemory) -> ConnMemory<'a> {
        ConnMemory {
            pool,
            read: 0,
            reply: 0,
        }
    }

    /// Makes sure the read buffer may hold `extra` bytes beyond its base: takes the difference
    /// from the budget in one piece, waiting until `deadline`. False if the budget could not give it
    /// (or never could: more than the whole budget).
    pub async fn grow_read(&mut self, extra: usize, deadline: Instant) -> bool {
        if extra <= self.read {
            return true;
        }
        let more = extra - self.read;
        if more > self.pool.budget.limit() || !self.pool.take(more, deadline).await {
            return false;
        }
        self.read = extra;
        true
    }

    /// The read buffer is back to its base: gives its grant back.
    pub fn shrink_read(&mut self) {
        self.pool.release(std::mem::take(&mut self.read));
    }

    /// Reserves room for a reply of up to `want` bytes beyond the base, waiting up to `wait` when
    /// the budget is short, then settling for what is free. Returns the bytes reserved (beyond
    /// what replies already hold), which the caller's reply must stay within.
    pub async fn reserve_reply(&mut self, want: usize, wait: Duration) -> usize {
        if want <= self.reply {
            return want;
        }
        let more = want - self.reply;
        if more <= self.pool.budget.limit() && self.pool.take(more, Instant::now() + wait).await {
            self.reply = want;
            return want;
        }
        // Short of memory: take what is free now (possibly nothing).
        let free = self.pool.budget.available().min(more);
        if free > 0 && self.pool.budget.try_charge(free) {
            self.reply += free;
        }
        self.reply
    }

    /// Whether a reply buffer emptied after a write may keep `extra` bytes beyond its base for the
    /// next reply (still charged): at most an eighth of the budget and 8 MiB, and only while half
    /// the budget is free, so kept buffers never hold more than about half of it.
    pub fn may_keep(&self, extra: usize) -> bool {
        let budget = &self.pool.budget;
        extra <= (budget.limit() / 8).min(KEEP_MAX) && budget.available() >= budget.limit() / 2
    }

    /// Replies now hold `held` bytes beyond the base: charges growth (memory already allocated
    /// must be counted, even past the limit) and gives back the rest of a reservation.
    pub fn settle_reply(&mut self, held: usize) {
        if held > self.reply {
            self.pool.budget.force_charge(held - self.reply);
        } else {
            self.pool.release(self.reply - held);
        }
        self.reply = held;
    }
}

impl Drop for ConnMemory<'_> {
    fn drop(&mut self) {
        self.pool.release(self.read + self.reply);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_grant_waits_for_memory_given_back() {
        rt().block_on(async {
            // Leaked so that a task spawned on the LocalSet may borrow it.
            let pool: &'static BufferMemory = Box::leak(Box::new(BufferMemory::new(100)));
            let mut a = ConnMemory::new(pool);
            let mut b = ConnMemory::new(pool);
            let soon = || Instant::now() + Duration::from_millis(50);
            assert!(a.grow_read(80, soon()).await);
            assert!(!b.grow_read(30, soon()).await, "only 20 are free");
            assert_eq!(pool.budget().used(), 80);
            let local = tokio::task::LocalSet::new();
            local
                .run_until(async {
                    let waiter = tokio::task::spawn_local(async move {
                        let ok = b
                            .grow_read(30, Instant::now() + Duration::from_secs(5))
                            .await;
                        (ok, b.read)
                    });
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    a.shrink_read();
                    assert_eq!(waiter.await.unwrap(), (true, 30));
                })
                .await;
            assert!(
                !a.grow_read(101, soon()).await,
                "more than the whole budget"
            );
        });
    }

    #[test]
    fn replies_settle_and_everything_is_given_back_on_drop() {
        rt().block_on(async {
            let pool = BufferMemory::new(100);
            {
                let mut a = ConnMemory::new(&pool);
                assert_eq!(a.reserve_reply(60, Duration::ZERO).await, 60);
                let mut b = ConnMemory::new(&pool);
                // Only 40 free: b settles for them.
                assert_eq!(b.reserve_reply(60, Duration::from_millis(30)).await, 40);
                a.settle_reply(10);
                assert_eq!(pool.budget().used(), 50);
                b.settle_reply(70); // grew past its reservation: counted anyway
                assert_eq!(pool.budget().used(), 80);
                assert!(a.grow_read(20, Instant::now()).await);
            }
            assert_eq!(pool.budget().used(), 0);
        });
    }
}
