//! `GET /effects`: how many times each handler ran per key, named `<route>:<event key>`.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use axum::{extract::State, http::StatusCode, Json};

use crate::{app::App, BoxError};

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

/// The in-process counts, with the `payments` and `inbox_effects` rows and the delivered outbox
/// messages read from the database.
pub async fn effects(State(app): State<App>) -> Result<Json<BTreeMap<String, u64>>, StatusCode> {
    let mut effects = app.effects.snapshot();
    if let Some(payments) = &app.payments {
        let rows = payments.rows().await;
        add_rows(&mut effects, "payments", rows)?;
    }
    if let Some(inbox) = &app.inbox_effects {
        let rows = inbox.rows().await;
        add_rows(&mut effects, "inbox", rows)?;
        let rows = inbox.outbox_rows().await;
        add_rows(&mut effects, "outbox", rows)?;
    }
    Ok(Json(effects))
}

/// Adds a table's counts as `<route>:<name>`; a table that cannot be read makes the answer `503`.
fn add_rows(
    effects: &mut BTreeMap<String, u64>,
    route: &str,
    rows: Result<Vec<(String, u64)>, BoxError>,
) -> Result<(), StatusCode> {
    let rows = rows.map_err(|error| {
        tracing::error!(%error, route, "reading the effects table failed");
        StatusCode::SERVICE_UNAVAILABLE
    })?;
    for (name, count) in rows {
        effects.insert(format!("{route}:{name}"), count);
    }
    Ok(())
}
