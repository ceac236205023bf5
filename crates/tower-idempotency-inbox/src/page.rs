//! The operator's page.

use axum::Router;

use crate::{Inbox, InboxDatabase};

pub(crate) fn routes<DB: InboxDatabase>(_inbox: Inbox<DB>) -> Router<Inbox<DB>> {
    Router::new()
}
