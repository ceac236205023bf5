//! The operator's page: server-rendered HTML (maud escapes every value), one small script and
//! style shipped in this file, nothing fetched from another host. Served by
//! [`admin::router`](crate::admin::router) at `GET /page` (the overview; `GET /` redirects to
//! it) and `GET /detail` (one event); its buttons call the router's JSON routes with the [`ADMIN_HEADER`](crate::admin::ADMIN_HEADER).
//! Built from the job engine's operator kit ([`tower_idempotency_jobs::page`]), as the
//! outbox's page is.

use std::{sync::LazyLock, time::Duration};

use axum::{
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use maud::{html, Markup};
use serde::Deserialize;
use tower_idempotency_jobs::{
    audit::{AuditEntry, DEFAULT_AUDIT_LIMIT},
    chart::{self, Activity},
    page::{
        self, amount, encode, html_response, relative, shell, Action, Detail, JobFields, Listing,
    },
    Pause, Unavailable,
};

use crate::{
    event::now_ms, EventDetail, EventFilter, EventKey, EventPage, EventRecord, EventState, Inbox,
    InboxDatabase, InboxError, ProviderCounts, StateCounts,
};

/// Events per page of the overview.
const PAGE_SIZE: u32 = 50;

/// The request header the state-changing routes accept instead of a JSON body: a browser
/// sends it only from a script of the page's own origin (another site's would need a CORS
/// preflight the router does not answer), never from a cross-site form.
pub const ADMIN_HEADER: &str = "x-inbox-admin";

pub(crate) fn routes<DB: InboxDatabase>() -> Router<Inbox<DB>> {
    page::routes(get(overview::<DB>), get(detail::<DB>))
}

/// The overview's query: the filters (state `failed` when absent, any when empty) and the cursor.
#[derive(Debug, Default, Deserialize)]
struct PageQuery {
    state: Option<String>,
    provider: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    cursor: Option<String>,
}

/// The overview as it is rendered.
#[derive(Debug)]
pub(crate) struct Overview {
    pub(crate) states: StateCounts,
    pub(crate) providers: Vec<ProviderCounts>,
    pub(crate) lag: Option<Duration>,
    /// The last hour, for the charts.
    pub(crate) activity: Activity,
    pub(crate) pauses: Vec<Pause>,
    /// The state filter's value: `failed`, `pending`, `processed`, `skipped` or empty (any).
    pub(crate) state: String,
    pub(crate) provider: String,
    pub(crate) event_type: String,
    pub(crate) page: EventPage,
    /// The newest operator changes.
    pub(crate) audit: Vec<AuditEntry>,
    pub(crate) now_ms: i64,
}

fn bad_request(message: &'static str) -> Response {
    (StatusCode::BAD_REQUEST, message).into_response()
}

async fn overview<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Query(query): Query<PageQuery>,
) -> Result<Response, Unavailable> {
    let state = query.state.unwrap_or_else(|| "failed".to_owned());
    let parsed = match state.as_str() {
        "" => None,
        "pending" => Some(EventState::Pending),
        "processed" => Some(EventState::Processed),
        "failed" => Some(EventState::Failed),
        "skipped" => Some(EventState::Skipped),
        _ => {
            return Ok(bad_request(
                "the state is pending, processed, failed or skipped",
            ))
        }
    };
    let text = |value: Option<String>| value.filter(|value| !value.is_empty());
    let filter = EventFilter {
        state: parsed,
        provider: text(query.provider),
        event_type: text(query.event_type),
        ..EventFilter::default()
    };
    let cursor = query.cursor.as_deref().filter(|cursor| !cursor.is_empty());
    let page = match inbox.events(&filter, cursor, PAGE_SIZE).await {
        Err(InboxError::InvalidCursor) => {
            return Ok(bad_request("the cursor is not one the inbox made"))
        }
        page => page?,
    };
    let view = Overview {
        states: inbox.counts().await?,
        providers: inbox.counts_by_provider().await?,
        lag: inbox.oldest_pending_age().await?,
        activity: inbox.activity().await?,
        pauses: inbox.pauses().await?,
        state,
        provider: filter.provider.unwrap_or_default(),
        event_type: filter.event_type.unwrap_or_default(),
        page,
        audit: inbox.audit_log(DEFAULT_AUDIT_LIMIT).await?,
        now_ms: now_ms(),
    };
    Ok(html_response(render_overview(&view)))
}

#[derive(Debug, Deserialize)]
struct DetailQuery {
    provider: String,
    event_id: String,
}

async fn detail<DB: InboxDatabase>(
    State(inbox): State<Inbox<DB>>,
    Query(query): Query<DetailQuery>,
) -> Result<Response, Unavailable> {
    let key = EventKey::new(query.provider, query.event_id);
    Ok(match inbox.event(&key).await? {
        Some(event) => html_response(render_detail(&event, now_ms())),
        None => (
            StatusCode::NOT_FOUND,
            html_response(layout(
                "Event not found",
                html! {
                    p { "The inbox holds no event " code { (key.provider) " " (key.event_id) } "." }
                    p { a href="page" { "Back to the inbox" } }
                },
            )),
        )
            .into_response(),
    })
}

/// A time as RFC 3339 and relative to now.
fn time(now: i64, rfc3339: &str) -> Markup {
    let relative = crate::parse_rfc3339(rfc3339)
        .map(|time| relative(now, crate::event::unix_ms(time)))
        .unwrap_or_default();
    html! {
        time datetime=(rfc3339) { (rfc3339) }
        " " span.rel { "(" (relative) ")" }
    }
}

/// An event's state as shown: `paused` for a pending event parked by a pause.
fn shown_state(event: &EventRecord) -> &str {
    let due = crate::parse_rfc3339(&event.available_at).map_or(0, crate::event::unix_ms);
    page::shown_state(event.state.as_str(), due)
}

fn detail_link(event: &EventRecord) -> String {
    format!(
        "detail?provider={}&event_id={}",
        encode(&event.provider),
        encode(&event.event_id)
    )
}

fn action_path(event: &EventRecord, action: &str) -> String {
    format!(
        "events/{}/{}/{action}",
        encode(&event.provider),
        encode(&event.event_id)
    )
}

/// The page's own script ([`page::script`]) with the bulk retry's count and confirmation.
static SCRIPT: LazyLock<String> =
    LazyLock::new(|| page::script(ADMIN_HEADER, "inbox", "event", "inbox", BULK_SCRIPT));

/// The bulk retry's and the bulk replay's count and confirmation, inside the page's script:
/// each section (`#bulk-retry`, `#bulk-replay`) counts with a dry run, asks, then posts.
const BULK_SCRIPT: &str = r#"
  document.querySelectorAll('section.bulk').forEach(function (section) {
    var route = section.getAttribute('data-route');
    var noun = section.getAttribute('data-noun');
    var verb = section.getAttribute('data-verb');
    var filter = JSON.parse(section.getAttribute('data-filter'));
    var count = section.querySelector('.bulk-count');
    var confirmBox = section.querySelector('.bulk-confirm');
    var text = section.querySelector('.bulk-text');
    var go = section.querySelector('.bulk-go');
    var cancel = section.querySelector('.bulk-cancel');
    count.addEventListener('click', function () {
      post(route, { filter: filter, dry_run: true }).then(function (r) { return r.json(); })
        .then(function (answer) {
          go.setAttribute('data-matched', answer.matched);
          text.textContent = answer.matched + ' ' + noun + ' match this filter. ' +
            section.getAttribute('data-question');
          confirmBox.hidden = false;
          go.disabled = answer.matched === 0;
          (answer.matched === 0 ? cancel : go).focus();
        }, function () { say('Failed: the inbox did not answer.'); });
    });
    go.addEventListener('click', function () {
      var rate = section.querySelector('.bulk-rate').value;
      var body = { filter: filter, dry_run: false };
      if (rate) { body.per_second = parseInt(rate, 10); }
      post(route, body).then(function (r) { return r.json(); }).then(function (answer) {
        confirmBox.hidden = true;
        say(verb + ' ' + answer[section.getAttribute('data-field')] + ' of ' + answer.matched + ' ' + noun + '.');
      }, function () { say('Failed: the inbox did not answer.'); });
    });
    cancel.addEventListener('click', function () {
      confirmBox.hidden = true;
      count.focus();
    });
  });
"#;

/// A bulk call's section: the rate, the count button, the confirmation.
struct Bulk<'a> {
    /// `retry` or `replay`: the section's id suffix and its route.
    route: &'a str,
    heading: &'a str,
    note: &'a str,
    /// The filter the call sends, as JSON.
    filter: String,
    /// What the count names (`failed events`).
    noun: &'a str,
    /// The question after the count.
    question: &'a str,
    /// The answer's field that counts the events changed, and the status line's verb.
    field: &'a str,
    verb: &'a str,
    count: &'a str,
    go: &'a str,
}

fn bulk(bulk: &Bulk<'_>) -> Markup {
    let id = |what: &str| format!("bulk-{}-{what}", bulk.route);
    html! {
        section.bulk id=(format!("bulk-{}", bulk.route)) data-route=(bulk.route)
            data-noun=(bulk.noun) data-verb=(bulk.verb) data-field=(bulk.field)
            data-question=(bulk.question) data-filter=(bulk.filter) {
            h2 { (bulk.heading) }
            p { (bulk.note) }
            p {
                label for=(id("rate")) { "Release at most this many per second (empty: all at once)" }
                " " input.bulk-rate id=(id("rate")) type="number" min="1" step="1";
            }
            p { button.bulk-count id=(id("count")) type="button" { (bulk.count) } }
            div.bulk-confirm id=(id("confirm")) hidden data-busy role="group" aria-labelledby=(id("text")) {
                p.bulk-text id=(id("text")) {}
                div.actions {
                    button.bulk-go id=(id("go")) type="button" { (bulk.go) }
                    button.bulk-cancel id=(id("cancel")) type="button" { "Cancel" }
                }
            }
        }
    }
}

fn layout(title: &str, content: Markup) -> Markup {
    shell("Webhook inbox", title, &SCRIPT, content)
}

fn counts_table(view: &Overview) -> Markup {
    html! {
        table #counts {
            caption { "Events per state" }
            thead { tr { th scope="col" { "provider" } th scope="col" { "pending" }
                th scope="col" { "processed" } th scope="col" { "failed" }
                th scope="col" { "skipped" } } }
            tbody {
                @for p in &view.providers {
                    tr { th scope="row" { (p.provider) } td.num { (p.pending) }
                        td.num { (p.processed) } td.num { (p.failed) } td.num { (p.skipped) } }
                }
                tr { th scope="row" { "all" } td.num { (view.states.pending) }
                    td.num { (view.states.processed) } td.num { (view.states.failed) }
                    td.num { (view.states.skipped) } }
            }
        }
        p #lag {
            "Oldest pending event: "
            @match view.lag {
                Some(lag) => { strong { (amount(u64::try_from(lag.as_millis()).unwrap_or(u64::MAX))) } " old" }
                None => { "none pending" }
            }
        }
    }
}

/// The overview: counts, lag, the last hour's charts, the filter form, the events and the bulk retry.
pub(crate) fn render_overview(view: &Overview) -> Markup {
    let filter = |state: &str| {
        serde_json::json!({
            "state": state,
            "provider": view.provider,
            "type": view.event_type,
        })
        .to_string()
    };
    // A replay takes the state filtered on when it is processed or skipped, else both.
    let replayed = match view.state.as_str() {
        "processed" | "skipped" => view.state.as_str(),
        _ => "",
    };
    let next = view.page.next_cursor.as_ref().map(|cursor| {
        format!(
            "page?state={}&provider={}&type={}&cursor={}",
            encode(&view.state),
            encode(&view.provider),
            encode(&view.event_type),
            encode(cursor)
        )
    });
    layout(
        "events",
        html! {
            (page::refresh())
            (counts_table(view))
            (chart::charts(&view.activity, "events", "processed"))
            (page::pauses(view.now_ms, &view.pauses, "events", html! {
                div {
                    label for="pause-provider" { "Provider" }
                    input #pause-provider data-scope-part required placeholder="stripe";
                }
                div {
                    label for="pause-type" { "Event type (empty: all)" }
                    input #pause-type data-scope-part placeholder="invoice.paid";
                }
            }))
            h2 { "Filter" }
            form.filters method="get" action="page" {
                (page::state_select(&["failed", "pending", "processed", "skipped"], &view.state))
                div {
                    label for="f-provider" { "Provider" }
                    input #f-provider name="provider" value=(view.provider) placeholder="stripe";
                }
                div {
                    label for="f-type" { "Event type" }
                    input #f-type name="type" value=(view.event_type) placeholder="charge.failed";
                }
                button type="submit" { "Apply" }
            }
            (page::listing(Listing {
                name: "events",
                heading: format!("Events: {}, newest first", page::state_name(&view.state)),
                empty: "No event matches.",
                columns: &["provider", "event id", "type", "state", "attempts", "last error", "received", "finished"],
                rows: (!view.page.events.is_empty()).then(|| html! {
                    @for event in &view.page.events {
                        tr data-event-id=(event.event_id) {
                            td { (event.provider) }
                            td { a href=(detail_link(event)) { (event.event_id) } }
                            td { (event.event_type.as_deref().unwrap_or("")) }
                            td { (shown_state(event)) }
                            td.num { (event.attempts) }
                            td.err { (event.last_error.as_deref().unwrap_or("")) }
                            td { (time(view.now_ms, &event.received_at)) }
                            td { @if let Some(finished) = &event.finished_at { (time(view.now_ms, finished)) } }
                        }
                    }
                }),
                next,
            }))
            (bulk(&Bulk {
                route: "retry",
                heading: "Retry all failed events matching the filter",
                note: "Provider and event type as filtered above; pending and processed events are never retried.",
                filter: filter("failed"),
                noun: "failed events",
                question: "Retry them?",
                field: "retried",
                verb: "Retried",
                count: "Count matching failed events",
                go: "Retry them",
            }))
            (bulk(&Bulk {
                route: "replay",
                heading: "Replay processed events matching the filter",
                note: "Provider, event type and state (processed or skipped; both otherwise) as filtered above. \
                       The handler runs again for every one of them.",
                filter: filter(replayed),
                noun: "processed or skipped events",
                question: "The handler runs again for each of them. Replay them?",
                field: "replayed",
                verb: "Replayed",
                count: "Count events to replay",
                go: "Replay them",
            }))
            (page::audit(view.now_ms, &view.audit))
        },
    )
}

/// One event: its fields, kept headers, pretty body, and the retry and discard actions.
pub(crate) fn render_detail(detail: &EventDetail, now: i64) -> Markup {
    let event = &detail.record;
    let (retry, discard) = (action_path(event, "retry"), action_path(event, "discard"));
    let replay = action_path(event, "replay");
    let kept_body = event.last_error.as_deref() != Some(crate::backend::DISCARDED);
    let actions = match event.state {
        EventState::Failed => Action::failed(
            (&retry, &discard),
            None,
            (
                "Retried: the event is pending and the worker takes it.",
                "Discarded: the event is never run again.",
            ),
        ),
        EventState::Processed | EventState::Skipped if kept_body => vec![Action {
            id: "replay",
            label: "Replay",
            post: &replay,
            key: None,
            done: "Replayed: the event is pending and the worker runs the handler again.",
            missed: "Nothing done: the event is no longer processed or skipped.",
            confirm: Some("The handler runs again for this event. Replay it?"),
        }],
        _ => Vec::new(),
    };
    layout(
        "event",
        page::detail(Detail {
            back: "← All failed events",
            noun: "Event",
            id: ("event-id", &event.event_id),
            rows: html! {
                tr { th scope="row" { "provider" } td { (event.provider) } }
                tr { th scope="row" { "type" } td { (event.event_type.as_deref().unwrap_or("")) } }
            },
            job: JobFields {
                state: shown_state(event),
                attempts: event.attempts,
                attempts_note: "(the inbox keeps the count of attempts and the last one's error)",
                last_error: html! { (event.last_error.as_deref().unwrap_or("")) },
                created: ("received", time(now, &event.received_at)),
                due: time(now, &event.available_at),
                finished: event
                    .finished_at
                    .as_deref()
                    .map(|finished| time(now, finished)),
            },
            actions,
            attempts: &detail.history,
            now_ms: now,
            headers_titles: ("Kept headers", "None kept."),
            headers: &detail.headers,
            body: detail.body_pretty.as_deref().unwrap_or(&detail.body),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVIL: &str = "<script>alert(1)</script>";

    fn record(event_id: &str) -> EventRecord {
        EventRecord {
            provider: "stripe".into(),
            event_id: event_id.into(),
            event_type: Some(EVIL.into()),
            state: EventState::Failed,
            attempts: 3,
            received_at: "2026-01-02T03:04:05.000Z".into(),
            available_at: "2026-01-02T03:04:05.000Z".into(),
            finished_at: Some("2026-01-02T03:05:05.000Z".into()),
            last_error: Some(format!("boom {EVIL}")),
        }
    }

    fn overview(events: Vec<EventRecord>) -> Overview {
        Overview {
            states: StateCounts {
                pending: 1,
                processed: 2,
                failed: 3,
                skipped: 4,
            },
            providers: vec![ProviderCounts {
                provider: "stripe".into(),
                pending: 1,
                processed: 2,
                failed: 3,
                skipped: 4,
            }],
            lag: Some(Duration::from_secs(90)),
            activity: chart::assemble(0, Vec::new(), Vec::new(), None),
            pauses: vec![],
            state: "failed".into(),
            provider: "\"><script>".into(),
            event_type: String::new(),
            page: EventPage {
                events,
                next_cursor: Some("ab&cd".into()),
            },
            audit: vec![AuditEntry::now(
                EVIL,
                tower_idempotency_jobs::audit::AuditAction::BulkReplay,
                EVIL,
                2,
            )],
            now_ms: 1_767_323_105_000,
        }
    }

    /// The page's own script is the only `<script>` element.
    fn scripts(html: &str) -> usize {
        html.matches("<script>").count()
    }

    #[test]
    fn an_event_id_type_and_error_render_as_text() {
        let html = render_overview(&overview(vec![record(EVIL)])).into_string();
        assert_eq!(scripts(&html), 1, "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("boom &lt;script&gt;"));
        // The link percent-encodes the id; the filter value stays inside its attribute.
        assert!(html.contains("detail?provider=stripe&amp;event_id=%3Cscript%3Ealert%281%29"));
        assert!(
            html.contains(r#"value="&quot;&gt;&lt;script&gt;""#),
            "{html}"
        );
        assert!(html.contains("cursor=ab%26cd"));
        assert!(
            html.contains("<strong>1 min</strong> old"),
            "the lag: {html}"
        );
        assert!(html.contains("(1 min ago)"), "relative time: {html}");
    }

    #[test]
    fn a_header_and_body_render_as_text() {
        let detail = EventDetail {
            record: record("evt_1"),
            headers: vec![("x-note".into(), EVIL.into()), (EVIL.into(), "v".into())],
            body: format!(r#"{{"note":"{EVIL}"}}"#),
            body_pretty: Some(format!("{{\n  \"note\": \"{EVIL}\"\n}}")),
            history: vec![tower_idempotency_jobs::Attempt::ended(
                1,
                0,
                tower_idempotency_jobs::AttemptOutcome::Failed,
            )
            .error(Some(format!("boom {EVIL}")))],
        };
        let html = render_detail(&detail, 0).into_string();
        assert_eq!(scripts(&html), 1, "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("\n  &quot;note&quot;") || html.contains("\n  \"note\""));
        assert!(
            html.contains(r#"data-post="events/stripe/evt_1/retry""#),
            "{html}"
        );
    }

    #[test]
    fn pauses_render_as_text_and_a_parked_event_reads_paused() {
        let mut parked = record("evt_parked");
        parked.state = EventState::Pending;
        parked.available_at =
            tower_idempotency_jobs::time::rfc3339_ms(tower_idempotency_jobs::PARKED_AT);
        let mut view = overview(vec![parked, record("evt_failed")]);
        view.pauses = vec![Pause::from((
            format!("stripe/{EVIL}"),
            0,
            "admin-api".into(),
        ))];
        let html = render_overview(&view).into_string();
        assert_eq!(scripts(&html), 1, "{html}");
        assert!(
            html.contains(r#"data-resume="stripe/&lt;script&gt;alert(1)&lt;/script&gt;""#),
            "{html}"
        );
        assert!(html.contains("<td>paused</td>"), "{html}");
        assert!(html.contains("<td>failed</td>"), "{html}");
        assert!(!html.contains("no-pauses"), "{html}");
        let empty = render_overview(&overview(vec![])).into_string();
        assert!(empty.contains("Nothing is paused."), "{empty}");
    }

    #[test]
    fn relative_times_read_naturally() {
        assert_eq!(relative(10_000, 5_000), "5 s ago");
        assert_eq!(relative(0, 180_000), "in 3 min");
        assert_eq!(relative(7_200_000, 0), "2 h ago");
    }
}
