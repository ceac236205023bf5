//! The operator's page for outbox messages: server-rendered HTML (maud escapes every value)
//! built from the job engine's operator kit (layout, style, times, redaction), one small script
//! shipped in this file, nothing fetched from another host. Served by
//! [`admin::router`](crate::admin::router) at `GET /page` (`GET /` redirects to it) and
//! `GET /detail?key=..`; its buttons post JSON with the [`ADMIN_HEADER`](crate::admin::ADMIN_HEADER).

use std::sync::LazyLock;

use axum::{
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use maud::{html, Markup};
use tower_idempotency_jobs::{
    audit::{AuditEntry, DEFAULT_AUDIT_LIMIT},
    chart::{self, Activity},
    page::{self, encode, html_response, shell, time_ms, Action, Detail, JobFields},
    redact::redact_url,
    time::now_ms,
    Pause,
};

use crate::{
    http::{state_filter, KeyQuery, Listing, Unavailable},
    MessageDetail, MessagePage, MessageState, MessageSummary, Outbox, OutboxDatabase, OutboxError,
    StateCounts,
};

/// Messages per page of the overview.
const PAGE_SIZE: u32 = 50;

const SITE: &str = "Outbox";

/// The request header the outbox's page sends with its actions, next to their JSON body (the
/// inbox's `x-inbox-admin` rule, under the outbox's name). Every state-changing route takes a
/// JSON body, which is what makes it unreachable from another site's form.
pub const ADMIN_HEADER: &str = "x-outbox-admin";

pub(crate) fn routes<DB: OutboxDatabase>() -> Router<Outbox<DB>> {
    page::routes(get(overview::<DB>), get(detail::<DB>))
}

/// The overview as it is rendered.
#[derive(Debug)]
pub(crate) struct Overview {
    pub(crate) counts: StateCounts,
    /// The last hour, for the charts.
    pub(crate) activity: Activity,
    pub(crate) pauses: Vec<Pause>,
    /// The state filter's value: `failed`, `pending`, `delivered`, `discarded` or empty (any).
    pub(crate) state: String,
    pub(crate) page: MessagePage,
    /// The newest operator changes.
    pub(crate) audit: Vec<AuditEntry>,
    pub(crate) now_ms: i64,
}

async fn overview<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Query(query): Query<Listing>,
) -> Result<Response, Unavailable> {
    let state = query.state.unwrap_or_else(|| "failed".to_owned());
    let Ok(filter) = state_filter(&state) else {
        return Ok((
            StatusCode::BAD_REQUEST,
            "the state is pending, delivered, failed or discarded",
        )
            .into_response());
    };
    let cursor = query.cursor.as_deref().filter(|cursor| !cursor.is_empty());
    let page = match outbox.messages(filter, cursor, PAGE_SIZE).await {
        Err(OutboxError::InvalidCursor) => {
            return Ok((
                StatusCode::BAD_REQUEST,
                "the cursor is not one the outbox made",
            )
                .into_response())
        }
        page => page?,
    };
    let view = Overview {
        counts: outbox.counts().await?,
        activity: outbox.activity().await?,
        pauses: outbox.pauses().await?,
        state,
        page,
        audit: outbox.audit_log(DEFAULT_AUDIT_LIMIT).await?,
        now_ms: now_ms(),
    };
    Ok(html_response(render_overview(&view)))
}

async fn detail<DB: OutboxDatabase>(
    State(outbox): State<Outbox<DB>>,
    Query(query): Query<KeyQuery>,
) -> Result<Response, Unavailable> {
    Ok(match outbox.message(&query.key).await? {
        Some(message) => html_response(render_detail(&message, now_ms())),
        None => (
            StatusCode::NOT_FOUND,
            html_response(shell(
                SITE,
                "Message not found",
                &SCRIPT,
                html! {
                    p { "The outbox holds no message " code { (query.key) } "." }
                    p { a href="page" { "Back to the outbox" } }
                },
            )),
        )
            .into_response(),
    })
}

/// The page's own script ([`page::script`]).
static SCRIPT: LazyLock<String> =
    LazyLock::new(|| page::script(ADMIN_HEADER, "outbox", "message", "outbox", ""));

fn detail_link(message: &MessageSummary) -> String {
    format!("detail?key={}", encode(&message.key))
}

/// Where a message goes: `POST https://..` (without user-info, query values masked) or
/// `topic ..`.
fn target(message: &MessageSummary) -> Markup {
    html! {
        @if let Some(url) = &message.url {
            (message.method.as_deref().unwrap_or("")) " " (redact_url(url))
        } @else if let Some(topic) = &message.topic {
            "topic " (topic)
        }
    }
}

/// The last attempt's answer and error: `HTTP 400: ..`.
fn last_error(message: &MessageSummary) -> Markup {
    html! {
        @if let Some(status) = message.last_status { "HTTP " (status) }
        @if message.last_status.is_some() && message.last_error.is_some() { ": " }
        (message.last_error.as_deref().unwrap_or(""))
    }
}

fn counts_table(counts: &StateCounts) -> Markup {
    html! {
        table #counts {
            caption { "Messages per state" }
            thead { tr { th scope="col" { "pending" } th scope="col" { "delivered" }
                th scope="col" { "failed" } th scope="col" { "discarded" } } }
            tbody { tr { td.num { (counts.pending) } td.num { (counts.delivered) }
                td.num { (counts.failed) } td.num { (counts.discarded) } } }
        }
    }
}

/// The overview: counts, the last hour's charts, the state filter, the messages newest first and the next page's link.
pub(crate) fn render_overview(view: &Overview) -> Markup {
    let next = view.page.next_cursor.as_ref().map(|cursor| {
        format!(
            "page?state={}&cursor={}",
            encode(&view.state),
            encode(cursor)
        )
    });
    shell(
        SITE,
        "messages",
        &SCRIPT,
        html! {
            (page::refresh())
            (counts_table(&view.counts))
            (chart::charts(&view.activity, "messages", "delivered"))
            (page::pauses(view.now_ms, &view.pauses, "messages", html! {
                div {
                    label for="pause-host" { "Target host (or broker:nats, broker:rabbitmq, topic:name)" }
                    input #pause-host data-scope-part required placeholder="api.example.com";
                }
            }))
            h2 { "Filter" }
            form.filters method="get" action="page" {
                (page::state_select(&["failed", "pending", "delivered", "discarded"], &view.state))
                button type="submit" { "Apply" }
            }
            (page::listing(page::Listing {
                name: "messages",
                heading: format!("Messages: {}, newest first", page::state_name(&view.state)),
                empty: "No message matches.",
                columns: &["key", "scope", "target", "state", "attempts", "last error", "enqueued", "finished"],
                rows: (!view.page.messages.is_empty()).then(|| html! {
                    @for message in &view.page.messages {
                        tr data-key=(message.key) {
                            td { a href=(detail_link(message)) { (message.key) } }
                            td { (message.scope.as_deref().unwrap_or("")) }
                            td { (target(message)) }
                            td { (page::shown_state(message.state.as_str(), message.available_at_ms)) }
                            td.num { (message.attempts) }
                            td.err { (last_error(message)) }
                            td { (time_ms(view.now_ms, message.created_at_ms)) }
                            td { @if let Some(finished) = message.finished_at_ms { (time_ms(view.now_ms, finished)) } }
                        }
                    }
                }),
                next,
            }))
            (page::audit(view.now_ms, &view.audit))
        },
    )
}

/// One message: its fields (the URL without user-info, query values masked), headers and body
/// (credentials redacted), and the retry and discard actions.
pub(crate) fn render_detail(detail: &MessageDetail, now: i64) -> Markup {
    let message = &detail.summary;
    let actions = if message.state == MessageState::Failed {
        Action::failed(
            ("retry", "discard"),
            Some(&message.key),
            (
                "Retried: the message is pending and the relay delivers it.",
                "Discarded: the message is never attempted again.",
            ),
        )
    } else {
        Vec::new()
    };
    shell(
        SITE,
        "message",
        &SCRIPT,
        page::detail(Detail {
            back: "← All failed messages",
            noun: "Message",
            id: ("message-key", &message.key),
            rows: html! {
                tr { th scope="row" { "scope" } td { (message.scope.as_deref().unwrap_or("")) } }
                @if let Some(url) = &message.url {
                    tr { th scope="row" { "method" } td #method { (message.method.as_deref().unwrap_or("")) } }
                    tr { th scope="row" { "URL" } td #url { (redact_url(url)) } }
                }
                @if let Some(topic) = &message.topic {
                    tr { th scope="row" { "topic" } td #topic { (topic) } }
                }
            },
            job: JobFields {
                state: page::shown_state(message.state.as_str(), message.available_at_ms),
                attempts: message.attempts,
                attempts_note: "(the outbox keeps the count of attempts and the last one's answer)",
                last_error: last_error(message),
                created: ("enqueued", time_ms(now, message.created_at_ms)),
                due: time_ms(now, message.available_at_ms),
                finished: message
                    .finished_at_ms
                    .map(|finished| time_ms(now, finished)),
            },
            actions,
            attempts: &detail.history,
            now_ms: now,
            headers_titles: ("Headers", "None."),
            headers: &detail.headers,
            body: detail.body_pretty.as_deref().unwrap_or(&detail.body),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVIL: &str = "<script>alert(1)</script>";

    fn summary(key: &str) -> MessageSummary {
        MessageSummary {
            key: key.into(),
            scope: Some(EVIL.into()),
            method: Some("POST".into()),
            url: Some(format!("http://127.0.0.1:9/{EVIL}")),
            topic: None,
            state: MessageState::Failed,
            attempts: 3,
            created_at_ms: 1_767_323_045_000,
            available_at_ms: 1_767_323_045_000,
            finished_at_ms: Some(1_767_323_105_000),
            last_status: Some(400),
            last_error: Some(format!("refused {EVIL}")),
        }
    }

    /// The page's own script is the only `<script>` element.
    fn scripts(html: &str) -> usize {
        html.matches("<script>").count()
    }

    #[test]
    fn a_key_scope_target_and_error_render_as_text() {
        let view = Overview {
            activity: chart::assemble(0, Vec::new(), Vec::new(), None),
            pauses: vec![],
            counts: StateCounts {
                pending: 1,
                delivered: 2,
                failed: 3,
                discarded: 4,
            },
            state: "failed".into(),
            page: MessagePage {
                messages: vec![summary(EVIL)],
                next_cursor: Some("17.a&b".into()),
            },
            audit: vec![AuditEntry::now(
                EVIL,
                tower_idempotency_jobs::audit::AuditAction::Retry,
                EVIL,
                1,
            )],
            now_ms: 1_767_323_105_000,
        };
        let html = render_overview(&view).into_string();
        assert_eq!(scripts(&html), 1, "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("HTTP 400: refused &lt;script&gt;"), "{html}");
        assert!(
            html.contains("detail?key=%3Cscript%3Ealert%281%29"),
            "{html}"
        );
        assert!(html.contains("cursor=17.a%26b"), "{html}");
        assert!(html.contains("2026-01-02T03:04:05.000Z"), "{html}");
        assert!(html.contains("(1 min ago)"), "relative time: {html}");
        assert!(html.contains("<td class=\"num\">3</td>"), "{html}");
    }

    #[test]
    fn a_header_and_body_render_as_text() {
        let detail = MessageDetail {
            summary: summary("msg-1"),
            headers: vec![("x-note".into(), EVIL.into()), (EVIL.into(), "v".into())],
            body: format!(r#"{{"note":"{EVIL}"}}"#),
            body_pretty: Some(format!("{{\n  \"note\": \"{EVIL}\"\n}}")),
            history: vec![tower_idempotency_jobs::Attempt::ended(
                1,
                0,
                tower_idempotency_jobs::AttemptOutcome::Retried,
            )
            .status(Some(503))
            .error(Some(format!("refused {EVIL}")))
            .response(Some(EVIL.to_owned()))],
        };
        let html = render_detail(&detail, 0).into_string();
        assert_eq!(scripts(&html), 1, "{html}");
        assert!(!html.contains(EVIL), "{html}");
        assert!(html.contains("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>"));
        assert!(
            html.contains("\n  &quot;note&quot;: &quot;&lt;script&gt;"),
            "{html}"
        );
        assert!(
            html.contains(r#"data-post="retry" data-key="msg-1""#),
            "{html}"
        );
        assert!(html.contains("<td id=\"method\">POST</td>"), "{html}");
    }

    #[test]
    fn a_credentialed_target_url_is_shown_redacted() {
        let mut message = summary("msg-3");
        message.url = Some("https://ops:hunter2@api.example.com/hook?token=tk_live_9&v=2".into());
        let shown = "https://api.example.com/hook?token=***&amp;v=***";
        let view = Overview {
            counts: StateCounts::default(),
            activity: chart::assemble(0, Vec::new(), Vec::new(), None),
            pauses: vec![],
            state: String::new(),
            page: MessagePage {
                messages: vec![message.clone()],
                next_cursor: None,
            },
            audit: Vec::new(),
            now_ms: 0,
        };
        let detail = MessageDetail {
            summary: message,
            headers: Vec::new(),
            body: String::new(),
            body_pretty: None,
            history: Vec::new(),
        };
        for html in [
            render_overview(&view).into_string(),
            render_detail(&detail, 0).into_string(),
        ] {
            assert!(
                !html.contains("hunter2") && !html.contains("tk_live_9"),
                "{html}"
            );
            assert!(html.contains(shown), "{html}");
        }
    }

    #[test]
    fn a_delivered_message_has_no_actions() {
        let mut detail = MessageDetail {
            summary: summary("msg-2"),
            headers: Vec::new(),
            body: String::new(),
            body_pretty: None,
            history: Vec::new(),
        };
        detail.summary.state = MessageState::Delivered;
        let html = render_detail(&detail, 0).into_string();
        assert!(!html.contains("id=\"retry\""), "{html}");
    }
}
