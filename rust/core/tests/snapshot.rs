//! Snapshots: version 2 round trips the whole state; version 1 (a file
//! written by the format-1 code) still loads; corrupt input of any kind is
//! a `BadSnapshot` naming what is wrong, never a panic.

use vtc_core::{
    ClientCap, ClientId, ClientKey, Config, CoreError, Cost, Overrides, Policy, Predictor,
    Scheduler, Tokens, SNAPSHOT_VERSION,
};

/// Written by `tests/test_snapshot.py`'s scenario on the format-1 code.
const V1: &[u8] = include_bytes!("../../../tests/data/snapshot_v1.bin");

fn sample() -> Scheduler {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    let a = s.add_client();
    let b = s.add_client();
    s.set_weight(b, 2.5).unwrap();
    s.submit(1, a, 100).unwrap();
    s.submit(2, b, 300).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[1, 2], Tokens::Each(7)).unwrap();
    s.finish(1).unwrap();
    s.finish(2).unwrap();
    s
}

/// Every option set, with refund credits and moving averages.
fn configured() -> Scheduler {
    let mut s = Scheduler::with_config(&Config {
        cost: Cost::Context {
            wp: 1.5,
            wq: 2.5,
            beta: 0.25,
        },
        client_cap: Some(ClientCap::Tokens(700)),
        predictor: Predictor::Mean,
        band_weights: Some(vec![(0, 3.0), (4, 0.5)]),
        locality_quantum: 12.5,
        ..Config::new(1000)
    })
    .unwrap();
    let a = s.add_client();
    let b = s.add_client();
    s.set_weight(b, 2.0).unwrap();
    s.submit(1, a, 100).unwrap();
    s.submit(2, b, 50).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[1, 2], Tokens::Each(9)).unwrap();
    s.finish(1).unwrap();
    s.finish(2).unwrap();
    // predicted 9 from the averages, 1 generated: the rest is refunded
    s.submit(3, a, 10).unwrap();
    s.schedule(&mut Vec::new());
    s.decode(&[3], Tokens::Each(1)).unwrap();
    s.finish(3).unwrap();
    s
}

fn key(c: ClientId) -> Vec<u8> {
    format!("k{}", c.0).into_bytes()
}

fn is_bad(r: Result<vtc_core::Restored, CoreError>) -> String {
    match r {
        Err(CoreError::BadSnapshot(m)) => m,
        Err(e) => panic!("not BadSnapshot: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn version_2_round_trips_the_configuration_credits_and_averages() {
    for s in [sample(), configured()] {
        let bytes = s.snapshot_with(key);
        assert_eq!(bytes[8..12], SNAPSHOT_VERSION.to_le_bytes());
        let r = Scheduler::restore(&bytes).unwrap();
        assert_eq!(r.version, 2);
        assert_eq!(r.keys, vec![b"k0".to_vec(), b"k1".to_vec()]);
        assert_eq!(r.scheduler.config(), s.config());
        for i in 0..2 {
            let (x, y) = (
                s.client(ClientId(i)).unwrap(),
                r.scheduler.client(ClientId(i)).unwrap(),
            );
            assert_eq!(
                (x.counter(), x.service(), x.weight(), x.credit()),
                (y.counter(), y.service(), y.weight(), y.credit())
            );
            assert_eq!(r.scheduler.mean(ClientId(i)), s.mean(ClientId(i)));
        }
        assert_eq!(r.scheduler.last_left(), s.last_left());
        assert_eq!(r.scheduler.snapshot_with(key), bytes);
        r.scheduler.check_invariants().unwrap();
    }
    let s = configured();
    assert!(s.client(ClientId(0)).unwrap().credit() > 0.0);
    assert!(s.mean(ClientId(0)).is_some());
}

#[test]
fn the_version_1_file_loads_to_the_state_it_held() {
    let r = Scheduler::restore(V1).unwrap();
    assert_eq!(r.version, 1);
    assert_eq!(
        r.scheduler.config(),
        Config {
            cost: Cost::Linear { wp: 1.5, wq: 3.0 },
            ..Config::new(1000)
        }
    );
    let keys: Vec<ClientKey> = r
        .keys
        .iter()
        .map(|k| ClientKey::decode(k).unwrap())
        .collect();
    assert_eq!(
        keys,
        vec![
            ClientKey::Str((*b"alice").into()),
            ClientKey::Int(7),
            ClientKey::Str((*b"\xed\xa0\x80x").into()),
            ClientKey::Str((*b"gone").into()),
        ]
    );
    let got: Vec<(f64, f64, f64, f64)> = (0..4)
        .map(|i| {
            let c = r.scheduler.client(ClientId(i)).unwrap();
            (c.counter(), c.service(), c.weight(), c.credit())
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (122.4, 122.4, 2.5, 0.0),
            (156.0, 156.0, 1.0, 0.0),
            (81.0, 81.0, 1.0, 0.0),
            (51.0, 0.0, 1.0, 0.0),
        ]
    );
    // re-encoded as version 2, it restores to the same scheduler
    let again =
        Scheduler::restore(&r.scheduler.snapshot_with(|c| r.keys[c.0 as usize].clone())).unwrap();
    assert_eq!(again.version, 2);
    assert_eq!(again.scheduler.config(), r.scheduler.config());
    assert_eq!(again.keys, r.keys);
    assert_eq!(again.scheduler.last_left(), r.scheduler.last_left());
}

#[test]
fn every_truncation_and_every_flipped_byte_is_rejected() {
    for bytes in [
        sample().snapshot_with(|c| vec![c.0 as u8; 3]),
        configured().snapshot_with(key),
        V1.to_vec(),
    ] {
        for n in 0..bytes.len() {
            is_bad(Scheduler::restore(&bytes[..n]));
        }
        for i in 0..bytes.len() {
            for bit in [0x01, 0x40, 0x80] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                is_bad(Scheduler::restore(&b));
            }
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert!(is_bad(Scheduler::restore(&padded)).contains("padded"));
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                0xEDB8_8320 ^ (crc >> 1)
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// An edit of a snapshot's payload.
type Edit = Box<dyn FnOnce(&mut Vec<u8>)>;

/// `bytes` with its payload edited by `edit` and the checksum made right,
/// so that only the value checks can refuse it.
fn edited(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut payload = bytes[24..].to_vec();
    edit(&mut payload);
    let mut out = bytes[..8].to_vec();
    out.extend_from_slice(&bytes[8..12]);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

#[test]
fn a_well_sealed_payload_with_a_bad_value_names_it() {
    // sample(): linear cost, no cap, no bands; payload offsets:
    // budget 0, policy 8, cost 9 (wp 10, wq 18), cap 26, predictor 34,
    // quantum 35, bands 43, clients 47, first key length 55, key 59 (3 bytes),
    // counter 62, service 70, weight 78, credit 86, has_mean 94, mean 95
    let bytes = sample().snapshot_with(|c| vec![c.0 as u8; 3]);
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|p| p[8] = 9), "unknown policy code 9"),
        (Box::new(|p| p[9] = 7), "unknown cost code 7"),
        (
            Box::new(|p| p[10..18].copy_from_slice(&f64::NAN.to_le_bytes())),
            "stored configuration is invalid",
        ),
        (
            Box::new(|p| p[26..34].copy_from_slice(&1001u64.to_le_bytes())),
            "client cap 1001 exceeds M 1000",
        ),
        (Box::new(|p| p[34] = 2), "unknown predictor code 2"),
        (
            Box::new(|p| {
                p[8] = 2; // fcfs
                p[35..43].copy_from_slice(&1.0f64.to_le_bytes());
            }),
            "needs a counter policy",
        ),
        (
            Box::new(|p| p[43..47].copy_from_slice(&1000u32.to_le_bytes())),
            "band count 1000 exceeds",
        ),
        (
            Box::new(|p| p[47..55].copy_from_slice(&u64::MAX.to_le_bytes())),
            "client count",
        ),
        (
            Box::new(|p| p[86..94].copy_from_slice(&(-1.0f64).to_le_bytes())),
            "client 0: credit -1 invalid",
        ),
        (Box::new(|p| p[94] = 2), "client 0: mean 0 (flag 2) invalid"),
        (
            Box::new(|p| p[95..103].copy_from_slice(&1.0f64.to_le_bytes())),
            "client 0: mean 1 (flag 0) invalid",
        ),
        (
            Box::new(|p| {
                let n = p.len();
                p[n - 8..].copy_from_slice(&5u64.to_le_bytes());
            }),
            "last-left client 5 does not exist",
        ),
    ];
    assert!(Scheduler::restore(&edited(&bytes, |_| ())).is_ok());
    for (edit, want) in cases {
        let m = is_bad(Scheduler::restore(&edited(&bytes, edit)));
        assert!(m.contains(want), "{m:?} does not say {want:?}");
    }
}

#[test]
fn another_version_is_rejected_with_its_number() {
    let mut bytes = sample().snapshot_with(key);
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    let m = is_bad(Scheduler::restore(&bytes));
    assert!(m.contains("version 3 is not supported"), "{m}");
}

#[test]
fn overrides_replace_the_stored_configuration_in_order() {
    let mut s = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    s.add_client();
    let bytes = s.snapshot_with(|_| vec![7]);
    let mut r = Scheduler::restore(&bytes).unwrap();
    r.override_config(Overrides {
        client_cap: Some(ClientCap::Fraction(0.25)),
        predictor: Some(Predictor::Mean),
        locality_quantum: Some(5.0),
        ..Overrides::default()
    })
    .unwrap();
    assert_eq!(r.scheduler.client_cap(), Some(250));
    assert_eq!(r.scheduler.predictor(), Predictor::Mean);
    assert_eq!(r.scheduler.locality_quantum(), 5.0);
    assert_eq!(r.scheduler.wq(), 2.0, "the stored cost is kept");
    let mut r = Scheduler::restore(&bytes).unwrap();
    let e = r
        .override_config(Overrides {
            client_cap: Some(ClientCap::Fraction(2.0)),
            locality_quantum: Some(-1.0),
            ..Overrides::default()
        })
        .unwrap_err();
    assert!(matches!(e, CoreError::InvalidCapFraction(_)), "{e}");
}
