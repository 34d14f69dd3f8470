//! `Scheduler::raise_counters`: `raise_counter` for many clients at once,
//! all checked before any counter moves.

mod common;

use common::Lcg;

use vtc_core::{ClientId, CoreError, Policy, Scheduler};

fn counters(s: &Scheduler, c: &[ClientId]) -> Vec<f64> {
    c.iter().map(|&k| s.counter(k).unwrap()).collect()
}

/// Admit everything that fits, one request at a time (the order tells the heap's).
fn drain(s: &mut Scheduler) -> Vec<u64> {
    let mut order = Vec::new();
    let mut out = Vec::new();
    while s.num_waiting() > 0 {
        out.clear();
        if s.schedule(&mut out) == 0 {
            break;
        }
        order.extend_from_slice(&out);
        for &r in &out {
            s.finish(r).unwrap();
        }
    }
    order
}

#[test]
fn one_call_does_what_one_raise_counter_per_pair_does() {
    for policy in [Policy::Vtc, Policy::Fcfs] {
        for seed in 0..40 {
            let mut rng = Lcg(seed);
            let mut a = Scheduler::new(64, 1.0, 2.0, policy).unwrap();
            let mut b = Scheduler::new(64, 1.0, 2.0, policy).unwrap();
            let ca: Vec<ClientId> = (0..6).map(|_| a.add_client()).collect();
            let cb: Vec<ClientId> = (0..6).map(|_| b.add_client()).collect();
            assert_eq!(ca, cb);
            let mut rid = 0;
            for _ in 0..30 {
                for _ in 0..rng.below(4) {
                    rid += 1;
                    let k = rng.below(6) as usize;
                    let p = 1 + rng.below(20) as i64;
                    a.submit(rid, ca[k], p).unwrap();
                    b.submit(rid, cb[k], p).unwrap();
                }
                // a batch, clients possibly named twice
                let batch: Vec<(ClientId, f64)> = (0..rng.below(5))
                    .map(|_| (ca[rng.below(6) as usize], rng.below(200) as f64))
                    .collect();
                let mut rose = 0;
                for &(c, v) in &batch {
                    let before = b.counter(c).unwrap();
                    b.raise_counter(c, v).unwrap();
                    rose += usize::from(b.counter(c).unwrap() > before);
                }
                assert_eq!(a.raise_counters(&batch).unwrap(), rose);
                assert_eq!(counters(&a, &ca), counters(&b, &cb));
                if rng.below(3) == 0 {
                    let mut oa = Vec::new();
                    let mut ob = Vec::new();
                    a.schedule(&mut oa);
                    b.schedule(&mut ob);
                    assert_eq!(oa, ob, "seed {seed}: admission order differs");
                }
            }
            assert_eq!(drain(&mut a), drain(&mut b), "seed {seed}");
        }
    }
}

#[test]
fn a_bad_pair_anywhere_changes_nothing() {
    let mut s = Scheduler::new(100, 1.0, 2.0, Policy::Vtc).unwrap();
    let c: Vec<ClientId> = (0..3).map(|_| s.add_client()).collect();
    s.raise_counter(c[0], 5.0).unwrap();
    for (rid, &k) in c.iter().enumerate() {
        s.submit(rid as u64, k, 10).unwrap(); // waiting: not forgotten
    }
    let mut gone = Vec::new();
    let ghost = s.add_client();
    s.forget_idle(&mut gone);
    assert_eq!(gone, vec![ghost]);
    let before = counters(&s, &c);
    for bad in [f64::NAN, f64::INFINITY, -f64::INFINITY, 2e30, -2e30] {
        let batch = [(c[0], 50.0), (c[1], 60.0), (c[2], bad)];
        assert!(matches!(
            s.raise_counters(&batch),
            Err(CoreError::InvalidCounter(v)) if v.to_bits() == bad.to_bits()
        ));
        assert_eq!(counters(&s, &c), before);
    }
    for unknown in [ghost, ClientId(99)] {
        let batch = [(c[1], 60.0), (unknown, 1.0)];
        assert!(matches!(
            s.raise_counters(&batch),
            Err(CoreError::UnknownClient(u)) if u == unknown.0
        ));
        assert_eq!(counters(&s, &c), before);
    }
    // never lowers; the larger of two values for one client wins
    let rose = s.raise_counters(&[(c[0], 1.0), (c[1], 7.0), (c[1], 3.0), (c[2], 1e30)]);
    assert_eq!(rose.unwrap(), 2);
    assert_eq!(counters(&s, &c), vec![5.0, 7.0, 1e30]);
    assert_eq!(s.raise_counters(&[]).unwrap(), 0);
}
