//! The reference receiver without the `inbox` feature: no `POST /inbox/stripe`, the same
//! interface as `inbox.rs` with nothing behind it.

use std::{collections::BTreeMap, time::Duration};

use axum::Router;

use crate::{config::InboxSettings as Settings, BoxError};

#[derive(Clone)]
pub enum Effects {}

impl Effects {
    pub async fn rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
        match *self {}
    }

    pub async fn order(&self) -> Result<BTreeMap<String, Vec<String>>, BoxError> {
        match *self {}
    }

    pub async fn outbox_rows(&self) -> Result<Vec<(String, u64)>, BoxError> {
        match *self {}
    }
}

pub enum Worker {}

pub struct Running {
    pub router: Router,
    pub worker: Worker,
    pub effects: Effects,
}

pub async fn start(
    _url: &str,
    _secrets: Vec<String>,
    settings: &Settings,
) -> Result<Option<Running>, BoxError> {
    let _ = (
        settings.handler_delay,
        settings.max_attempts,
        settings.backoff,
    );
    let _ = (settings.lease, settings.sweep, &settings.outbox_target);
    let _ = (settings.attempt_timeout, settings.ordering);
    Ok(None)
}

pub async fn drain(worker: Worker, _deadline: Duration) -> bool {
    match worker {}
}
