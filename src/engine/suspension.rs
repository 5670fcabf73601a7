//! A global freeze (`tend suspend`): the agent observes and reports, and
//! changes nothing, until `tend resume` or the expiry.

use std::time::SystemTime;

use crate::model::OnExpiry;

/// The freeze as the state keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspension {
    /// Why (required): an incident, a change freeze.
    pub reason: String,
    /// When it was set.
    pub since: SystemTime,
    /// When it ends (`None`: until `tend resume`).
    pub expires: Option<SystemTime>,
    /// At the expiry: `hold` (stay frozen, report it expired, alert) or
    /// `resume` (act again).
    pub on_expiry: OnExpiry,
    /// Who set it (`uid 0 (pid 4242)`).
    pub by: String,
}

impl Suspension {
    /// Whether the expiry has passed.
    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires.is_some_and(|at| now >= at)
    }

    /// Whether it holds every change now: until the expiry, and after it
    /// unless `on_expiry` is `resume`.
    pub fn in_force(&self, now: SystemTime) -> bool {
        !self.expired(now) || self.on_expiry == OnExpiry::Hold
    }

    /// When it stops holding, if it will by itself.
    pub fn ends_at(&self) -> Option<SystemTime> {
        match self.on_expiry {
            OnExpiry::Resume => self.expires,
            OnExpiry::Hold => None,
        }
    }

    /// The sentence every held decision and report line carries.
    pub fn describe(&self, now: SystemTime) -> String {
        let expiry = match (self.expires, self.expired(now)) {
            (Some(at), true) => format!(
                "; EXPIRED at {} and held on (on expiry: hold)",
                crate::time::rfc3339(at)
            ),
            (Some(at), false) => format!(
                "; it ends at {}{}",
                crate::time::rfc3339(at),
                match self.on_expiry {
                    OnExpiry::Resume => "",
                    OnExpiry::Hold => " (then held on and reported expired: on expiry hold)",
                }
            ),
            (None, _) => String::new(),
        };
        format!(
            "the agent is suspended since {} by {} (`tend suspend`: {}): it observes and reports but changes nothing; `tend resume` ends it{expiry}",
            crate::time::rfc3339(self.since),
            self.by,
            self.reason
        )
    }
}
