//! How often the running agent rewrites report files that say what they
//! said: only when their times moved, at most every [`TIMES_ONLY_EVERY`].
//!
//! # Guarantees
//! * A report that says something new (its digest, which leaves out the
//!   times, differs from the one the files were written from) is written
//!   at once, and so is one while the status branch fails or that carries
//!   a branch failure.
//! * One whose times alone moved waits at most [`TIMES_ONLY_EVERY`] from
//!   the last write: the status writer comes back for it then, so the
//!   files show every observation within that long.

use std::time::{Duration, SystemTime};

/// At most this often for a report that only moves times. At 100,000
/// resources a rewrite is 32 MB of JSON and most of a core for a tenth of
/// a second: cycles that follow each other closely (webhooks, due times,
/// requests) need not pay it each time.
pub(crate) const TIMES_ONLY_EVERY: Duration = Duration::from_secs(10);

/// The digest of the report the files were last written from, and when.
#[derive(Debug, Default)]
pub(crate) struct FilesSaid(Option<(String, SystemTime)>);

impl FilesSaid {
    /// How long the files may wait for a report digested as `digest`
    /// (`None`: not digested), at `now`; `None`: write them now.
    /// `may_defer`: false for a report that must be written at once (the
    /// branch fails).
    pub(crate) fn may_wait(
        &self,
        digest: Option<&str>,
        may_defer: bool,
        now: SystemTime,
    ) -> Option<Duration> {
        let (said, at) = self.0.as_ref()?;
        if !may_defer || digest? != said {
            return None;
        }
        // A clock that went back writes them now.
        let since = now.duration_since(*at).ok()?;
        TIMES_ONLY_EVERY
            .checked_sub(since)
            .filter(|wait| !wait.is_zero())
    }

    /// The files were written at `now` from a report digested as `digest`
    /// (`None`: one this does not know, never waited for).
    pub(crate) fn written(&mut self, digest: Option<&str>, now: SystemTime) {
        self.0 = digest.map(|d| (d.to_string(), now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_times_moved_waits_until_its_time_and_anything_new_is_written_at_once() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut said = FilesSaid::default();
        assert_eq!(said.may_wait(Some("a"), true, t0), None, "never written");
        said.written(Some("a"), t0);
        let later = t0 + Duration::from_secs(3);
        assert_eq!(
            said.may_wait(Some("a"), true, later),
            Some(TIMES_ONLY_EVERY - Duration::from_secs(3))
        );
        assert_eq!(
            said.may_wait(Some("b"), true, later),
            None,
            "says something new"
        );
        assert_eq!(said.may_wait(None, true, later), None, "not digested");
        assert_eq!(
            said.may_wait(Some("a"), false, later),
            None,
            "the branch fails"
        );
        assert_eq!(
            said.may_wait(Some("a"), true, t0 + TIMES_ONLY_EVERY),
            None,
            "due"
        );
        assert_eq!(
            said.may_wait(Some("a"), true, t0 - Duration::from_secs(1)),
            None,
            "the clock went back"
        );
        said.written(None, later);
        assert_eq!(
            said.may_wait(Some("a"), true, later),
            None,
            "an unknown report written"
        );
    }
}
