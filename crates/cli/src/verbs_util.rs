//! Helpers the verbs tools share: completion waits with a safety-net timeout, blocking on
//! the CQ (condition variable) or busy-polling it.

use std::time::{Duration, Instant};

use softrdma::{Cq, Error, WorkCompletion};

/// How a tool waits for completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Block on the CQ until a completion arrives (the thread sleeps).
    Block,
    /// Spin on `poll`, yielding the CPU between polls (what perftest does by default).
    Busy,
}

/// Moves at least one and at most `max` completions to `out`, waiting at most `timeout`
/// (a safety net: [`Error::Timeout`] when nothing arrived).
pub fn wait_some(
    cq: &Cq,
    mode: WaitMode,
    max: usize,
    timeout: Duration,
    out: &mut Vec<WorkCompletion>,
) -> Result<usize, Error> {
    match mode {
        WaitMode::Block => cq.wait(1, max, timeout, out),
        WaitMode::Busy => {
            let n = cq.poll(max, out);
            if n > 0 {
                return Ok(n);
            }
            let deadline = Instant::now() + timeout;
            let mut spins = 0u32;
            loop {
                let n = cq.poll(max, out);
                if n > 0 {
                    return Ok(n);
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout);
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// Spins (yielding) until `cond` holds or `timeout` passes; `false` on timeout.
pub fn spin_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    loop {
        if cond() {
            return true;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(16) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}
