//! `decode_all`: the uniform engine-form decode (every running request
//! generates the same number of tokens, no ids passed) charges exactly what
//! `decode` with every running id charges, for every cost, prediction and
//! band setting, and fails without changing anything.

mod common;

use common::{every_cost, Lcg};
use vtc_core::{
    ClientId, CoreError, Policy, Predictor, Scheduler, Tokens, MAX_REQUEST_TOKENS,
    MAX_TOKENS_PER_CALL,
};

/// Everything observable that a decode changes, compared bit for bit.
fn observe(s: &Scheduler, clients: &[ClientId]) -> Vec<String> {
    let mut out: Vec<String> = clients
        .iter()
        .map(|&c| {
            format!(
                "{c:?} {:?} {:?} {:?}",
                s.counter(c).unwrap().to_bits(),
                s.service(c).unwrap().to_bits(),
                s.tokens(c).unwrap()
            )
        })
        .collect();
    out.push(format!("occupancy {}", s.occupancy()));
    out.push(format!("peek {:?}", s.peek()));
    for rid in s.running() {
        out.push(format!("running {rid} {}", s.generated(rid).unwrap()));
    }
    for (p, v) in s.band_counters() {
        out.push(format!("band {p} {:?}", v.to_bits()));
    }
    out
}

/// One random engine-mode run through two schedulers, one decoding with
/// `decode_all(t)` and the other with `decode(<running ids>, Each(t))`.
/// Without `predict` no request has a predicted length: with the `none`
/// predictor every `decode_all` then takes the per-client sums.
fn run_pair(seed: u64, predict: bool, uniform: &mut Scheduler, listed: &mut Scheduler) {
    let mut rng = Lcg(seed);
    let clients: Vec<ClientId> = (0..5)
        .map(|_| {
            let c = uniform.add_client();
            assert_eq!(listed.add_client(), c);
            c
        })
        .collect();
    let mut next_rid = 0u64;
    let mut ids = Vec::new();
    for _ in 0..600 {
        match rng.below(10) {
            0..=2 => {
                next_rid += 1;
                let c = clients[rng.below(5) as usize];
                let prompt = 1 + rng.below(40) as i64;
                let cached = rng.below(prompt as u64) as i64 / 2;
                let predicted = match rng.below(4) {
                    0 if predict => Some(rng.below(12) as i64),
                    _ => None,
                };
                let priority = rng.below(2) as i64;
                for s in [&mut *uniform, &mut *listed] {
                    s.submit_priority(next_rid, c, prompt, cached, predicted, priority)
                        .unwrap();
                }
            }
            3..=4 => {
                assert_eq!(uniform.pop(), listed.pop());
            }
            5..=7 => {
                let t = [0i64, 1, 1, 1, 2, 7][rng.below(6) as usize];
                ids.clear();
                ids.extend(listed.running());
                listed.decode(&ids, Tokens::Each(t)).unwrap();
                uniform.decode_all(t).unwrap();
            }
            8 => {
                let n = uniform.num_running();
                if n > 0 {
                    let rid = uniform.running().nth(rng.below(n as u64) as usize).unwrap();
                    if rng.below(3) == 0 {
                        uniform.preempt(rid).unwrap();
                        listed.preempt(rid).unwrap();
                    } else {
                        uniform.finish(rid).unwrap();
                        listed.finish(rid).unwrap();
                    }
                }
            }
            _ => {
                let c = clients[rng.below(5) as usize];
                let w = [0.5, 1.0, 3.0][rng.below(3) as usize];
                uniform.set_weight(c, w).unwrap();
                listed.set_weight(c, w).unwrap();
            }
        }
        assert_eq!(observe(uniform, &clients), observe(listed, &clients));
        uniform.check_invariants().unwrap();
        listed.check_invariants().unwrap();
    }
}

#[test]
fn decode_all_charges_what_decode_with_every_running_id_charges() {
    let mut seed = 1;
    for cost in every_cost() {
        for predictor in [Predictor::None, Predictor::Mean] {
            for bands in [None, Some(&[(0i64, 1.0), (1, 3.0)][..])] {
                for (policy, predict) in [
                    (Policy::Vtc, true),
                    (Policy::Vtc, false),
                    (Policy::Fcfs, false),
                ] {
                    let make = || {
                        let mut s = Scheduler::with_cost(1 << 20, cost, policy).unwrap();
                        s.set_predictor(predictor);
                        s.set_band_weights(bands).unwrap();
                        s
                    };
                    let (mut a, mut b) = (make(), make());
                    run_pair(seed, predict, &mut a, &mut b);
                    seed += 1;
                }
            }
        }
    }
}

#[test]
fn decode_all_refuses_bad_counts_and_changes_nothing() {
    let mut s = Scheduler::new(1 << 20, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit(1, x, 10).unwrap();
    s.submit(2, x, 10).unwrap();
    s.pop().unwrap();
    s.pop().unwrap();
    let before = observe(&s, &[x]);
    assert!(matches!(
        s.decode_all(-1),
        Err(CoreError::NegativeTokens(-1))
    ));
    let too_many = MAX_TOKENS_PER_CALL as i64 + 1;
    assert!(matches!(
        s.decode_all(too_many),
        Err(CoreError::TooManyTokens(t)) if t == too_many as u64
    ));
    assert_eq!(observe(&s, &[x]), before);
    // no running request: a bad count is still refused, a good one does nothing
    let mut idle = Scheduler::new(100, 1.0, 2.0, Policy::Vtc).unwrap();
    assert!(idle.decode_all(-3).is_err());
    idle.decode_all(5).unwrap();
    assert_eq!(idle.occupancy(), 0);
}

#[test]
fn decode_all_names_the_first_admitted_request_it_would_take_past_the_limit() {
    let mut s = Scheduler::new(1 << 20, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit(1, x, 1).unwrap();
    s.submit(2, x, 1).unwrap();
    s.pop().unwrap();
    let step = MAX_TOKENS_PER_CALL as i64;
    // request 1 alone up to just below the limit, then request 2 joins
    let full = MAX_REQUEST_TOKENS / MAX_TOKENS_PER_CALL;
    for _ in 0..full {
        s.decode_all(step).unwrap();
    }
    s.pop().unwrap();
    let g1 = s.generated(1).unwrap();
    assert!(g1 <= MAX_REQUEST_TOKENS && g1 + MAX_TOKENS_PER_CALL > MAX_REQUEST_TOKENS);
    let before = observe(&s, &[x]);
    match s.decode_all(step) {
        Err(CoreError::RequestTooLong {
            request_id: 1,
            tokens,
        }) => assert_eq!(tokens, u128::from(g1) + u128::from(MAX_TOKENS_PER_CALL)),
        other => panic!("expected RequestTooLong for request 1, got {other:?}"),
    }
    assert_eq!(observe(&s, &[x]), before);
    // exactly up to the limit is allowed
    let room = (MAX_REQUEST_TOKENS - g1) as i64;
    s.decode_all(room).unwrap();
    assert_eq!(s.generated(1).unwrap(), MAX_REQUEST_TOKENS);
    assert_eq!(s.generated(2).unwrap(), room as u64);
}

#[test]
fn decode_with_ids_refuses_to_pass_the_limit_however_the_count_got_there() {
    let step = MAX_TOKENS_PER_CALL as i64;
    let full = MAX_REQUEST_TOKENS / MAX_TOKENS_PER_CALL;
    for uniform in [true, false] {
        let mut s = Scheduler::new(1 << 20, 1.0, 2.0, Policy::Vtc).unwrap();
        let x = s.add_client();
        s.submit(1, x, 1).unwrap();
        s.submit(2, x, 1).unwrap();
        s.pop().unwrap();
        s.pop().unwrap();
        s.finish(2).unwrap(); // a request that left: the bound stays loose
        for _ in 0..full {
            if uniform {
                s.decode_all(step).unwrap();
            } else {
                s.decode(&[1], Tokens::Each(step)).unwrap();
            }
        }
        let g = s.generated(1).unwrap();
        let before = observe(&s, &[x]);
        match s.decode(&[1], Tokens::PerRequest(&[step])) {
            Err(CoreError::RequestTooLong {
                request_id: 1,
                tokens,
            }) => assert_eq!(tokens, u128::from(g) + u128::from(MAX_TOKENS_PER_CALL)),
            other => panic!("expected RequestTooLong for request 1, got {other:?}"),
        }
        assert_eq!(observe(&s, &[x]), before);
        let room = (MAX_REQUEST_TOKENS - g) as i64;
        s.decode(&[1], Tokens::Each(room)).unwrap();
        assert_eq!(s.generated(1).unwrap(), MAX_REQUEST_TOKENS);
        assert!(s.decode(&[1], Tokens::Each(1)).is_err());
        assert!(s.decode_all(1).is_err());
        s.decode_all(0).unwrap();
        s.check_invariants().unwrap();
    }
}

#[test]
fn a_decode_of_no_ids_changes_nothing_whatever_its_count() {
    // `Each(t)` with no ids checks nothing (no position, no check: the
    // reference's order); it must not move the bound on generated counts
    // either: `-1` made it u64::MAX, and the next decode_all overflowed it.
    for t in [-1, i64::MIN, i64::MAX, MAX_TOKENS_PER_CALL as i64 + 1, 3] {
        let mut s = Scheduler::new(1 << 20, 1.0, 2.0, Policy::Vtc).unwrap();
        let x = s.add_client();
        s.decode(&[], Tokens::Each(t)).unwrap();
        s.check_invariants().unwrap();
        s.submit(1, x, 10).unwrap();
        s.pop().unwrap();
        let before = observe(&s, &[x]);
        s.decode(&[], Tokens::Each(t)).unwrap();
        assert_eq!(observe(&s, &[x]), before);
        s.decode_all(1).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.generated(1).unwrap(), 1);
        s.decode(&[1], Tokens::Each(2)).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.generated(1).unwrap(), 3);
    }
}

/// With 32 or more running clients, each of them also waiting, a uniform
/// decode sets every heap key at once and rebuilds the heap (the bulk path of
/// `rekey_touched`, which reads each key's client from the heap entry): what
/// the scheduler admits next is still the waiting client with the least
/// counter (ties: the oldest waiting request), step after step, for every
/// cost, with clients running different numbers of requests.
#[test]
fn after_a_bulk_rekey_the_least_counter_is_admitted_next() {
    use std::collections::VecDeque;
    const CLIENTS: usize = 40;
    for cost in every_cost() {
        let mut s = Scheduler::with_cost(1 << 30, cost, Policy::Vtc).unwrap();
        let mut rng = Lcg(17);
        let clients: Vec<ClientId> = (0..CLIENTS).map(|_| s.add_client()).collect();
        let mut waiting: Vec<VecDeque<u64>> = vec![VecDeque::new(); CLIENTS];
        let mut running: Vec<(u64, usize)> = Vec::new();
        let mut next = 0u64;
        for (i, &c) in clients.iter().enumerate() {
            for _ in 0..(3 + i % 4) {
                next += 1;
                s.submit(next, c, 1 + rng.below(30) as i64).unwrap();
                waiting[i].push_back(next);
            }
        }
        let owner = |rid: u64, waiting: &[VecDeque<u64>]| {
            waiting.iter().position(|q| q.front() == Some(&rid))
        };
        let mut admit = |s: &mut Scheduler,
                         waiting: &mut Vec<VecDeque<u64>>,
                         running: &mut Vec<(u64, usize)>,
                         next: &mut u64| {
            let rid = s.pop().expect("every client waits");
            let i = owner(rid, waiting).expect("a client's oldest waiting request");
            waiting[i].pop_front();
            running.push((rid, i));
            *next += 1; // (the client stays backlogged)
            s.submit(*next, clients[i], 1 + rng.below(30) as i64)
                .unwrap();
            waiting[i].push_back(*next);
        };
        for _ in 0..2 * CLIENTS {
            admit(&mut s, &mut waiting, &mut running, &mut next);
        }
        let busy = (0..CLIENTS)
            .filter(|&i| running.iter().any(|&(_, j)| j == i))
            .count();
        assert_eq!(busy, CLIENTS, "{cost:?}: every client runs (the bulk path)");
        for step in 0..150 {
            s.decode_all(1 + (step % 3) as i64).unwrap();
            let least = (0..CLIENTS)
                .filter(|&i| !waiting[i].is_empty())
                .min_by(|&a, &b| {
                    let (ca, cb) = (
                        s.counter(clients[a]).unwrap(),
                        s.counter(clients[b]).unwrap(),
                    );
                    ca.total_cmp(&cb).then(waiting[a][0].cmp(&waiting[b][0]))
                })
                .unwrap();
            assert_eq!(s.peek(), Some(waiting[least][0]), "{cost:?}, step {step}");
            s.check_invariants().unwrap();
            admit(&mut s, &mut waiting, &mut running, &mut next);
            if step % 2 == 0 {
                let (rid, _) = running.swap_remove(0);
                s.finish(rid).unwrap();
            }
        }
    }
}
