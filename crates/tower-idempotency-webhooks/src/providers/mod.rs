//! One module per provider, each behind its cargo feature and re-exported at the crate root.
//! A provider file holds its verifier and, behind `test-support`, its fixture
//! ([`crate::testing`]), listed in [`fixtures`]. What several verifiers hold alike has a module
//! of its own, built with the providers that use it.

#[cfg(any(feature = "discord", feature = "sendgrid"))]
pub(crate) mod public_keys;
#[cfg(any(
    feature = "linear",
    feature = "mailgun",
    feature = "paddle",
    feature = "slack",
    feature = "stripe",
    feature = "zoom"
))]
pub(crate) mod timed_secrets;

/// The rendered answer to `provider`'s endpoint-validation request, if `webhook` is one (and
/// from `provider`): what the providers' `*_response` functions return.
#[cfg(any(feature = "discord", feature = "slack", feature = "zoom"))]
fn challenge_response(
    webhook: &crate::VerifiedWebhook,
    provider: &str,
) -> Option<axum_core::response::Response> {
    (webhook.provider() == provider)
        .then(|| webhook.challenge())
        .flatten()
        .map(crate::ChallengeResponse::to_response)
}

#[cfg(feature = "discord")]
pub mod discord;
#[cfg(feature = "github")]
pub mod github;
#[cfg(feature = "gitlab")]
pub mod gitlab;
#[cfg(feature = "linear")]
pub mod linear;
#[cfg(feature = "mailgun")]
pub mod mailgun;
#[cfg(feature = "paddle")]
pub mod paddle;
#[cfg(feature = "sendgrid")]
pub mod sendgrid;
#[cfg(feature = "shopify")]
pub mod shopify;
#[cfg(feature = "slack")]
pub mod slack;
#[cfg(feature = "square")]
pub mod square;
#[cfg(feature = "standard-webhooks")]
pub mod standard;
#[cfg(feature = "stripe")]
pub mod stripe;
#[cfg(feature = "twilio")]
pub mod twilio;
#[cfg(feature = "zoom")]
pub mod zoom;

/// The fixture of every provider this build includes (see [`crate::testing`]).
#[cfg(feature = "test-support")]
pub(crate) fn fixtures() -> Vec<Box<dyn crate::testing::Fixture>> {
    vec![
        #[cfg(feature = "stripe")]
        Box::new(stripe::fixture()),
        #[cfg(feature = "github")]
        Box::new(github::fixture()),
        #[cfg(feature = "slack")]
        Box::new(slack::fixture()),
        #[cfg(feature = "standard-webhooks")]
        Box::new(standard::fixture::StandardFixture),
        #[cfg(feature = "shopify")]
        Box::new(shopify::fixture()),
        #[cfg(feature = "paddle")]
        Box::new(paddle::fixture()),
        #[cfg(feature = "linear")]
        Box::new(linear::fixture()),
        #[cfg(feature = "gitlab")]
        Box::new(gitlab::fixture()),
        #[cfg(feature = "zoom")]
        Box::new(zoom::fixture()),
        #[cfg(feature = "discord")]
        Box::new(discord::fixture()),
        #[cfg(feature = "sendgrid")]
        Box::new(sendgrid::fixture()),
        #[cfg(feature = "mailgun")]
        Box::new(mailgun::fixture()),
        #[cfg(feature = "square")]
        Box::new(square::fixture()),
        #[cfg(feature = "twilio")]
        Box::new(twilio::fixture()),
    ]
}
