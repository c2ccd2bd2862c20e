//! Property tests. The claim state machine: any interleaving of claim, finish, release,
//! hold, resolve, lease expiry, sweep and restart agrees with a reference model of the
//! claim states in `docs/contract.md`, so only the owner finishes or holds, a key is done
//! only after its owner finished it (or an operator resolved its hold), a held key stays
//! held across restarts until resolved or expired, and never two owners hold a key inside
//! a lease; an entity's newest version (`order:`) only grows while its record lives; the
//! sweep never removes more than has expired, and in the end removes every expired record.
//! Versions sort as the numbers and instants they stand for. And the parsers (key
//! templates, key extraction, versions, configuration) never panic on any input.
//!
//! `PROPTEST_CASES=100000 cargo test --release --test it properties::` runs a longer search.

use crate::support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use dedupe_proxy::config::{Config, Overrides};
use dedupe_proxy::key::{Delivery, KeyError, KeyTemplate, MAX_KEY_BYTES};
use dedupe_proxy::store::{
    Ambiguity, Claim, ClaimOutcome, ClaimStore, Completion, KeyState, ManualClock, Resolution,
    StoreError,
};
use dedupe_proxy::testing::{SORT_KEY_DIGITS, parse_version};
use proptest::prelude::*;
use support::open_sled;

// ------------------------------------------------------------------ the state machine

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: usize,
        lease_ms: u64,
    },
    Finish {
        handle: usize,
        retention_ms: u64,
    },
    Release {
        handle: usize,
    },
    Hold {
        handle: usize,
        retention_ms: u64,
    },
    Resolve {
        key: usize,
        done: bool,
        retention_ms: u64,
    },
    Advance {
        ms: u64,
    },
    /// An entity's version recorded as done (`order:`).
    RecordVersion {
        entity: usize,
        version: u64,
        retention_ms: u64,
    },
    ForgetEntity {
        entity: usize,
    },
    Sweep,
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 200..1500u64).prop_map(|(key, lease_ms)| Op::Claim { key, lease_ms }),
        3 => (0..16usize, 500..3000u64).prop_map(|(handle, retention_ms)| Op::Finish { handle, retention_ms }),
        2 => (0..16usize).prop_map(|handle| Op::Release { handle }),
        2 => (0..16usize, 500..3000u64).prop_map(|(handle, retention_ms)| Op::Hold { handle, retention_ms }),
        1 => (0..3usize, any::<bool>(), 500..3000u64)
            .prop_map(|(key, done, retention_ms)| Op::Resolve { key, done, retention_ms }),
        3 => (0..2000u64).prop_map(|ms| Op::Advance { ms }),
        3 => (0..2usize, 0..6u64, 500..3000u64)
            .prop_map(|(entity, version, retention_ms)| Op::RecordVersion { entity, version, retention_ms }),
        1 => (0..2usize).prop_map(|entity| Op::ForgetEntity { entity }),
        1 => Just(Op::Sweep),
        1 => Just(Op::Restart),
    ]
}

/// The reference model of one key, as `docs/contract.md` describes it: a lease while in flight,
/// and a done record that outlives it until its retention ends.
#[derive(Debug, Clone, Default)]
struct Model {
    /// (owner token, lease end)
    lease: Option<(u128, u64)>,
    done_until: Option<u64>,
    held_until: Option<u64>,
}

const KEYS: [&str; 3] = ["a:1", "a:2", "b:1"];
/// Entities' store keys; the first shares its name with a key.
const ENTITIES: [&str; 2] = ["a#entity:1", "b#entity:x"];

/// The reference model of an entity's record: the newest version done, until its retention
/// ends.
#[derive(Debug, Clone, Copy, Default)]
struct EntityModel {
    newest: Option<(u64, u64)>,
}

impl EntityModel {
    fn live(&self, now: u64) -> Option<u64> {
        self.newest
            .filter(|(_, until)| *until > now)
            .map(|(version, _)| version)
    }
}

/// A version whose text is `n`: its order is the numbers' order.
fn version(n: u64) -> dedupe_proxy::store::Version {
    parse_version(&n.to_string()).unwrap()
}

async fn run_ops(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let clock = ManualClock::new(1_000_000);
    let mut store = open_sled(&path, &clock);
    let mut now = 1_000_000u64;
    let mut model: HashMap<&str, Model> = KEYS.iter().map(|key| (*key, Model::default())).collect();
    let mut entities = [EntityModel::default(); 2];
    let mut handles: Vec<Claim> = Vec::new();
    // Leases and done records that reached their end, and what the sweep removed. Ended
    // leases are swept at once; done records once their expiry window has passed.
    let mut ended = 0;
    let mut swept_total = 0;

    for op in ops {
        match op {
            Op::Claim { key, lease_ms } => {
                let key = KEYS[key];
                let outcome = store
                    .claim(key, [0; 32], Duration::from_millis(lease_ms))
                    .await
                    .unwrap();
                let entry = model.get_mut(key).unwrap();
                let live_lease = entry.lease.filter(|(_, until)| *until > now);
                let live_held = entry.held_until.filter(|until| *until > now);
                let live_done = entry.done_until.filter(|until| *until > now);
                match (live_lease, live_held, live_done, outcome) {
                    (Some((_, until)), _, _, ClaimOutcome::InFlight { lease_until }) => {
                        prop_assert_eq!(until, lease_until)
                    }
                    (None, Some(until), _, ClaimOutcome::Held(record)) => {
                        prop_assert_eq!(until, record.expires_at)
                    }
                    (None, None, Some(until), ClaimOutcome::Done(record)) => {
                        prop_assert_eq!(until, record.expires_at)
                    }
                    (None, None, None, ClaimOutcome::Claimed(claim)) => {
                        entry.lease = Some((claim.token, now + lease_ms));
                        entry.held_until = None;
                        handles.push(claim);
                    }
                    (lease, held, done, outcome) => {
                        prop_assert!(
                            false,
                            "{key}: lease {lease:?}, held {held:?}, done {done:?}, store {outcome:?}"
                        )
                    }
                }
            }
            Op::Finish {
                handle,
                retention_ms,
            } if !handles.is_empty() => {
                let claim = handles[handle % handles.len()].clone();
                let entry = model.get_mut(claim.key.as_str()).unwrap();
                let owner = entry.lease.is_some_and(|(token, _)| token == claim.token);
                let completion = Completion {
                    upstream_status: 200,
                    retention: Duration::from_millis(retention_ms),
                    response: None,
                };
                match store.finish(&claim, completion).await {
                    Ok(()) => {
                        prop_assert!(owner, "a non-owner finished {}", claim.key);
                        entry.lease = None;
                        if entry.done_until.is_some_and(|until| until <= now) {
                            ended += 1; // the expired record is replaced
                        }
                        entry.done_until = Some(now + retention_ms);
                    }
                    Err(StoreError::NotOwner) => {
                        prop_assert!(!owner, "the owner was refused on {}", claim.key)
                    }
                    Err(error) => prop_assert!(false, "{error}"),
                }
            }
            Op::Release { handle } if !handles.is_empty() => {
                let claim = handles[handle % handles.len()].clone();
                let entry = model.get_mut(claim.key.as_str()).unwrap();
                let owner = entry.lease.is_some_and(|(token, _)| token == claim.token);
                match store.release(&claim).await {
                    Ok(()) => {
                        prop_assert!(owner, "a non-owner released {}", claim.key);
                        entry.lease = None;
                    }
                    Err(StoreError::NotOwner) => {
                        prop_assert!(!owner, "the owner was refused on {}", claim.key)
                    }
                    Err(error) => prop_assert!(false, "{error}"),
                }
            }
            Op::Hold {
                handle,
                retention_ms,
            } if !handles.is_empty() => {
                let claim = handles[handle % handles.len()].clone();
                let entry = model.get_mut(claim.key.as_str()).unwrap();
                let owner = entry.lease.is_some_and(|(token, _)| token == claim.token);
                let retention = Duration::from_millis(retention_ms);
                match store
                    .hold(&claim, Ambiguity::UpstreamTimeout, retention)
                    .await
                {
                    Ok(()) => {
                        prop_assert!(owner, "a non-owner held {}", claim.key);
                        entry.lease = None;
                        entry.held_until = Some(now + retention_ms);
                    }
                    Err(StoreError::NotOwner) => {
                        prop_assert!(!owner, "the owner was refused on {}", claim.key)
                    }
                    Err(error) => prop_assert!(false, "{error}"),
                }
            }
            Op::Resolve {
                key,
                done,
                retention_ms,
            } => {
                let key = KEYS[key];
                let entry = model.get_mut(key).unwrap();
                let held = entry.lease.is_none_or(|(_, until)| until <= now)
                    && entry.held_until.is_some_and(|until| until > now);
                let resolution = if done {
                    Resolution::Done {
                        retention: Duration::from_millis(retention_ms),
                    }
                } else {
                    Resolution::Release
                };
                let resolved = store.resolve(key, resolution).await.unwrap();
                prop_assert_eq!(resolved, held, "{} resolved", key);
                if resolved {
                    entry.held_until = None;
                    if done {
                        if entry.done_until.is_some_and(|until| until <= now) {
                            ended += 1; // the expired record is replaced
                        }
                        entry.done_until = Some(now + retention_ms);
                    }
                }
            }
            Op::RecordVersion {
                entity,
                version: n,
                retention_ms,
            } => {
                let retention = Duration::from_millis(retention_ms);
                let recorded = store
                    .record_version(ENTITIES[entity], &version(n), retention)
                    .await
                    .unwrap();
                let model = &mut entities[entity];
                let expected = model.live(now).is_none_or(|newest| n > newest);
                prop_assert_eq!(recorded, expected, "{} recorded {}", ENTITIES[entity], n);
                if recorded {
                    if model.newest.is_some_and(|(_, until)| until <= now) {
                        ended += 1; // the expired record is replaced
                    }
                    model.newest = Some((n, now + retention_ms));
                }
            }
            Op::ForgetEntity { entity } => {
                let forgotten = store.forget_entity(ENTITIES[entity]).await.unwrap();
                let model = &mut entities[entity];
                prop_assert_eq!(forgotten, model.live(now).is_some());
                if model.newest.is_some_and(|(_, until)| until <= now) {
                    ended += 1; // removed expired, never to be swept
                }
                model.newest = None;
            }
            Op::Finish { .. } | Op::Release { .. } | Op::Hold { .. } => {}
            Op::Advance { ms } => {
                clock.advance(Duration::from_millis(ms));
                now += ms;
            }
            Op::Sweep => {
                for entry in model.values_mut() {
                    if entry.lease.is_some_and(|(_, until)| until <= now) {
                        entry.lease = None;
                        ended += 1;
                    }
                    if entry.done_until.is_some_and(|until| until <= now) {
                        entry.done_until = None;
                        ended += 1;
                    }
                    if entry.held_until.is_some_and(|until| until <= now) {
                        entry.held_until = None;
                        ended += 1;
                    }
                }
                for entity in &mut entities {
                    if entity.newest.is_some_and(|(_, until)| until <= now) {
                        entity.newest = None;
                        ended += 1;
                    }
                }
                swept_total += store.sweep(10_000).await.unwrap().removed;
                prop_assert!(
                    swept_total <= ended,
                    "swept {} of {} ended",
                    swept_total,
                    ended
                );
            }
            Op::Restart => {
                drop(store);
                store = open_sled(&path, &clock);
                // A new process holds no claims: the old ones are released. Held keys stay.
                for entry in model.values_mut() {
                    entry.lease = None;
                    if entry.held_until.is_some_and(|until| until <= now) {
                        entry.held_until = None;
                    }
                }
            }
        }
        // The store agrees with the model on who holds each key: one owner at most.
        for key in KEYS {
            let leased = model[key].lease.is_some_and(|(_, until)| until > now);
            let held = !leased && model[key].held_until.is_some_and(|until| until > now);
            let done = !leased && !held && model[key].done_until.is_some_and(|until| until > now);
            let state = store.inspect(key).await.unwrap();
            prop_assert_eq!(
                leased,
                matches!(state, Some(KeyState::InFlight { .. })),
                "{} in flight",
                key
            );
            prop_assert_eq!(
                held,
                matches!(state, Some(KeyState::Held(_))),
                "{} held",
                key
            );
            prop_assert_eq!(
                done,
                matches!(state, Some(KeyState::Done(_))),
                "{} done",
                key
            );
        }
        // And on each entity's newest version, which only grows while it lives.
        for (entity, model) in ENTITIES.iter().zip(&entities) {
            let stored = store.newest_version(entity).await.unwrap();
            prop_assert_eq!(
                stored.map(|record| record.newest),
                model.live(now).map(version),
                "{} newest",
                entity
            );
        }
    }
    // Long after every retention (at most 3 s) and its window (at most 1 s more), the
    // sweep has removed every record.
    clock.advance(Duration::from_secs(5));
    store.sweep(10_000).await.unwrap();
    prop_assert_eq!(
        store.sweep(10_000).await.unwrap().removed,
        0,
        "all swept at once"
    );
    prop_assert_eq!(store.done_keys(), Some(0));
    for key in KEYS {
        prop_assert_eq!(store.inspect(key).await.unwrap(), None);
    }
    for entity in ENTITIES {
        prop_assert_eq!(store.newest_version(entity).await.unwrap(), None);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_claim_store_agrees_with_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run_ops(ops))?;
    }
}

// ------------------------------------------------------------------ the parsers

fn template_text() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        "[a-z:_-]{0,4}",
        Just("{json:/id}".to_owned()),
        Just("{json:/a~1b/0}".to_owned()),
        Just("{header:x-id}".to_owned()),
        Just("{query:q}".to_owned()),
        Just("{form:f}".to_owned()),
        Just("{{".to_owned()),
        Just("}}".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        "\\{[a-z]{0,6}:?[^{}]{0,6}\\}",
        any::<String>(),
    ];
    prop::collection::vec(part, 0..6).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn templates_parse_without_panicking_and_print_back(text in template_text()) {
        if let Ok(template) = text.parse::<KeyTemplate>() {
            prop_assert_eq!(template.to_string(), text.clone());
            prop_assert_eq!(template.to_string().parse::<KeyTemplate>(), Ok(template));
        }
    }

    #[test]
    fn extraction_never_panics_and_bounds_the_key(
        text in template_text(),
        header in proptest::collection::vec(any::<u8>(), 0..700),
        query in any::<String>(),
        body in prop_oneof![
            any::<Vec<u8>>(),
            "\\{\"id\":(\"[^\"]{0,600}\"|-?[0-9]{1,30}(\\.[0-9]{1,5})?|null|true|\\[\\]|\\{\\})\\}".prop_map(String::into_bytes),
            "([a-z]{1,3}=[^&]{0,10}&?){0,5}f=[^&]{0,600}".prop_map(String::into_bytes),
        ],
    ) {
        let Ok(template) = text.parse::<KeyTemplate>() else { return Ok(()) };
        let mut headers = http::HeaderMap::new();
        if let Ok(value) = http::HeaderValue::from_bytes(&header) {
            headers.insert("x-id", value);
        }
        let delivery = Delivery { headers: &headers, query: Some(&query), body: &body };
        match template.extract(&delivery) {
            Ok(key) => prop_assert!(key.len() <= MAX_KEY_BYTES),
            Err(KeyError::TooLong(length)) => prop_assert!(length > MAX_KEY_BYTES),
            Err(KeyError::Missing { .. }) => {}
        }
    }

    #[test]
    fn any_text_is_a_configuration_or_a_located_error(text in any::<String>()) {
        config_never_panics(&text)?;
    }

    #[test]
    fn a_mangled_example_is_a_configuration_or_a_located_error(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<char>(), 0..3u8), 1..8)
    ) {
        let mut text: Vec<char> = include_str!("../../config/example.yaml").chars().collect();
        for (at, character, action) in edits {
            let at = at.index(text.len());
            match action {
                0 => text[at] = character,
                1 => { text.remove(at); }
                _ => text.insert(at, character),
            }
        }
        config_never_panics(&text.into_iter().collect::<String>())?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn versions_sort_as_the_numbers_they_stand_for(
        a in any::<u64>(), b in any::<u64>(), fa in 0..1_000_000_000u32, fb in 0..1_000_000_000u32,
    ) {
        let key = |whole: u64, fraction: u32| {
            let text = format!("{whole}.{fraction:09}");
            parse_version(&text).unwrap().sort_key
        };
        prop_assert_eq!((a, fa).cmp(&(b, fb)), key(a, fa).cmp(&key(b, fb)));
        prop_assert_eq!(
            a.cmp(&b),
            parse_version(&a.to_string()).unwrap().sort_key.cmp(&parse_version(&b.to_string()).unwrap().sort_key)
        );
    }

    #[test]
    fn times_sort_as_the_instants_they_stand_for_whatever_their_offset(
        a in 0..253_402_300_799i64, b in 0..253_402_300_799i64,
        offset_a in -86_399..86_399i32, offset_b in -86_399..86_399i32,
    ) {
        let text = |seconds: i64, offset: i32| {
            let offset = time::UtcOffset::from_whole_seconds(offset - offset % 60).unwrap();
            let at = time::OffsetDateTime::from_unix_timestamp(seconds).unwrap().to_offset(offset);
            at.format(&time::format_description::well_known::Rfc3339).ok()
        };
        // A time whose local year falls outside 0000-9999 has no RFC 3339 form.
        let (Some(ta), Some(tb)) = (text(a, offset_a), text(b, offset_b)) else { return Ok(()) };
        let (va, vb) = (parse_version(&ta).unwrap(), parse_version(&tb).unwrap());
        prop_assert_eq!(a.cmp(&b), va.sort_key.cmp(&vb.sort_key), "{} {}", ta, tb);
        prop_assert_eq!(va.sort_key, parse_version(&a.to_string()).unwrap().sort_key);
    }

    #[test]
    fn any_text_is_a_version_of_the_fixed_width_or_none(text in any::<String>()) {
        if let Some(version) = parse_version(&text) {
            prop_assert_eq!(version.sort_key.len(), SORT_KEY_DIGITS);
            prop_assert!(version.sort_key.bytes().all(|byte| byte.is_ascii_digit()));
        }
    }
}

fn config_never_panics(text: &str) -> Result<(), TestCaseError> {
    match Config::parse(text, Path::new("fuzz.yaml"), &Overrides::default()) {
        Ok(config) => prop_assert!(serde_yaml::to_string(&config).is_ok()),
        Err(error) => {
            let message = error.to_string();
            prop_assert!(message.starts_with("fuzz.yaml:"), "{}", message);
        }
    }
    Ok(())
}
