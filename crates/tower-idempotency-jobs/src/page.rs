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
th{background:#eef1f6}td.num{text-align:right}td.err{max-width:28rem;color:#8a1111}
.rel{color:#555;font-size:.9em}time{white-space:nowrap}form.filters{display:flex;gap:1rem;flex-wrap:wrap;align-items:end}
form.filters div{display:flex;flex-direction:column}label{font-weight:600;font-size:.9em}
button,input,select{font:inherit;padding:.25rem .5rem}button{cursor:pointer}
#status{min-height:1.5em;font-weight:600;color:#0b5a1a}pre{background:#fff;border:1px solid #ccd;
padding:.8rem;overflow:auto;max-height:32rem}.actions{display:flex;gap:.6rem;margin:.6rem 0}
:focus-visible{outline:3px solid #f0a500;outline-offset:2px}
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
