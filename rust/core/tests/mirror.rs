//! `vtc_core::mirror::MetricsMirror`: never panics on any sequence of reads
//! (reader slots in and out of range, resets), drops, forgets and takes
//! (labelled keys repeated or unknown), and stays the core's full read: its
//! rows and totals are the scheduler's, and every token charged is taken
//! once (read before a forget, as the metrics do).

mod common;

use std::borrow::Cow;
use std::collections::HashMap;

use common::{scheduler_op, Lcg};
use vtc_core::mirror::{MetricsMirror, Row};
use vtc_core::{ClientKey, KeyRef, Policy, Scheduler, READERS};

fn key(i: u64) -> KeyRef<'static> {
    match i % 6 {
        4 => KeyRef::Int(i as i64),
        5 => KeyRef::Str(Cow::Owned((i - 1).to_string().into_bytes())), // "4" beside 4
        _ => KeyRef::Str(Cow::Owned(format!("t{i}").into_bytes())),
    }
}

/// Every keyed client's row, as the change feed gives it.
fn full_read(s: &Scheduler) -> HashMap<ClientKey, Row> {
    s.keyed_clients()
        .map(|(c, k)| {
            let cl = s.client(c).unwrap();
            let row = Row {
                counter: cl.counter(),
                service: cl.service(),
                prompt: cl.prompt_tokens(),
                decode: cl.decode_tokens(),
                waiting: cl.num_waiting() + cl.num_aside(),
                running: cl.num_running(),
            };
            (k.clone(), row)
        })
        .collect()
}

fn charged(s: &Scheduler) -> u64 {
    full_read(s).values().map(|r| r.prompt + r.decode).sum()
}

#[test]
fn never_panics_and_stays_the_cores_full_read() {
    for seed in 0..30u64 {
        let mut rng = Lcg(seed * 7_919 + 5);
        let mut s = Scheduler::new(2_000, 1.0, 2.0, Policy::Vtc).unwrap();
        let mut m = MetricsMirror::new();
        let tenants = 2 + rng.below(14);
        let mut rid = 0u64;
        let (mut taken, mut lost) = (0u64, 0u64);
        let mut misused = false;
        let mut gone = Vec::new();
        let (mut mirrored, mut last_removed) = (HashMap::<ClientKey, Row>::new(), 0u64);
        for _ in 0..500 {
            let op = rng.below(14);
            if scheduler_op(&mut rng, &mut s, op, &mut rid, tenants, key) {
                continue;
            }
            match op {
                7 => {
                    // the metrics read before the core forgets; sometimes not
                    if rng.below(4) != 0 {
                        m.read(&mut s, 0).unwrap();
                    }
                    let before = charged(&s);
                    let known: Vec<ClientKey> = full_read(&s).into_keys().collect();
                    s.forget_idle(&mut gone);
                    lost += before - charged(&s);
                    if rng.below(2) == 0 {
                        let left = full_read(&s);
                        let forgotten: Vec<KeyRef<'_>> = known
                            .iter()
                            .filter(|k| !left.contains_key(*k))
                            .map(ClientKey::as_key_ref)
                            .collect();
                        m.drop_keys(&forgotten, rng.below(2) == 0);
                        m.drop_keys(&forgotten, true); // twice: nothing more
                    }
                }
                8 => {
                    // the metrics' slot, or one out of range (another slot is
                    // another reader's: its forgets would be applied twice)
                    let reader = [0, READERS, READERS + 1][rng.below(3) as usize];
                    assert_eq!(m.read(&mut s, reader).is_err(), reader >= READERS);
                    if rng.below(10) == 0 {
                        s.reset_changes(0).unwrap();
                    }
                }
                9 => {
                    let keys: Vec<KeyRef<'static>> = (0..rng.below(4))
                        .map(|_| key(rng.below(tenants + 3)))
                        .collect();
                    m.drop_keys(&keys, rng.below(2) == 0);
                    // live keys dropped (not what the metrics do): a full read
                    // brings them back, their tallies from zero
                    s.reset_changes(0).unwrap();
                    misused = true;
                }
                _ => {
                    m.read(&mut s, 0).unwrap();
                    let want = full_read(&s);
                    let got: HashMap<ClientKey, Row> =
                        m.rows().map(|(k, r)| (k.clone(), *r)).collect();
                    assert_eq!(got, want, "seed {seed}");
                    assert_eq!(m.len(), want.len());
                    // removed() unchanged: no tenant mirrored then has left since
                    if m.removed() == last_removed {
                        assert!(mirrored.keys().all(|k| got.contains_key(k)), "seed {seed}");
                    }
                    (mirrored, last_removed) = (got.clone(), m.removed());
                    let active = want.values().filter(|r| r.waiting + r.running > 0).count();
                    let waiting = want.values().map(|r| r.waiting).sum::<usize>();
                    let running = want.values().map(|r| r.running).sum::<usize>();
                    assert_eq!(m.totals(), (active, waiting, running), "seed {seed}");
                    let mut labelled: Vec<KeyRef<'static>> = (0..rng.below(tenants + 2))
                        .map(|_| key(rng.below(tenants + 3)))
                        .collect();
                    labelled.push(KeyRef::Str(Cow::Borrowed(b"_other")));
                    let fresh: Vec<KeyRef<'static>> = (0..rng.below(3))
                        .map(|_| key(rng.below(tenants + 3)))
                        .collect();
                    let t = m.take(&labelled, &fresh);
                    assert_eq!(t.active, active);
                    let mut lw = 0;
                    let mut lr = 0;
                    let mut counted = Vec::new();
                    for (i, k) in labelled.iter().enumerate() {
                        let k = ClientKey::from(k);
                        if counted.contains(&k) {
                            continue;
                        }
                        counted.push(k.clone());
                        if let Some(r) = want.get(&k) {
                            lw += r.waiting;
                            lr += r.running;
                            let _ = i;
                        }
                    }
                    assert_eq!(t.other_requests, (waiting - lw, running - lr));
                    for &(i, c, w, r) in &t.rows {
                        let k = ClientKey::from(&labelled[i]);
                        match want.get(&k) {
                            Some(row) => {
                                assert_eq!((c, w, r), (Some(row.counter), row.waiting, row.running))
                            }
                            None => assert_eq!((c, w, r), (None, 0, 0)),
                        }
                    }
                    taken += t.increments.iter().map(|&(_, p, d)| p + d).sum::<u64>();
                    taken += t.other_tokens.0 + t.other_tokens.1;
                    let most = charged(&s) + lost;
                    assert!(
                        misused || taken <= most,
                        "seed {seed} step: {taken} > {most}"
                    );
                }
            }
        }
        m.read(&mut s, 0).unwrap();
        let t = m.take(&[], &[]);
        taken += t.other_tokens.0 + t.other_tokens.1;
        // every token charged taken once, but those forgotten unread: at most
        let most = charged(&s) + lost;
        assert!(misused || taken <= most, "seed {seed}: {taken} > {most}");
    }
}

#[test]
fn every_token_is_taken_once_when_read_before_each_forget() {
    for seed in 0..30u64 {
        let mut rng = Lcg(seed * 104_729 + 11);
        let mut s = Scheduler::new(2_000, 1.0, 2.0, Policy::Vtc).unwrap();
        let mut m = MetricsMirror::new();
        let tenants = 2 + rng.below(10);
        let (mut rid, mut taken, mut lost) = (0u64, 0u64, 0u64);
        let mut gone = Vec::new();
        for _ in 0..400 {
            let op = rng.below(10);
            if scheduler_op(&mut rng, &mut s, op, &mut rid, tenants, key) {
                continue;
            }
            if op == 7 {
                m.read(&mut s, 0).unwrap();
                let before = charged(&s);
                s.forget_idle(&mut gone);
                lost += before - charged(&s);
            } else {
                m.read(&mut s, 0).unwrap();
                let labelled: Vec<KeyRef<'static>> = (0..rng.below(tenants))
                    .map(|_| key(rng.below(tenants)))
                    .collect();
                let t = m.take(&labelled, &[]);
                taken += t.increments.iter().map(|&(_, p, d)| p + d).sum::<u64>();
                taken += t.other_tokens.0 + t.other_tokens.1;
            }
        }
        m.read(&mut s, 0).unwrap();
        let t = m.take(&[], &[]);
        taken += t.other_tokens.0 + t.other_tokens.1;
        assert_eq!(taken, charged(&s) + lost, "seed {seed}");
    }
}
