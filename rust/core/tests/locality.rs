//! The locality window (docs/locality.md, specified by `vtc.reference`): with
//! a quantum `Q` and a prefix lookup, among the clients whose counter is
//! within `Q` of the least, each offering its first `LOCALITY_DEPTH` waiting
//! requests (only its head once `LOCALITY_DEPTH - 1` later ones went before
//! it), the request with the longest cached prefix goes next, ties by the
//! plain key (counter, seq of the head), then queue order; `Q = 0` or no lookup is plain
//! VTC; a failing lookup changes nothing, except that `schedule_with`
//! returns what it admitted before the failure.

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};

use common::Lcg;
use vtc_core::{
    ClientId, Config, CoreError, LookupFailed, Policy, Scheduler, Tokens, LOCALITY_DEPTH,
};

fn with_quantum(budget: i64, q: f64, policy: Policy) -> Scheduler {
    Scheduler::with_config(&Config {
        policy,
        locality_quantum: q,
        ..Config::new(budget)
    })
    .unwrap()
}

/// `a` at counter 0 and `b` at counter 30, one waiting request each (1: a, 2: b).
fn two_clients(q: f64) -> (Scheduler, ClientId, ClientId) {
    let mut s = with_quantum(1000, q, Policy::Vtc);
    let a = s.add_client();
    let b = s.add_client();
    s.raise_counter(b, 30.0).unwrap();
    s.submit(1, a, 10).unwrap();
    s.submit(2, b, 10).unwrap();
    (s, a, b)
}

#[test]
fn the_longest_cached_prefix_within_the_quantum_wins() {
    let (mut s, _, _) = two_clients(50.0);
    let mut asked = Vec::new();
    let mut lookup = |rid: u64, fp: u64| {
        asked.push((rid, fp));
        Ok(if rid == 2 { 8 } else { 3 })
    };
    assert_eq!(s.peek_with(&mut lookup), Ok(Some(2)));
    assert_eq!(s.peek(), Some(1)); // plain VTC without the lookup
    assert_eq!(s.pop_with(None, &mut lookup), Ok(Some(2)));
    asked.sort_unstable();
    assert_eq!(asked, vec![(1, 10), (1, 10), (2, 10), (2, 10)]);
    s.check_invariants().unwrap();
}

#[test]
fn outside_the_quantum_or_alone_nothing_is_asked() {
    for q in [0.0, 29.0] {
        let (mut s, _, _) = two_clients(q);
        let mut calls = 0;
        let mut lookup = |_: u64, _: u64| {
            calls += 1;
            Ok(10)
        };
        assert_eq!(s.peek_with(&mut lookup), Ok(Some(1)));
        assert_eq!(s.set_aside_with(&mut lookup), Ok(Some(1)));
        assert_eq!(calls, 0, "Q = {q}");
    }
    // exactly at the edge is inside
    let (mut s, _, _) = two_clients(30.0);
    assert_eq!(s.peek_with(&mut |rid, _| Ok(rid)), Ok(Some(2)));
}

#[test]
fn equal_hits_fall_back_to_the_plain_key() {
    let (mut s, _, _) = two_clients(50.0);
    assert_eq!(s.peek_with(&mut |_, _| Ok(4)), Ok(Some(1)));
    // equal counters: the older head (smaller seq) first
    let mut s = with_quantum(1000, 5.0, Policy::Lcf);
    let a = s.add_client();
    let b = s.add_client();
    s.submit(7, b, 10).unwrap();
    s.submit(3, a, 10).unwrap();
    assert_eq!(s.peek_with(&mut |_, _| Ok(0)), Ok(Some(7)));
}

#[test]
fn a_failing_or_out_of_range_lookup_changes_nothing() {
    let (mut s, a, b) = two_clients(50.0);
    let before = (s.counter(a), s.counter(b), s.num_waiting(), s.occupancy());
    let mut fail = |rid: u64, _: u64| if rid == 2 { Err(LookupFailed) } else { Ok(0) };
    assert_eq!(
        s.pop_with(Some(0), &mut fail),
        Err(CoreError::PrefixLookupFailed(2))
    );
    assert_eq!(
        s.schedule_with(&mut Vec::new(), &mut fail),
        Err(CoreError::PrefixLookupFailed(2))
    );
    let mut over = |rid: u64, fp: u64| Ok(if rid == 2 { fp + 1 } else { 0 });
    let err = s.set_aside_with(&mut over).unwrap_err();
    assert_eq!(
        err,
        CoreError::InvalidPrefixHit {
            request_id: 2,
            hit: 11,
            footprint: 10
        }
    );
    assert_eq!(
        err.to_string(),
        "prefix lookup of request 2 returned 11, outside [0, 10] (its prompt and generated tokens)"
    );
    assert_eq!(
        (s.counter(a), s.counter(b), s.num_waiting(), s.occupancy()),
        before
    );
    s.check_invariants().unwrap();
}

#[test]
fn a_lookup_failing_inside_schedule_returns_what_was_admitted() {
    // as tests/test_locality.py: 6 lookups (all six waiting), then 5, the 12th fails
    for cap in [None, Some(1000)] {
        let mut s = with_quantum(100, 50.0, Policy::Vtc);
        s.set_client_cap(cap).unwrap();
        let a = s.add_client();
        let b = s.add_client();
        for rid in 0..6u64 {
            s.submit(rid, if rid % 2 == 0 { a } else { b }, 10).unwrap();
        }
        let mut asked = 0;
        let mut failing = true;
        let mut out = Vec::new();
        let mut lookup = |_: u64, _: u64| {
            asked += 1;
            if failing && asked >= 12 {
                Err(LookupFailed)
            } else {
                Ok(0)
            }
        };
        assert_eq!(s.schedule_with(&mut out, &mut lookup), Ok(2));
        assert_eq!(out, vec![0, 1]);
        assert_eq!(
            (s.num_running(), s.num_waiting(), s.occupancy()),
            (2, 4, 20)
        );
        let before = (s.counter(a), s.counter(b));
        assert!(s.schedule_with(&mut out, &mut lookup).is_err());
        assert_eq!(out.len(), 2);
        assert_eq!(
            (s.counter(a), s.counter(b), s.num_waiting()),
            (before.0, before.1, 4)
        );
        failing = false;
        let mut lookup = |_: u64, _: u64| if failing { Err(LookupFailed) } else { Ok(0) };
        assert_eq!(s.schedule_with(&mut out, &mut lookup), Ok(4));
        assert_eq!(out, vec![0, 1, 2, 3, 4, 5]);
        s.check_invariants().unwrap();
    }
}

#[test]
fn a_zero_quantum_is_plain_vtc_and_never_asks() {
    let mut rng = Lcg(5);
    let mut plain = Scheduler::new(500, 1.0, 2.0, Policy::Vtc).unwrap();
    let mut zero = with_quantum(500, 0.0, Policy::Vtc);
    let clients: Vec<(ClientId, ClientId)> = (0..5)
        .map(|_| (plain.add_client(), zero.add_client()))
        .collect();
    let mut never = |_: u64, _: u64| -> Result<u64, LookupFailed> { panic!("asked at Q = 0") };
    for rid in 0..400u64 {
        let (p, z) = clients[rng.below(5) as usize];
        let len = 1 + rng.below(60) as i64;
        plain.submit(rid, p, len).unwrap();
        zero.submit(rid, z, len).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        plain.schedule(&mut x);
        zero.schedule_with(&mut y, &mut never).unwrap();
        assert_eq!(x, y);
        plain.decode_step(&mut x).unwrap();
        zero.decode_step(&mut y).unwrap();
        for r in plain.running().collect::<Vec<_>>() {
            if plain.generated(r).unwrap() > 3 + r % 7 {
                plain.finish(r).unwrap();
                zero.finish(r).unwrap();
            }
        }
        assert_eq!(zero.peek_with(&mut never).unwrap(), plain.peek());
    }
}

/// The window against a model of it: one band, clients' FIFOs and their
/// heads' overtakes kept by the test; every selection must ask exactly the
/// offered requests of the clients within `Q` of the least counter (the first
/// `LOCALITY_DEPTH`, or the head alone once it was overtaken
/// `LOCALITY_DEPTH - 1` times; nobody when that is one request) and pick the
/// longest hit, ties by (counter, seq of the head), then queue order.
#[test]
fn the_window_chooses_as_its_definition_says() {
    let mut overtakes = 0;
    for seed in 0..40u64 {
        let mut rng = Lcg(seed);
        let q = [1.0, 10.0, 50.0, 200.0, 1e6][(seed % 5) as usize];
        let policy = if seed % 3 == 0 {
            Policy::Lcf
        } else {
            Policy::Vtc
        };
        let mut s = with_quantum(400, q, policy);
        let n = 2 + rng.below(6) as usize;
        let clients: Vec<ClientId> = (0..n).map(|_| s.add_client()).collect();
        for &c in &clients {
            if rng.below(2) == 0 {
                s.set_weight(c, [0.5, 2.0, 3.0][rng.below(3) as usize])
                    .unwrap();
            }
        }
        let mut queues: Vec<VecDeque<u64>> = vec![VecDeque::new(); n];
        let mut owner: HashMap<u64, usize> = HashMap::new();
        let mut hits: HashMap<u64, u64> = HashMap::new();
        let mut prompt: HashMap<u64, u64> = HashMap::new();
        let mut rid = 0u64;
        // per client: (its head when overtaken, how many times)
        let mut skips: Vec<(u64, usize)> = vec![(0, 0); n];
        for _ in 0..300 {
            for _ in 0..rng.below(4) {
                rid += 1;
                let c = rng.below(n as u64) as usize;
                let p = 1 + rng.below(40);
                s.submit(rid, clients[c], p as i64).unwrap();
                queues[c].push_back(rid);
                owner.insert(rid, c);
                prompt.insert(rid, p);
                hits.insert(rid, rng.below(p + 1) / 4 * 4); // coarse: ties happen
            }
            // the model's choice
            let heads: Vec<(usize, u64)> = (0..n)
                .filter_map(|c| queues[c].front().map(|&r| (c, r)))
                .collect();
            let mut asked = BTreeMap::new();
            let got = s
                .peek_with(&mut |r: u64, fp: u64| {
                    assert_eq!(
                        fp, prompt[&r],
                        "a waiting request's footprint is its prompt"
                    );
                    *asked.entry(r).or_insert(0) += 1;
                    Ok(hits[&r])
                })
                .unwrap();
            if heads.is_empty() {
                assert_eq!(got, None);
                continue;
            }
            let counter = |c: usize| s.counter(clients[c]).unwrap();
            let least = heads
                .iter()
                .map(|&(c, _)| counter(c))
                .fold(f64::INFINITY, f64::min);
            let k0 = heads
                .iter()
                .filter(|&&(c, _)| counter(c) == least)
                .min_by_key(|&&(_, r)| r)
                .unwrap();
            let edge = counter(k0.0) + q;
            let window: Vec<usize> = heads
                .iter()
                .filter(|&&(c, _)| counter(c) <= edge)
                .map(|&(c, _)| c)
                .collect();
            // (client, position, rid) of every offered request
            let offered: Vec<(usize, usize, u64)> = window
                .iter()
                .flat_map(|&c| {
                    let head = queues[c][0];
                    let depth = if skips[c] == (head, LOCALITY_DEPTH - 1) {
                        1
                    } else {
                        LOCALITY_DEPTH
                    };
                    queues[c]
                        .iter()
                        .take(depth)
                        .enumerate()
                        .map(move |(i, &r)| (c, i, r))
                })
                .collect();
            let (wc, wpos, want) = if offered.len() == 1 {
                assert!(asked.is_empty(), "seed {seed}: asked with one candidate");
                offered[0]
            } else {
                let called: Vec<u64> = asked.keys().copied().collect();
                let mut cands: Vec<u64> = offered.iter().map(|&(_, _, r)| r).collect();
                cands.sort_unstable();
                assert_eq!(called, cands, "seed {seed}: asked the wrong requests");
                assert!(asked.values().all(|&k| k == 1), "asked twice");
                *offered
                    .iter()
                    .max_by(|x, y| {
                        hits[&x.2].cmp(&hits[&y.2]).then_with(|| {
                            // the smaller plain key, then position, wins the tie
                            (counter(y.0), queues[y.0][0], y.1)
                                .partial_cmp(&(counter(x.0), queues[x.0][0], x.1))
                                .unwrap()
                        })
                    })
                    .unwrap()
            };
            assert_eq!(got, Some(want), "seed {seed}");
            let _ = counter;
            // admit it (the same choice), run a step, finish some
            let popped = s
                .pop_with(None, &mut |r: u64, _: u64| Ok(hits[&r]))
                .unwrap();
            assert_eq!(popped, Some(want));
            let c = owner[&want];
            assert_eq!(c, wc);
            if wpos > 0 {
                overtakes += 1;
                let head = queues[c][0];
                skips[c] = if skips[c].0 == head {
                    (head, skips[c].1 + 1)
                } else {
                    (head, 1)
                };
            }
            assert_eq!(queues[c].remove(wpos), Some(want));
            let running: Vec<u64> = s.running().collect();
            s.decode(&running, Tokens::Each(1)).unwrap();
            for r in running {
                if rng.below(3) == 0 {
                    s.finish(r).unwrap();
                }
            }
            s.check_invariants().unwrap();
        }
    }
    // the window took requests from behind their heads, as it may
    assert!(overtakes > 100, "{overtakes} overtakes");
}
