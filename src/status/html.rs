//! `latest.html`: the report as one self-contained page, for a browser
//! or a phone. No scripts, fonts, images or styles from anywhere else: it
//! works offline, from a file, an artifact store or the agent's `/`.
//!
//! Order of the page: what needs a human (Blocked, Stalled,
//! Unconvergeable, Error), the counts, drift field by field, active
//! overrides with the time they have left, pending deletions with when
//! they run, then every resource.

use std::fmt::Write;

use super::render::{self, relative};
use super::report::{Report, ResourceReport};
use crate::engine::State;

/// Text made safe for HTML (element content and quoted attributes).
fn h(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
:root{--fg:#1b1f24;--muted:#59636e;--line:#d1d9e0;--bg:#fff;--head:#f6f8fa;
--red:#b42318;--redbg:#fef3f2;--amber:#8a5a00;--amberbg:#fffaeb;--green:#067647;--greenbg:#ecfdf3}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--muted:#9198a1;--line:#3d444d;--bg:#0d1117;--head:#151b23;
--red:#ff7b72;--redbg:#2d1214;--amber:#e3b341;--amberbg:#272115;--green:#3fb950;--greenbg:#12261e}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:72rem;padding:1rem;font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:var(--fg);background:var(--bg)}
h1{font-size:1.4rem;margin:.2rem 0}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
.meta{color:var(--muted);font-size:.9rem;overflow-wrap:anywhere}
code{font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere}
.meta code{overflow-wrap:anywhere}
.banner{border:1px solid var(--red);background:var(--redbg);color:var(--red);padding:.6rem .8rem;border-radius:6px;margin:.8rem 0;overflow-wrap:anywhere}
.counts{display:flex;flex-wrap:wrap;gap:.5rem;margin:.8rem 0}
.count{border:1px solid var(--line);border-radius:6px;padding:.35rem .7rem;min-width:6.5rem}
.count b{display:block;font-size:1.3rem}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;width:100%;font-size:.92rem}
th,td{border-bottom:1px solid var(--line);padding:.35rem .5rem;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:var(--head);font-weight:600}
@media (max-width:40rem){
thead{display:none}
table,tbody,tr,td{display:block;width:100%}
tr{border:1px solid var(--line);border-radius:6px;margin:0 0 .6rem;padding:.2rem 0}
td{border:0;padding:.2rem .6rem}
td::before{content:attr(data-label);display:block;color:var(--muted);font-size:.8rem}
}
.state{font-weight:600;white-space:nowrap}
.bad{color:var(--red)}.warn{color:var(--amber)}.ok{color:var(--green)}
.none{color:var(--muted)}
";

/// Whether a state needs a human, and is shown first.
/// A resource a human must look at: a state tend cannot get out of alone,
/// or an override that expired (kept or not, someone has to decide).
fn needs_attention(r: &ResourceReport) -> bool {
    matches!(
        r.state,
        State::Blocked | State::Stalled | State::Unconvergeable | State::Error | State::Failed
    ) || r.override_.as_ref().is_some_and(|o| o.expired)
}

fn state_class(state: State) -> &'static str {
    match state {
        State::InSync | State::Released => "ok",
        State::Drifted | State::Missing | State::Deleting | State::Overridden => "warn",
        _ => "bad",
    }
}

fn state_cell(state: State) -> String {
    format!(
        "<span class=\"state {}\">{}</span>",
        state_class(state),
        state.as_str()
    )
}

/// `t` with its distance from the report (`in 3h 2m as of this report`):
/// the page is read later than it was made, so an age is said as of the
/// report, never as of "now".
fn when(report: &Report, t: &str) -> String {
    match relative(report, t) {
        Some(r) => format!("{} <span class=\"meta\">({})</span>", h(t), h(&r)),
        None => h(t),
    }
}

/// A table of `rows` (cells as HTML); on a narrow screen each row becomes
/// a card whose cells are labelled with their column.
/// Rows are written as they come: a fleet's page is streamed, not built
/// whole in memory first.
fn table<W: Write>(
    out: &mut W,
    id: &str,
    headers: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
) {
    let _ = write!(out, "<div class=\"scroll\"><table id=\"{id}\"><thead><tr>");
    for header in headers {
        let _ = write!(out, "<th>{header}</th>");
    }
    let _ = out.write_str("</tr></thead><tbody>");
    for row in rows {
        let _ = out.write_str("<tr>");
        for (cell, header) in row.iter().zip(headers) {
            let _ = write!(out, "<td data-label=\"{header}\">{cell}</td>");
        }
        let _ = out.write_str("</tr>");
    }
    let _ = out.write_str("</tbody></table></div>\n");
}

/// The page of `report`; `title` names what made it (`tend run`).
pub fn page(report: &Report, title: &str) -> String {
    let mut out = String::with_capacity(4096 + report.resources.len() * 400);
    page_into(&mut out, report, title);
    out
}

/// [`page`] written to `out`.
pub(crate) fn page_into<W: Write>(out: &mut W, report: &Report, title: &str) {
    let s = &report.summary;
    let attention: Vec<&ResourceReport> = report.entries().filter(|r| needs_attention(r)).collect();
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{}: {}, {} need attention</title><style>{STYLE}</style></head><body>\n",
        h(title),
        s.resources(),
        attention.len() + usize::from(report.source.error.is_some())
    );
    let _ = writeln!(out, "<h1>{}</h1>", h(title));
    let made = if report.generated_at.is_empty() {
        String::new()
    } else {
        format!(" · report made {}", h(&report.generated_at))
    };
    let _ = writeln!(
        out,
        "<div class=\"meta\">agent <code>{}</code> · tend {}{made}</div>",
        h(&report.agent.id),
        h(&report.agent.version)
    );
    let commit = report.source.commit.as_deref().unwrap_or("unknown commit");
    let committed = report
        .source
        .commit_time
        .as_deref()
        .map(|t| format!(", committed {}", when(report, t)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "<div class=\"meta\" id=\"source\">source <code>{}</code> branch <code>{}</code> at <code>{}</code>{committed}</div>",
        h(&report.source.url),
        h(&report.source.branch),
        h(commit)
    );
    for (id, line) in render::banners(report) {
        let _ = writeln!(out, "<div class=\"banner\" id=\"{id}\">{}</div>", h(&line));
    }

    let _ = out.write_str("<div class=\"counts\" id=\"summary\">");
    for (label, n, class) in [
        ("resources", s.total, "none"),
        ("in sync", s.in_sync, "ok"),
        ("drifted", s.drifted, "warn"),
        ("missing", s.missing, "warn"),
        ("overridden", s.overridden, "warn"),
        ("deleting", s.deleting, "warn"),
        ("blocked", s.blocked, "bad"),
        ("errors", s.errors, "bad"),
    ] {
        let shown = if n == 0 { "none" } else { class };
        let _ = write!(
            out,
            "<div class=\"count\"><b class=\"{shown}\">{n}</b>{label}</div>"
        );
    }
    let _ = out.write_str("</div>\n");

    let code = |t: &str| format!("<code>{}</code>", h(t));
    if !attention.is_empty() {
        let _ = out.write_str("<h2>Needs attention</h2>\n");
        let rows: Vec<Vec<String>> = attention
            .iter()
            .map(|r| vec![code(&r.name), state_cell(r.state), h(&r.reason)])
            .collect();
        table(out, "attention", &["name", "state", "reason"], rows);
    }

    let drift: Vec<Vec<String>> = report
        .resources
        .iter()
        .flat_map(|r| r.drift.iter().map(move |d| (r, d)))
        .map(|(r, d)| {
            vec![
                code(&r.name),
                code(&d.field),
                h(&render::value(&d.desired)),
                h(&render::value(&d.observed)),
                h(&render::drift_origin(d.origin, d.ignored)),
            ]
        })
        .collect();
    if !drift.is_empty() {
        let _ = out.write_str("<h2>Drift</h2>\n");
        table(
            out,
            "drift",
            &["name", "field", "declared", "observed", "origin"],
            drift,
        );
    }

    let overrides: Vec<Vec<String>> = report
        .resources
        .iter()
        .filter_map(|r| r.override_.as_ref().map(|o| (r, o)))
        .map(|(r, o)| {
            let first = if o.is_folded() { "first of them: " } else { "" };
            let expires = match (&o.expires, o.expired) {
                (Some(t), true) => format!(
                    "{first}<span class=\"bad\">EXPIRED</span> {}",
                    when(report, t)
                ),
                (Some(t), false) => format!("{first}{}", when(report, t)),
                (None, _) => "<span class=\"warn\">no expiry</span>".into(),
            };
            let fields = if o.fields.is_empty() {
                String::new()
            } else {
                format!(" {}", code(&o.fields.join(", ")))
            };
            vec![
                code(&r.name),
                h(&o.source),
                format!("{}{fields}", h(&o.kind)),
                h(&o.reason),
                expires,
                o.first_seen
                    .as_deref()
                    .map(|t| when(report, t))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    if !overrides.is_empty() {
        let _ = out.write_str("<h2>Active overrides</h2>\n");
        table(
            out,
            "overrides",
            &["name", "source", "kind", "reason", "expires", "first seen"],
            overrides,
        );
    }

    let kept: Vec<Vec<String>> = report
        .resources
        .iter()
        .filter_map(|r| r.propose.as_ref().map(|c| (r, c)))
        .map(|(r, c)| {
            vec![
                code(&r.name),
                code(c),
                h(&r.drift
                    .iter()
                    .map(|d| d.field.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")),
            ]
        })
        .collect();
    if !kept.is_empty() {
        let _ = out.write_str("<h2>Changes made at the provider, to keep in Git</h2>\n");
        table(out, "propose", &["name", "run", "fields"], kept);
    }

    let deletions: Vec<Vec<String>> = report
        .resources
        .iter()
        .filter(|r| matches!(r.state, State::Deleting | State::Stalled))
        .map(|r| {
            vec![
                code(&r.name),
                state_cell(r.state),
                r.acts_at
                    .as_deref()
                    .map(|t| when(report, t))
                    .unwrap_or_else(|| "now".into()),
                h(&r.reason),
            ]
        })
        .collect();
    if !deletions.is_empty() {
        let _ = out.write_str("<h2>Pending deletions</h2>\n");
        table(
            out,
            "deletions",
            &["name", "state", "runs", "reason"],
            deletions,
        );
    }

    let _ = out.write_str("<h2>All resources</h2>\n");
    let (mut ordered, quiet) = report.listed(false);
    ordered.sort_by_key(|r| !needs_attention(r));
    let rows = ordered.iter().map(|r| {
        let unobserved = if r.unobserved.is_empty() {
            String::new()
        } else {
            format!(
                "<br><span class=\"warn\">not observed: {}</span>",
                h(&r.unobserved.join(", "))
            )
        };
        vec![
            format!(
                "{}<br><span class=\"meta\">{}</span>",
                code(&r.name),
                h(&r.file)
            ),
            state_cell(r.state),
            r.action.as_str().to_string(),
            format!("{}{unobserved}", h(&r.reason)),
            r.observed_at
                .map(|t| when(report, &crate::time::rfc3339(t)))
                .unwrap_or_else(|| "not observed".into()),
        ]
    });
    table(
        out,
        "resources",
        &["name", "state", "action", "reason", "observed"],
        rows,
    );
    if quiet > 0 {
        // Named, folded: a person can still find one (the browser's find
        // opens a folded section), at a few bytes a resource.
        let _ = write!(
            out,
            "<details id=\"in-sync\"><summary>{quiet} more in sync, with nothing more to say</summary><p class=\"names\">"
        );
        for r in report.resources.iter().filter(|r| r.is_quiet()) {
            let _ = write!(out, "{} ", h(&r.name));
        }
        let _ = out.write_str("</p></details>\n");
    }

    if !report.errors.is_empty() {
        let _ = out.write_str("<h2>Declaration errors</h2>\n");
        let rows: Vec<Vec<String>> = report
            .errors
            .iter()
            .map(|e| {
                vec![
                    code(&format!("{}:{}:{}", e.file, e.line, e.column)),
                    h(&e.message),
                ]
            })
            .collect();
        table(out, "errors", &["where", "problem"], rows);
    }
    if !report.orphaned_overrides.is_empty() {
        let _ = out.write_str("<h2>Orphaned local overrides</h2>\n");
        let rows: Vec<Vec<String>> = report
            .orphaned_overrides
            .iter()
            .map(|o| vec![code(&o.name), h(&o.reason), h(&o.set_at)])
            .collect();
        table(out, "orphans", &["name", "reason", "set"], rows);
    }
    let _ = out.write_str("</body></html>\n");
}

#[cfg(test)]
mod tests {
    use super::h;

    #[test]
    fn outside_text_cannot_open_an_element() {
        assert_eq!(
            h("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(h("a\u{1b}[2J"), "a\\u{1b}[2J");
    }
}
