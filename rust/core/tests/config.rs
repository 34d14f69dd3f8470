//! `Config`: the whole configuration, validated in one place, in one order.

use vtc_core::{ClientCap, Config, CoreError, Cost, Policy, Predictor, Scheduler};

#[test]
fn the_defaults_are_the_plain_constructors() {
    let s = Scheduler::with_config(&Config::new(1000)).unwrap();
    let t = Scheduler::new(1000, 1.0, 2.0, Policy::Vtc).unwrap();
    assert_eq!(s.config(), t.config());
    assert_eq!(s.cost(), Cost::LINEAR);
    assert_eq!(
        (s.policy(), s.predictor(), s.client_cap()),
        (Policy::Vtc, Predictor::None, None)
    );
    assert_eq!(s.band_weights(), None);
}

#[test]
fn a_config_round_trips_through_a_scheduler() {
    let config = Config {
        budget: 4096,
        cost: Cost::CONTEXT,
        policy: Policy::Lcf,
        client_cap: Some(ClientCap::Fraction(0.25)),
        predictor: Predictor::Mean,
        band_weights: Some(vec![(0, 4.0), (1, 1.0)]),
        locality_quantum: 250.0,
    };
    let s = Scheduler::with_config(&config).unwrap();
    let back = s.config();
    assert_eq!(back.client_cap, Some(ClientCap::Tokens(1024)));
    assert_eq!(Scheduler::with_config(&back).unwrap().config(), back);
    assert_eq!(back.band_weights, config.band_weights);
    assert_eq!(back.locality_quantum, 250.0);
}

#[test]
fn the_cap_rule_lives_in_the_core() {
    let m = 1000;
    assert_eq!(ClientCap::Fraction(0.25).tokens(m), Ok(250));
    assert_eq!(ClientCap::Fraction(1.0).tokens(m), Ok(1000));
    assert_eq!(ClientCap::Fraction(1e-9).tokens(m), Ok(1)); // at least one token
    assert_eq!(ClientCap::Tokens(5000).tokens(m), Ok(1000)); // above M is M
    assert_eq!(
        ClientCap::Tokens(0).tokens(m),
        Err(CoreError::InvalidClientCap(0))
    );
    for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            ClientCap::Fraction(bad).tokens(m),
            Err(CoreError::InvalidCapFraction(_))
        ));
    }
}

#[test]
fn the_first_bad_value_in_a_fixed_order_is_the_error() {
    let bad_cost = Cost::Linear { wp: -1.0, wq: 2.0 };
    let all_bad = Config {
        budget: 0,
        cost: bad_cost,
        client_cap: Some(ClientCap::Fraction(2.0)),
        band_weights: Some(vec![(0, 0.0)]),
        locality_quantum: f64::NAN,
        ..Config::new(1)
    };
    assert_eq!(all_bad.validate(), Err(CoreError::InvalidBudget(0)));
    let c = Config {
        budget: 10,
        ..all_bad
    };
    assert!(matches!(
        c.validate(),
        Err(CoreError::InvalidTokenWeight { name: "wp", .. })
    ));
    let c = Config {
        cost: Cost::LINEAR,
        ..c
    };
    assert_eq!(c.validate(), Err(CoreError::InvalidCapFraction(2.0)));
    let c = Config {
        client_cap: None,
        ..c
    };
    assert!(matches!(
        c.validate(),
        Err(CoreError::InvalidLocalityQuantum(q)) if q.is_nan()
    ));
    let c = Config {
        locality_quantum: 0.0,
        ..c
    };
    assert_eq!(c.validate(), Err(CoreError::InvalidWeight(0.0)));
    assert!(Scheduler::with_config(&c).is_err());
    let c = Config {
        band_weights: None,
        ..c
    };
    assert!(c.validate().is_ok() && Scheduler::with_config(&c).is_ok());
}

#[test]
fn the_locality_quantum_is_finite_non_negative_and_needs_a_counter_policy() {
    for bad in [-1.0, -1e-300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let c = Config {
            locality_quantum: bad,
            ..Config::new(100)
        };
        assert!(matches!(
            c.validate(),
            Err(CoreError::InvalidLocalityQuantum(_))
        ));
        assert!(Scheduler::with_config(&c).is_err());
    }
    let fcfs = Config {
        policy: Policy::Fcfs,
        locality_quantum: 5.0,
        ..Config::new(100)
    };
    assert_eq!(fcfs.validate(), Err(CoreError::LocalityNeedsCounter(5.0)));
    assert_eq!(
        CoreError::LocalityNeedsCounter(5.0).to_string(),
        "locality_quantum=5.0 needs a counter policy (vtc or lcf), not fcfs"
    );
    assert!(Config {
        locality_quantum: 0.0,
        ..fcfs.clone()
    }
    .validate()
    .is_ok());
    for policy in [Policy::Vtc, Policy::Lcf] {
        let s = Scheduler::with_config(&Config {
            policy,
            ..fcfs.clone()
        })
        .unwrap();
        assert_eq!(s.locality_quantum(), 5.0);
    }
    let mut s = Scheduler::new(100, 1.0, 2.0, Policy::Fcfs).unwrap();
    assert_eq!(
        s.set_locality_quantum(1.0),
        Err(CoreError::LocalityNeedsCounter(1.0))
    );
    assert_eq!(s.locality_quantum(), 0.0);
}

#[test]
fn costs_by_name() {
    assert_eq!(Cost::named("linear"), Ok(Cost::LINEAR));
    assert_eq!(Cost::named("quadratic"), Ok(Cost::PAPER_QUADRATIC));
    assert_eq!(Cost::named("context"), Ok(Cost::CONTEXT));
    assert_eq!(
        Cost::named("cubic"),
        Err(CoreError::UnknownCost("cubic".into()))
    );
    assert_eq!(Cost::default(), Cost::LINEAR);
}
