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

type Layer<T> = fn(Vec<String>, Arc<dyn Store>) -> T;

/// How a provider's layer is made from its secrets and the store.
enum Build {
    /// From shared secrets, which [`webhook_layers`] checks first.
    Secrets(Layer<IdempotencyLayer>),
    /// From keys the constructor reads (public keys, `whsec_` secrets), which it can refuse.
    Parsed(Layer<Result<IdempotencyLayer, webhooks::ConfigError>>),
}

/// A provider whose route is mounted when its variable is set.
struct Provider {
    var: &'static str,
    route: &'static str,
    build: Build,
}

/// Every provider configured by one variable. Square and Twilio also need the URL they call
/// (they sign it), so [`webhook_layers`] handles them.
fn providers() -> [Provider; 12] {
    use Build::{Parsed, Secrets};
    let p = |var, route, build| Provider { var, route, build };
    [
        p(
            "STRIPE_WEBHOOK_SECRET",
            "stripe",
            Secrets(IdempotencyLayer::stripe),
        ),
        p(
            "GITHUB_WEBHOOK_SECRET",
            "github",
            Secrets(IdempotencyLayer::github),
        ),
        p(
            "SLACK_SIGNING_SECRET",
            "slack",
            Secrets(IdempotencyLayer::slack),
        ),
        p(
            "STANDARD_WEBHOOKS_SECRET",
            "standard",
            Parsed(IdempotencyLayer::standard_webhooks),
        ),
        p(
            "SHOPIFY_WEBHOOK_SECRET",
            "shopify",
            Secrets(IdempotencyLayer::shopify),
        ),
        p(
            "PADDLE_WEBHOOK_SECRET",
            "paddle",
            Secrets(IdempotencyLayer::paddle),
        ),
        p(
            "LINEAR_WEBHOOK_SECRET",
            "linear",
            Secrets(IdempotencyLayer::linear),
        ),
        p(
            "GITLAB_WEBHOOK_TOKEN",
            "gitlab",
            Secrets(IdempotencyLayer::gitlab),
        ),
        p(
            "ZOOM_WEBHOOK_SECRET",
            "zoom",
            Secrets(IdempotencyLayer::zoom),
        ),
        p(
            "DISCORD_PUBLIC_KEY",
            "discord",
            Parsed(IdempotencyLayer::discord),
        ),
        p(
            "SENDGRID_VERIFICATION_KEY",
            "sendgrid",
            Parsed(IdempotencyLayer::sendgrid),
        ),
        p(
            "MAILGUN_SIGNING_KEY",
            "mailgun",
            Secrets(IdempotencyLayer::mailgun),
        ),
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
            let layer = match provider.build {
                Build::Secrets(build) => Ok(build(secrets, store.clone())),
                Build::Parsed(build) => build(secrets, store.clone()),
            }
            .map_err(|source| StartError::Provider {
                name: provider.var,
                source,
            })?;
            layers.push((provider.route, layer));
        }
    }
    let name = "SQUARE_SIGNATURE_KEY";
    if let Some((keys, url)) = signed_url(name, "SQUARE_NOTIFICATION_URL")? {
        let layer = IdempotencyLayer::square(url, keys, store.clone())
            .map_err(|source| StartError::Provider { name, source })?;
        layers.push(("square", layer));
    }
    let name = "TWILIO_AUTH_TOKEN";
    if let Some((tokens, url)) = signed_url(name, "RECEIVER_PUBLIC_URL")? {
        let layer = IdempotencyLayer::twilio(&url, tokens, store.clone())
            .map_err(|source| StartError::Provider { name, source })?;
        layers.push(("twilio", layer));
    }
    Ok(layers)
}

/// The secrets in `name` and the URL in `url_var` of a provider that signs the URL it calls:
/// neither when `name` is unset, an error when only the URL is missing.
fn signed_url(
    name: &'static str,
    url_var: &'static str,
) -> Result<Option<(Vec<String>, String)>, StartError> {
    let Some(secrets) = secrets(name) else {
        return Ok(None);
    };
    let url = var(url_var).ok_or(StartError::Incomplete {
        name,
        needs: url_var,
    })?;
    Ok(Some((secrets, url)))
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
