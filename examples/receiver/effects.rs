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
/// messages read from the database,
/// and, per Stripe object the inbox handled, its event ids in handling order
/// (`"order:<object id>": [..]`).
pub async fn effects(
    State(app): State<App>,
) -> Result<Json<BTreeMap<String, serde_json::Value>>, StatusCode> {
    let mut effects = app.effects.snapshot();
    if let Some(payments) = &app.payments {
        let rows = payments.rows().await;
        add_rows(&mut effects, "payments", rows)?;
    }
    let order = match &app.inbox_effects {
        Some(inbox) => {
            let rows = inbox.rows().await;
            add_rows(&mut effects, "inbox", rows)?;
            let rows = inbox.outbox_rows().await;
            add_rows(&mut effects, "outbox", rows)?;
            inbox.order().await.map_err(|error| {
                tracing::error!(%error, "reading the inbox's handling order failed");
                StatusCode::SERVICE_UNAVAILABLE
            })?
        }
        None => BTreeMap::new(),
    };
    let mut answer: BTreeMap<String, serde_json::Value> = effects
        .into_iter()
        .map(|(name, count)| (name, count.into()))
        .collect();
    for (object, events) in order {
        answer.insert(format!("order:{object}"), events.into());
    }
    Ok(Json(answer))
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
