//! Timeline signals of the device's own type (from its queue factory): monotonic values,
//! waits satisfied in order, timeouts, and failure that reaches every waiter.
//!
//! No check depends on timing: waits that must succeed get a generous limit ([`HANG_GUARD`])
//! that only matters when the implementation is broken, and "has not returned yet" is only
//! asserted for waits whose target cannot have been reached.

use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use kiln_device::{Device, Error, TimelineSignal};

use crate::{Failure, Outcome, ensure, expect_err, queues};

/// The longest any check waits for something that must happen; reaching it means a hang.
pub const HANG_GUARD: Duration = Duration::from_secs(30);

/// A waiting thread's handle: the wait's result and the value seen after it.
type Waiter = JoinHandle<(Result<(), Error>, u64)>;

/// A thread waiting for `target`; it returns the wait's result and the value it then saw.
fn waiter(s: &Arc<dyn TimelineSignal>, target: u64) -> Waiter {
    let s = s.clone();
    thread::spawn(move || {
        let r = s.wait(target, HANG_GUARD);
        (r, s.value())
    })
}

fn join<T>(h: JoinHandle<T>, what: &str) -> Result<T, Failure> {
    h.join().map_err(|_| Failure::Violation(format!("{what}: the waiting thread panicked")))
}

/// `set` never lowers the value; waits return in value order, each only once its value is
/// reached; a waiting thread sees every value a setting thread reaches.
pub fn ordering(dev: &Arc<Device>) -> Outcome {
    let f = queues(dev)?;
    let s = f.create_dyn_signal()?;
    ensure!(s.value() == 0, "a new signal starts at {}, not 0", s.value());
    s.set(5);
    s.set(3);
    ensure!(s.value() == 5, "set(5) then set(3) left the value at {}", s.value());
    s.wait(5, Duration::ZERO)?;
    s.wait(1, Duration::ZERO)?;
    ensure!(s.is_reached(5) && !s.is_reached(6), "is_reached disagrees with the value 5");

    let mut pending: Vec<(u64, Waiter)> = [8u64, 6, 7].iter().map(|t| (*t, waiter(&s, *t))).collect();
    for step in [6u64, 7, 8] {
        s.set(step);
        let i = pending.iter().position(|(t, _)| *t == step).unwrap_or(0);
        let (target, h) = pending.remove(i);
        let (r, seen) = join(h, &format!("wait({target})"))?;
        r.map_err(|e| Failure::Violation(format!("wait({target}) after set({step}) failed: {e}")))?;
        ensure!(seen >= target, "wait({target}) returned but the value is {seen}");
        for (t, h) in &pending {
            ensure!(!h.is_finished(), "wait({t}) returned while the value was {step}");
        }
    }

    // A setter racing a waiter that walks the timeline in order.
    let count = 2000u64;
    let base = s.value();
    let setter = {
        let s = s.clone();
        thread::spawn(move || (1..=count).for_each(|v| s.set(base + v)))
    };
    let mut last = base;
    for v in 1..=count {
        s.wait(base + v, HANG_GUARD)
            .map_err(|e| Failure::Violation(format!("wait({}) in a racing sequence failed: {e}", base + v)))?;
        let now = s.value();
        ensure!(now >= base + v && now >= last, "value {now} after wait({}) (previously {last})", base + v);
        last = now;
    }
    join(setter, "setter")?;
    ensure!(s.value() == base + count, "after setting up to {} the value is {}", base + count, s.value());
    Ok(())
}

/// A wait that cannot be satisfied in time returns [`Error::Timeout`] naming the target and
/// the current value; a zero timeout polls.
pub fn timeout(dev: &Arc<Device>) -> Outcome {
    let s = queues(dev)?.create_dyn_signal()?;
    let is_timeout = |target: u64, current: u64| move |e: &Error| matches!(e, Error::Timeout { target: t, current: c, .. } if *t == target && *c == current);
    expect_err("wait(1) for 20 ms on a new signal", s.wait(1, Duration::from_millis(20)), is_timeout(1, 0))?;
    expect_err("wait(1) polling a new signal", s.wait(1, Duration::ZERO), is_timeout(1, 0))?;
    s.set(3);
    expect_err("wait(4) for 5 ms at value 3", s.wait(4, Duration::from_millis(5)), is_timeout(4, 3))?;
    s.wait(3, Duration::ZERO)?;
    ensure!(s.failure().is_none(), "a timeout failed the signal: {:?}", s.failure());
    s.set(4);
    s.wait(4, Duration::ZERO)?;
    Ok(())
}

/// `fail` reaches every current and later waiter of an unreached value with the original
/// error; reached values stay reached; the value is frozen and the first failure wins.
pub fn failure_propagation(dev: &Arc<Device>) -> Outcome {
    let s = queues(dev)?.create_dyn_signal()?;
    s.set(2);
    let current = [waiter(&s, 3), waiter(&s, 5)];
    s.fail(Error::Invalid("producer broke".into()));
    let is_failed =
        |e: &Error| matches!(e, Error::SignalFailed(c) if matches!(&**c, Error::Invalid(m) if m == "producer broke"));
    for (h, t) in current.into_iter().zip([3, 5]) {
        let (r, _) = join(h, &format!("wait({t})"))?;
        expect_err(&format!("a wait({t}) pending when the signal failed"), r, is_failed)?;
    }
    expect_err("a wait(4) after the failure", s.wait(4, HANG_GUARD), is_failed)?;
    s.wait(2, Duration::ZERO)
        .map_err(|e| Failure::Violation(format!("wait(2) for a value reached before fail: {e}")))?;
    ensure!(
        matches!(s.failure(), Some(ref e) if e.to_string().contains("producer broke")),
        "failure() is {:?}",
        s.failure()
    );
    s.set(10);
    ensure!(s.value() == 2, "set(10) after fail moved the value to {}", s.value());
    expect_err("a wait(10) after set(10) on a failed signal", s.wait(10, Duration::ZERO), is_failed)?;
    s.fail(Error::Invalid("second failure".into()));
    ensure!(
        matches!(s.failure(), Some(ref e) if e.to_string().contains("producer broke")),
        "a second fail replaced the first: {:?}",
        s.failure()
    );
    Ok(())
}
