//! The operator's pages' shared parts: the shell (style, header, status line), the security
//! headers of a page response, times, link encoding, and a stored request's headers and body.
//! Server-rendered HTML (maud escapes every value); nothing is fetched from another host.

use axum::{
    http::{header, HeaderMap},
    response::{Html, IntoResponse, Response},
};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// What a path segment or query value keeps unencoded: RFC 3986's unreserved characters.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `text` percent-encoded as a path segment or query value.
pub fn encode(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

/// A page as a response: not cached, not framed, and under a content security policy that
/// allows the page's own inline script and style and requests to its own origin only.
pub fn html_response(markup: Markup) -> Response {
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_FRAME_OPTIONS, "DENY"),
            // The page's own inline script and style, requests to its own origin only.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self'; form-action 'self'; \
                 frame-ancestors 'none'; base-uri 'none'",
            ),
        ],
        Html(markup.into_string()),
    )
        .into_response()
}

/// A duration in its largest whole unit: `5 s`, `3 min`, `2 h`, `4 d`.
pub fn amount(millis: u64) -> String {
    let seconds = millis / 1000;
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86_400 => format!("{} h", seconds / 3600),
        _ => format!("{} d", seconds / 86_400),
    }
}

/// `ms` relative to `now` (unix milliseconds): `5 s ago`, `3 min ago`, `in 2 h`.
pub fn relative(now: i64, ms: i64) -> String {
    let delta = now.saturating_sub(ms);
    let amount = amount(delta.unsigned_abs());
    if delta >= 0 {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

/// A time in unix milliseconds as RFC 3339 and relative to `now`.
pub fn time_ms(now: i64, ms: i64) -> Markup {
    let rfc3339 = crate::time::rfc3339_ms(ms);
    html! {
        time datetime=(rfc3339) { (rfc3339) }
        " " span.rel { "(" (relative(now, ms)) ")" }
    }
}

const STYLE: &str = "
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1b1b1b;background:#fafafa}
header,main{padding:0 1.5rem}header{background:#20304a;color:#fff;padding:.8rem 1.5rem}
header a{color:#fff}h1{font-size:1.3rem;margin:0}h2{font-size:1.1rem;margin:1.4rem 0 .5rem}
table{border-collapse:collapse;background:#fff;margin:.3rem 0}
th,td{border:1px solid #ccd;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#eef1f6}td{overflow-wrap:anywhere}td.num{text-align:right}td.err{max-width:28rem;color:#8a1111}
.rel{color:#555;font-size:.9em}time{white-space:nowrap}form.filters,#pause-form{display:flex;gap:1rem;flex-wrap:wrap;align-items:end}
form.filters div,#pause-form div{display:flex;flex-direction:column}label{font-weight:600;font-size:.9em}
button,input,select{font:inherit;padding:.25rem .5rem}button{cursor:pointer}
#status{min-height:1.5em;font-weight:600;color:#0b5a1a}pre{background:#fff;border:1px solid #ccd;
padding:.8rem;overflow:auto;max-height:32rem}.actions{display:flex;gap:.6rem;margin:.6rem 0}
:focus-visible{outline:3px solid #f0a500;outline-offset:2px}
.charts{display:flex;flex-wrap:wrap;gap:1rem}figure.chart{margin:0;flex:1 1 24rem;max-width:38rem;background:#fff;
border:1px solid #ccd;padding:.4rem}figure.chart svg{display:block;width:100%;height:auto}figcaption{font-size:.9em}
.series{margin-right:.8rem;white-space:nowrap}.swatch{display:inline-block;width:.9em;height:.9em;margin-right:.3em}
";

/// A page of `site` (`Webhook inbox`, `Outbox`): the shared style, a header linking to the overview
/// (`page`), a status line (`#status`) for the script's answers, `content`, and `script`.
pub fn shell(site: &str, title: &str, script: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · " (site) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header { h1 { a href="page" { (site) } " · " (title) } }
                main {
                    p #status role="status" aria-live="polite" {}
                    (content)
                }
                script { (PreEscaped(script)) }
            }
        }
    }
}

/// A detail page's headers (`#headers`, under the heading `titles.0`, or `titles.1` when there
/// are none) and body (`#body`, as text).
pub fn headers_and_body(titles: (&str, &str), headers: &[(String, String)], body: &str) -> Markup {
    html! {
        h2 { (titles.0) }
        @if headers.is_empty() {
            p { (titles.1) }
        } @else {
            table #headers {
                thead { tr { th scope="col" { "name" } th scope="col" { "value" } } }
                tbody {
                    @for (name, value) in headers {
                        tr { td { (name) } td { (value) } }
                    }
                }
            }
        }
        h2 { "Body" }
        pre #body { (body) }
    }
}

/// Whether a state-changing admin request cannot have come from another site's form: it
/// carries the `admin_header` (which a cross-site page could only send after a CORS preflight
/// the admin routers never answer) or a `Content-Type: application/json` body (likewise).
pub fn same_site(headers: &HeaderMap, admin_header: &str) -> bool {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    json || headers.contains_key(admin_header)
}

/// One job's page ([`detail`]): what is the half's own, around the engine's fields.
pub struct Detail<'a> {
    /// The link back to the overview's text (`← All failed events`).
    pub back: &'a str,
    /// The heading's noun (`Event`, `Message`).
    pub noun: &'a str,
    /// The heading's `code` element: its id and the job's key as shown.
    pub id: (&'a str, &'a str),
    /// The half's own rows of the fields table, before the engine's.
    pub rows: Markup,
    /// The engine's rows.
    pub job: JobFields<'a>,
    /// The buttons of the job's state (Retry and Discard while it is failed; none, or the
    /// half's own, otherwise).
    pub actions: Vec<Action<'a>>,
    /// Its recorded attempts, oldest first ([`attempts`]).
    pub attempts: &'a [crate::Attempt],
    /// Now, unix ms, for the attempts' relative times.
    pub now_ms: i64,
    /// The headers' heading, and what stands there when there are none.
    pub headers_titles: (&'a str, &'a str),
    /// The stored headers (credentials already masked).
    pub headers: &'a [(String, String)],
    /// The stored body as shown (credentials already masked).
    pub body: &'a str,
}

/// The engine's fields of one job, as [`detail`] shows them.
pub struct JobFields<'a> {
    /// The half's name of the job's state.
    pub state: &'a str,
    /// The attempts counted.
    pub attempts: u32,
    /// What follows the count (`(the inbox keeps the count of attempts ...)`).
    pub attempts_note: &'a str,
    /// The last attempt's error as shown.
    pub last_error: Markup,
    /// The enqueue time's label (`received`, `enqueued`) and the time.
    pub created: (&'a str, Markup),
    /// When the job is due.
    pub due: Markup,
    /// When the job finished, if it has.
    pub finished: Option<Markup>,
}

/// A button of a job's page (`#{id}`, reading `label`): the page's script `POST`s to `post`
/// (relative to the page), with `key` as a `{"key": ..}` body when set, and shows `done` when
/// it succeeds, `missed` when the route answers `404`. With `confirm`, the page first shows
/// that question (`#confirm-text`) with a button that goes ahead (`#confirm-go`) and one that
/// cancels (`#confirm-cancel`).
pub struct Action<'a> {
    /// The button's id (`retry`, `discard`, `replay`).
    pub id: &'a str,
    /// The button's text.
    pub label: &'a str,
    /// The path the button posts to.
    pub post: &'a str,
    /// The key the body names, for a route that takes it there.
    pub key: Option<&'a str>,
    /// The status line's text once it succeeded.
    pub done: &'a str,
    /// The status line's text when the job is no longer in a state the action applies to.
    pub missed: &'a str,
    /// The question to confirm before the action is sent.
    pub confirm: Option<&'a str>,
}

impl<'a> Action<'a> {
    /// The Retry (`#retry`) and Discard (`#discard`) buttons of a failed job, posting to
    /// `retry` and `discard` (paths relative to the page) with `key` as the body's when set,
    /// showing `done`'s texts once they succeeded.
    pub fn failed(
        (retry, discard): (&'a str, &'a str),
        key: Option<&'a str>,
        done: (&'a str, &'a str),
    ) -> Vec<Self> {
        let missed = "Nothing done: it is no longer failed.";
        vec![
            Self {
                id: "retry",
                label: "Retry",
                post: retry,
                key,
                done: done.0,
                missed,
                confirm: None,
            },
            Self {
                id: "discard",
                label: "Discard",
                post: discard,
                key,
                done: done.1,
                missed,
                confirm: None,
            },
        ]
    }
}

/// The buttons of `actions` and, when one asks for a confirmation, the box that asks
/// (`#confirm`, hidden until then).
pub fn actions(actions: &[Action<'_>]) -> Markup {
    html! {
        @if !actions.is_empty() {
            div.actions {
                @for action in actions {
                    button id=(action.id) type="button" data-post=(action.post) data-key=[action.key]
                        data-done=(action.done) data-missed=(action.missed)
                        data-confirm=[action.confirm] { (action.label) }
                }
            }
        }
        @if actions.iter().any(|action| action.confirm.is_some()) {
            div #confirm hidden data-busy role="group" aria-labelledby="confirm-text" {
                p #confirm-text {}
                div.actions {
                    button #confirm-go type="button" { "Go ahead" }
                    button #confirm-cancel type="button" { "Cancel" }
                }
            }
        }
    }
}

/// One job's page content (for [`shell`]): the link back, the heading, the fields (the half's
/// rows, then state, attempts, last error, enqueue, due and finish times), the Retry
/// (`#retry`) and Discard (`#discard`) buttons, its [`attempts`], and [`headers_and_body`].
pub fn detail(detail: Detail<'_>) -> Markup {
    let job = &detail.job;
    html! {
        p { a href="page" { (detail.back) } }
        h2 { (detail.noun) " " code id=(detail.id.0) { (detail.id.1) } }
        table #fields {
            tbody {
                (detail.rows)
                tr { th scope="row" { "state" } td #state { (job.state) } }
                tr { th scope="row" { "attempts" } td { (job.attempts) " " (job.attempts_note) } }
                tr { th scope="row" { "last error" } td.err #last-error { (job.last_error) } }
                tr { th scope="row" { (job.created.0) } td { (job.created.1) } }
                tr { th scope="row" { "due" } td { (job.due) } }
                tr { th scope="row" { "finished" } td { @if let Some(finished) = &job.finished { (finished) } } }
            }
        }
        (actions(&detail.actions))
        (attempts(detail.now_ms, detail.attempts))
        (headers_and_body(detail.headers_titles, detail.headers, detail.body))
    }
}

/// A job's recorded attempts (`#attempts`, under the heading `Attempts`), oldest first: number,
/// start, duration, outcome and error, and the status and the start of the answer when any
/// attempt met one. A gap in the numbers is the attempts the history no longer keeps.
pub fn attempts(now: i64, attempts: &[crate::Attempt]) -> Markup {
    let answered = attempts
        .iter()
        .any(|attempt| attempt.status.is_some() || attempt.response.is_some());
    html! {
        h2 #attempts-heading { "Attempts" }
        @if attempts.is_empty() {
            p #no-attempts { "None recorded." }
        } @else {
            table #attempts aria-labelledby="attempts-heading" {
                thead { tr {
                    th scope="col" { "#" } th scope="col" { "started" } th scope="col" { "took" }
                    th scope="col" { "outcome" } th scope="col" { "error" }
                    @if answered { th scope="col" { "status" } th scope="col" { "answer" } }
                } }
                tbody {
                    @for attempt in attempts {
                        tr data-attempt=(attempt.attempt) data-outcome=(attempt.outcome.as_str()) {
                            // A replay is no attempt that ran: it has no number.
                            td.num { @if attempt.outcome != crate::AttemptOutcome::Replayed { (attempt.attempt) } }
                            td { (time_ms(now, attempt.started_at_ms)) }
                            td.num { (attempt.duration_ms) " ms" }
                            td.outcome { (attempt.outcome.as_str()) }
                            td.err { (attempt.error.as_deref().unwrap_or("")) }
                            @if answered {
                                td.num { @if let Some(status) = attempt.status { (status) } }
                                td { @if let Some(answer) = &attempt.response { code.answer { (answer) } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The newest operator changes (`#audit`, under the heading `Operator changes`), newest
/// first: when, who, what, on which jobs, how many rows.
pub fn audit(now: i64, entries: &[crate::audit::AuditEntry]) -> Markup {
    html! {
        h2 #audit-heading { "Operator changes" }
        @if entries.is_empty() {
            p #no-audit { "None recorded." }
        } @else {
            table #audit aria-labelledby="audit-heading" {
                thead { tr {
                    th scope="col" { "when" } th scope="col" { "who" } th scope="col" { "action" }
                    th scope="col" { "target" } th scope="col" { "changed" }
                } }
                tbody {
                    @for entry in entries {
                        tr data-action=(entry.action_name()) {
                            td { (time_ms(now, entry.at_ms)) }
                            td.who { (entry.who) }
                            td.action { (entry.action_name()) }
                            td.err { (entry.target) }
                            td.num { (entry.changed) }
                        }
                    }
                }
            }
        }
    }
}

/// The overview's refresh controls: a checkbox (`#refresh`, on) that the page's script reads
/// before reloading, and a link that reloads now.
pub fn refresh() -> Markup {
    html! {
        p {
            input #refresh type="checkbox" checked;
            " " label for="refresh" { "Refresh every 10 s" }
            " · " a href="" { "Refresh now" }
        }
    }
}

/// The filter form's state field (`#f-state`, named `state`): each of `states`, then `any`
/// (the empty value), `selected` chosen.
pub fn state_select(states: &[&str], selected: &str) -> Markup {
    html! {
        div {
            label for="f-state" { "State" }
            select #f-state name="state" {
                @for state in states {
                    option value=(state) selected[selected == *state] { (state) }
                }
                option value="" selected[selected.is_empty()] { "any" }
            }
        }
    }
}

/// The pauses of an overview (`#pauses-heading` `Paused`): a table (`#pauses`) of each paused
/// scope with when and by whom, and its Resume button (`data-resume`), or `#no-pauses`; then
/// the form that pauses (`#pause-form`): the half's `inputs` (each with a `data-scope-part`:
/// the non-empty ones, in order and joined by `/`, name the scope) and its Pause button. The
/// page's [`script`] posts both to the routes of [`admin`](crate::admin) and reloads the page.
pub fn pauses(now: i64, pauses: &[crate::Pause], what: &str, inputs: Markup) -> Markup {
    html! {
        h2 #pauses-heading { "Paused" }
        @if pauses.is_empty() {
            p #no-pauses { "Nothing is paused." }
        } @else {
            table #pauses aria-labelledby="pauses-heading" {
                thead { tr { th scope="col" { "scope" } th scope="col" { "paused" }
                    th scope="col" { "by" } th scope="col" { "" } } }
                tbody {
                    @for pause in pauses {
                        tr data-scope=(pause.scope) {
                            td { code { (pause.scope) } }
                            td { (time_ms(now, pause.paused_at_ms)) }
                            td { (pause.by) }
                            td { button type="button" data-resume=(pause.scope) aria-label=(format!("Resume {}", pause.scope)) { "Resume" } }
                        }
                    }
                }
            }
        }
        p { "Paused " (what) " stay pending and spend no attempt until resumed; an attempt already running finishes." }
        form #pause-form {
            (inputs)
            button #pause type="submit" { "Pause" }
        }
    }
}

/// Whether a job listed in `state` (the half's name of it) and due at `available_at_ms` reads
/// `paused`: a pending job parked by a pause ([`pauses`](crate::pauses)).
pub fn shown_state(state: &str, available_at_ms: i64) -> &str {
    if state == "pending" && crate::pauses::is_parked(available_at_ms) {
        "paused"
    } else {
        state
    }
}

/// The name of a filtered state as a heading says it: `all` for none.
pub fn state_name(state: &str) -> &str {
    if state.is_empty() {
        "all"
    } else {
        state
    }
}

/// An overview's listing ([`listing`]).
pub struct Listing<'a> {
    /// The jobs' name, plural and lowercase (`events`): the ids `#{name}`, `#{name}-heading`
    /// and `#no-{name}`.
    pub name: &'a str,
    /// The heading (`Events: failed, newest first`).
    pub heading: String,
    /// What stands instead of an empty table (`No event matches.`).
    pub empty: &'a str,
    /// The columns' headings.
    pub columns: &'a [&'a str],
    /// The rows, `tr` elements; empty markup for none.
    pub rows: Option<Markup>,
    /// The next page's link, when there is one (`#next-page`).
    pub next: Option<String>,
}

/// An overview's listing: its heading, the table of its rows (or the empty text) and the next
/// page's link.
pub fn listing(listing: Listing<'_>) -> Markup {
    let name = listing.name;
    let heading_id = format!("{name}-heading");
    html! {
        h2 id=(heading_id) { (listing.heading) }
        @if let Some(rows) = listing.rows {
            table id=(name) aria-labelledby=(heading_id) {
                thead { tr {
                    @for column in listing.columns { th scope="col" { (column) } }
                } }
                tbody { (rows) }
            }
        } @else {
            p id=(format!("no-{name}")) { (listing.empty) }
        }
        @if let Some(next) = listing.next {
            p { a #next-page href=(next) { "Next page" } }
        }
    }
}

/// The pages' routes of a half: `GET /` redirects to the overview wherever the router is
/// nested, `GET /page` is `overview`, `GET /detail` is `detail`.
pub fn routes<S: Clone + Send + Sync + 'static>(
    overview: axum::routing::MethodRouter<S>,
    detail: axum::routing::MethodRouter<S>,
) -> axum::Router<S> {
    axum::Router::new()
        .route("/", axum::routing::get(to_page))
        .route("/page", overview)
        .route("/detail", detail)
}

/// The router's root (the mount path itself) leads to the overview, wherever it is nested.
async fn to_page(
    axum::extract::OriginalUri(uri): axum::extract::OriginalUri,
) -> axum::response::Redirect {
    axum::response::Redirect::to(&format!("{}/page", uri.path().trim_end_matches('/')))
}

/// The pages' own script for a half whose actions send `admin_header`, whose refresh choice is
/// kept under `{name}-refresh`, whose jobs are called `noun` and whose site answers as
/// `site`: a button with `data-post` posts there (with `{"key": data-key}` as a JSON body when
/// it has a `data-key`) and says its `data-done` text; a `data-resume` button and the
/// `#pause-form` resume and pause ([`pauses`]); the overview reloads every 10 s while
/// `#refresh` is checked, the status line is empty and no `[data-busy]` element is shown.
/// `more` runs after, inside the same function, with `post(url, body)` and `say(text)` in
/// scope.
pub fn script(admin_header: &str, name: &str, noun: &str, site: &str, more: &str) -> String {
    format!(
        r#"
(function () {{
  var status = document.getElementById('status');
  function say(text) {{ status.textContent = text; }}
  function post(url, body) {{
    var init = {{ method: 'POST', credentials: 'same-origin', headers: {{ '{admin_header}': '1' }} }};
    if (body !== undefined) {{
      init.headers['content-type'] = 'application/json';
      init.body = JSON.stringify(body);
    }}
    return fetch(url, init);
  }}
  function act(button) {{
    button.disabled = true;
    var key = button.getAttribute('data-key');
    post(button.getAttribute('data-post'), key === null ? undefined : {{ key: key }}).then(function (response) {{
      if (response.ok) {{ say(button.getAttribute('data-done')); }}
      else if (response.status === 404) {{ say(button.getAttribute('data-missed') || 'Nothing done: the {noun} changed meanwhile.'); }}
      else {{ say('Failed: HTTP ' + response.status); }}
      button.disabled = false;
    }}, function () {{ say('Failed: the {site} did not answer.'); button.disabled = false; }});
  }}
  var asking = null;
  var confirmBox = document.getElementById('confirm');
  if (confirmBox) {{
    document.getElementById('confirm-go').addEventListener('click', function () {{
      confirmBox.hidden = true;
      if (asking) {{ act(asking); asking = null; }}
    }});
    document.getElementById('confirm-cancel').addEventListener('click', function () {{
      confirmBox.hidden = true;
      if (asking) {{ asking.focus(); asking = null; }}
    }});
  }}
  document.querySelectorAll('button[data-post]').forEach(function (button) {{
    button.addEventListener('click', function () {{
      var question = button.getAttribute('data-confirm');
      if (question && confirmBox) {{
        asking = button;
        document.getElementById('confirm-text').textContent = question;
        confirmBox.hidden = false;
        document.getElementById('confirm-go').focus();
      }} else {{
        act(button);
      }}
    }});
  }});
  document.querySelectorAll('button[data-resume]').forEach(function (button) {{
    button.addEventListener('click', function () {{
      button.disabled = true;
      post('pauses/resume', {{ scope: button.getAttribute('data-resume') }}).then(function (response) {{
        if (response.ok) {{ location.reload(); }}
        else {{ say('Failed: HTTP ' + response.status); button.disabled = false; }}
      }}, function () {{ say('Failed: the {site} did not answer.'); button.disabled = false; }});
    }});
  }});
  var pauseForm = document.getElementById('pause-form');
  if (pauseForm) {{
    pauseForm.addEventListener('submit', function (event) {{
      event.preventDefault();
      var parts = [];
      pauseForm.querySelectorAll('[data-scope-part]').forEach(function (input) {{
        if (input.value.trim()) {{ parts.push(input.value.trim()); }}
      }});
      if (!parts.length) {{ say('Name what to pause.'); return; }}
      post('pauses', {{ scope: parts.join('/') }}).then(function (response) {{
        if (response.ok) {{ location.reload(); }}
        else {{ say('Failed: HTTP ' + response.status); }}
      }}, function () {{ say('Failed: the {site} did not answer.'); }});
    }});
  }}
{more}
  var refresh = document.getElementById('refresh');
  if (refresh) {{
    refresh.checked = localStorage.getItem('{name}-refresh') !== 'off';
    refresh.addEventListener('change', function () {{
      localStorage.setItem('{name}-refresh', refresh.checked ? 'on' : 'off');
    }});
    setInterval(function () {{
      var busy = document.querySelector('[data-busy]:not([hidden])');
      if (refresh.checked && !busy && !status.textContent) {{ location.reload(); }}
    }}, 10000);
  }}
}})();
"#
    )
}
