//! Scheduler tests on the pure-Rust core: queue and heap invariants under
//! random operation sequences, and the policy's defining behaviours.

use vtc_core::{ClientId, CoreError, Policy, RequestState, Scheduler, Tokens};

mod common;

use common::Lcg;

fn sched(m: i64, policy: Policy) -> (Scheduler, Vec<ClientId>) {
    let mut s = Scheduler::new(m, 1.0, 2.0, policy).unwrap();
    let cs = (0..5).map(|_| s.add_client()).collect();
    (s, cs)
}

#[test]
fn random_operations_keep_every_invariant() {
    for policy in [Policy::Vtc, Policy::Lcf, Policy::Fcfs] {
        for seed in 0..40u64 {
            let mut rng = Lcg(seed * 31 + 1);
            let m = [16i64, 100, 1000][(seed % 3) as usize];
            let (mut s, cs) = sched(m, policy);
            // some sequences in priority bands, some with a per-client cap
            let bands: &[i64] = if seed % 2 == 0 { &[0] } else { &[0, 0, -1, 5] };
            if seed % 5 == 1 {
                s.set_client_cap(Some(m as u64 / 3 + 1)).unwrap();
            }
            let mut live: Vec<u64> = Vec::new();
            let mut counters = vec![0.0f64; cs.len()];
            let mut out = Vec::new();
            for rid in 0..2000u64 {
                match rng.below(10) {
                    0..=3 => {
                        let c = cs[rng.below(cs.len() as u64) as usize];
                        let p = 1 + rng.below(m as u64) as i64;
                        let band = bands[rng.below(bands.len() as u64) as usize];
                        s.submit_priority(rid, c, p, 0, None, band).unwrap();
                        live.push(rid);
                    }
                    4 | 5 => {
                        s.schedule(&mut out);
                    }
                    6 | 7 => {
                        let mut pre = Vec::new();
                        match s.decode_step(&mut pre) {
                            Ok(()) => {}
                            Err(CoreError::Capacity { request_id, .. }) => {
                                s.finish(request_id).unwrap()
                            }
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                    8 if !live.is_empty() => {
                        let r = live.swap_remove(rng.below(live.len() as u64) as usize);
                        match s.status(r) {
                            Some(RequestState::Running) => s.finish(r).unwrap(),
                            Some(RequestState::Waiting | RequestState::Aside) => {
                                s.cancel(r).unwrap()
                            }
                            None => {}
                        }
                    }
                    _ if !live.is_empty() => {
                        let r = live[rng.below(live.len() as u64) as usize];
                        if s.status(r) == Some(RequestState::Running) {
                            s.preempt(r).unwrap();
                        } else if s.status(r) == Some(RequestState::Aside) {
                            s.put_back(r).unwrap();
                        } else if rng.below(2) == 0 {
                            s.set_aside();
                        }
                    }
                    _ => {}
                }
                s.check_invariants()
                    .unwrap_or_else(|e| panic!("seed {seed} op {rid}: {e}"));
                assert!(
                    s.occupancy() <= m as u128,
                    "occupancy {} > M {m}",
                    s.occupancy()
                );
                for (i, &c) in cs.iter().enumerate() {
                    let v = s.counter(c).unwrap();
                    assert!(v >= counters[i], "counter of client {i} decreased");
                    counters[i] = v;
                }
            }
        }
    }
}

#[test]
fn least_counter_first_then_fifo_and_seq_tiebreak() {
    let (mut s, c) = sched(10_000, Policy::Vtc);
    s.submit(1, c[0], 10).unwrap();
    s.submit(2, c[0], 10).unwrap();
    s.submit(3, c[1], 10).unwrap();
    s.submit(4, c[2], 10).unwrap();
    let mut out = Vec::new();
    s.schedule(&mut out);
    assert_eq!(out, vec![1, 3, 4, 2]);
}

#[test]
fn returning_client_is_lifted_to_the_floor_not_above() {
    let (mut s, c) = sched(100, Policy::Vtc);
    let mut out = Vec::new();
    s.submit(1, c[0], 60).unwrap();
    s.schedule(&mut out); // c0 counter 60
    s.submit(2, c[0], 60).unwrap(); // c0 backlogged at 60
    s.submit(3, c[1], 30).unwrap(); // c1 lifted from 0 to 60
    assert_eq!(s.counter(c[1]).unwrap(), 60.0);
    s.submit(4, c[2], 30).unwrap(); // floor is min(60, 60)
    assert_eq!(s.counter(c[2]).unwrap(), 60.0);
    // an over-served client is never lowered
    let (mut s, c) = sched(1000, Policy::Vtc);
    s.submit(1, c[0], 500).unwrap();
    s.schedule(&mut out);
    s.submit(2, c[1], 10).unwrap(); // nobody backlogged: lifted to the last client to leave, c0
    assert_eq!(s.counter(c[1]).unwrap(), 500.0);
    s.submit(3, c[0], 10).unwrap();
    assert_eq!(s.counter(c[0]).unwrap(), 500.0);
}

#[test]
fn lcf_never_lifts() {
    let (mut s, c) = sched(1000, Policy::Lcf);
    let mut out = Vec::new();
    s.submit(1, c[0], 500).unwrap();
    s.schedule(&mut out);
    s.submit(2, c[0], 100).unwrap();
    s.submit(3, c[1], 100).unwrap();
    assert_eq!(s.counter(c[1]).unwrap(), 0.0);
}

#[test]
fn errors_leave_the_scheduler_unchanged() {
    let (mut s, c) = sched(100, Policy::Vtc);
    s.submit(1, c[0], 50).unwrap();
    let mut out = Vec::new();
    s.schedule(&mut out);
    s.submit(2, c[0], 80).unwrap();
    assert_eq!(s.submit(1, c[1], 5), Err(CoreError::DuplicateRequest(1)));
    assert_eq!(s.submit(9, c[1], 0), Err(CoreError::InvalidPrompt(0)));
    assert!(matches!(
        s.submit(9, c[1], 101),
        Err(CoreError::PromptTooLong { .. })
    ));
    assert!(matches!(s.finish(2), Err(CoreError::NotRunning { .. })));
    assert_eq!(s.cancel(7), Err(CoreError::UnknownRequest(7)));
    assert!(matches!(
        s.decode(&[1, 1], Tokens::Each(1)),
        Err(CoreError::DuplicateInBatch(1))
    ));
    assert!(matches!(
        s.decode(&[1, 2], Tokens::Each(1)),
        Err(CoreError::NotRunning { .. })
    ));
    assert!(matches!(
        s.decode(&[1], Tokens::PerRequest(&[-1])),
        Err(CoreError::NegativeTokens(-1))
    ));
    assert_eq!(s.set_weight(c[0], 0.0), Err(CoreError::InvalidWeight(0.0)));
    s.check_invariants().unwrap();
    assert_eq!(s.occupancy(), 50);
    assert_eq!(s.num_waiting(), 1);
    assert_eq!(s.counter(c[0]).unwrap(), 50.0);
}

#[test]
fn put_back_returns_a_request_set_aside_unchanged() {
    let (mut s, c) = sched(1000, Policy::Vtc);
    s.submit(1, c[1], 30).unwrap();
    s.submit(2, c[0], 10).unwrap();
    s.submit(3, c[0], 20).unwrap();
    s.raise_counter(c[1], 100.0).unwrap();
    let before: Vec<f64> = c[..2].iter().map(|&k| s.counter(k).unwrap()).collect();
    assert_eq!(s.set_aside(), Some(2));
    assert_eq!(s.set_aside(), Some(3));
    assert_eq!(s.status(2), Some(RequestState::Aside));
    assert_eq!((s.num_waiting(), s.num_running(), s.occupancy()), (1, 0, 0));
    assert_eq!(s.peek(), Some(1)); // client 0 has nothing waiting now
    assert!(matches!(s.finish(2), Err(CoreError::NotRunning { .. })));
    let mut gone = Vec::new();
    s.forget_idle(&mut gone);
    assert!(!gone.contains(&c[0])); // a client with a request set aside is not idle
    s.put_back(3).unwrap();
    s.put_back(2).unwrap();
    let after: Vec<f64> = c[..2].iter().map(|&k| s.counter(k).unwrap()).collect();
    assert_eq!(before, after); // nothing charged, no lift to client 1's 100
    assert_eq!(s.peek(), Some(2)); // in its place, ahead of 3
    assert!(matches!(s.put_back(2), Err(CoreError::NotAside { .. })));
    assert_eq!(s.put_back(99), Err(CoreError::UnknownRequest(99)));
    assert_eq!(s.pop_cached(Some(4)).unwrap(), Some(2));
    assert_eq!(s.counter(c[0]).unwrap(), 6.0); // charged once, at the real admission
    assert_eq!(s.set_aside(), Some(3));
    s.cancel(3).unwrap();
    assert_eq!(s.status(3), None);
    s.check_invariants().unwrap();
}

#[test]
fn preempted_request_is_not_charged_twice() {
    let (mut s, c) = sched(1000, Policy::Vtc);
    let mut out = Vec::new();
    s.submit(1, c[0], 100).unwrap();
    s.schedule(&mut out);
    s.decode(&[1], Tokens::Each(10)).unwrap();
    assert_eq!(s.counter(c[0]).unwrap(), 120.0);
    s.preempt(1).unwrap();
    assert_eq!(s.occupancy(), 0);
    out.clear();
    s.schedule(&mut out);
    assert_eq!(out, vec![1]);
    assert_eq!(s.counter(c[0]).unwrap(), 120.0);
    assert_eq!(s.occupancy(), 110);
}

#[test]
fn decode_evicts_from_the_most_served_client() {
    let (mut s, c) = sched(60, Policy::Vtc);
    let mut out = Vec::new();
    s.submit(1, c[0], 30).unwrap(); // c0 counter 30
    s.submit(2, c[1], 10).unwrap(); // c1 counter 10
    s.submit(3, c[1], 20).unwrap(); // c1 counter 30 after admission
    s.schedule(&mut out);
    assert_eq!(out, vec![1, 2, 3]);
    s.decode(&[2], Tokens::Each(1)).unwrap(); // c1: 32 > c0: 30, occupancy 61 > M
                                              // every request must grow by one: 61 + 3 > 60 -> evict c1's latest (3), 41 + 2 fits
    let mut pre = Vec::new();
    s.submit(4, c[2], 1).unwrap();
    s.decode_step(&mut pre).unwrap();
    assert_eq!(pre, vec![3]);
    assert_eq!(s.status(3), Some(RequestState::Waiting));
}
