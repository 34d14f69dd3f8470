//! `vtc_core::ledger::SyncLedger`: the unacknowledged service by tenant and
//! the waiting tenants, against a direct computation by key (what
//! `vtc.distributed.SharedCounters` computed in Python from a full read of
//! every tenant's service) over random workloads with forgets, resets and
//! acknowledgments.

mod common;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use common::{scheduler_op, Lcg};
use vtc_core::ledger::{Read, SyncLedger};
use vtc_core::wire::{parse_changed, push_json, push_json_key};
use vtc_core::{ClientKey, KeyRef, Policy, Scheduler, Tokens};

const READER: usize = 1;

/// The ledger as Python kept it: every tenant's service at the last fold
/// (all of them read each time), the amounts folded since the last
/// acknowledgment.
#[derive(Default)]
struct Reference {
    seen: HashMap<ClientKey, f64>,
    unacked: HashMap<ClientKey, f64>,
}

impl Reference {
    /// Fold every tenant (`fold_changed` over a full read); returns the
    /// waiting set now.
    fn fold(&mut self, core: &Scheduler) -> HashSet<ClientKey> {
        let mut live = HashMap::new();
        let mut waiting = HashSet::new();
        for (c, k) in core.keyed_clients() {
            let cl = core.client(c).unwrap();
            live.insert(k.clone(), cl.service());
            if cl.num_waiting() + cl.num_aside() > 0 {
                waiting.insert(k.clone());
            }
        }
        for (k, &v) in &live {
            let mut d = v - self.seen.get(k).copied().unwrap_or(0.0);
            if d < 0.0 {
                d = v;
            }
            if d > 0.0 {
                *self.unacked.entry(k.clone()).or_insert(0.0) += d;
            }
        }
        self.seen = live;
        waiting
    }
}

fn key(i: u64) -> KeyRef<'static> {
    if i % 4 == 3 {
        KeyRef::Int(i as i64 - 2)
    } else {
        KeyRef::Str(Cow::Owned(format!("tenant-{i}").into_bytes()))
    }
}

fn unacked_of(ledger: &SyncLedger) -> HashMap<ClientKey, f64> {
    ledger.unacked().map(|(k, v)| (k.clone(), v)).collect()
}

#[test]
fn matches_a_full_read_by_key_over_random_workloads() {
    for seed in 0..60u64 {
        let mut rng = Lcg(seed * 104_729 + 3);
        let mut s = Scheduler::new(2_000, 1.0, 2.0, Policy::Vtc).unwrap();
        let mut ledger = SyncLedger::new(READER);
        let mut reference = Reference::default();
        ledger.reset(&mut s).unwrap();
        reference.fold(&s);
        let mut waiting: HashSet<ClientKey> = HashSet::new(); // as the caller follows it
        let mut read = Read::default();
        let tenants = 2 + rng.below(10);
        let (mut rid, mut forgotten) = (0u64, Vec::new());
        let mut first = true;
        for step in 0..500 {
            match rng.below(12) {
                op if scheduler_op(&mut rng, &mut s, op, &mut rid, tenants, key) => {}
                7 => {
                    // SharedCounters.forget_idle folds first (what was charged since the
                    // last read counts); a forget without it loses only that
                    if rng.below(2) == 0 {
                        ledger.read(&mut s, false, &mut read).unwrap();
                        follow(&mut waiting, &read, first);
                        first = false;
                        reference.fold(&s);
                    }
                    s.forget_idle(&mut forgotten);
                    let live: HashSet<ClientKey> =
                        s.keyed_clients().map(|(_, k)| k.clone()).collect();
                    reference.seen.retain(|k, _| live.contains(k));
                }
                8 => {
                    if rid > 0 {
                        let _ = s.cancel(1 + rng.below(rid));
                    }
                }
                9 => {
                    ledger.acknowledge();
                    reference.unacked.clear();
                }
                _ => {
                    let idle = rng.below(2) == 0;
                    ledger.read(&mut s, idle, &mut read).unwrap();
                    assert_eq!(read.full, first, "seed {seed} step {step}");
                    follow(&mut waiting, &read, first);
                    first = false;
                    let now = reference.fold(&s);
                    assert_eq!(waiting, now, "seed {seed} step {step}: waiting set");
                    for k in &read.idle {
                        assert!(!now.contains(k), "seed {seed}: idle {k:?} is waiting");
                    }
                    let got = unacked_of(&ledger);
                    assert_eq!(
                        got.len(),
                        reference.unacked.len(),
                        "seed {seed} step {step}"
                    );
                    for (k, v) in &reference.unacked {
                        let g = got.get(k).copied().unwrap_or(f64::NAN);
                        assert!(
                            (g - v).abs() <= 1e-9 * v.abs(),
                            "seed {seed} {k:?}: {g} vs {v}"
                        );
                    }
                    for k in now.iter() {
                        assert!(ledger.waiting(k));
                    }
                    ledger.check().unwrap();
                }
            }
        }
    }
}

/// The caller's waiting set, kept from the reads' transitions only.
fn follow(waiting: &mut HashSet<ClientKey>, read: &Read, first: bool) {
    if read.full {
        assert!(first);
        *waiting = read.entered.iter().cloned().collect();
        return;
    }
    for k in &read.left {
        assert!(waiting.remove(k), "left {k:?} was not waiting");
    }
    for k in &read.entered {
        assert!(waiting.insert(k.clone()), "entered {k:?} was waiting");
    }
}

#[test]
fn service_held_at_reset_is_never_pushed_and_a_key_back_counts_in_full() {
    let mut s = Scheduler::new(1_000, 1.0, 2.0, Policy::Vtc).unwrap();
    let a = KeyRef::Str(Cow::Borrowed(b"a"));
    s.submit_keyed(1, &a, 100, 0, None, 0).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[1], Tokens::Each(10)).unwrap();
    let held = s.client(s.client_of(&a).unwrap()).unwrap().service();
    assert!(held > 0.0);
    let mut ledger = SyncLedger::new(READER);
    ledger.reset(&mut s).unwrap();
    let mut read = Read::default();
    ledger.read(&mut s, false, &mut read).unwrap();
    assert!(read.full);
    assert_eq!(
        ledger.num_unacked(),
        0,
        "what was charged before counts as in the store"
    );
    s.decode(&[1], Tokens::Each(5)).unwrap();
    ledger.read(&mut s, false, &mut read).unwrap();
    let ka = ClientKey::Str(b"a".to_vec().into_boxed_slice());
    assert_eq!(ledger.unacked_of(&ka), 10.0); // 5 tokens at wq = 2
    s.finish(1).unwrap();
    // another tenant leaves the backlog last (the lift's reference is never forgotten)
    s.submit_keyed(10, &KeyRef::Str(Cow::Borrowed(b"b")), 1, 0, None, 0)
        .unwrap();
    s.schedule(&mut Vec::new());
    ledger.read(&mut s, false, &mut read).unwrap(); // folded before the forget
    assert_eq!(s.forget_idle(&mut Vec::new()), 1);
    // back, and served more than it had before: all of it is new
    s.submit_keyed(2, &a, 500, 0, None, 0).unwrap();
    s.schedule(&mut Vec::new());
    ledger.read(&mut s, false, &mut read).unwrap();
    assert_eq!(read.gone, vec![ka.clone()]);
    assert_eq!(ledger.unacked_of(&ka), 10.0 + 500.0);
    assert_eq!(read.entered, vec![]); // admitted at once: never waiting at a read
    ledger.acknowledge();
    assert_eq!(ledger.num_unacked(), 0);
    ledger.check().unwrap();
}

#[test]
fn the_push_is_one_json_array_of_keys_and_amounts() {
    let mut s = Scheduler::new(100_000, 1.0, 2.0, Policy::Vtc).unwrap();
    let names: [&[u8]; 4] = [
        b"q\"b\\s",
        b"tab\there\n",
        "caf\u{e9}".as_bytes(),
        b"\xed\xa0\x80",
    ];
    let mut rid = 0;
    for (i, n) in names.iter().enumerate() {
        rid += 1;
        s.submit_keyed(
            rid,
            &KeyRef::Str(Cow::Borrowed(n)),
            10 + i as i64,
            0,
            None,
            0,
        )
        .unwrap();
    }
    rid += 1;
    s.submit_keyed(rid, &KeyRef::Int(-7), 1, 0, None, 0)
        .unwrap();
    let mut ledger = SyncLedger::new(READER);
    ledger.reset(&mut s).unwrap();
    s.schedule(&mut Vec::new());
    ledger.read(&mut s, false, &mut Read::default()).unwrap();
    let mut out = Vec::new();
    assert_eq!(push_json(&ledger, &mut out), 5);
    let text = out.clone();
    let mut want = Vec::new();
    for (k, v) in ledger.unacked() {
        push_json_key(&mut want, k);
        want.extend_from_slice(format!(",\"{v:?}\",").as_bytes());
    }
    want.pop();
    assert_eq!(&text[1..text.len() - 1], &want[..]);
    let mut one = Vec::new();
    push_json_key(&mut one, &ClientKey::Str(names[0].into()));
    assert_eq!(one, b"\"s:q\\\"b\\\\s\"");
    one.clear();
    push_json_key(&mut one, &ClientKey::Str(names[1].into()));
    assert_eq!(one, b"\"s:tab\\u0009here\\u000a\"");
    one.clear();
    push_json_key(&mut one, &ClientKey::Int(-7));
    assert_eq!(one, b"\"i:-7\"");
    ledger.acknowledge();
    assert_eq!(push_json(&ledger, &mut out), 0);
    assert_eq!(out, b"[]");
}

fn s(b: &[u8]) -> ClientKey {
    ClientKey::Str(b.to_vec().into_boxed_slice())
}

#[test]
fn the_replys_changed_counters_are_read_as_python_reads_them() {
    let mut out = Vec::new();
    // cjson's empty table, and an empty array: nothing, whatever the values say
    assert_eq!(parse_changed(b"{}", b"", &mut out), Ok(0));
    assert_eq!(parse_changed(b" [ ] ", b"1,2", &mut out), Ok(0));
    assert!(out.is_empty());
    let keys = br#"["s:a","i:-3","s:q\"b\\s\/x","s:\u00e9\ud83d\ude00","s:\ud800","s:\t\n","s:","x:y", "i:7"]"#;
    let values = b"1,2.5,3e2,4,5,6,0,1e30,1e31";
    assert_eq!(parse_changed(keys, values, &mut out), Ok(1)); // 1e31 is no counter
    let want = vec![
        (s(b"a"), 1.0),
        (ClientKey::Int(-3), 2.5),
        (s(b"q\"b\\s/x"), 300.0),
        (s("é😀".as_bytes()), 4.0),
        (s(b"\xed\xa0\x80"), 5.0), // a lone surrogate, as the core keeps it
        (s(b"\t\n"), 6.0),
        (s(b""), 0.0),
        (s(b"y"), 1e30), // not i: -> a str, two characters off
    ];
    assert_eq!(out, want);
    out.clear();
    // values that are no counter are dropped, not errors
    let keys = br#"["s:a","s:b","s:c","s:d","s:e","s:f"]"#;
    assert_eq!(parse_changed(keys, b"nan,inf,-1,abc,,7", &mut out), Ok(5));
    assert_eq!(out, vec![(s(b"f"), 7.0)]);
    out.clear();
    // what cannot be read is an error, and nothing is kept
    for (k, v) in [
        (&b"[\"s:a\",\"s:b\"]"[..], &b"1"[..]),  // fewer values
        (b"[\"s:a\"]", b"1,2"),                  // more
        (b"[\"s:a\"", b"1"),                     // unterminated
        (b"[\"s:a\"]x", b"1"),                   // trailing
        (b"[\"s:\x01\"]", b"1"),                 // a raw control character
        (b"[\"i:abc\"]", b"1"),                  // an int key that is none
        (b"[\"i:99999999999999999999\"]", b"1"), // past i64
        (b"[\"s:\\x\"]", b"1"),                  // a bad escape
        (b"[\"s:\\u12\"]", b"1"),                // a short \u
        (b"[1]", b"1"),                          // not a string
        (b"", b""),                              // nothing
    ] {
        assert!(
            parse_changed(k, v, &mut out).is_err(),
            "{:?}",
            String::from_utf8_lossy(k)
        );
        assert!(out.is_empty());
    }
}

#[test]
fn pulled_counters_rise_by_what_was_charged_since_the_acknowledgment() {
    let mut s0 = Scheduler::new(1_000, 1.0, 2.0, Policy::Vtc).unwrap();
    let a = KeyRef::Str(Cow::Borrowed(b"a"));
    s0.submit_keyed(1, &a, 10, 0, None, 0).unwrap();
    s0.submit_keyed(2, &KeyRef::Int(5), 10, 0, None, 0).unwrap();
    let mut ledger = SyncLedger::new(READER);
    ledger.reset(&mut s0).unwrap();
    s0.schedule(&mut Vec::new());
    let mut read = Read::default();
    ledger.read(&mut s0, false, &mut read).unwrap();
    ledger.acknowledge();
    s0.decode(&[1], Tokens::Each(3)).unwrap(); // 6 charged to a during the round trip
    ledger.read(&mut s0, false, &mut read).unwrap();
    let pulled = vec![
        (s(b"a"), 100.0),
        (ClientKey::Int(5), 50.0),
        (s(b"new"), 7.0),
        (ClientKey::Int(9), 1e30), // + nothing: still a counter
        (s(b"a-over"), 1e30),
    ];
    let mut values = Vec::new();
    assert_eq!(ledger.raise_values(&pulled, &mut values), 0);
    assert_eq!(values[0], (s(b"a"), 106.0));
    assert_eq!(values[1], (ClientKey::Int(5), 50.0));
    let (raised, skipped) = ledger.raise_pulled(&mut s0, &pulled).unwrap();
    assert_eq!((raised, skipped), (5, 0));
    let ca = s0.client_of(&a).unwrap();
    assert_eq!(s0.counter(ca).unwrap(), 106.0);
    // past the maximum with the local part: tests/redis/test_feed.py (charges of 2^32 tokens)
}
