//! The dashboard (`outbox::web`) over real HTTP on every backend: each page shows what the
//! table holds; each button is the library's audited change, named after the web user;
//! read-only mode hides the buttons and refuses their POSTs; cross-site POSTs, foreign
//! hosts and bad input are refused with a clear page, and change nothing.

use std::net::SocketAddr;
use std::time::Duration;

use outbox::web::{Dashboard, WebConfig};
use outbox::{enqueue, HandlerError, NewTask, Registry, TaskContext, TaskTx, TenantLimits};

use crate::http::{get, post_form, request, Response};
use crate::siege;
use crate::TestDb;

/// A request's extra headers.
type Headers<'a> = Vec<(&'a str, &'a str)>;
/// A form's fields.
type Fields<'a> = Vec<(&'a str, &'a str)>;

/// The error `mail.send` fails with, permanently.
const SMTP_ERROR: &str = "smtp: 550 mailbox <x@y> unavailable";

/// The tasks of [`seed`].
struct Seeded {
    /// `mail.send m-1`: dead, with [`SMTP_ERROR`].
    dead: i64,
    /// `mail.log m-1`, child of `dead`: cancelled with it.
    child: i64,
    /// `points.credit p-1`: pending, due.
    due: i64,
    /// `mail.send m-2`: pending, due in an hour.
    later: i64,
}

/// A table with a task of every kind a page shows, made by the library and a real drain;
/// a live node that serves `mail.send` and `points.credit`; a tenant row.
fn seed(db: &TestDb) -> Seeded {
    let mut conn = db.conn();
    let task = |t: NewTask, conn: &mut outbox::DbConnection| enqueue(conn, &t).expect("enqueue").id;
    let dead = task(
        NewTask::new("mail.send", "m-1")
            .tenant("acme")
            .max_attempts(1)
            .payload(&serde_json::json!({"to": "x@y"})),
        &mut conn,
    );
    let child = task(NewTask::new("mail.log", "m-1").after(dead), &mut conn);
    let due = task(NewTask::new("points.credit", "p-1"), &mut conn);
    let later = task(
        NewTask::new("mail.send", "m-2").delay(Duration::from_secs(3600)),
        &mut conn,
    );
    let mut registry = Registry::new();
    registry.register("mail.send", |_: &TaskContext, _: &mut TaskTx| {
        Err(HandlerError::permanent(anyhow::anyhow!(SMTP_ERROR)))
    });
    let tally = outbox::testing::drain(&db.url, registry).expect("drain");
    assert_eq!(tally.dead, 1, "{tally:?}");
    outbox::set_tenant(
        &mut conn,
        "acme",
        &TenantLimits::default().max_queued(Some(100)),
        "setup",
    )
    .expect("tenant");
    let published = serde_json::json!({"threads": 4, "domains": [{
        "domain": "default", "mode": "max", "keywords": ["mail.send", "points.credit"],
        "threads": 4, "reserved": 0, "borrowed": 0, "running": 0, "queued": 0, "stuck": 0,
        "queue": 32, "timeout_ms": 300000, "paused": false, "released": false,
    }]});
    db.exec(&format!(
        "INSERT INTO async_node (name, domains) VALUES ('web-test:1', '{published}')"
    ));
    Seeded {
        dead,
        child,
        due,
        later,
    }
}

fn start(db: &TestDb, actions: bool) -> Dashboard {
    let config = WebConfig::new("127.0.0.1:0".parse().expect("an address"))
        .allow_actions(actions)
        .user("alice");
    Dashboard::start(&db.url, config).expect("start the dashboard")
}

fn ok(addr: SocketAddr, path: &str) -> String {
    let response = get(addr, path);
    assert_eq!(response.status, 200, "GET {path}: {}", response.body);
    assert!(
        response
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/html")),
        "{path}: {:?}",
        response.headers
    );
    response.body
}

/// The forms' token, as a page carries it.
fn token(page: &str) -> String {
    let at = page
        .find(r#"name="token" value=""#)
        .expect("a form with the token");
    let rest = &page[at + r#"name="token" value=""#.len()..];
    rest[..rest.find('"').expect("the token's end")].to_owned()
}

/// A POST as the dashboard's own form sends it: its origin, its token.
fn press(addr: SocketAddr, path: &str, token: &str, fields: &[(&str, &str)]) -> Response {
    let origin = format!("http://{addr}");
    let mut all = vec![("token", token)];
    all.extend_from_slice(fields);
    post_form(addr, path, &[("Origin", &origin)], &all)
}

fn state_of(db: &TestDb, id: i64) -> String {
    db.task(id).state
}

fn web_audits(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM async_audit WHERE actor = 'alice'")
}

every_backend! {
    fn every_page_shows_what_the_table_holds(db: &TestDb) {
        let t = seed(db);
        let web = start(db, false);
        let addr = web.local_addr();

        let overview = ok(addr, "/");
        assert!(overview.contains(r#"http-equiv="refresh" content="5; url=/""#), "{overview}");
        for keyword in ["mail.send", "mail.log", "points.credit"] {
            assert!(overview.contains(&format!(r#"data-keyword="{keyword}""#)), "{keyword}: {overview}");
        }
        // mail.send: 1 pending (not due), 1 dead; points.credit: 1 pending, due (an age).
        assert!(overview.contains(r#"href="/tasks?keyword=mail.send&amp;state=dead">1<"#), "{overview}");
        let credit = &overview[overview.find(r#"data-keyword="points.credit""#).expect("row")..];
        let credit = &credit[..credit.find("</tr>").expect("row end")];
        assert!(credit.contains(r#"<td class="n">"#) && credit.contains("s</td>"), "{credit}");
        assert!(overview.contains("1 live node(s)"), "{overview}");
        // No live node serves mail.log: nothing claims it, and there is nothing to pause.
        let log = &overview[overview.find(r#"data-keyword="mail.log""#).expect("row")..];
        assert!(log[..log.find("</tr>").expect("row end")].contains("no live node"), "{log}");

        let dead = ok(addr, "/tasks?state=dead");
        assert!(dead.contains("<h1>Dead tasks</h1>"), "{dead}");
        assert!(!dead.contains("http-equiv"), "a page with a form is not reloaded: {dead}");
        assert!(dead.contains(&format!(r#"data-id="{}""#, t.dead)), "{dead}");
        assert!(!dead.contains(&format!(r#"data-id="{}""#, t.due)), "{dead}");
        assert!(dead.contains("smtp: 550 mailbox &lt;x@y&gt; unavailable"), "{dead}");

        let filtered = ok(addr, "/tasks?keyword=mail.send&tenant=acme");
        assert!(filtered.contains(&format!(r#"data-id="{}""#, t.dead)), "{filtered}");
        assert!(!filtered.contains(&format!(r#"data-id="{}""#, t.later)), "{filtered}");

        let task = ok(addr, &format!("/tasks/{}", t.dead));
        assert!(task.contains(&format!(r#"content="5; url=/tasks/{}""#, t.dead)), "{task}");
        for (column, value) in [("keyword", "mail.send"), ("biz_id", "m-1"), ("tenant", "acme"), ("state", "dead"), ("failures", "1"), ("children", "1")] {
            assert!(task.contains(&format!(r#"data-column="{column}">{value}<"#)), "{column}: {task}");
        }
        assert!(task.contains("smtp: 550 mailbox &lt;x@y&gt; unavailable"), "{task}");
        assert!(task.contains(&format!(r#"href="/tasks/{}""#, t.child)), "{task}");
        assert!(task.contains("&quot;to&quot;: &quot;x@y&quot;"), "{task}");

        // The child was cancelled by its dead parent: its error chain leads there.
        let child = ok(addr, &format!("/tasks/{}", t.child));
        assert!(child.contains(r#"data-column="state">cancelled<"#), "{child}");
        assert!(child.contains(&format!("parent task {} is dead", t.dead)), "{child}");
        assert!(child.contains(SMTP_ERROR.replace('<', "&lt;").replace('>', "&gt;").as_str()), "{child}");

        let nodes = ok(addr, "/nodes");
        assert!(nodes.contains("web-test:1") && nodes.contains(">live<"), "{nodes}");
        assert!(nodes.contains(">gone<"), "the drain's node: {nodes}");

        let domains = ok(addr, "/domains");
        assert!(domains.contains(r#"data-domain="default""#), "{domains}");
        assert!(domains.contains("mail.send, points.credit"), "{domains}");
        assert!(domains.contains(">acme<") && domains.contains(">100<"), "{domains}");

        let schedules = ok(addr, "/schedules");
        assert!(schedules.contains("No schedules"), "{schedules}");

        let audit = ok(addr, "/audit");
        assert!(audit.contains("tenant.set"), "{audit}");
    }
}

every_backend! {
    fn read_only_shows_no_button_and_refuses_every_post(db: &TestDb) {
        let t = seed(db);
        let web = start(db, false);
        let addr = web.local_addr();
        for path in ["/".to_owned(), "/tasks?state=dead".into(), format!("/tasks/{}", t.dead), "/domains".into()] {
            let page = ok(addr, &path);
            assert!(!page.contains("<form method=\"post\""), "{path}: {page}");
            assert!(page.contains("read-only"), "{path}");
        }
        // Even with a well-formed form from the dashboard's own origin.
        let origin = format!("http://{addr}");
        for (path, name) in [(format!("/tasks/{}/retry", t.dead), ""), (format!("/tasks/{}/cancel", t.due), ""), ("/pause".into(), "mail.send")] {
            let response = post_form(addr, &path, &[("Origin", &origin)], &[("token", "x"), ("name", name)]);
            assert_eq!(response.status, 403, "{path}: {}", response.body);
            assert!(response.body.contains("read-only") && response.body.contains("--allow-actions"), "{}", response.body);
        }
        assert_eq!(state_of(db, t.dead), "dead");
        assert_eq!(state_of(db, t.due), "pending");
        assert_eq!(db.count("SELECT count(*) FROM async_pause"), 0);
        assert_eq!(web_audits(db), 0);
    }
}

every_backend! {
    fn retry_from_the_web_is_the_audited_change_of_the_web_user(db: &TestDb) {
        let t = seed(db);
        let web = start(db, true);
        let addr = web.local_addr();
        let page = ok(addr, "/tasks?state=dead");
        let action = format!("/tasks/{}/retry", t.dead);
        assert!(page.contains(&format!(r#"action="{action}""#)), "{page}");

        let response = press(addr, &action, &token(&page), &[]);
        assert_eq!(response.status, 303, "{}", response.body);
        let to = response.header("location").expect("a redirect").to_owned();
        assert_eq!(to, format!("/tasks/{}?done=retried&name={}", t.dead, t.dead));

        let row = db.task(t.dead);
        assert_eq!((row.state.as_str(), row.failures), ("pending", 0));
        let shown = ok(addr, &to);
        assert!(shown.contains(&format!("Task {} retried.", t.dead)), "{shown}");
        assert!(shown.contains(r#"data-column="state">pending<"#), "{shown}");
        // The audit names the web user, the action and the task, once.
        assert_eq!(db.count(&format!(
            "SELECT count(*) FROM async_audit WHERE actor = 'alice' AND action = 'task.retry' \
             AND target = '{}' AND affected = 1", t.dead)), 1);
        assert!(ok(addr, "/audit").contains("alice"));

        // Pressed again: the task is no longer dead; nothing changes.
        let again = press(addr, &action, &token(&page), &[]);
        assert_eq!(again.status, 409, "{}", again.body);
        assert!(again.body.contains("is pending: only a dead or cancelled task is retried"), "{}", again.body);
        assert_eq!(web_audits(db), 1);
    }
}

every_backend! {
    fn cancel_pause_and_resume_are_audited_changes(db: &TestDb) {
        let t = seed(db);
        let web = start(db, true);
        let addr = web.local_addr();
        let token = token(&ok(addr, "/"));

        let response = press(addr, &format!("/tasks/{}/cancel", t.due), &token, &[]);
        assert_eq!(response.status, 303, "{}", response.body);
        assert_eq!(state_of(db, t.due), "cancelled");
        let again = press(addr, &format!("/tasks/{}/cancel", t.due), &token, &[]);
        assert_eq!(again.status, 409, "{}", again.body);

        // A keyword, from the overview: back there, shown paused.
        let response = press(addr, "/pause", &token, &[("name", "mail.send"), ("back", "/")]);
        assert_eq!(response.status, 303, "{}", response.body);
        assert_eq!(response.header("location"), Some("/?done=paused&name=mail.send"));
        assert_eq!(db.count("SELECT count(*) FROM async_pause WHERE keyword = 'mail.send'"), 1);
        let overview = ok(addr, "/?done=paused&name=mail.send");
        assert!(overview.contains("Paused mail.send"), "{overview}");
        let row = &overview[overview.find(r#"data-keyword="mail.send""#).expect("row")..];
        assert!(row[..row.find("</tr>").expect("row end")].contains(r#"action="/resume""#), "{row}");
        // Paused again: nothing changes, and it says so.
        let response = press(addr, "/pause", &token, &[("name", "mail.send"), ("back", "/")]);
        assert_eq!(response.header("location"), Some("/?done=already-paused&name=mail.send"));
        let response = press(addr, "/resume", &token, &[("name", "mail.send")]);
        assert_eq!(response.header("location"), Some("/domains?done=resumed&name=mail.send"));
        assert_eq!(db.count("SELECT count(*) FROM async_pause"), 0);

        // A domain, from the domains page.
        let response = press(addr, "/pause", &token, &[("name", "default")]);
        assert_eq!(response.status, 303, "{}", response.body);
        let domains = ok(addr, "/domains");
        let row = &domains[domains.find(r#"data-domain="default""#).expect("row")..];
        assert!(row[..row.find("</tr>").expect("row end")].contains(">paused<"), "{row}");
        press(addr, "/resume", &token, &[("name", "default")]);

        let actions: Vec<String> = ["task.cancel", "keyword.pause", "keyword.resume", "domain.pause", "domain.resume"]
            .into_iter()
            .filter(|a| db.count(&format!("SELECT count(*) FROM async_audit WHERE actor = 'alice' AND action = '{a}'")) != 1)
            .map(str::to_owned)
            .collect();
        assert!(actions.is_empty(), "not audited once: {actions:?}");
        assert_eq!(web_audits(db), 5);
    }
}

every_backend! {
    fn cross_site_posts_and_foreign_hosts_are_refused(db: &TestDb) {
        let t = seed(db);
        let web = start(db, true);
        let addr = web.local_addr();
        let token = token(&ok(addr, "/"));
        let path = format!("/tasks/{}/retry", t.dead);
        let own = format!("http://{addr}");
        let refused: [(&str, Headers, Fields); 6] = [
            ("no Origin nor Referer", vec![], vec![("token", &token)]),
            ("another site's Origin", vec![("Origin", "http://evil.example")], vec![("token", &token)]),
            ("an opaque Origin", vec![("Origin", "null")], vec![("token", &token)]),
            ("another site's Referer", vec![("Referer", "http://evil.example/x")], vec![("token", &token)]),
            ("no token", vec![("Origin", &own)], vec![]),
            ("a wrong token", vec![("Origin", &own)], vec![("token", "00")]),
        ];
        for (what, headers, fields) in &refused {
            let response = post_form(addr, &path, headers, fields);
            assert_eq!(response.status, 403, "{what}: {}", response.body);
        }
        // A DNS-rebinding page reaches the server under a name of its own: refused, GET too.
        for method in ["GET", "POST"] {
            let response = request(addr, method, "/", &[("Host", "evil.example:8080"), ("Origin", "http://evil.example:8080")], None);
            assert_eq!(response.status, 421, "{method}: {}", response.body);
        }
        assert_eq!(state_of(db, t.dead), "dead");
        assert_eq!(web_audits(db), 0);
        // The Referer of the dashboard's own page is enough when a browser sends no Origin.
        let referer = format!("http://{addr}/tasks?state=dead");
        let response = post_form(addr, &path, &[("Referer", &referer)], &[("token", &token)]);
        assert_eq!(response.status, 303, "{}", response.body);
        // Every answer forbids framing and caching.
        let response = get(addr, "/");
        assert_eq!(response.header("x-frame-options"), Some("DENY"));
        assert!(response.header("content-security-policy").is_some_and(|c| c.contains("frame-ancestors 'none'")));
        assert_eq!(response.header("cache-control"), Some("no-store"));
    }
}

every_backend! {
    fn bad_input_gets_a_clear_page_and_changes_nothing(db: &TestDb) {
        let t = seed(db);
        let web = start(db, true);
        let addr = web.local_addr();
        let token = token(&ok(addr, "/"));
        let gets: [(&str, u16, &str); 8] = [
            ("/tasks/999999", 404, "no task 999999"),
            ("/tasks/abc", 400, "\"abc\" is not a task id"),
            ("/tasks?state=zombie", 400, "unknown state \"zombie\": one of blocked, pending"),
            ("/tasks?keyword=Bad!", 400, "invalid keyword"),
            ("/tasks?after=x", 400, "after=\"x\" is not a task id"),
            ("/audit?before=x", 400, "is not an audit row id"),
            ("/no-such-page", 404, "no page /no-such-page"),
            ("/pause", 405, "GET is not accepted at /pause"),
        ];
        for (path, status, says) in gets {
            let response = get(addr, path);
            assert_eq!(response.status, status, "{path}: {}", response.body);
            let body = response.body.replace("&quot;", "\"");
            assert!(body.contains(says), "{path} lacks {says:?}: {body}");
        }
        let posts: [(String, Fields, u16, &str); 5] = [
            ("/tasks/999999/retry".into(), vec![], 404, "no task 999999"),
            ("/tasks/-3/cancel".into(), vec![], 400, "is not a task id"),
            (format!("/tasks/{}/retry", t.due), vec![], 409, "is pending"),
            ("/pause".into(), vec![("name", "no.such")], 404, "no domain or keyword \"no.such\""),
            ("/pause".into(), vec![], 400, "names no domain or keyword"),
        ];
        for (path, fields, status, says) in &posts {
            let response = press(addr, path, &token, fields);
            assert_eq!(response.status, *status, "{path}: {}", response.body);
            let body = response.body.replace("&quot;", "\"");
            assert!(body.contains(says), "{path} lacks {says:?}: {body}");
            assert!(body.contains("Nothing was changed"), "{body}");
        }
        // A body that is not a form.
        let origin = format!("http://{addr}");
        let response = request(addr, "POST", &format!("/tasks/{}/retry", t.dead), &[("Origin", &origin)], Some(("application/json", b"{}")));
        assert_eq!(response.status, 400, "{}", response.body);
        assert!(response.body.contains("not one of the dashboard"), "{}", response.body);

        assert_eq!(state_of(db, t.dead), "dead");
        assert_eq!(state_of(db, t.due), "pending");
        assert_eq!(db.count("SELECT count(*) FROM async_pause"), 0);
        assert_eq!(web_audits(db), 0);
    }
}

every_backend! {
    fn an_address_in_use_is_a_clear_error(db: &TestDb) {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = taken.local_addr().expect("addr");
        let error = Dashboard::start(&db.url, WebConfig::new(addr)).expect_err("the port is taken");
        assert!(matches!(error, outbox::Error::Listen { .. }), "{error:?}");
        assert!(error.to_string().starts_with(&format!("cannot listen on {addr}: ")), "{error}");
    }
}

every_backend! {
    fn a_stopped_dashboard_no_longer_answers(db: &TestDb) {
        let web = start(db, false);
        let addr = web.local_addr();
        assert_eq!(get(addr, "/").status, 200);
        web.stop();
        assert!(std::net::TcpStream::connect(addr).is_err(), "still listening on {addr}");
    }
}

/// The dashboard's bounds (`crate::http` in the library): a connection that sends no header
/// is closed after the header timeout (10 s); idle connections and a client that pipelines
/// requests and never reads hold up no one else's page.
/// How soon a page answers beside the idle and pipelining clients: a page they held up would
/// wait for the 10 s header timeout; 3 s leaves a loaded machine its slowness.
const ANSWERED_WITHIN: Duration = Duration::from_secs(3);

#[test]
fn silent_connections_are_closed_and_hold_up_no_page() {
    let db = TestDb::sqlite();
    seed(&db);
    let web = start(&db, false);
    let addr = web.local_addr();
    let mut idle = siege::idle(addr, 300);
    let pipelining = siege::pipelining(addr, "/tasks");
    for _ in 0..3 {
        assert_eq!(siege::answered_within(addr, "/", ANSWERED_WITHIN), Ok(200));
    }
    // The header timeout is 10 s; 20 s is the test's bound.
    assert!(
        siege::closed_by_server_within(&mut idle[0], Duration::from_secs(20)),
        "a connection that sent nothing for 20 s is still open"
    );
    drop((idle, pipelining));
    assert_eq!(siege::answered_within(addr, "/", ANSWERED_WITHIN), Ok(200));
    web.stop();
}

/// What one request may make the server hold (`crate::http` in the library, the metrics
/// endpoint's too): a head past 16 KiB is refused (431) and an action's form past 4 KiB too
/// (413), neither buffered whole, and nothing changes.
#[test]
fn oversized_heads_and_forms_are_refused() {
    let db = TestDb::sqlite();
    seed(&db);
    let web = start(&db, true);
    let addr = web.local_addr();
    let long = "a".repeat(32 * 1024);
    let response = request(addr, "GET", "/", &[("X-Long", &long)], None);
    assert_eq!(response.status, 431, "{}", response.body);
    let token = token(&ok(addr, "/"));
    let filler = "x".repeat(64 * 1024);
    let fields = [("name", "mail.send"), ("filler", filler.as_str())];
    let response = press(addr, "/pause", &token, &fields);
    assert_eq!(response.status, 413, "{}", response.body);
    assert_eq!(
        db.count("SELECT count(*) FROM async_pause"),
        0,
        "nothing paused"
    );
    // Within the bounds, the same pause goes through.
    let response = press(addr, "/pause", &token, &[("name", "mail.send")]);
    assert_eq!(response.status, 303, "{}", response.body);
    web.stop();
}
