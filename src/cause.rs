//! The cause of a failure, kept by an error that must stay `Clone` and
//! `PartialEq`.
//!
//! The source's errors are compared (a failure like the last one is
//! reported once, not at every retry) and cloned (each outcome is
//! published to every watcher of the branch); `std::io::Error`,
//! `git2::Error` and `notify::Error` are neither. A [`Cause`] shares the
//! underlying error behind an `Arc`, so `Error::source` still reaches it,
//! and keeps the text an operator reads, by which two causes compare.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// An underlying error and the text shown for it.
#[derive(Clone)]
pub struct Cause {
    /// What the enclosing error's message shows.
    text: String,
    error: Arc<dyn Error + Send + Sync>,
}

impl Cause {
    /// `error`, shown as it displays itself.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Self {
        Cause {
            text: error.to_string(),
            error: Arc::new(error),
        }
    }

    /// A libgit2 failure, shown by its message alone (its class and code
    /// stay in `Debug`). Copied: `git2::Error` is not `Clone`, and the
    /// caller often still reads it.
    pub fn git(error: &git2::Error) -> Self {
        Cause::explained(
            error.message().to_string(),
            git2::Error::new(error.code(), error.class(), error.message()),
        )
    }

    /// `error`, shown as `text`: a sentence of tend's that names it and
    /// says what to do.
    pub fn explained(text: String, error: impl Error + Send + Sync + 'static) -> Self {
        Cause {
            text,
            error: Arc::new(error),
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cause")
            .field("text", &self.text)
            .field("error", &self.error)
            .finish()
    }
}

/// Two causes are the same failure when they read the same.
impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Error for Cause {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_underlying_error_stays_reachable_and_the_text_is_what_compares() {
        let io = || std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let cause = Cause::new(io());
        assert_eq!(cause.to_string(), "denied");
        let source = cause.source().expect("the io error");
        assert_eq!(
            source.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        assert_eq!(cause.clone(), Cause::new(io()));
        let explained = Cause::explained("cannot watch: denied".into(), io());
        assert_eq!(explained.to_string(), "cannot watch: denied");
        assert_ne!(explained, cause);
    }

    #[test]
    fn a_git_failure_shows_its_message_without_class_and_code() {
        let e = git2::Error::new(
            git2::ErrorCode::NotFound,
            git2::ErrorClass::Reference,
            "no such ref",
        );
        assert!(e.to_string().contains("class="), "{e}");
        let cause = Cause::git(&e);
        assert_eq!(cause.to_string(), "no such ref");
        assert!(format!("{cause:?}").contains("code: -3"), "{cause:?}");
        assert!(cause.source().is_some_and(|s| s.is::<git2::Error>()));
    }
}
