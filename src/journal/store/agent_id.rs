//! The agent id kept in the state: every database tend manages carries it
//! in its ownership marker, so a configuration naming another is refused.

use std::time::SystemTime;

use super::{StateStore, ms};
use crate::journal::StateError;
use crate::model::hash::sha256_hex;

impl StateStore {
    /// The agent id: the kept one, else the configured one (then kept),
    /// else a new one generated once and kept. A configured id that
    /// differs from the kept one is refused ([`StateError::AgentIdChanged`]):
    /// the resources at the provider carry the kept one.
    pub fn agent_id(&self, configured: Option<&str>) -> Result<String, StateError> {
        if let Some(kept) = self.kept_agent_id(configured)? {
            return Ok(kept);
        }
        let id = match configured {
            Some(configured) => configured.to_string(),
            None => {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_i64(ms(SystemTime::now()));
                h.write_u32(std::process::id());
                format!("tend-{}", &sha256_hex(&h.finish().to_le_bytes())[..12])
            }
        };
        self.set_meta("agent_id", &id)?;
        Ok(id)
    }

    /// The agent id a reader reports: the kept one; the configured one
    /// when none is kept yet; refused like [`StateStore::agent_id`] when
    /// they differ. Writes nothing.
    pub fn agent_id_for_reading(
        &self,
        configured: Option<&str>,
    ) -> Result<Option<String>, StateError> {
        Ok(self
            .kept_agent_id(configured)?
            .or_else(|| configured.map(str::to_string)))
    }

    /// The kept agent id, if any; refused when `configured` is another.
    fn kept_agent_id(&self, configured: Option<&str>) -> Result<Option<String>, StateError> {
        let kept = self.meta("agent_id")?;
        match (kept, configured) {
            (Some(kept), Some(configured)) if kept != configured => {
                Err(StateError::AgentIdChanged {
                    location: self.location.clone(),
                    configured: configured.to_string(),
                    kept,
                })
            }
            (kept, _) => Ok(kept),
        }
    }
}
