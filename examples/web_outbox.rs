//! A web handler that writes a row and publishes a message in one transaction (the
//! transactional outbox), and a worker that handles the messages.
//!
//! `cargo run -p rowbus-examples --example web_outbox` serves http://127.0.0.1:3000 until
//! Ctrl-C; place an order with
//!
//! ```text
//! curl -d '{"item": "tea", "quantity": 2}' -H 'content-type: application/json' 127.0.0.1:3000/orders
//! ```
//!
//! and the worker prints it. With `--demo` it serves on a free port, places three orders
//! itself, waits for the worker to have handled them, and exits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use rowbus::sqlx::{self, Sqlite};
use rowbus::{Broker, BrokerOptions, Message, Queue};
use rowbus_examples::{TempDatabase, http};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// What a client posts.
#[derive(Deserialize)]
struct NewOrder {
    item: String,
    quantity: u32,
}

/// What the worker is told.
#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
    item: String,
    quantity: u32,
}

#[derive(Clone)]
struct App {
    broker: Broker<Sqlite>,
    orders: Queue<Sqlite>,
}

type Failure = (StatusCode, String);

fn failure(error: impl std::fmt::Display) -> Failure {
    (StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
}

/// `POST /orders`: the order's row and its message commit together, or neither does. The
/// worker is woken when the transaction commits, not before.
async fn place_order(
    State(app): State<App>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<serde_json::Value>), Failure> {
    let mut tx = app.broker.begin().await.map_err(failure)?;
    let (order_id,): (i64,) =
        sqlx::query_as("INSERT INTO orders (item, quantity) VALUES (?, ?) RETURNING id")
            .bind(&order.item)
            .bind(order.quantity)
            .fetch_one(&mut *tx)
            .await
            .map_err(failure)?;
    let placed = OrderPlaced { order_id, item: order.item, quantity: order.quantity };
    tx.publish(&app.orders, Message::json(&placed).map_err(failure)?).await.map_err(failure)?;
    tx.commit().await.map_err(failure)?;
    Ok((StatusCode::CREATED, Json(serde_json::json!({ "order_id": order_id }))))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let demo = std::env::args().any(|a| a == "--demo");
    let database = TempDatabase::new("web_outbox");
    let pool = rowbus::connect_creating::<Sqlite>(&database.url(), 4).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL, quantity INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let broker = Broker::new(pool.clone(), BrokerOptions::default()).await?;
    let orders = broker.queue("order_events")?;
    orders.deploy().await?;

    // The worker: here in the same process; a process of its own would do the same with
    // `listen_notify` on, to be woken by publishes made elsewhere.
    let handled = Arc::new(AtomicUsize::new(0));
    let some_handled = Arc::new(Notify::new());
    let worker = orders.subscribe().workers(4).run({
        let (handled, some_handled) = (handled.clone(), some_handled.clone());
        move |delivery| {
            let (handled, some_handled) = (handled.clone(), some_handled.clone());
            async move {
                let placed: OrderPlaced = delivery.json()?;
                println!(
                    "worker: order {} ({} x {}): receipt sent",
                    placed.order_id, placed.quantity, placed.item
                );
                handled.fetch_add(1, Ordering::SeqCst);
                some_handled.notify_one();
                Ok::<_, rowbus::Error>(())
            }
        }
    });
    let worker = tokio::spawn(worker);

    let app =
        Router::new().route("/orders", post(place_order)).with_state(App { broker: broker.clone(), orders });
    let address: SocketAddr = if demo { ([127, 0, 0, 1], 0).into() } else { ([127, 0, 0, 1], 3000).into() };
    let listener = tokio::net::TcpListener::bind(address).await?;
    let address = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    println!("serving on http://{address}/orders");

    if demo {
        for (item, quantity) in [("tea", 2), ("scones", 6), ("jam", 1)] {
            let body = serde_json::json!({ "item": item, "quantity": quantity }).to_string();
            let response = http(address, "POST", "/orders", &[], &body).await?;
            println!("client: POST /orders {body} -> {}", response.status);
            assert_eq!(response.status, 201, "the order was refused: {}", response.head);
        }
        tokio::time::timeout(Duration::from_secs(30), async {
            while handled.load(Ordering::SeqCst) < 3 {
                some_handled.notified().await;
            }
        })
        .await?;
        let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM orders").fetch_one(&pool).await?;
        println!("{rows} orders stored, {} handled", handled.load(Ordering::SeqCst));
    } else {
        tokio::signal::ctrl_c().await?;
    }
    server.abort();
    broker.shutdown(Duration::from_secs(5)).await;
    worker.await??;
    Ok(())
}
