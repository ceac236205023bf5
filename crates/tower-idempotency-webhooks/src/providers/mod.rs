//! One module per provider, each behind its cargo feature.

// The v0 helpers of GitHub and Slack are shared by Slack and Zoom.
#[cfg(feature = "discord")]
pub mod discord;
#[cfg(any(feature = "github", feature = "slack", feature = "zoom"))]
#[cfg_attr(not(feature = "github"), allow(dead_code))]
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
#[cfg(any(feature = "slack", feature = "zoom"))]
#[cfg_attr(not(feature = "slack"), allow(dead_code))]
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
