//! `POST /webhooks/<provider>`: one route per provider whose variable is set.

use std::sync::Arc;

use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    routing::post,
    Json, Router,
};
use serde_json::json;
use tower_idempotency::{
    webhooks::{self, discord, slack, zoom},
    IdempotencyLayer, Store, VerifiedWebhook, WebhookLayerExt,
};

use crate::{
    app::App,
    config::{secrets, var, StartError},
};

type Build = fn(Vec<String>, Arc<dyn Store>) -> Result<IdempotencyLayer, webhooks::ConfigError>;

/// A provider whose route is mounted when its variable is set.
struct Provider {
    var: &'static str,
    route: &'static str,
    build: Build,
}

/// Every provider configured by one variable. Square and Twilio also need the URL they call
/// (they sign it), so [`webhook_layers`] handles them.
fn providers() -> [Provider; 12] {
    let p = |var, route, build| Provider { var, route, build };
    [
        p("STRIPE_WEBHOOK_SECRET", "stripe", |s, st| {
            Ok(IdempotencyLayer::stripe(s, st))
        }),
        p("GITHUB_WEBHOOK_SECRET", "github", |s, st| {
            Ok(IdempotencyLayer::github(s, st))
        }),
        p("SLACK_SIGNING_SECRET", "slack", |s, st| {
            Ok(IdempotencyLayer::slack(s, st))
        }),
        p(
            "STANDARD_WEBHOOKS_SECRET",
            "standard",
            IdempotencyLayer::standard_webhooks,
        ),
        p("SHOPIFY_WEBHOOK_SECRET", "shopify", |s, st| {
            Ok(IdempotencyLayer::shopify(s, st))
        }),
        p("PADDLE_WEBHOOK_SECRET", "paddle", |s, st| {
            Ok(IdempotencyLayer::paddle(s, st))
        }),
        p("LINEAR_WEBHOOK_SECRET", "linear", |s, st| {
            Ok(IdempotencyLayer::linear(s, st))
        }),
        p("GITLAB_WEBHOOK_TOKEN", "gitlab", |s, st| {
            Ok(IdempotencyLayer::gitlab(s, st))
        }),
        p("ZOOM_WEBHOOK_SECRET", "zoom", |s, st| {
            Ok(IdempotencyLayer::zoom(s, st))
        }),
        p("DISCORD_PUBLIC_KEY", "discord", IdempotencyLayer::discord),
        p(
            "SENDGRID_VERIFICATION_KEY",
            "sendgrid",
            IdempotencyLayer::sendgrid,
        ),
        p("MAILGUN_SIGNING_KEY", "mailgun", |s, st| {
            Ok(IdempotencyLayer::mailgun(s, st))
        }),
    ]
}

/// The webhook layers to mount, keyed by route name.
pub fn webhook_layers(
    store: &Arc<dyn Store>,
) -> Result<Vec<(&'static str, IdempotencyLayer)>, StartError> {
    let mut layers = Vec::new();
    for provider in providers() {
        if let Some(secrets) = secrets(provider.var) {
            // Refused here as a start error rather than by the constructor's panic.
            for secret in &secrets {
                webhooks::Secret::try_new(secret).map_err(|source| StartError::Provider {
                    name: provider.var,
                    source,
                })?;
            }
            let layer = (provider.build)(secrets, store.clone()).map_err(|source| {
                StartError::Provider {
                    name: provider.var,
                    source,
                }
            })?;
            layers.push((provider.route, layer));
        }
    }
    if let Some(keys) = secrets("SQUARE_SIGNATURE_KEY") {
        let name = "SQUARE_SIGNATURE_KEY";
        let url = var("SQUARE_NOTIFICATION_URL").ok_or(StartError::Incomplete {
            name,
            needs: "SQUARE_NOTIFICATION_URL",
        })?;
        let layer = IdempotencyLayer::square(url, keys, store.clone())
            .map_err(|source| StartError::Provider { name, source })?;
        layers.push(("square", layer));
    }
    if let Some(tokens) = secrets("TWILIO_AUTH_TOKEN") {
        let name = "TWILIO_AUTH_TOKEN";
        let url = var("RECEIVER_PUBLIC_URL").ok_or(StartError::Incomplete {
            name,
            needs: "RECEIVER_PUBLIC_URL",
        })?;
        let layer = IdempotencyLayer::twilio(&url, tokens, store.clone())
            .map_err(|source| StartError::Provider { name, source })?;
        layers.push(("twilio", layer));
    }
    Ok(layers)
}

/// Endpoint-validation requests (Slack, Zoom, Discord) are answered, not executed.
fn challenge_answer(webhook: &VerifiedWebhook) -> Option<Response> {
    slack::url_verification_response(webhook)
        .or_else(|| zoom::url_validation_response(webhook))
        .or_else(|| discord::ping_response(webhook))
}

async fn handle_webhook(app: App, route: &'static str, webhook: VerifiedWebhook) -> Response {
    if let Some(answer) = challenge_answer(&webhook) {
        return answer;
    }
    app.execute(route, webhook.event_id()).await;
    if route == "twilio" {
        // Twilio parses the answer as TwiML: an empty document means "nothing to do".
        return ([(header::CONTENT_TYPE, "text/xml")], "<Response/>").into_response();
    }
    Json(json!({ "received": webhook.event_id(), "route": route })).into_response()
}

pub fn webhook_routes(route: &'static str, layer: IdempotencyLayer) -> Router<App> {
    let handler =
        move |State(app): State<App>, webhook: VerifiedWebhook| handle_webhook(app, route, webhook);
    Router::new()
        .route(&format!("/webhooks/{route}"), post(handler))
        .route_layer(layer)
}
