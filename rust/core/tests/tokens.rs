//! Per-client token tallies (`Scheduler::tokens`): the raw prompt and decode
//! tokens each client was charged, whatever they cost.

mod common;

use std::collections::HashMap;

use common::{every_cost, Lcg};
use vtc_core::{ClientId, CoreError, Cost, Policy, RequestState, Scheduler, Tokens};

fn tokens(s: &Scheduler, c: ClientId) -> (u64, u64) {
    s.tokens(c).unwrap()
}

#[test]
fn a_new_client_has_charged_nothing() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    assert_eq!(tokens(&s, x), (0, 0));
    s.submit(1, x, 100).unwrap();
    assert_eq!(tokens(&s, x), (0, 0)); // submitting charges nothing
    assert_eq!(
        s.tokens(ClientId(7)).unwrap_err(),
        CoreError::UnknownClient(7)
    );
}

#[test]
fn prompt_counts_only_the_tokens_not_in_the_prefix_cache() {
    let mut s = Scheduler::new(10_000, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit_cached(1, x, 400, 300).unwrap();
    s.submit(2, x, 50).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(tokens(&s, x), (100 + 50, 0));
    // engine mode: the hit known at admission replaces the one given at submit
    s.submit_cached(3, x, 200, 10).unwrap();
    s.submit(4, x, 80).unwrap();
    s.submit_cached(5, x, 60, 60).unwrap();
    assert_eq!(s.pop_cached(Some(150)).unwrap(), Some(3));
    assert_eq!(s.pop_cached(None).unwrap(), Some(4));
    assert_eq!(s.pop(), Some(5)); // fully cached: nothing computed, nothing counted
    assert_eq!(tokens(&s, x), (150 + 50 + 80, 0));
    // a refused pop_cached admits and counts nothing
    s.submit(6, x, 10).unwrap();
    assert!(s.pop_cached(Some(11)).is_err());
    assert_eq!(tokens(&s, x), (280, 0));
}

#[test]
fn a_preempted_request_is_not_counted_again_when_readmitted() {
    for cost in every_cost() {
        let mut s = Scheduler::with_cost(10_000, cost, Policy::Vtc).unwrap();
        let x = s.add_client();
        s.submit_cached(1, x, 100, 30).unwrap();
        s.schedule(&mut Vec::new());
        s.decode(&[1], Tokens::Each(4)).unwrap();
        assert_eq!(tokens(&s, x), (70, 4));
        s.preempt(1).unwrap();
        assert_eq!(s.status(1), Some(RequestState::Waiting));
        s.schedule(&mut Vec::new()); // re-admitted: prompt + generated recomputed, uncharged
        assert_eq!(tokens(&s, x), (70, 4));
        s.preempt(1).unwrap();
        assert_eq!(s.pop_cached(Some(0)).unwrap(), Some(1)); // and by pop, whatever the hit
        assert_eq!(tokens(&s, x), (70, 4));
        s.decode(&[1], Tokens::Each(2)).unwrap();
        assert_eq!(tokens(&s, x), (70, 6));
    }
}

#[test]
fn decode_counts_every_token_charged_by_either_form() {
    let mut s = Scheduler::new(10_000, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = (s.add_client(), s.add_client());
    s.submit(1, x, 10).unwrap();
    s.submit(2, x, 10).unwrap();
    s.submit(3, y, 10).unwrap();
    s.schedule(&mut Vec::new());
    s.decode_step(&mut Vec::new()).unwrap();
    assert_eq!((tokens(&s, x), tokens(&s, y)), ((20, 2), (10, 1)));
    s.decode(&[1, 2, 3], Tokens::PerRequest(&[3, 0, 5]))
        .unwrap();
    assert_eq!((tokens(&s, x), tokens(&s, y)), ((20, 5), (10, 6)));
    s.decode(&[3, 1], Tokens::Each(2)).unwrap();
    assert_eq!((tokens(&s, x), tokens(&s, y)), ((20, 7), (10, 8)));
    // all or nothing: a failing call counts nothing
    assert!(s.decode(&[1, 99], Tokens::Each(1)).is_err());
    assert!(s.decode(&[1, 1], Tokens::Each(1)).is_err());
    assert!(s.decode(&[1, 2], Tokens::PerRequest(&[1, -1])).is_err());
    assert_eq!((tokens(&s, x), tokens(&s, y)), ((20, 7), (10, 8)));
    // finishing and cancelling take nothing back
    s.finish(1).unwrap();
    s.cancel(3).unwrap();
    assert_eq!((tokens(&s, x), tokens(&s, y)), ((20, 7), (10, 8)));
}

#[test]
fn decode_step_counts_only_the_requests_that_grew() {
    // M = 25: two requests of 12 cannot both grow; the larger counter is evicted
    let mut s = Scheduler::new(25, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = (s.add_client(), s.add_client());
    s.submit(1, x, 12).unwrap();
    s.submit(2, y, 11).unwrap();
    s.schedule(&mut Vec::new());
    let mut pre = Vec::new();
    s.decode_step(&mut pre).unwrap();
    assert!(pre.is_empty());
    s.decode_step(&mut pre).unwrap(); // 25 + 2 > 25: x (counter 14) is preempted
    assert_eq!(pre, vec![1]);
    assert_eq!((tokens(&s, x), tokens(&s, y)), ((12, 1), (11, 2)));
    // a step that fails with Capacity counts nothing
    let mut s = Scheduler::new(10, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit(1, x, 10).unwrap();
    s.schedule(&mut Vec::new());
    assert!(matches!(
        s.decode_step(&mut Vec::new()),
        Err(CoreError::Capacity { .. })
    ));
    assert_eq!(tokens(&s, x), (10, 0));
}

#[test]
fn counts_do_not_depend_on_prices_weights_or_the_cost() {
    // fcfs: the counters decide nothing, so every run admits, preempts and
    // decodes the same requests; only what each token costs differs
    let run = |cost: Cost, weight: f64| {
        let mut s = Scheduler::with_cost(300, cost, Policy::Fcfs).unwrap();
        let (x, y) = (s.add_client(), s.add_client());
        s.set_weight(x, weight).unwrap();
        for rid in 0..40u64 {
            let c = if rid % 3 == 0 { y } else { x };
            let p = 20 + (rid as i64 * 7) % 90;
            s.submit_cached(rid, c, p, (rid as i64) % 15).unwrap();
        }
        let mut out = Vec::new();
        for step in 0..300u64 {
            s.schedule(&mut out);
            s.decode_step(&mut Vec::new()).unwrap();
            let running: Vec<u64> = s.running().collect();
            if let Some(&r) = running.first() {
                if step % 5 == 0 {
                    s.decode(&[r], Tokens::Each(3)).unwrap();
                }
                if step % 7 == 0 {
                    s.finish(r).unwrap();
                }
            }
        }
        let service = s.service(x).unwrap() + s.service(y).unwrap();
        ((tokens(&s, x), tokens(&s, y)), service)
    };
    let (want, service) = run(Cost::Linear { wp: 1.0, wq: 2.0 }, 1.0);
    assert!(want.0 .0 > 0 && want.0 .1 > 0 && want.1 .0 > 0 && want.1 .1 > 0);
    // linear, weight 1, no prediction: the service is exactly the tokens' price
    let total = |i: usize| [want.0, want.1].iter().map(|t| [t.0, t.1][i]).sum::<u64>() as f64;
    assert_eq!(service, total(0) + 2.0 * total(1));
    let linear = [
        Cost::Linear { wp: 0.0, wq: 0.0 },
        Cost::Linear { wp: 1e9, wq: 0.5 },
    ];
    for cost in every_cost().into_iter().chain(linear) {
        for weight in [1.0, 4.0, 1e-6, 1e6] {
            assert_eq!(run(cost, weight).0, want, "{cost:?} weight {weight}");
        }
    }
}

#[test]
fn a_prediction_is_counted_at_admission_then_only_tokens_beyond_it() {
    let mut s = Scheduler::new(10_000, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit_full(1, x, 100, 20, Some(10)).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(tokens(&s, x), (80, 10)); // what the counter was charged: 80 + 2 * 10
    s.decode(&[1], Tokens::Each(8)).unwrap();
    assert_eq!(tokens(&s, x), (80, 10));
    s.decode(&[1], Tokens::Each(5)).unwrap(); // 13: 3 beyond the prediction
    assert_eq!(tokens(&s, x), (80, 13));
    s.preempt(1).unwrap();
    s.schedule(&mut Vec::new()); // not pre-charged again
    assert_eq!(tokens(&s, x), (80, 13));
    s.finish(1).unwrap();
    // an over-prediction refunded as credit is not taken back
    s.submit_full(2, x, 10, 0, Some(50)).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[2], Tokens::Each(5)).unwrap();
    s.finish(2).unwrap();
    assert!(s.client(x).unwrap().credit() > 0.0);
    assert_eq!(tokens(&s, x), (90, 63));
    // and charges absorbed by that credit are still counted
    s.submit(3, x, 10).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[3], Tokens::Each(4)).unwrap();
    assert_eq!(tokens(&s, x), (100, 67));
}

#[test]
fn a_forgotten_client_loses_its_tally() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = (s.add_client(), s.add_client());
    s.submit(1, x, 10).unwrap();
    s.submit(2, y, 500).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[1], Tokens::Each(3)).unwrap();
    s.finish(1).unwrap();
    assert_eq!(tokens(&s, x), (10, 3));
    let mut gone = Vec::new();
    assert_eq!(s.forget_idle(&mut gone), 1);
    assert_eq!(gone, vec![x]);
    assert_eq!(s.tokens(x).unwrap_err(), CoreError::UnknownClient(x.0));
    assert_eq!(tokens(&s, y), (500, 0)); // the others keep theirs
    let z = s.add_client(); // x's id, reused: a new client
    assert_eq!(z, x);
    assert_eq!(tokens(&s, z), (0, 0));
}

#[test]
fn a_restored_scheduler_starts_every_tally_at_zero() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = (s.add_client(), s.add_client());
    s.submit(1, x, 10).unwrap();
    s.submit(2, y, 20).unwrap();
    s.schedule(&mut Vec::new());
    s.decode_step(&mut Vec::new()).unwrap();
    s.finish(1).unwrap();
    s.finish(2).unwrap();
    let data = s.snapshot_with(|c| c.0.to_le_bytes().to_vec());
    let restored = Scheduler::restore(&data).unwrap().scheduler;
    for c in [x, y] {
        assert_eq!(restored.counter(c).unwrap(), s.counter(c).unwrap());
        assert_eq!(restored.tokens(c).unwrap(), (0, 0));
    }
    // the tallies are not in the format: the restored scheduler's snapshot
    // is byte for byte the one it came from
    assert_eq!(restored.snapshot_with(|c| c.0.to_le_bytes().to_vec()), data);
}

#[test]
fn random_operations_count_exactly_what_a_model_counts() {
    for seed in 0..30u64 {
        let mut rng = Lcg(seed + 1);
        let cost = every_cost()[(seed % 3) as usize];
        let mut s = Scheduler::with_cost(200, cost, Policy::Vtc).unwrap();
        let cs: Vec<ClientId> = (0..4).map(|_| s.add_client()).collect();
        let mut want: HashMap<ClientId, (u64, u64)> = cs.iter().map(|&c| (c, (0, 0))).collect();
        // live request -> (client, prompt - cached, admitted before)
        let mut reqs: HashMap<u64, (ClientId, u64, bool)> = HashMap::new();
        let mut out = Vec::new();
        for rid in 0..1500u64 {
            match rng.below(8) {
                0..=2 => {
                    let c = cs[rng.below(4) as usize];
                    let p = 1 + rng.below(60);
                    let k = rng.below(p + 1);
                    s.submit_cached(rid, c, p as i64, k as i64).unwrap();
                    reqs.insert(rid, (c, p - k, false));
                }
                3 => {
                    out.clear();
                    s.schedule(&mut out);
                    for r in &out {
                        let e = reqs.get_mut(r).unwrap();
                        if !e.2 {
                            want.get_mut(&e.0).unwrap().0 += e.1;
                            e.2 = true;
                        }
                    }
                }
                4 => {
                    if s.decode_step(&mut Vec::new()).is_ok() {
                        for r in s.running() {
                            want.get_mut(&reqs[&r].0).unwrap().1 += 1;
                        }
                    }
                }
                5 => {
                    let ids: Vec<u64> = s.running().take(3).collect();
                    let t = rng.below(4);
                    s.decode(&ids, Tokens::Each(t as i64)).unwrap();
                    for r in ids {
                        want.get_mut(&reqs[&r].0).unwrap().1 += t;
                    }
                }
                6 => {
                    let first = s.running().next();
                    if let Some(r) = first {
                        s.preempt(r).unwrap();
                    }
                }
                _ => {
                    let r = s.running().last().or_else(|| s.peek());
                    if let Some(r) = r {
                        s.cancel(r).unwrap();
                        reqs.remove(&r);
                    }
                }
            }
            for &c in &cs {
                assert_eq!(tokens(&s, c), want[&c], "seed {seed} op {rid}");
            }
        }
        assert!(want.values().all(|&(p, d)| p > 0 && d > 0), "seed {seed}");
    }
}
