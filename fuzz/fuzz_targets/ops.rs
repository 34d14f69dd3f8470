//! Arbitrary operation sequences on the core. After every operation:
//! no panic; every structural invariant (`check_invariants`); each request
//! is in exactly the state a simple model says (waiting / running / ended);
//! counters never decrease; a failed operation changed nothing; and, until
//! an engine-mode call (`pop`, `decode(ids, tokens)`) hands memory to the
//! engine, occupancy never exceeds M; every counter stays finite and the
//! snapshot restores. The first byte's bit 6 selects extreme values: the
//! largest budget, prices, prompts and token counts the API accepts and just
//! past them, weights at and past their limits, counters raised to and past
//! 1e30, non-finite floats.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use vtc_core::limits::{MAX_COUNTER, MAX_PRICE, MAX_WEIGHT, MIN_WEIGHT};
use vtc_core::{
    ClientId, CoreError, Policy, RequestState, Scheduler, Tokens, MAX_BUDGET, MAX_REQUEST_TOKENS,
    MAX_TOKENS_PER_CALL,
};

#[derive(Clone, Copy, PartialEq, Debug)]
enum St {
    Waiting,
    Running,
    Aside,
}

fn fingerprint(s: &Scheduler, clients: &[ClientId]) -> (u128, usize, usize, Vec<(u64, u64)>) {
    let cs = clients
        .iter()
        .filter_map(|&c| s.client(c).ok())
        .map(|c| (c.counter().to_bits(), c.service().to_bits()))
        .collect();
    (s.occupancy(), s.num_waiting(), s.num_running(), cs)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let extreme = data[0] & 0x40 != 0;
    let big = MAX_BUDGET as i64;
    let budget = if extreme {
        [big, big, 1000, big + 1][(data[0] & 3) as usize]
    } else {
        [8i64, 32, 100, 1000][(data[0] & 3) as usize]
    };
    let policy =
        [Policy::Vtc, Policy::Lcf, Policy::Fcfs, Policy::Vtc][((data[0] >> 2) & 3) as usize];
    let (wp, wq) = if extreme {
        let prices = [MAX_PRICE, 0.0, 1.0, MAX_PRICE * 2.0];
        (
            prices[((data[0] >> 4) & 3) as usize],
            prices[(data[0] >> 7) as usize * 2],
        )
    } else {
        (1.0, [2.0, 1.0, 0.5, 3.0][((data[0] >> 4) & 3) as usize])
    };
    let mut s = match Scheduler::new(budget, wp, wq, policy) {
        Ok(s) => s,
        Err(_) => {
            // refused: only past a limit, or no price at all
            assert!(budget > big || wp > MAX_PRICE || wq > MAX_PRICE || wp + wq == 0.0);
            return;
        }
    };
    let mut clients: Vec<ClientId> = (0..4).map(|_| s.add_client()).collect();
    let mut model: HashMap<u64, St> = HashMap::new();
    let mut engine_mode = false;
    let mut prev: Vec<f64> = vec![0.0; clients.len()];
    let mut out = Vec::new();
    for op in data[1..].chunks(4) {
        let b = |i: usize| *op.get(i).unwrap_or(&0);
        let rid = (b(1) % 32) as u64;
        let c = clients[(b(2) % clients.len() as u8) as usize];
        let before = fingerprint(&s, &clients);
        let res: Result<(), CoreError> = match b(0) % 12 {
            0 | 1 | 2 => {
                let p = if extreme {
                    let huge = MAX_REQUEST_TOKENS as i64;
                    [1, budget, budget + 1, huge, huge + 1, i64::MAX, -1, 5][(b(3) & 7) as usize]
                } else {
                    b(3) as i64 % (budget + 2) - 1
                };
                // priority bands: mostly the default, some urgent, some at the extremes
                let band = [0, 0, 0, 0, 1, -1, i64::MIN, i64::MAX][(b(4) & 7) as usize];
                let r = s.submit_priority(rid, c, p, (b(3) % 4) as i64, None, band);
                if r.is_ok() {
                    model.insert(rid, St::Waiting);
                }
                r
            }
            3 | 4 => {
                out.clear();
                s.schedule(&mut out);
                for r in &out {
                    assert_eq!(model.insert(*r, St::Running), Some(St::Waiting));
                }
                Ok(())
            }
            5 | 6 => {
                out.clear();
                let r = s.decode_step(&mut out);
                for p in &out {
                    assert_eq!(model.insert(*p, St::Waiting), Some(St::Running));
                }
                r
            }
            7 => {
                let ids: Vec<u64> = (0..b(3) % 4).map(|k| (rid + k as u64) % 32).collect();
                let toks: Vec<i64> = if extreme {
                    let most = MAX_TOKENS_PER_CALL as i64;
                    let t = [1, most, most + 1, i64::MAX, -1, 0, most, 3][(b(2) & 7) as usize];
                    ids.iter().map(|_| t).collect()
                } else {
                    ids.iter()
                        .map(|&i| (i as i64 % 5) - (b(2) % 7 == 0) as i64)
                        .collect()
                };
                let r = if b(3) & 4 != 0 {
                    // uniform: every running request, no ids
                    s.decode_all(toks.first().copied().unwrap_or(1))
                } else {
                    s.decode(&ids, Tokens::PerRequest(&toks))
                };
                engine_mode |= r.is_ok();
                r
            }
            8 => s
                .finish(rid)
                .inspect(|_| assert_eq!(model.remove(&rid), Some(St::Running))),
            9 => s
                .cancel(rid)
                .inspect(|_| assert!(model.remove(&rid).is_some())),
            10 if b(1) & 1 == 0 => s.preempt(rid).inspect(|_| {
                assert_eq!(model.insert(rid, St::Waiting), Some(St::Running));
            }),
            10 => s.put_back(rid).inspect(|_| {
                assert_eq!(model.insert(rid, St::Waiting), Some(St::Aside));
            }),
            _ => match b(3) % 4 {
                0 if b(1) & 1 == 0 => {
                    if let Some(r) = s.set_aside() {
                        assert_eq!(model.insert(r, St::Aside), Some(St::Waiting));
                    }
                    Ok(())
                }
                0 => {
                    if let Some(r) = s.pop() {
                        engine_mode = true;
                        assert_eq!(model.insert(r, St::Running), Some(St::Waiting));
                    }
                    Ok(())
                }
                1 if extreme => {
                    let w = [
                        MIN_WEIGHT,
                        MAX_WEIGHT,
                        MIN_WEIGHT / 2.0,
                        MAX_WEIGHT * 2.0,
                        5e-324,
                    ][(b(1) % 8 % 5) as usize];
                    let w = if b(1) & 0x80 != 0 {
                        [f64::NAN, f64::INFINITY][(b(1) & 1) as usize]
                    } else {
                        w
                    };
                    s.set_weight(c, w)
                }
                1 if b(1) & 0x40 != 0 => {
                    // weighted bands on (sometimes a bad weight), changed, or off
                    let w = [4.0, 0.5, 1.0, -1.0][(b(1) & 3) as usize];
                    match b(1) >> 4 & 3 {
                        0 => s.set_band_weights(None),
                        _ => s.set_band_weights(Some(&[(0, w), (-1, 2.0), (7, 1.0)])),
                    }
                }
                1 => s.set_weight(c, [0.5, 1.0, 2.0, -1.0][(b(1) & 3) as usize]),
                2 if extreme => {
                    let v = [
                        MAX_COUNTER,
                        -MAX_COUNTER,
                        MAX_COUNTER * 2.0,
                        f64::INFINITY,
                        f64::NAN,
                        1e29,
                    ][(b(1) % 6) as usize];
                    s.raise_counter(c, v)
                }
                2 => s.raise_counter(c, b(1) as f64 * 10.0),
                _ => {
                    let mut gone = Vec::new();
                    s.forget_idle(&mut gone);
                    for g in &gone {
                        clients.retain(|x| x != g);
                    }
                    while clients.len() < 4 {
                        clients.push(s.add_client());
                    }
                    prev = clients.iter().map(|&c| s.counter(c).unwrap()).collect();
                    Ok(())
                }
            },
        };
        if res.is_err() {
            assert_eq!(
                fingerprint(&s, &clients),
                before,
                "a failed operation changed state"
            );
        }
        s.check_invariants().unwrap();
        for (&r, &st) in &model {
            let want = match st {
                St::Waiting => RequestState::Waiting,
                St::Running => RequestState::Running,
                St::Aside => RequestState::Aside,
            };
            assert_eq!(s.status(r), Some(want), "request {r}");
        }
        let aside = model.values().filter(|&&st| st == St::Aside).count();
        assert_eq!(s.num_waiting() + s.num_running() + aside, model.len());
        if !engine_mode {
            assert!(s.occupancy() <= budget as u128);
        }
        let snap = s.snapshot_with(|c| c.0.to_le_bytes().to_vec());
        let back = Scheduler::restore(&snap).expect("every snapshot restores");
        assert_eq!(back.scheduler.num_clients(), s.num_clients());
        for (i, &c) in clients.iter().enumerate() {
            let v = s.counter(c).unwrap();
            assert!(v.is_finite(), "counter {v} of client {c:?}");
            assert!(v >= prev[i], "counter decreased");
            prev[i] = v;
        }
    }
});
