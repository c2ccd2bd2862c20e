//! Secrets: a `_env` field's variable and the value it holds (never printed), and the
//! loads that stand in for variables the environment does not set (`check
//! --without-secrets`, a dry run's sample secrets).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use super::string_value::{FromStrVisitor, string_value};

/// The name of an environment variable holding a secret (a field ending in `_env`),
/// read as the file is parsed so that an unset variable is reported at its line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvSecret {
    pub variable: String,
    pub secret: Secret,
}

impl FromStr for EnvSecret {
    type Err = String;

    fn from_str(variable: &str) -> Result<Self, String> {
        Ok(EnvSecret {
            variable: variable.to_owned(),
            secret: Secret::from_env(variable)?,
        })
    }
}

impl fmt::Display for EnvSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.variable)
    }
}

string_value!(EnvSecret, "the name of an environment variable");

/// A secret read from the environment; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// Stands in for a variable that is not set, while [`without_secrets`] or
    /// [`with_given_secrets`] loads.
    stand_in: bool,
}

thread_local! {
    /// While [`without_secrets`] or [`with_given_secrets`] runs on this thread: the values
    /// given for variables the environment does not set, and the variables used so.
    static STANDING_IN: RefCell<Option<StandIns>> = const { RefCell::new(None) };
}

/// Ends a load's standing in when dropped.
struct StandingEnds;

impl Drop for StandingEnds {
    fn drop(&mut self) {
        STANDING_IN.with(|standing| standing.borrow_mut().take());
    }
}

/// What a load did for the secrets whose variables the environment does not set (or
/// sets empty).
#[derive(Debug, Default)]
pub struct StandIns {
    given: Vec<(String, Secret)>,
    /// Variables stood in for by an empty secret, sorted.
    pub unset: BTreeSet<String>,
    /// Variables whose value came from the ones given, sorted.
    pub from_given: BTreeSet<String>,
}

/// Runs `load` with every secret's variable that is not set (or empty) stood in for by
/// an empty secret that no check of a secret's form refuses; returns what `load` did and
/// the variables stood in for, sorted. For `check` in a pipeline that holds no secrets.
pub fn without_secrets<T>(load: impl FnOnce() -> T) -> (T, Vec<String>) {
    let (loaded, stand_ins) = with_given_secrets(Vec::new(), load);
    (loaded, stand_ins.unset.into_iter().collect())
}

/// As [`without_secrets`], but a variable the environment does not set takes its value
/// from `given` where it is there: a dry run of a shipped sample uses the test secret it
/// was signed with.
pub fn with_given_secrets<T>(
    given: Vec<(String, Secret)>,
    load: impl FnOnce() -> T,
) -> (T, StandIns) {
    let stand_ins = StandIns {
        given,
        ..StandIns::default()
    };
    STANDING_IN.with(|standing| *standing.borrow_mut() = Some(stand_ins));
    // Ended even if `load` panics: a later load on this thread must not stand in for
    // unset secrets.
    let _ended = StandingEnds;
    let loaded = load();
    let stand_ins = STANDING_IN.with(|standing| standing.borrow_mut().take());
    (loaded, stand_ins.unwrap_or_default())
}

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret {
            value,
            stand_in: false,
        }
    }

    /// Reads the secret held by the environment variable `variable`.
    pub(crate) fn from_env(variable: &str) -> Result<Secret, String> {
        let missing = match std::env::var(variable) {
            Ok(value) if !value.is_empty() => return Ok(Secret::new(value)),
            Ok(_) => format!("environment variable {variable} is empty"),
            Err(_) => format!("environment variable {variable} is not set"),
        };
        STANDING_IN.with(|standing| {
            let mut standing = standing.borrow_mut();
            let Some(stand_ins) = standing.as_mut() else {
                return Err(missing);
            };
            let given = stand_ins.given.iter().find(|(name, _)| name == variable);
            if let Some((_, value)) = given.filter(|(_, value)| !value.value.is_empty()) {
                stand_ins.from_given.insert(variable.to_owned());
                return Ok(value.clone());
            }
            stand_ins.unset.insert(variable.to_owned());
            Ok(Secret {
                value: String::new(),
                stand_in: true,
            })
        })
    }

    pub(crate) fn expose(&self) -> &str {
        &self.value
    }

    /// Whether the secret stands in for an unset variable ([`without_secrets`]): its form
    /// cannot be checked.
    pub(crate) fn is_stand_in(&self) -> bool {
        self.stand_in
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}
