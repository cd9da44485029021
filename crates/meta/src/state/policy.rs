//! A VDI's write policy (`sync` or `zone-sync`) and its zone-sync lag bounds, as
//! operators change them after creation. The record is all that changes here: every
//! node's watcher hands the new record to its open volume (`Volume::set_info`), so
//! the writer's gateway learns it without a reattach.
use drove_types::{validate_client_names, validate_max_lag, WritePolicy};

use std::sync::Arc;

use super::{invalid, no_vdi, ApplyResult, MetaState, Reply};

impl MetaState {
    /// Replace VDI `name`'s NBD access list (snapshots too: they are exports).
    pub(super) fn set_vdi_access(&mut self, name: &str, clients: &[String]) -> ApplyResult {
        validate_client_names(clients).map_err(|e| invalid(e.message().to_string()))?;
        if !self.vdis.contains_key(name) {
            return Err(no_vdi(name));
        }
        let Some(vdi) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
            return Err(no_vdi(name));
        };
        vdi.nbd_clients = clients.to_vec();
        Ok(Reply::Vdi(vdi.clone()))
    }

    /// [`super::Command::SetVdiQos`].
    pub(super) fn set_vdi_qos(&mut self, name: &str, change: &drove_types::Qos) -> ApplyResult {
        change
            .validate(true)
            .map_err(|e| invalid(e.message().to_string()))?;
        let Some(vdi) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
            return Err(no_vdi(name));
        };
        vdi.qos = vdi.qos.merged(change);
        Ok(Reply::Vdi(vdi.clone()))
    }

    pub(super) fn set_vdi_policy(
        &mut self,
        name: &str,
        policy: Option<WritePolicy>,
        (max_lag_ms, reset_ms): (Option<u32>, bool),
        (max_lag_bytes, reset_bytes): (Option<u64>, bool),
    ) -> ApplyResult {
        // Check everything before changing anything: a refused command leaves the
        // record as it was.
        let Some(vdi) = Arc::make_mut(&mut self.vdis).get_mut(name) else {
            return Err(no_vdi(name));
        };
        if vdi.snapshot {
            return Err(invalid(format!(
                "'{name}' is a snapshot (read-only): change the VDI it was taken of, or a clone of it",
                name = drove_types::shown(name)
            )));
        }
        if policy.is_none()
            && max_lag_ms.is_none()
            && max_lag_bytes.is_none()
            && !reset_ms
            && !reset_bytes
        {
            return Err(invalid(format!(
                "Nothing to change for VDI '{name}': give a policy, a lag bound in ms or one in bytes",
                name = drove_types::shown(name)
            )));
        }
        if (reset_ms && max_lag_ms.is_some()) || (reset_bytes && max_lag_bytes.is_some()) {
            return Err(invalid(format!(
                "VDI '{name}': a lag bound is given and reset to its default at once",
                name = drove_types::shown(name)
            )));
        }
        validate_max_lag(max_lag_ms, max_lag_bytes)
            .map_err(|e| invalid(e.message().to_string()))?;
        if let Some(p) = policy {
            vdi.policy = p;
        }
        if max_lag_ms.is_some() || reset_ms {
            vdi.max_lag_ms = max_lag_ms;
        }
        if max_lag_bytes.is_some() || reset_bytes {
            vdi.max_lag_bytes = max_lag_bytes;
        }
        Ok(Reply::Vdi(vdi.clone()))
    }
}
