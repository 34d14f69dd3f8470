//! `vtc_core::fairness::FairnessWindow`: Jain's index, the counter spread and
//! the clients' gains over a sliding window, against a direct computation by key (as
//! `vtc.metrics` computed them in Python) over random workloads.

mod common;

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use common::{scheduler_op, Lcg};
use vtc_core::fairness::{jain_index, FairnessWindow, Figures};
use vtc_core::{ClientKey, KeyRef, Policy, Scheduler, Tokens};

/// A reference snapshot: every client's service and whether it was backlogged.
type Services = HashMap<ClientKey, (f64, bool)>;

/// The window as `vtc.metrics` kept it: every snapshot a map by key of
/// every client's service and whether it was backlogged.
struct Reference {
    window: f64,
    history: VecDeque<(f64, Services)>,
    /// The last refresh's start (empty without one).
    before: HashMap<ClientKey, f64>,
}

impl Reference {
    fn new(window: f64) -> Self {
        Reference {
            window,
            history: VecDeque::new(),
            before: HashMap::new(),
        }
    }

    fn refresh(&mut self, core: &Scheduler, now: f64) -> Figures {
        let mut services = HashMap::new();
        let mut counters = Vec::new();
        for (c, key) in core.keyed_clients() {
            let cl = core.client(c).unwrap();
            let waiting = cl.num_waiting() + cl.num_aside() > 0;
            services.insert(key.clone(), (cl.service(), waiting));
            if waiting {
                counters.push(cl.counter());
            }
        }
        let h = &mut self.history;
        while h.len() > 1 && now - h[1].0 >= self.window {
            h.pop_front();
        }
        self.before = h
            .front()
            .map(|(_, m)| m.iter().map(|(k, (s, _))| (k.clone(), *s)).collect())
            .unwrap_or_default();
        let jain = match h.front() {
            Some((start, before)) if now > *start => Some(jain_index(before.iter().filter_map(
                |(k, (b, was))| match services.get(k) {
                    Some((s, true)) if *was => Some(s - b),
                    _ => None,
                },
            ))),
            _ => None,
        };
        if h.back().is_none_or(|(t, _)| now - t >= self.window / 32.0) {
            h.push_back((now, services));
        }
        let spread = if counters.len() > 1 {
            counters.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                - counters.iter().cloned().fold(f64::INFINITY, f64::min)
        } else {
            0.0
        };
        Figures {
            jain,
            spread,
            backlogged: counters.len(),
        }
    }

    /// Every keyed client's gain over the last refresh's window.
    fn gains(&self, core: &Scheduler) -> Vec<(ClientKey, f64)> {
        core.keyed_clients()
            .map(|(c, k)| {
                let s = core.client(c).unwrap().service();
                (k.clone(), s - self.before.get(k).copied().unwrap_or(0.0))
            })
            .collect()
    }
}

/// `gains` and `above` of the window agree with the reference's for every
/// client and a few bars.
fn same_gains(fw: &FairnessWindow, reference: &Reference, core: &Scheduler) {
    let want = reference.gains(core);
    let keys: Vec<KeyRef<'_>> = want
        .iter()
        .map(|(k, _)| match k {
            ClientKey::Int(i) => KeyRef::Int(*i),
            ClientKey::Str(b) => KeyRef::Str(Cow::Borrowed(b)),
        })
        .collect();
    let got = fw.gains(core, &keys);
    for ((k, w), g) in want.iter().zip(&got) {
        assert_eq!(w, g, "gain of {k:?}");
    }
    let missing = KeyRef::Str(Cow::Borrowed(b"nobody"));
    assert!(fw.gains(core, &[missing])[0].is_nan());
    let mut bars = vec![f64::NEG_INFINITY, 0.0, f64::INFINITY, f64::NAN];
    bars.extend(want.iter().map(|(_, g)| *g).take(3));
    for bar in bars {
        let above: Vec<(ClientKey, f64)> = fw
            .above(core, bar)
            .into_iter()
            .map(|(k, g)| (k.clone(), g))
            .collect();
        let expected: Vec<(ClientKey, f64)> =
            want.iter().filter(|(_, g)| *g > bar).cloned().collect();
        assert_eq!(above, expected, "above {bar}");
    }
}

fn same(a: Figures, b: Figures) -> bool {
    let jain = match (a.jain, b.jain) {
        (None, None) => true,
        (Some(x), Some(y)) => {
            (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        _ => false,
    };
    jain && a.spread == b.spread && a.backlogged == b.backlogged
}

fn key(i: u64) -> KeyRef<'static> {
    if i % 5 == 4 {
        KeyRef::Int(i as i64)
    } else {
        KeyRef::Str(Cow::Owned(format!("tenant-{i}").into_bytes()))
    }
}

#[test]
fn matches_a_direct_computation_by_key_over_random_workloads() {
    for seed in 0..40u64 {
        let mut rng = Lcg(seed * 7919 + 1);
        let mut s = Scheduler::new(2_000, 1.0, 2.0, Policy::Vtc).unwrap();
        let window = [1.0, 5.0, 30.0, f64::INFINITY][(seed % 4) as usize];
        let mut fw = FairnessWindow::new(window).unwrap();
        let mut reference = Reference::new(window);
        let tenants = 2 + rng.below(12);
        let (mut rid, mut now) = (0u64, 0.0f64);
        let mut gone = Vec::new();
        for _ in 0..400 {
            match rng.below(10) {
                op if scheduler_op(&mut rng, &mut s, op, &mut rid, tenants, key) => {}
                7 => {
                    if rng.below(3) == 0 {
                        s.forget_idle(&mut gone);
                    } else if rid > 0 {
                        let _ = s.cancel(1 + rng.below(rid));
                    }
                }
                _ => {
                    // a refresh; sometimes at the same time, rarely back in time
                    now += [0.0, 0.1, 0.5, 1.0, 3.0][rng.below(5) as usize];
                    let t = if rng.below(50) == 0 { now - 2.0 } else { now };
                    let got = fw.refresh(&s, t);
                    let want = reference.refresh(&s, t);
                    assert!(same(got, want), "seed {seed}: {got:?} vs {want:?}");
                    same_gains(&fw, &reference, &s);
                    fw.check().unwrap();
                    assert_eq!(fw.snapshots(), reference.history.len());
                }
            }
        }
    }
}

#[test]
fn a_client_forgotten_and_back_is_the_same_tenant_and_a_reused_id_is_not() {
    // a budget for one running request each: the second ones wait
    let mut s = Scheduler::new(25, 1.0, 1.0, Policy::Vtc).unwrap();
    let mut fw = FairnessWindow::new(10.0).unwrap();
    let mut reference = Reference::new(10.0);
    let (a, b, c) = (key(0), key(1), key(2));
    for (rid, k) in [(1, &a), (2, &a), (3, &b), (4, &b)] {
        s.submit_keyed(rid, k, 10, 0, None, 0).unwrap();
    }
    let mut out = Vec::new();
    s.schedule(&mut out);
    assert_eq!(out.len(), 2);
    s.decode(&out, Tokens::Each(2)).unwrap();
    let first = fw.refresh(&s, 0.0);
    assert!(same(first, reference.refresh(&s, 0.0)));
    assert_eq!(first.jain, None); // no start before now yet
    assert_eq!((first.spread, first.backlogged), (0.0, 2));
    for r in 1..=4 {
        s.cancel(r).unwrap();
    }
    let mut gone = Vec::new();
    s.forget_idle(&mut gone);
    // b at least (a may stay: the last to leave the backlog is kept)
    assert!(!gone.is_empty(), "a client is forgotten");
    // c takes a forgotten id; a and b come back under their keys, unserved
    for (rid, k) in [(5, &c), (6, &a), (7, &b)] {
        s.submit_keyed(rid, k, 10, 0, None, 0).unwrap();
    }
    assert!(gone.contains(&s.intern(&c)));
    let got = fw.refresh(&s, 1.0);
    assert!(same(got, reference.refresh(&s, 1.0)), "{got:?}");
    same_gains(&fw, &reference, &s);
    // a forgotten one gained -12 (its service started again), one kept 0; c is
    // not in the start
    assert_eq!(got.jain, Some(if gone.len() == 2 { 1.0 } else { 0.5 }));
    assert_eq!(got.backlogged, 3);
    fw.check().unwrap();
}

#[test]
fn jain_index_of_plain_lists() {
    assert_eq!(jain_index([3.0, 3.0, 3.0]), 1.0);
    assert_eq!(jain_index([1.0, 0.0]), 0.5);
    assert!((jain_index([2.0, 1.0]) - 0.9).abs() < 1e-15);
    assert!(jain_index([]).is_nan() && jain_index([0.0, 0.0]).is_nan());
}

#[test]
fn a_window_must_be_positive_and_any_time_is_taken() {
    assert!(FairnessWindow::new(0.0).is_none());
    assert!(FairnessWindow::new(-1.0).is_none());
    assert!(FairnessWindow::new(f64::NAN).is_none());
    let s = Scheduler::new(100, 1.0, 1.0, Policy::Vtc).unwrap();
    let mut fw = FairnessWindow::new(1.0).unwrap();
    for t in [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -5.0,
        f64::NAN,
    ] {
        let f = fw.refresh(&s, t);
        assert_eq!((f.spread, f.backlogged), (0.0, 0));
        fw.check().unwrap();
    }
}

#[test]
fn snapshots_stay_bounded_and_keys_are_pruned() {
    let mut s = Scheduler::new(1_000_000, 1.0, 1.0, Policy::Vtc).unwrap();
    let mut fw = FairnessWindow::new(4.0).unwrap();
    let mut rid = 0u64;
    let mut gone = Vec::new();
    for round in 0..300u64 {
        // every round new tenants come, wait, and leave
        let mut mine = Vec::new();
        for i in 0..20 {
            rid += 1;
            let k = KeyRef::Str(Cow::Owned(format!("one-off-{round}-{i}").into_bytes()));
            s.submit_keyed(rid, &k, 5, 0, None, 0).unwrap();
            mine.push(rid);
        }
        fw.refresh(&s, round as f64 * 0.25);
        for r in mine {
            s.cancel(r).unwrap();
        }
        s.forget_idle(&mut gone);
        assert!(fw.snapshots() <= 34, "{} snapshots", fw.snapshots());
        fw.check().unwrap();
    }
}

/// `relabel`'s shape for any labelled list (keys the scheduler lacks, whose
/// gains are NaN, duplicates), limit and factor (NaN, negative, infinite): no
/// panic; the tenants over the limit go; no more labels taken than are free;
/// each swap replaces a different labelled tenant left; no labelled tenant
/// takes a label again; no tenant takes the reserved label value. (Its values: `tests/test_fairness_window.py`, against
/// the Python computation.)
#[test]
fn relabel_never_panics_and_keeps_its_shape() {
    for seed in 0..20u64 {
        let mut rng = Lcg(seed * 104_729 + 3);
        let mut s = Scheduler::new(2_000, 1.0, 2.0, Policy::Vtc).unwrap();
        let mut fw = FairnessWindow::new(5.0).unwrap();
        let tenants = 2 + rng.below(15);
        let (mut rid, mut now) = (0u64, 0.0f64);
        for _ in 0..300 {
            let op = rng.below(10);
            if scheduler_op(&mut rng, &mut s, op, &mut rid, tenants, key) {
                continue;
            }
            now += 1.0;
            fw.refresh(&s, now);
            let mut labelled: Vec<KeyRef<'static>> = (0..rng.below(tenants + 3))
                .map(|_| key(rng.below(tenants + 2)))
                .collect();
            labelled.push(KeyRef::Str(Cow::Borrowed(b"nobody")));
            for limit in [0, 1, labelled.len() / 2, labelled.len(), labelled.len() + 2] {
                for (factor, reserved) in [
                    (f64::NAN, None),
                    (-1.0, Some(&b"4"[..])),
                    (0.0, None),
                    (2.0, Some(&b"tenant-1"[..])),
                    (f64::INFINITY, Some(&b"tenant-0"[..])),
                ] {
                    let r = fw.relabel(&s, &labelled, limit, factor, reserved);
                    let label = |k: &ClientKey| match k {
                        ClientKey::Int(i) => i.to_string().into_bytes(),
                        ClientKey::Str(b) => b.to_vec(),
                    };
                    for k in r.taken.iter().chain(r.swaps.iter().map(|(k, _)| k)) {
                        assert!(
                            reserved != Some(&label(k)[..]),
                            "{k:?} took a reserved label"
                        );
                    }
                    assert_eq!(r.dropped.len(), labelled.len().saturating_sub(limit));
                    let left = labelled.len() - r.dropped.len();
                    assert!(r.taken.len() <= limit - left);
                    let mut replaced: Vec<usize> = r.swaps.iter().map(|&(_, i)| i).collect();
                    replaced.extend(&r.dropped);
                    replaced.sort_unstable();
                    replaced.dedup();
                    assert_eq!(replaced.len(), r.swaps.len() + r.dropped.len());
                    assert!(replaced.iter().all(|&i| i < labelled.len()));
                    let owned: Vec<ClientKey> = labelled.iter().map(ClientKey::from).collect();
                    for k in r.taken.iter().chain(r.swaps.iter().map(|(k, _)| k)) {
                        assert!(!owned.contains(k) || r.dropped.iter().any(|&i| owned[i] == **k));
                    }
                }
            }
        }
    }
}
