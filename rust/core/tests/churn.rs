//! Bounded memory under client churn: ten million one-off clients, each
//! sending one request, through a scheduler that forgets idle clients and
//! one that forgets nothing. Every admission, preemption and heavy-client
//! counter must match, and the forgetting scheduler's client table must stay
//! proportional to the live set.

use std::collections::HashMap;

use vtc_core::{ClientId, Policy, Scheduler};

const ONE_OFFS: u64 = 10_000_000;
const PER_STEP: u64 = 64;
const HEAVY: usize = 4;
/// Clients that come back now and then: forgetting one wrongly would show.
const OCCASIONAL: u64 = 2_000;

#[test]
fn ten_million_one_off_clients_leave_memory_proportional_to_the_live_set() {
    let budget = 4096;
    let mut forgetful = Scheduler::new(budget, 1.0, 2.0, Policy::Vtc).unwrap();
    let mut plain = Scheduler::new(budget, 1.0, 2.0, Policy::Vtc).unwrap();
    let heavy: Vec<(ClientId, ClientId)> = (0..HEAVY)
        .map(|_| (forgetful.add_client(), plain.add_client()))
        .collect();
    let mut output: HashMap<u64, u64> = HashMap::new();
    let (mut a_out, mut b_out, mut a_pre, mut b_pre) = (vec![], vec![], vec![], vec![]);
    let mut gone = Vec::new();
    let mut rid = 0u64;
    let mut one_offs = 0u64;
    let mut max_bound = 0u32;
    let mut forgotten = 0usize;
    let mut step = 0u64;
    // occasional clients: key -> id in `plain` (fixed) and in `forgetful` (re-added after a forget)
    let occ_plain: Vec<ClientId> = (0..OCCASIONAL).map(|_| plain.add_client()).collect();
    let mut occ_forgetful: HashMap<u64, ClientId> = HashMap::new();
    let mut key_of_id: HashMap<u32, u64> = HashMap::new();
    let mut lcg = 12345u64;
    while one_offs < ONE_OFFS {
        step += 1;
        for k in 0..PER_STEP {
            rid += 1;
            let p = 1 + (rid % 8) as i64;
            let (fc, pc) = if k % 8 == 0 {
                lcg = lcg
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = (lcg >> 33) % OCCASIONAL;
                let fc = *occ_forgetful.entry(key).or_insert_with(|| {
                    let c = forgetful.add_client();
                    key_of_id.insert(c.0, key);
                    c
                });
                (fc, occ_plain[key as usize])
            } else {
                one_offs += 1;
                (forgetful.add_client(), plain.add_client())
            };
            forgetful.submit(rid, fc, p).unwrap();
            plain.submit(rid, pc, p).unwrap();
            output.insert(rid, 1 + rid % 4);
        }
        if step % 4 == 0 {
            for &(fa, pa) in &heavy {
                if forgetful.client(fa).unwrap().num_waiting() < 2 {
                    for _ in 0..8 {
                        rid += 1;
                        forgetful.submit(rid, fa, 32).unwrap();
                        plain.submit(rid, pa, 32).unwrap();
                        output.insert(rid, 8);
                    }
                }
            }
        }
        a_out.clear();
        b_out.clear();
        forgetful.schedule(&mut a_out);
        plain.schedule(&mut b_out);
        assert_eq!(a_out, b_out, "admissions differ at step {step}");
        a_pre.clear();
        b_pre.clear();
        forgetful.decode_step(&mut a_pre).unwrap();
        plain.decode_step(&mut b_pre).unwrap();
        assert_eq!(a_pre, b_pre, "preemptions differ at step {step}");
        let done: Vec<u64> = forgetful
            .running()
            .filter(|&r| forgetful.generated(r).unwrap() >= output[&r])
            .collect();
        for r in done {
            forgetful.finish(r).unwrap();
            plain.finish(r).unwrap();
            output.remove(&r);
        }
        if step % 64 == 0 {
            forgotten += forgetful.forget_idle(&mut gone);
            for c in gone.drain(..) {
                if let Some(key) = key_of_id.remove(&c.0) {
                    occ_forgetful.remove(&key);
                }
            }
            for (&key, &fc) in &occ_forgetful {
                let pc = occ_plain[key as usize];
                assert_eq!(forgetful.counter(fc).unwrap(), plain.counter(pc).unwrap());
            }
            max_bound = max_bound.max(forgetful.client_id_bound());
            for &(fa, pa) in &heavy {
                assert_eq!(forgetful.counter(fa).unwrap(), plain.counter(pa).unwrap());
            }
        }
    }
    forgetful.check_invariants().unwrap();
    assert!(
        forgotten as u64 > ONE_OFFS * 9 / 10,
        "forgot only {forgotten}"
    );
    for (&key, &fc) in &occ_forgetful {
        assert_eq!(
            forgetful.counter(fc).unwrap(),
            plain.counter(occ_plain[key as usize]).unwrap()
        );
    }
    // live set: a few hundred running and waiting requests, each its own client
    let live = forgetful.num_running() + forgetful.num_waiting() + HEAVY;
    assert!(
        (max_bound as usize) < 50 * live.max(100),
        "client table grew to {max_bound} ids for a live set of {live}"
    );
    eprintln!("max id bound {max_bound}, live {live}, forgotten {forgotten}");
    assert_eq!(
        plain.num_clients() as u64,
        one_offs + HEAVY as u64 + OCCASIONAL
    );
}
