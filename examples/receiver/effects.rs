//! `GET /effects`: how many times each handler ran per key, named `<route>:<event key>`.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use axum::{extract::State, http::StatusCode, Json};

use crate::app::App;

/// Executions per `<route>:<event key>`, in this process.
#[derive(Clone, Default)]
pub struct Effects(Arc<Mutex<HashMap<String, u64>>>);

impl Effects {
    pub fn record(&self, route: &str, key: &str) {
        *self
            .0
            .lock()
            .unwrap()
            .entry(format!("{route}:{key}"))
            .or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap().clone().into_iter().collect()
    }
}

/// The in-process counts, with the `payments` and `inbox_effects` rows read from the database.
pub async fn effects(State(app): State<App>) -> Result<Json<BTreeMap<String, u64>>, StatusCode> {
    let mut effects = app.effects.snapshot();
    if let Some(payments) = &app.payments {
        let rows = payments.rows().await.map_err(|error| {
            tracing::error!(%error, "reading the payments table failed");
            StatusCode::SERVICE_UNAVAILABLE
        })?;
        for (key, count) in rows {
            effects.insert(format!("payments:{key}"), count);
        }
    }
    if let Some(inbox) = &app.inbox_effects {
        let rows = inbox.rows().await.map_err(|error| {
            tracing::error!(%error, "reading the inbox_effects table failed");
            StatusCode::SERVICE_UNAVAILABLE
        })?;
        for (event_id, count) in rows {
            effects.insert(format!("inbox:{event_id}"), count);
        }
    }
    Ok(Json(effects))
}
