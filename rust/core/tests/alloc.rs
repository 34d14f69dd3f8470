//! "No allocation per decode step in the core" (issue 5), checked with a
//! counting global allocator: once the scheduler has warmed up, charging a
//! running batch (`decode` with one count for all or one per request,
//! `decode_all`, and the capacity-checked `decode_step`) allocates nothing,
//! for every cost function
//! and in the bulk re-key path (a decode that touches most backlogged clients)
//! as well as the per-client one. Reading `active_clients` allocates nothing
//! either, nor does a selection through the locality window, nor a metrics
//! refresh of the fairness window (`FairnessWindow::refresh`).
//!
//! The counter is per thread (tests run in parallel threads of this binary),
//! kept in a `const`-initialised thread local so that reading it never
//! allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod common;

use common::every_cost;
use vtc_core::fairness::FairnessWindow;
use vtc_core::{ClientId, Cost, KeyRef, Policy, Scheduler, Tokens};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: a thread being torn down still allocates through us.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations made by `f` on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

/// A scheduler with `clients` clients, `per_client` waiting requests each and a
/// batch admitted under `budget`; returns it with the running ids.
fn loaded(cost: Cost, clients: usize, per_client: usize, budget: i64) -> (Scheduler, Vec<u64>) {
    let mut s = Scheduler::with_cost(budget, cost, Policy::Vtc).unwrap();
    let ids: Vec<ClientId> = (0..clients).map(|_| s.add_client()).collect();
    let mut rid = 0;
    for _ in 0..per_client {
        for &c in &ids {
            s.submit(rid, c, 64 + (rid % 7) as i64 * 16).unwrap();
            rid += 1;
        }
    }
    let mut admitted = Vec::new();
    s.schedule(&mut admitted);
    assert!(
        admitted.len() > 16,
        "the batch should be sizeable: {}",
        admitted.len()
    );
    (s, admitted)
}

#[test]
fn decode_of_a_running_batch_allocates_nothing() {
    // Few clients (the tops freshened), many clients most with one running
    // request (keys left stale), and every backlogged client running (the
    // bulk re-key path: every key set, the heaps rebuilt).
    for (clients, per_client, budget) in [(8, 200, 20_000), (2_000, 2, 200_000), (64, 4, 12_000)] {
        for cost in every_cost() {
            let (mut s, running) = loaded(cost, clients, per_client, budget);
            let counts: Vec<i64> = (0..running.len()).map(|i| 1 + (i % 3) as i64).collect();
            // Warm-up: the first call may size the scheduler's scratch space.
            s.decode(&running, Tokens::Each(1)).unwrap();
            s.decode(&running, Tokens::PerRequest(&counts)).unwrap();
            s.decode_all(1).unwrap();
            for step in 0..50 {
                let n = allocations_in(|| {
                    s.decode(&running, Tokens::Each(1)).unwrap();
                    s.decode(&running, Tokens::PerRequest(&counts)).unwrap();
                    s.decode_all(2).unwrap();
                });
                assert_eq!(
                    n, 0,
                    "{cost:?}, {clients} clients: {n} allocations at step {step}"
                );
            }
            s.check_invariants().unwrap();
        }
    }
}

#[test]
fn capacity_checked_decode_step_allocates_nothing_without_preemption() {
    for cost in every_cost() {
        // A budget far above what the batch will grow to in 50 steps.
        let mut s = Scheduler::with_cost(1_000_000, cost, Policy::Vtc).unwrap();
        let ids: Vec<ClientId> = (0..64).map(|_| s.add_client()).collect();
        for (rid, &c) in (0..2_000u64).zip(ids.iter().cycle()) {
            s.submit(rid, c, 128).unwrap();
        }
        let mut admitted = Vec::new();
        s.schedule(&mut admitted);
        let mut preempted = Vec::with_capacity(16);
        s.decode_step(&mut preempted).unwrap();
        for step in 0..50 {
            let n = allocations_in(|| s.decode_step(&mut preempted).unwrap());
            assert_eq!(n, 0, "{cost:?}: {n} allocations at step {step}");
            assert!(preempted.is_empty());
        }
    }
}

#[test]
fn selection_through_the_locality_window_allocates_nothing() {
    // Many clients within the quantum: every selection walks the window
    // (its scratch buffer is reused) and asks the lookup of each offered
    // request, some of them behind their heads.
    let mut s = Scheduler::with_config(&vtc_core::Config {
        locality_quantum: 1e9,
        ..vtc_core::Config::new(1_000_000)
    })
    .unwrap();
    let ids: Vec<ClientId> = (0..500).map(|_| s.add_client()).collect();
    for (rid, &c) in (0..2_000u64).zip(ids.iter().cycle()) {
        s.submit(rid, c, 64).unwrap();
    }
    let mut lookup = |rid: u64, _: u64| Ok(rid % 37);
    // Warm-up: the first selection sizes the window's buffer.
    s.peek_with(&mut lookup).unwrap();
    let r = s.set_aside_with(&mut lookup).unwrap().unwrap();
    s.put_back(r).unwrap();
    for step in 0..50 {
        let n = allocations_in(|| {
            s.peek_with(&mut lookup).unwrap();
            let r = s.set_aside_with(&mut lookup).unwrap().unwrap();
            s.put_back(r).unwrap();
        });
        assert_eq!(n, 0, "{n} allocations at step {step}");
    }
    s.check_invariants().unwrap();
}

#[test]
fn active_clients_allocates_nothing() {
    // Read from the per-client counts: no allocation, whatever the number of
    // requests (waiting, running and set aside).
    let (mut s, _) = loaded(Cost::Linear { wp: 1.0, wq: 2.0 }, 500, 8, 200_000);
    assert!(s.set_aside().is_some() && s.set_aside().is_some());
    let mut sums = (0, 0, 0);
    let n = allocations_in(|| {
        for (_, (w, r)) in s.active_clients() {
            sums = (sums.0 + 1, sums.1 + w, sums.2 + r);
        }
    });
    assert_eq!(n, 0, "{n} allocations");
    assert_eq!(sums, (500, s.num_waiting() + 2, s.num_running()));
    s.check_invariants().unwrap();
}

#[test]
fn decode_and_change_reads_allocate_nothing_with_readers_active() {
    // Two change readers (metrics, a sync): once their lists and the caller's
    // buffers have grown, marking the charged clients in decode and reading
    // the changes allocate nothing.
    for (clients, per_client, budget) in [(8, 200, 20_000), (2_000, 2, 200_000)] {
        let (mut s, running) = loaded(
            Cost::Linear { wp: 1.0, wq: 2.0 },
            clients,
            per_client,
            budget,
        );
        let (mut changed, mut gone) = (Vec::new(), Vec::new());
        for reader in [0, 2] {
            assert!(s.changes(reader, &mut changed, &mut gone).unwrap());
        }
        s.decode(&running, Tokens::Each(1)).unwrap();
        for reader in [0, 2] {
            changed.clear();
            assert!(!s.changes(reader, &mut changed, &mut gone).unwrap());
        }
        for step in 0..50 {
            let n = allocations_in(|| {
                s.decode(&running, Tokens::Each(1)).unwrap();
                s.decode_all(2).unwrap();
                for reader in [0, 2] {
                    changed.clear();
                    s.changes(reader, &mut changed, &mut gone).unwrap();
                }
            });
            assert_eq!(n, 0, "{clients} clients: {n} allocations at step {step}");
            assert!(!changed.is_empty() && gone.is_empty());
        }
        s.check_invariants().unwrap();
    }
}

#[test]
fn fairness_window_refresh_allocates_nothing_once_warmed_up() {
    // Keyed clients (int and str keys), some backlogged, served between
    // refreshes; four refreshes per snapshot: the refreshes between two
    // snapshots and those that take one (and drop the oldest, whose buffer
    // the next snapshot reuses) allocate nothing once the window is full.
    let mut s = Scheduler::new(4_000, 1.0, 1.0, Policy::Vtc).unwrap();
    let mut rid = 0u64;
    for i in 0..300i64 {
        for _ in 0..3 {
            rid += 1;
            if i % 2 == 0 {
                s.submit_keyed(rid, &KeyRef::Int(i), 64, 0, None, 0)
                    .unwrap();
            } else {
                let k = KeyRef::Str(format!("tenant-{i}").into_bytes().into());
                s.submit_keyed(rid, &k, 64, 0, None, 0).unwrap();
            }
        }
    }
    let mut running = Vec::new();
    s.schedule(&mut running);
    assert!(!running.is_empty() && s.num_waiting() > 0);
    let mut fw = FairnessWindow::new(8.0).unwrap();
    let mut now = 0.0;
    // Warm-up: the window fills (32 snapshots and the start), buffers grow.
    for _ in 0..(4 * 40) {
        s.decode(&running, Tokens::Each(1)).unwrap();
        fw.refresh(&s, now);
        now += 0.0625; // window / 32 / 4, exact in binary
    }
    let full = fw.snapshots();
    for step in 0..(4 * 40) {
        s.decode(&running, Tokens::Each(1)).unwrap();
        let mut figures = None;
        let n = allocations_in(|| figures = Some(fw.refresh(&s, now)));
        assert_eq!(n, 0, "{n} allocations at refresh {step}");
        let f = figures.unwrap();
        assert!(f.jain.is_some_and(|j| j > 0.0) && f.backlogged > 0);
        assert_eq!(fw.snapshots(), full);
        now += 0.0625;
    }
    fw.check().unwrap();
}

#[test]
fn the_counter_sees_allocations() {
    // The check above would pass vacuously if the allocator were not counting.
    let n = allocations_in(|| {
        let v: Vec<u64> = std::hint::black_box(Vec::with_capacity(10));
        drop(v);
    });
    assert_eq!(n, 1);
}
