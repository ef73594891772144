//! What a validation found wrong: one [`ConfigError`] per bad setting, and
//! [`ConfigErrors`], every one found by one run, so that `check-config` names
//! them all at once instead of one per run. Checks that do not depend on
//! each other all run ([`Found`]); a rule that spans settings runs only once
//! the settings it reads are valid.

/// One invalid setting: the variable's name and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub reason: String,
}

pub(crate) fn bad(setting: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        reason: reason.into(),
    }
}

/// Every invalid setting one validation found, in the order checked (at
/// least one). Shown as one line: the first, and how many more there are
/// (`serve` says one line; `check-config` prints each).
#[derive(Debug)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// The first found.
    pub fn first(&self) -> &ConfigError {
        &self.0[0]
    }

    /// Every one, in the order checked.
    pub fn all(&self) -> &[ConfigError] {
        &self.0
    }

    /// The first, dropping the others.
    pub fn into_first(self) -> ConfigError {
        self.0.into_iter().next().expect("at least one error")
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> ConfigErrors {
        ConfigErrors(vec![e])
    }
}

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.first())?;
        match self.0.len() - 1 {
            0 => Ok(()),
            more => write!(
                f,
                " ({more} more: `fencehook check-config` lists every one)"
            ),
        }
    }
}

impl std::error::Error for ConfigErrors {}

/// The errors of the checks made so far.
#[derive(Debug, Default)]
pub(crate) struct Found(Vec<ConfigError>);

impl Found {
    /// The value of a check that passed; `None`, its error kept, otherwise.
    pub fn ok<T>(&mut self, checked: Result<T, ConfigError>) -> Option<T> {
        checked.map_err(|e| self.0.push(e)).ok()
    }

    /// As [`Found::ok`], for a check that finds several errors.
    pub fn all<T>(&mut self, checked: Result<T, ConfigErrors>) -> Option<T> {
        checked.map_err(|e| self.0.extend(e.0)).ok()
    }

    /// Keeps an error.
    pub fn refuse(&mut self, setting: &'static str, reason: impl Into<String>) {
        self.0.push(bad(setting, reason));
    }

    /// `make(value)` when nothing was found wrong and the value is there;
    /// every error found otherwise.
    pub fn finish<T, U>(
        self,
        value: Option<T>,
        make: impl FnOnce(T) -> U,
    ) -> Result<U, ConfigErrors> {
        match value {
            Some(v) if self.0.is_empty() => Ok(make(v)),
            _ => Err(self.into_errors()),
        }
    }

    /// What was found; a value missing with nothing found is a bug of the
    /// caller, said rather than hidden.
    fn into_errors(self) -> ConfigErrors {
        assert!(!self.0.is_empty(), "a check failed without an error");
        ConfigErrors(self.0)
    }
}
