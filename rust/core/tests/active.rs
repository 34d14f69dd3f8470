//! `Scheduler::active_clients`: every client with live requests and its
//! `(waiting, running)` counts, set-aside requests counted as waiting.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::Lcg;

use vtc_core::{ClientId, Policy, RequestState, Scheduler, Tokens};

type Active = Vec<(ClientId, (usize, usize))>;

fn active(s: &Scheduler) -> Active {
    s.active_clients().collect()
}

#[test]
fn submit_schedule_finish_and_cancel() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y, z) = (s.add_client(), s.add_client(), s.add_client());
    assert_eq!(active(&s), vec![]); // known clients without requests are absent
    s.submit(1, x, 10).unwrap();
    s.submit(2, x, 10).unwrap();
    s.submit(3, y, 10).unwrap();
    assert_eq!(active(&s), vec![(x, (2, 0)), (y, (1, 0))]);
    let mut out = Vec::new();
    s.schedule(&mut out);
    assert_eq!(out.len(), 3);
    assert_eq!(active(&s), vec![(x, (0, 2)), (y, (0, 1))]);
    s.submit(4, z, 10).unwrap();
    s.submit(5, y, 10).unwrap();
    assert_eq!(active(&s), vec![(x, (0, 2)), (y, (1, 1)), (z, (1, 0))]);
    s.finish(1).unwrap();
    assert_eq!(active(&s), vec![(x, (0, 1)), (y, (1, 1)), (z, (1, 0))]);
    s.finish(2).unwrap(); // x finished everything: it drops out, still known
    assert_eq!(active(&s), vec![(y, (1, 1)), (z, (1, 0))]);
    assert!(s.client(x).is_ok());
    s.cancel(5).unwrap(); // a waiting one
    assert_eq!(active(&s), vec![(y, (0, 1)), (z, (1, 0))]);
    s.cancel(3).unwrap(); // a running one (an abort)
    s.cancel(4).unwrap();
    assert_eq!(active(&s), vec![]);
    assert_eq!(s.num_clients(), 3);
    s.check_invariants().unwrap();
}

#[test]
fn a_set_aside_request_counts_as_waiting_until_put_back_or_cancelled() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = (s.add_client(), s.add_client());
    s.submit(1, x, 10).unwrap();
    s.submit(2, x, 10).unwrap();
    s.submit(3, y, 10).unwrap();
    let first = s.set_aside().unwrap();
    assert_eq!(s.status(first), Some(RequestState::Aside));
    assert_eq!(s.num_waiting(), 2); // out of the queue...
    assert_eq!(active(&s), vec![(x, (2, 0)), (y, (1, 0))]); // ...but still waiting here
    s.check_invariants().unwrap();
    // set aside every request: each client is still listed, all waiting
    let mut aside = vec![first];
    while let Some(r) = s.set_aside() {
        aside.push(r);
    }
    assert_eq!(aside.len(), 3);
    assert_eq!(s.num_waiting(), 0);
    assert_eq!(active(&s), vec![(x, (2, 0)), (y, (1, 0))]);
    s.check_invariants().unwrap();
    // a client with only set-aside requests is not idle: forget_idle keeps it
    assert_eq!(s.forget_idle(&mut Vec::new()), 0);
    for &r in aside.iter().rev() {
        s.put_back(r).unwrap();
        assert_eq!(active(&s), vec![(x, (2, 0)), (y, (1, 0))]);
    }
    assert_eq!(s.num_waiting(), 3);
    // pop admits one; the one set aside is cancelled from the aside state
    let popped = s.pop().unwrap();
    let c = if popped == 3 { y } else { x };
    let other = s.set_aside().unwrap();
    s.cancel(other).unwrap();
    let mut want: BTreeMap<ClientId, (usize, usize)> = [(x, (2, 0)), (y, (1, 0))].into();
    want.get_mut(&c).unwrap().0 -= 1;
    want.get_mut(&c).unwrap().1 += 1;
    let oc = if other == 3 { y } else { x };
    want.get_mut(&oc).unwrap().0 -= 1;
    want.retain(|_, &mut (w, r)| w + r > 0);
    assert_eq!(active(&s), want.into_iter().collect::<Active>());
    s.check_invariants().unwrap();
}

#[test]
fn preemption_moves_a_request_back_to_waiting() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit(1, x, 10).unwrap();
    s.submit(2, x, 10).unwrap();
    s.schedule(&mut Vec::new());
    s.preempt(1).unwrap();
    assert_eq!(active(&s), vec![(x, (1, 1))]);
    s.schedule(&mut Vec::new());
    assert_eq!(active(&s), vec![(x, (0, 2))]);
    // decode_step preempting by itself: M = 25, two requests of 12 cannot both grow
    let mut s = Scheduler::new(25, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = (s.add_client(), s.add_client());
    s.submit(1, x, 12).unwrap();
    s.submit(2, y, 11).unwrap();
    s.schedule(&mut Vec::new());
    let mut pre = Vec::new();
    s.decode_step(&mut pre).unwrap();
    assert!(pre.is_empty());
    assert_eq!(active(&s), vec![(x, (0, 1)), (y, (0, 1))]);
    s.decode_step(&mut pre).unwrap();
    assert_eq!(pre, vec![1]);
    assert_eq!(active(&s), vec![(x, (1, 0)), (y, (0, 1))]);
    s.check_invariants().unwrap();
}

#[test]
fn forgotten_clients_are_absent_and_a_reused_id_starts_empty() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let (x, y) = (s.add_client(), s.add_client());
    s.submit(1, x, 10).unwrap();
    s.submit(2, y, 500).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[1], Tokens::Each(3)).unwrap();
    s.finish(1).unwrap();
    assert_eq!(active(&s), vec![(y, (0, 1))]);
    let mut gone = Vec::new();
    assert_eq!(s.forget_idle(&mut gone), 1);
    assert_eq!(gone, vec![x]);
    assert_eq!(active(&s), vec![(y, (0, 1))]); // y has a request: kept
    let z = s.add_client();
    assert_eq!(z, x); // x's id, reused
    assert_eq!(active(&s), vec![(y, (0, 1))]);
    s.submit(3, z, 5).unwrap();
    assert_eq!(active(&s), vec![(z, (1, 0)), (y, (0, 1))]);
    s.check_invariants().unwrap();
}

#[test]
fn a_restored_scheduler_has_no_active_client() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let x = s.add_client();
    s.submit(1, x, 10).unwrap();
    s.schedule(&mut Vec::new());
    let data = s.snapshot_with(|c| c.0.to_le_bytes().to_vec());
    let restored = Scheduler::restore(&data).unwrap().scheduler;
    assert_eq!(active(&restored), vec![]);
    assert_eq!(active(&s), vec![(x, (0, 1))]);
}

#[test]
fn random_operations_list_what_counting_the_statuses_gives() {
    let mut saw = [false; 3]; // a client both waiting and running, one set aside, a forget
    for seed in 0..30u64 {
        let mut rng = Lcg(seed + 1);
        let policy = [Policy::Vtc, Policy::Lcf, Policy::Fcfs][(seed % 3) as usize];
        let mut s = Scheduler::new(200, 1.0, 2.0, policy).unwrap();
        let mut cs: Vec<ClientId> = (0..5).map(|_| s.add_client()).collect();
        let mut live: HashMap<u64, ClientId> = HashMap::new();
        let mut out = Vec::new();
        for rid in 0..1500u64 {
            match rng.below(11) {
                0..=2 => {
                    let c = cs[rng.below(cs.len() as u64) as usize];
                    s.submit(rid, c, 1 + rng.below(60) as i64).unwrap();
                    live.insert(rid, c);
                }
                3 => {
                    out.clear();
                    s.schedule(&mut out);
                }
                4 => {
                    let _ = s.decode_step(&mut Vec::new());
                }
                5 => {
                    let first = s.running().next();
                    if let Some(r) = first {
                        s.preempt(r).unwrap();
                    }
                }
                6 => {
                    if s.set_aside().is_some() {
                        saw[1] = true;
                    }
                }
                7 => {
                    let aside: Vec<u64> = live
                        .keys()
                        .copied()
                        .filter(|&r| s.status(r) == Some(RequestState::Aside))
                        .collect();
                    if let Some(&r) = aside.iter().max() {
                        s.put_back(r).unwrap();
                    }
                }
                8 => {
                    let last = s.running().last();
                    if let Some(r) = last {
                        s.finish(r).unwrap();
                        live.remove(&r);
                    }
                }
                9 => {
                    let mut rids: Vec<u64> = live.keys().copied().collect();
                    rids.sort_unstable();
                    if !rids.is_empty() {
                        let r = rids[rng.below(rids.len() as u64) as usize];
                        s.cancel(r).unwrap();
                        live.remove(&r);
                    }
                }
                _ => {
                    let mut gone = Vec::new();
                    s.forget_idle(&mut gone);
                    if !gone.is_empty() {
                        saw[2] = true;
                        cs.retain(|c| !gone.contains(c));
                        while cs.len() < 5 {
                            cs.push(s.add_client());
                        }
                    }
                }
            }
            let mut want: BTreeMap<ClientId, (usize, usize)> = BTreeMap::new();
            for (&r, &c) in &live {
                let e = want.entry(c).or_default();
                match s.status(r).unwrap() {
                    RequestState::Running => e.1 += 1,
                    RequestState::Waiting | RequestState::Aside => e.0 += 1,
                }
            }
            let got = active(&s);
            assert_eq!(
                got,
                want.into_iter().collect::<Active>(),
                "seed {seed} op {rid}"
            );
            saw[0] |= got.iter().any(|&(_, (w, r))| w > 0 && r > 0);
            let running: usize = got.iter().map(|&(_, (_, r))| r).sum();
            assert_eq!(running, s.num_running());
            s.check_invariants().unwrap();
        }
    }
    assert_eq!(saw, [true; 3]);
}
