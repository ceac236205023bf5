//! Broker targets: how a [`Message::nats`](crate::Message::nats) or
//! [`Message::rabbitmq`](crate::Message::rabbitmq) target is stored, and the relay's publishers
//! (features `nats` and `rabbitmq`).
//!
//! A broker target is stored in the table's `url` column with `method` and `topic` left
//! `NULL` (an HTTP message always has a method, a dispatched one a topic and no URL, so the
//! three kinds never overlap):
//!
//! - `nats:<subject>`: a JetStream publish to `<subject>`;
//! - `amqp:<exchange>/<routing key>`: a RabbitMQ publish; the exchange has `%` and `/`
//!   percent-encoded (`%25`, `%2F`), so the first `/` ends it; the routing key is kept as is.

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::{message::Target, DispatchError, OutboxError};

#[cfg(feature = "nats")]
pub(crate) mod nats;
#[cfg(feature = "rabbitmq")]
pub(crate) mod rabbitmq;

#[cfg(feature = "nats")]
use nats::NatsPublisher;
#[cfg(feature = "rabbitmq")]
use rabbitmq::RabbitPublisher;

/// The prefix of a stored NATS target.
const NATS: &str = "nats:";
/// The prefix of a stored RabbitMQ target.
const AMQP: &str = "amqp:";

/// A broker target as the relay reads it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BrokerTarget {
    Nats {
        subject: String,
    },
    Rabbitmq {
        exchange: String,
        routing_key: String,
    },
}

/// The `url` column's text for a broker target, checked.
pub(crate) fn stored(target: &Target) -> Result<String, OutboxError> {
    match target {
        Target::Nats { subject } => {
            let valid = !subject.is_empty()
                && !subject.chars().any(char::is_whitespace)
                && !subject.starts_with('.')
                && !subject.ends_with('.');
            if !valid {
                return Err(OutboxError::InvalidBrokerTarget);
            }
            Ok(format!("{NATS}{subject}"))
        }
        Target::Rabbitmq {
            exchange,
            routing_key,
        } => {
            // AMQP's short strings: at most 255 bytes each.
            if exchange.len() > 255 || routing_key.len() > 255 {
                return Err(OutboxError::InvalidBrokerTarget);
            }
            // Two replacements, so no percent-encoding crate: only these two characters are
            // special in the stored form.
            let exchange = exchange.replace('%', "%25").replace('/', "%2F");
            Ok(format!("{AMQP}{exchange}/{routing_key}"))
        }
        Target::Http { .. } | Target::Dispatch { .. } => Err(OutboxError::InvalidBrokerTarget),
    }
}

/// Reads a stored broker target back; `None` for text that is not one.
pub(crate) fn parse(stored: &str) -> Option<BrokerTarget> {
    if let Some(subject) = stored.strip_prefix(NATS) {
        return Some(BrokerTarget::Nats {
            subject: subject.to_owned(),
        });
    }
    let rest = stored.strip_prefix(AMQP)?;
    let (exchange, routing_key) = rest.split_once('/')?;
    Some(BrokerTarget::Rabbitmq {
        exchange: exchange.replace("%2F", "/").replace("%25", "%"),
        routing_key: routing_key.to_owned(),
    })
}

/// One broker message as a publisher sends it.
#[cfg_attr(not(any(feature = "nats", feature = "rabbitmq")), allow(dead_code))]
pub(crate) struct Outgoing {
    pub(crate) key: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Bytes,
}

/// The relay's broker publishers: the ones it was given ([`Relay::nats`](crate::Relay),
/// [`Relay::rabbitmq`](crate::Relay)).
#[derive(Clone, Default)]
pub(crate) struct Brokers {
    #[cfg(feature = "nats")]
    pub(crate) nats: Option<Arc<NatsPublisher>>,
    #[cfg(feature = "rabbitmq")]
    pub(crate) rabbitmq: Option<Arc<RabbitPublisher>>,
}

impl Brokers {
    /// Publishes one message to its stored broker `target`; `horizon` is the relay's retry
    /// horizon ([`Relay::retry_horizon`](crate::Relay::retry_horizon)), which a JetStream
    /// stream's duplicate window should cover.
    pub(crate) async fn publish(
        &self,
        target: &str,
        message: Outgoing,
        horizon: Duration,
    ) -> Result<(), DispatchError> {
        let Some(target) = parse(target) else {
            return Err(DispatchError::permanent("the stored message has no target"));
        };
        let _ = (&message, horizon);
        match target {
            BrokerTarget::Nats { subject } => {
                #[cfg(feature = "nats")]
                if let Some(nats) = &self.nats {
                    return nats.publish(&subject, message, horizon).await;
                }
                let _ = subject;
                Err(DispatchError::permanent(
                    "the relay has no NATS publisher for this message",
                ))
            }
            BrokerTarget::Rabbitmq {
                exchange,
                routing_key,
            } => {
                #[cfg(feature = "rabbitmq")]
                if let Some(rabbitmq) = &self.rabbitmq {
                    return rabbitmq.publish(&exchange, &routing_key, message).await;
                }
                let _ = (exchange, routing_key);
                Err(DispatchError::permanent(
                    "the relay has no RabbitMQ publisher for this message",
                ))
            }
        }
    }

    /// Which publishers are set, for the relay's `Debug`.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        #[allow(unused_mut)]
        let mut names = Vec::new();
        #[cfg(feature = "nats")]
        if self.nats.is_some() {
            names.push("nats");
        }
        #[cfg(feature = "rabbitmq")]
        if self.rabbitmq.is_some() {
            names.push("rabbitmq");
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_stored_and_read_back() {
        let nats = Target::Nats {
            subject: "orders.created".into(),
        };
        assert_eq!(stored(&nats).unwrap(), "nats:orders.created");
        assert_eq!(
            parse("nats:orders.created"),
            Some(BrokerTarget::Nats {
                subject: "orders.created".into()
            })
        );
        let amqp = Target::Rabbitmq {
            exchange: "a/b%c".into(),
            routing_key: "k/1".into(),
        };
        let text = stored(&amqp).unwrap();
        assert_eq!(text, "amqp:a%2Fb%25c/k/1");
        assert_eq!(
            parse(&text),
            Some(BrokerTarget::Rabbitmq {
                exchange: "a/b%c".into(),
                routing_key: "k/1".into()
            })
        );
        let default_exchange = Target::Rabbitmq {
            exchange: String::new(),
            routing_key: "jobs".into(),
        };
        assert_eq!(
            parse(&stored(&default_exchange).unwrap()),
            Some(BrokerTarget::Rabbitmq {
                exchange: String::new(),
                routing_key: "jobs".into()
            })
        );
        assert_eq!(parse("http://x"), None);
        for bad in ["", "a b", ".a", "a."] {
            let target = Target::Nats {
                subject: bad.into(),
            };
            assert!(stored(&target).is_err(), "{bad:?}");
        }
        let long = Target::Rabbitmq {
            exchange: "e".repeat(256),
            routing_key: String::new(),
        };
        assert!(stored(&long).is_err());
    }
}
