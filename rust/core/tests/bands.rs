//! Priority bands: strict order between bands, least counter inside one,
//! the lift against the client's own band, preemption from the least urgent
//! band, and memory that follows the waiting requests.

use vtc_core::{ClientId, Policy, Scheduler, Tokens};

fn sched(m: i64, policy: Policy) -> (Scheduler, Vec<ClientId>) {
    let mut s = Scheduler::new(m, 1.0, 2.0, policy).unwrap();
    let cs = (0..4).map(|_| s.add_client()).collect();
    (s, cs)
}

fn submit(s: &mut Scheduler, rid: u64, c: ClientId, prompt: i64, priority: i64) {
    s.submit_priority(rid, c, prompt, 0, None, priority)
        .unwrap();
    s.check_invariants().unwrap();
}

#[test]
fn an_urgent_request_goes_first_whatever_its_counter() {
    for policy in [Policy::Vtc, Policy::Lcf, Policy::Fcfs] {
        let (mut s, c) = sched(1000, policy);
        let mut out = Vec::new();
        submit(&mut s, 1, c[0], 100, 0);
        s.schedule(&mut out); // c0 is the most served
        submit(&mut s, 2, c[1], 10, 1);
        submit(&mut s, 3, c[2], 10, 1);
        submit(&mut s, 4, c[0], 10, 0); // later, more served, but urgent
        assert_eq!(s.peek(), Some(4), "{policy:?}");
        out.clear();
        s.schedule(&mut out);
        assert_eq!(out, vec![4, 2, 3], "{policy:?}");
        s.check_invariants().unwrap();
    }
}

#[test]
fn no_skipping_across_bands() {
    let (mut s, c) = sched(100, Policy::Vtc);
    let mut out = Vec::new();
    submit(&mut s, 1, c[0], 60, 0);
    s.schedule(&mut out);
    submit(&mut s, 2, c[1], 50, -3); // urgent, does not fit
    submit(&mut s, 3, c[2], 10, 0); // would fit, less urgent
    out.clear();
    assert_eq!(s.schedule(&mut out), 0);
    assert_eq!(s.num_bands(), 2);
}

#[test]
fn least_counter_inside_a_band_while_another_waits() {
    let (mut s, c) = sched(10_000, Policy::Vtc);
    let mut out = Vec::new();
    submit(&mut s, 1, c[0], 500, 0);
    s.schedule(&mut out); // c0: 500
    submit(&mut s, 2, c[0], 10, 2); // both in band 2; c1 lifted to 500 too
    submit(&mut s, 3, c[1], 10, 2);
    submit(&mut s, 4, c[2], 10, 7);
    s.decode(&[1], Tokens::Each(1)).unwrap(); // c0 now 502 > c1
    out.clear();
    s.schedule(&mut out);
    assert_eq!(out, vec![3, 2, 4]);
}

#[test]
fn the_lift_is_to_the_clients_own_band() {
    let (mut s, c) = sched(10_000, Policy::Vtc);
    let mut out = Vec::new();
    // c0 at 1000 waits in band 0; c1 at 1200 in band 1
    s.raise_counter(c[0], 1000.0).unwrap();
    s.raise_counter(c[1], 1200.0).unwrap();
    submit(&mut s, 3, c[0], 10, 0);
    submit(&mut s, 4, c[1], 10, 1);
    assert_eq!(s.counter(c[0]).unwrap(), 1000.0);
    assert_eq!(s.counter(c[1]).unwrap(), 1200.0);
    // c2 joins band 1: lifted to band 1's least (c1's 1200), not band 0's 1000
    submit(&mut s, 5, c[2], 10, 1);
    assert_eq!(s.counter(c[2]).unwrap(), 1200.0);
    // c3 joins band 0: lifted to band 0's least (c0's 1000), not band 1's 1200
    submit(&mut s, 6, c[3], 10, 0);
    assert_eq!(s.counter(c[3]).unwrap(), 1000.0);
    // a new band with nobody in it: the least over all bands (1000)
    let d = s.add_client();
    submit(&mut s, 7, d, 10, 9);
    assert_eq!(s.counter(d).unwrap(), 1000.0);
    // entering a second band lifts a client already waiting in another one
    let (mut s, c) = sched(10_000, Policy::Vtc);
    submit(&mut s, 1, c[0], 500, 1);
    s.schedule(&mut out); // c0: 500
    submit(&mut s, 2, c[0], 10, 1);
    submit(&mut s, 3, c[1], 10, 0); // c1 lifted to the least overall: 500
    submit(&mut s, 4, c[2], 10, 1);
    assert_eq!(s.counter(c[2]).unwrap(), 500.0);
    s.decode(&[1], Tokens::Each(100)).unwrap(); // c0: 700
    submit(&mut s, 5, c[0], 10, 0); // joins band 0, whose least is c1's 500: no lift
    assert_eq!(s.counter(c[0]).unwrap(), 700.0);
}

#[test]
fn preempted_and_put_back_requests_return_to_their_own_band_without_a_lift() {
    let (mut s, c) = sched(10_000, Policy::Vtc);
    let mut out = Vec::new();
    submit(&mut s, 1, c[0], 100, 1);
    s.schedule(&mut out);
    submit(&mut s, 2, c[1], 1000, 0);
    submit(&mut s, 3, c[1], 10, 0);
    out.clear();
    s.schedule(&mut out);
    assert_eq!(out, vec![2, 3]);
    let before = s.counter(c[0]).unwrap();
    s.preempt(1).unwrap(); // back to band 1, c0 not lifted to c1's 1110
    assert_eq!(s.counter(c[0]).unwrap(), before);
    submit(&mut s, 4, c[2], 10, 1); // joins band 1 at c0's 100
    assert_eq!(s.counter(c[2]).unwrap(), 100.0);
    submit(&mut s, 5, c[3], 10, 0);
    assert_eq!(s.set_aside(), Some(5));
    assert_eq!(s.peek(), Some(1), "band 1 head is the preempted request");
    s.put_back(5).unwrap();
    assert_eq!(s.peek(), Some(5));
    s.check_invariants().unwrap();
}

#[test]
fn growth_preempts_the_least_urgent_band_first() {
    let (mut s, c) = sched(100, Policy::Vtc);
    let mut out = Vec::new();
    submit(&mut s, 1, c[0], 40, 0);
    submit(&mut s, 2, c[1], 10, 5);
    s.schedule(&mut out);
    submit(&mut s, 3, c[1], 49, 0);
    out.clear();
    s.schedule(&mut out);
    assert_eq!(out, vec![3]);
    // c1 is the least served, yet its band-5 request goes first
    let mut pre = Vec::new();
    s.decode_step(&mut pre).unwrap();
    assert_eq!(pre, vec![2]);
    s.check_invariants().unwrap();
}

#[test]
fn bands_and_entities_follow_the_waiting_requests() {
    let (mut s, c) = sched(1_000_000, Policy::Vtc);
    let mut out = Vec::new();
    for round in 0..50u64 {
        for i in 0..40u64 {
            let rid = round * 100 + i;
            submit(
                &mut s,
                rid,
                c[(i % 4) as usize],
                1,
                (rid * 7919 % 13) as i64 - 6,
            );
        }
        assert!(s.num_bands() <= 13);
        out.clear();
        s.schedule(&mut out);
        for &r in &out {
            s.finish(r).unwrap();
        }
        assert_eq!(s.num_bands(), 0);
        assert_eq!(s.num_backlogged(), 0);
    }
    // the extremes of the range order like any other priority
    submit(&mut s, 10_000, c[0], 1, i64::MAX);
    submit(&mut s, 10_001, c[1], 1, i64::MIN);
    submit(&mut s, 10_002, c[2], 1, 0);
    out.clear();
    s.schedule(&mut out);
    assert_eq!(out, vec![10_001, 10_002, 10_000]);
}

#[test]
fn weighted_bands_share_service_by_weight() {
    let (mut s, c) = sched(1000, Policy::Vtc);
    s.set_band_weights(Some(&[(0, 4.0), (1, 1.0)])).unwrap();
    let mut rid = 0;
    for _ in 0..100 {
        for (client, priority) in [(c[0], 0), (c[1], 1)] {
            rid += 1;
            submit(&mut s, rid, client, 10, priority);
        }
    }
    let mut urgent = 0;
    for _ in 0..100 {
        let r = s.pop().unwrap();
        urgent += usize::from(r % 2 == 1);
        s.decode(&[r], Tokens::PerRequest(&[10])).unwrap();
        s.finish(r).unwrap();
        s.check_invariants().unwrap();
    }
    assert!((78..=82).contains(&urgent), "{urgent}");
    let counters: Vec<(i64, f64)> = s.band_counters().collect();
    assert_eq!(counters.len(), 2);
    assert!(
        (counters[0].1 - counters[1].1).abs() <= 30.0,
        "{counters:?}"
    );
}

#[test]
fn bad_band_weights_change_nothing_and_shares_follow_live_requests() {
    let (mut s, c) = sched(1000, Policy::Vtc);
    submit(&mut s, 1, c[0], 10, 3);
    assert!(s.set_band_weights(Some(&[(0, 2.0), (1, 0.0)])).is_err());
    assert_eq!(s.band_weights(), None);
    s.set_band_weights(Some(&[(3, 2.0), (3, 4.0)])).unwrap();
    assert_eq!(s.band_weights(), Some(&[(3, 4.0)][..]));
    assert_eq!(s.band_counters().collect::<Vec<_>>(), vec![(3, 0.0)]);
    assert_eq!(s.pop(), Some(1));
    assert_eq!(s.band_counters().collect::<Vec<_>>(), vec![(3, 2.5)]);
    s.finish(1).unwrap();
    assert_eq!(s.band_counters().count(), 0);
    s.check_invariants().unwrap();
}
