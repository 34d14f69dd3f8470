//! `state_version`: every call that changes the scheduling state advances it
//! (what a snapshot holds, the configuration, the next request), and the
//! calls that change nothing leave it (reads, the change feed, refused calls);
//! `uniform_decodes` counts the `decode_all` calls that charged.

mod common;

use common::Lcg;
use vtc_core::{ClientId, Cost, Policy, Predictor, Scheduler, Tokens};

/// What the scheduling state is, as far as a caller can tell.
fn state(s: &Scheduler) -> (Vec<u8>, String, Option<u64>) {
    (s.snapshot(), format!("{:?}", s.config()), s.peek())
}

/// One random call on `s` (errors ignored: a refused call changes nothing).
fn random_call(rng: &mut Lcg, s: &mut Scheduler, clients: &mut Vec<ClientId>, rid: &mut u64) {
    let running: Vec<u64> = s.running().collect();
    let pick =
        |rng: &mut Lcg, ids: &[u64]| ids.get(rng.below(ids.len() as u64 + 1) as usize).copied();
    match rng.below(20) {
        0..=3 => {
            if clients.is_empty() || rng.below(4) == 0 {
                clients.push(s.add_client());
            }
            let c = clients[rng.below(clients.len() as u64) as usize];
            *rid += 1;
            let predicted = [None, Some(0), Some(5)][rng.below(3) as usize];
            let prompt = rng.below(40) as i64; // (0: refused)
            let _ = s.submit_priority(*rid, c, prompt, 0, predicted, rng.below(2) as i64);
        }
        4 => {
            s.schedule(&mut Vec::new());
        }
        5 => {
            let _ = s.pop_cached([None, Some(0), Some(-1)][rng.below(3) as usize]);
        }
        6 => {
            let n = rng.below(running.len() as u64 + 1) as usize;
            let _ = s.decode(&running[..n], Tokens::Each(rng.below(3) as i64));
        }
        7 => {
            let _ = s.decode_all(rng.below(3) as i64 - (rng.below(8) == 0) as i64 * 5);
        }
        8 => {
            let _ = s.finish(pick(rng, &running).unwrap_or(*rid + 1));
        }
        9 => {
            let _ = s.cancel(rng.below(*rid + 2));
        }
        10 => {
            let _ = s.preempt(pick(rng, &running).unwrap_or(0));
        }
        11 => {
            if rng.below(2) == 0 {
                s.set_aside();
            } else {
                let _ = s.put_back(rng.below(*rid + 2));
            }
        }
        12 => {
            if let Some(&c) = clients.get(rng.below(clients.len() as u64 + 1) as usize) {
                let _ = s.set_weight(c, [0.5, 1.0, 2.0, -1.0][rng.below(4) as usize]);
            }
        }
        13 => {
            if let Some(&c) = clients.get(rng.below(clients.len() as u64 + 1) as usize) {
                let _ = s.raise_counter(c, rng.below(500) as f64);
            }
        }
        14 => {
            let mut gone = Vec::new();
            s.forget_idle(&mut gone);
            clients.retain(|c| !gone.contains(c));
        }
        15 => {
            let weights = [None, Some(vec![(0, 1.0), (1, 3.0)]), Some(vec![(0, -2.0)])];
            let _ = s.set_band_weights(weights[rng.below(3) as usize].as_deref());
        }
        16 => match rng.below(4) {
            0 => {
                let _ = s.set_cost(
                    [Cost::Linear { wp: 1.0, wq: 2.0 }, Cost::PAPER_QUADRATIC]
                        [rng.below(2) as usize],
                );
            }
            1 => s.set_predictor([Predictor::None, Predictor::Mean][rng.below(2) as usize]),
            2 => {
                let _ = s.set_client_cap([None, Some(50), Some(0)][rng.below(3) as usize]);
            }
            _ => {
                let _ = s.set_locality_quantum([0.0, 5.0, -1.0][rng.below(3) as usize]);
            }
        },
        17 => {
            let _ = s.decode_step(&mut Vec::new());
        }
        _ => {
            // the change feed: a reader's read, or its reset
            if rng.below(2) == 0 {
                let _ = s.changes(rng.below(5) as usize, &mut Vec::new(), &mut Vec::new());
            } else {
                let _ = s.reset_changes(rng.below(5) as usize);
            }
        }
    }
}

#[test]
fn every_change_of_the_state_advances_the_version() {
    for seed in 0..40 {
        let mut rng = Lcg(seed);
        let mut s = Scheduler::new(120, 1.0, 2.0, Policy::Vtc).unwrap();
        let (mut clients, mut rid) = (Vec::new(), 0);
        let mut changed = 0;
        for step in 0..400 {
            let before = (s.state_version(), state(&s));
            random_call(&mut rng, &mut s, &mut clients, &mut rid);
            if state(&s) != before.1 {
                changed += 1;
                assert_ne!(
                    s.state_version(),
                    before.0,
                    "seed {seed}, call {step}: the state changed, the version did not"
                );
            }
        }
        assert!(
            changed > 100,
            "seed {seed}: only {changed} calls changed anything"
        );
        s.check_invariants().unwrap();
    }
}

#[test]
fn reads_refusals_and_the_change_feed_leave_the_version() {
    let mut s = Scheduler::new(100, 1.0, 2.0, Policy::Vtc).unwrap();
    let c = s.add_client();
    s.submit(1, c, 10).unwrap();
    s.submit(2, c, 10).unwrap();
    s.pop().unwrap();
    let v = s.state_version();
    let _ = (
        s.peek(),
        s.num_waiting(),
        s.status(1),
        s.counter(c),
        s.snapshot(),
    );
    let (mut changed, mut gone) = (Vec::new(), Vec::new());
    s.changes(0, &mut changed, &mut gone).unwrap();
    s.changes(0, &mut changed, &mut gone).unwrap();
    s.reset_changes(0).unwrap();
    assert!(s.submit(1, c, 10).is_err()); // (a duplicate id)
    assert!(s.finish(2).is_err()); // (waiting, not running)
    assert!(s.decode(&[1], Tokens::Each(-1)).is_err());
    assert!(s.decode_all(-1).is_err());
    assert!(s.set_weight(c, 0.0).is_err());
    assert!(s.set_client_cap(Some(0)).is_err());
    assert!(s.set_band_weights(Some(&[(0, f64::NAN)])).is_err());
    s.decode_all(0).unwrap(); // (no tokens: nothing changes)
    assert_eq!(s.state_version(), v);
    // and each kind of change moves it
    s.decode_all(1).unwrap();
    assert_ne!(s.state_version(), v);
    let v = s.state_version();
    s.set_predictor(Predictor::Mean);
    assert_ne!(s.state_version(), v);
}

#[test]
fn decode_all_counts_the_uniform_decodes_that_charged() {
    let mut s = Scheduler::new(100, 1.0, 2.0, Policy::Vtc).unwrap();
    s.decode_all(1).unwrap(); // (nothing runs)
    assert_eq!(s.uniform_decodes(), 0);
    let c = s.add_client();
    s.submit(1, c, 10).unwrap();
    s.pop().unwrap();
    s.decode_all(0).unwrap();
    assert!(s.decode_all(-3).is_err());
    assert_eq!(s.uniform_decodes(), 0);
    s.decode_all(2).unwrap();
    s.decode(&[1], Tokens::Each(1)).unwrap(); // (ids: not uniform)
    s.decode_all(1).unwrap();
    assert_eq!(s.uniform_decodes(), 2);
    let restored = Scheduler::restore(&s.snapshot()).unwrap().scheduler;
    assert_eq!(restored.uniform_decodes(), 0); // (not kept in a snapshot)
}
