//! rowbus's dashboard inside a service of your own: the `rowbus-ui` router mounted under
//! `/admin/rowbus`, behind the service's own sign-in (here a session cookie), with
//! operations on and no token of its own.
//!
//! `cargo run -p rowbus-examples --example dashboard` serves http://127.0.0.1:3000 until
//! Ctrl-C: open http://127.0.0.1:3000/login, which signs you in and takes you to the
//! dashboard. `--port N` serves on another port (0: a free one, printed). With `--demo` it
//! serves on a free port, checks as a client that the dashboard is there for a signed-in
//! user only and that it can pause the queue, and exits.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use rowbus::sqlx::Sqlite;
use rowbus::{Broker, BrokerOptions, Message};
use rowbus_examples::{TempDatabase, http};
use rowbus_ui::Dashboard;

/// The session cookie this example's sign-in sets. A real service checks its own sessions
/// or tokens here; the dashboard needs nothing of it but that it runs first.
const SESSION: &str = "session=signed-in-operator";

/// The service's own authentication: only a signed-in user reaches what it guards.
async fn signed_in(request: Request, next: Next) -> Response {
    let cookies = request.headers().get(header::COOKIE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if cookies.split("; ").any(|c| c == SESSION) {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "sign in at /login first\n").into_response()
    }
}

/// `GET /login`: signs the visitor in and sends them to the dashboard.
async fn login() -> Response {
    (
        [(header::SET_COOKIE, format!("{SESSION}; Path=/; HttpOnly; SameSite=Strict"))],
        Redirect::to("/admin/rowbus"),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let demo = args.iter().any(|a| a == "--demo");
    let port: u16 = match args.iter().position(|a| a == "--port") {
        Some(i) => args.get(i + 1).ok_or("--port needs a number")?.parse()?,
        None if demo => 0,
        None => 3000,
    };
    let database = TempDatabase::new("dashboard");
    let pool = rowbus::connect_creating::<Sqlite>(&database.url(), 4).await?;
    let broker = Broker::new(pool, BrokerOptions::default()).await?;
    let emails = broker.queue("emails")?;
    emails.deploy().await?;
    for to in ["ada@example.com", "grace@example.com", "edsger@example.com"] {
        emails.publish(Message::json(&serde_json::json!({ "to": to }))?).await?;
    }

    // The dashboard under a path of the service's, behind its sign-in. Its operations
    // (pause, resume, requeue, cancel) are on: whoever signs in is an operator here.
    let admin = Router::new()
        .nest("/rowbus", Dashboard::new(broker.clone()).router())
        .layer(middleware::from_fn(signed_in));
    let app = Router::new()
        .route("/", get(|| async { "the service's own pages; the dashboard is at /login\n" }))
        .route("/login", get(login))
        .nest("/admin", admin);

    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    println!("sign in at http://{address}/login (the dashboard is at /admin/rowbus)");

    if demo {
        let figures = "/admin/rowbus/api/queues";
        let refused = http(address, "GET", figures, &[], "").await?;
        println!("client: GET {figures} without a session -> {}", refused.status);
        assert_eq!(refused.status, 401, "{}", refused.head);
        let session = [("Cookie", SESSION)];
        let shown = http(address, "GET", figures, &session, "").await?;
        println!("client: GET {figures} signed in -> {}", shown.status);
        assert_eq!(shown.status, 200, "{}", shown.head);
        let body: serde_json::Value = serde_json::from_str(&shown.body)?;
        let ready = body["queues"][0]["ready"].as_i64();
        println!("client: queue {} has {ready:?} ready", body["queues"][0]["table"]);
        assert_eq!(ready, Some(3), "{body}");
        let paused =
            http(address, "POST", "/admin/rowbus/api/ops/queues/emails/pause", &session, "{}").await?;
        println!("client: POST .../emails/pause signed in -> {} {}", paused.status, paused.body);
        assert_eq!(paused.status, 200, "{}", paused.head);
        let cross = [("Cookie", SESSION), ("Origin", "https://elsewhere.example")];
        let forged =
            http(address, "POST", "/admin/rowbus/api/ops/queues/emails/resume", &cross, "{}").await?;
        println!("client: the same from another site's page -> {}", forged.status);
        assert_eq!(forged.status, 403, "{}", forged.head);
        assert!(emails.paused().await?.queue, "the queue was paused");
    } else {
        tokio::signal::ctrl_c().await?;
    }
    server.abort();
    broker.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
