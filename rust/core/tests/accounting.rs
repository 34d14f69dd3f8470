//! Accounting beyond tokens: cost functions, prefix caching, length
//! prediction, per-client memory caps and preemption (issue 6).

mod common;

use common::{every_cost, Lcg};
use vtc_core::{ClientId, CoreError, Cost, Policy, Predictor, RequestState, Scheduler, Tokens};

fn two(s: &mut Scheduler) -> (ClientId, ClientId) {
    (s.add_client(), s.add_client())
}

fn h_quadratic(n: f64, q: f64) -> f64 {
    2.1 * n + q + 0.04 * n * q + 0.032 * q * q + 11.46
}

#[test]
fn linear_cost_object_is_bit_for_bit_the_default() {
    let mut a = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let mut b = Scheduler::with_cost(1000, Cost::Linear { wp: 1.0, wq: 2.0 }, Policy::Vtc).unwrap();
    for s in [&mut a, &mut b] {
        let (x, y) = two(s);
        s.submit(1, x, 100).unwrap();
        s.submit(2, y, 7).unwrap();
        s.schedule(&mut Vec::new());
        for _ in 0..5 {
            s.decode_step(&mut Vec::new()).unwrap();
        }
        s.decode(&[1, 2], Tokens::PerRequest(&[3, 0])).unwrap();
    }
    for c in [ClientId(0), ClientId(1)] {
        assert_eq!(
            a.counter(c).unwrap().to_bits(),
            b.counter(c).unwrap().to_bits()
        );
    }
    assert_eq!(a.counter(ClientId(0)).unwrap(), 100.0 + 2.0 * 8.0);
}

#[test]
fn quadratic_cost_charges_h_incrementally() {
    let mut s = Scheduler::with_cost(10_000, Cost::PAPER_QUADRATIC, Policy::Vtc).unwrap();
    let (x, _) = two(&mut s);
    s.submit(1, x, 300).unwrap();
    s.schedule(&mut Vec::new());
    assert!((s.counter(x).unwrap() - h_quadratic(300.0, 0.0)).abs() < 1e-9);
    for _ in 0..10 {
        s.decode_step(&mut Vec::new()).unwrap();
    }
    // several tokens at once: the sum of the per-token increments
    s.decode(&[1], Tokens::Each(15)).unwrap();
    let want = h_quadratic(300.0, 25.0);
    assert!((s.counter(x).unwrap() - want).abs() < 1e-9 * want);
}

#[test]
fn context_cost_meters_context_length() {
    let cost = Cost::Context {
        wp: 1.0,
        wq: 2.0,
        beta: 0.01,
    };
    let mut s = Scheduler::with_cost(100_000, cost, Policy::Vtc).unwrap();
    let (short, long) = two(&mut s);
    s.submit(1, short, 256).unwrap();
    s.submit(2, long, 4096).unwrap();
    s.schedule(&mut Vec::new());
    let (c0, l0) = (s.counter(short).unwrap(), s.counter(long).unwrap());
    s.decode_step(&mut Vec::new()).unwrap();
    // the first generated token attends over the prompt
    assert!((s.counter(short).unwrap() - c0 - (2.0 + 0.01 * 256.0)).abs() < 1e-9);
    assert!((s.counter(long).unwrap() - l0 - (2.0 + 0.01 * 4096.0)).abs() < 1e-9);
    // the second over prompt + 1
    let c1 = s.counter(short).unwrap();
    s.decode(&[1], Tokens::Each(1)).unwrap();
    assert!((s.counter(short).unwrap() - c1 - (2.0 + 0.01 * 257.0)).abs() < 1e-9);
}

#[test]
fn decode_charge_does_not_depend_on_request_order() {
    for cost in [
        Cost::PAPER_QUADRATIC,
        Cost::Context {
            wp: 1.0,
            wq: 2.0,
            beta: 0.3,
        },
    ] {
        let mut runs = Vec::new();
        for order in [[1u64, 2, 3], [3, 1, 2]] {
            let mut s = Scheduler::with_cost(100_000, cost, Policy::Vtc).unwrap();
            let c = s.add_client();
            for (rid, p) in [(1, 17), (2, 333), (3, 5)] {
                s.submit(rid, c, p).unwrap();
            }
            s.schedule(&mut Vec::new());
            let toks: Vec<i64> = order.iter().map(|&r| r as i64 * 3).collect();
            s.decode(&order, Tokens::PerRequest(&toks)).unwrap();
            runs.push(s.counter(c).unwrap().to_bits());
        }
        assert_eq!(runs[0], runs[1]);
    }
}

#[test]
fn invalid_cost_is_rejected() {
    let bad = Cost::Quadratic {
        a_p: 1.0,
        a_q: -1.0,
        a_pq: 0.0,
        a_qq: 0.0,
        c: 0.0,
    };
    assert!(matches!(
        Scheduler::with_cost(10, bad, Policy::Vtc),
        Err(CoreError::InvalidTokenWeight { name: "a_q", .. })
    ));
}

#[test]
fn prefix_cache_hit_is_not_charged_but_occupies_memory() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = two(&mut s);
    s.submit_cached(1, x, 400, 300).unwrap();
    s.submit(2, y, 400).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(s.counter(x).unwrap(), 100.0);
    assert_eq!(s.counter(y).unwrap(), 400.0);
    assert_eq!(s.occupancy(), 800);
}

#[test]
fn preemption_never_charges_the_prompt_twice_under_any_cost() {
    let mut s = Scheduler::with_cost(10_000, Cost::PAPER_QUADRATIC, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit(1, x, 100).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[1], Tokens::Each(4)).unwrap();
    let before = s.counter(x).unwrap();
    s.preempt(1).unwrap();
    assert_eq!(s.status(1), Some(RequestState::Waiting));
    s.schedule(&mut Vec::new());
    assert_eq!(s.counter(x).unwrap(), before);
    assert_eq!(s.occupancy(), 104);
}

#[test]
fn client_cap_removes_a_capped_client_from_selection() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    s.set_client_cap(Some(250)).unwrap();
    let (hog, other) = two(&mut s);
    for rid in 0..5 {
        s.submit(rid, hog, 100).unwrap();
    }
    s.submit(10, other, 100).unwrap();
    s.submit(11, other, 100).unwrap();
    let mut out = Vec::new();
    s.schedule(&mut out);
    // hog: 2 x 100 fit under 250, the third would not; other likewise
    assert_eq!(out, vec![0, 10, 1, 11]);
    assert_eq!(s.client(hog).unwrap().occupancy(), 200);
    assert_eq!(s.num_waiting(), 3);
    s.check_invariants().unwrap();
    // capped clients are still backlogged: a finish re-opens them
    s.finish(0).unwrap();
    out.clear();
    s.schedule(&mut out);
    assert_eq!(out, vec![2]);
    s.check_invariants().unwrap();
}

#[test]
fn a_lone_request_larger_than_the_cap_still_runs() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    s.set_client_cap(Some(50)).unwrap();
    let x = s.add_client();
    s.submit(1, x, 400).unwrap();
    s.submit(2, x, 10).unwrap();
    let mut out = Vec::new();
    s.schedule(&mut out);
    assert_eq!(out, vec![1]);
    assert!(matches!(
        s.set_client_cap(Some(0)),
        Err(CoreError::InvalidClientCap(0))
    ));
}

#[test]
fn prediction_charges_up_front_then_only_beyond() {
    let mut s = Scheduler::new(10_000, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit_full(1, x, 100, 0, Some(10)).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(s.counter(x).unwrap(), 100.0 + 20.0);
    s.decode(&[1], Tokens::Each(8)).unwrap();
    assert_eq!(s.counter(x).unwrap(), 120.0);
    s.decode(&[1], Tokens::Each(5)).unwrap(); // 13 > 10: 3 beyond
    assert_eq!(s.counter(x).unwrap(), 126.0);
    s.finish(1).unwrap();
    assert_eq!(s.client(x).unwrap().credit(), 0.0);
}

#[test]
fn over_prediction_is_refunded_as_credit_and_counters_never_decrease() {
    // lcf: no lift, so the credit is absorbed whole
    let mut s = Scheduler::new(10_000, 1.0, 2.0, Policy::Lcf).unwrap();
    let (x, y) = two(&mut s);
    s.submit_full(1, x, 100, 0, Some(50)).unwrap();
    s.submit(2, y, 1000).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(s.counter(x).unwrap(), 200.0);
    s.decode(&[1], Tokens::Each(10)).unwrap();
    s.finish(1).unwrap();
    // 40 tokens paid and never generated: 80 of credit, counter unchanged
    assert_eq!(s.counter(x).unwrap(), 200.0);
    assert_eq!(s.client(x).unwrap().credit(), 80.0);
    // the next 80 of charges are absorbed
    s.submit(3, x, 50).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(s.counter(x).unwrap(), 200.0);
    assert_eq!(s.client(x).unwrap().credit(), 30.0);
    s.decode(&[3], Tokens::Each(20)).unwrap(); // 40 charged, 30 absorbed
    assert_eq!(s.counter(x).unwrap(), 210.0);
    assert_eq!(s.client(x).unwrap().credit(), 0.0);
    s.check_invariants().unwrap();
}

#[test]
fn lift_forfeits_credit_below_the_floor() {
    let mut s = Scheduler::new(200, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = two(&mut s);
    s.submit(2, y, 20).unwrap();
    s.submit_full(1, x, 10, 0, Some(100)).unwrap(); // 10 + 200
    s.submit(3, y, 200).unwrap();
    let mut out = Vec::new();
    s.schedule(&mut out);
    assert_eq!(out, vec![2, 1]); // 3 does not fit: y stays backlogged at 20
    s.finish(1).unwrap(); // generated 0: credit 200, counter 210
    assert_eq!(s.client(x).unwrap().credit(), 200.0);
    // x returns: it stands at 210 - 200 = 10, below the floor 20
    s.submit(5, x, 10).unwrap();
    assert_eq!(s.counter(x).unwrap(), 210.0);
    assert_eq!(s.client(x).unwrap().credit(), 190.0);
    s.check_invariants().unwrap();
}

#[test]
fn mean_predictor_learns_per_client() {
    let mut s = Scheduler::new(10_000, 1.0, 2.0, Policy::Vtc).unwrap();
    s.set_predictor(Predictor::Mean);
    let x = s.add_client();
    s.submit(1, x, 10).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(s.counter(x).unwrap(), 10.0); // no history: no prediction
    s.decode(&[1], Tokens::Each(40)).unwrap();
    s.finish(1).unwrap(); // mean 40
    s.submit(2, x, 10).unwrap();
    s.schedule(&mut Vec::new());
    assert_eq!(s.counter(x).unwrap(), 90.0 + 10.0 + 80.0);
    assert!(matches!(
        s.submit_full(3, x, 10, 0, Some(-1)),
        Err(CoreError::InvalidPrediction(-1))
    ));
}

#[test]
fn random_operations_with_every_option_keep_the_invariants() {
    let costs = every_cost();
    for seed in 0..60u64 {
        let mut rng = Lcg(seed * 7 + 3);
        let m = [64i64, 500, 4000][(seed % 3) as usize];
        let policy = [Policy::Vtc, Policy::Lcf, Policy::Fcfs][(seed / 3 % 3) as usize];
        let mut s = Scheduler::with_cost(m, costs[(seed / 9 % 3) as usize], policy).unwrap();
        if seed % 2 == 0 {
            s.set_client_cap(Some(1 + rng.below(m as u64))).unwrap();
        }
        if seed % 5 < 2 {
            s.set_predictor(Predictor::Mean);
        }
        let cs: Vec<ClientId> = (0..6).map(|_| s.add_client()).collect();
        let mut counters = vec![0.0f64; cs.len()];
        let mut live: Vec<u64> = Vec::new();
        let mut out = Vec::new();
        for rid in 0..1500u64 {
            match rng.below(12) {
                0..=3 => {
                    let c = cs[rng.below(cs.len() as u64) as usize];
                    let p = 1 + rng.below(m as u64 / 2) as i64;
                    let k = rng.below(p as u64 + 1) as i64;
                    let pred = if rng.below(3) == 0 {
                        Some(rng.below(50) as i64)
                    } else {
                        None
                    };
                    s.submit_full(rid, c, p, k, pred).unwrap();
                    live.push(rid);
                }
                4 | 5 => {
                    s.schedule(&mut out);
                }
                6 | 7 => match s.decode_step(&mut Vec::new()) {
                    Ok(()) => {}
                    Err(CoreError::Capacity { request_id, .. }) => s.finish(request_id).unwrap(),
                    Err(e) => panic!("unexpected {e}"),
                },
                8 => {
                    let ids: Vec<u64> = s.running().take(5).collect();
                    let toks: Vec<i64> = ids.iter().map(|_| rng.below(4) as i64).collect();
                    s.decode(&ids, Tokens::PerRequest(&toks)).unwrap();
                }
                9 | 10 if !live.is_empty() => {
                    let r = live.swap_remove(rng.below(live.len() as u64) as usize);
                    match s.status(r) {
                        Some(RequestState::Running) if rng.below(4) > 0 => s.finish(r).unwrap(),
                        Some(_) => s.cancel(r).unwrap(),
                        None => {}
                    }
                }
                _ if !live.is_empty() => {
                    let r = live[rng.below(live.len() as u64) as usize];
                    if s.status(r) == Some(RequestState::Running) {
                        s.preempt(r).unwrap();
                    }
                }
                _ => {}
            }
            s.check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed} op {rid}: {e}"));
            for (i, &c) in cs.iter().enumerate() {
                let v = s.counter(c).unwrap();
                assert!(
                    v >= counters[i],
                    "seed {seed}: counter of client {i} decreased"
                );
                assert!(s.client(c).unwrap().credit() >= 0.0);
                counters[i] = v;
            }
        }
    }
}
