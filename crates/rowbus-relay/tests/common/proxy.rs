//! A TCP proxy on a port of its own in front of a broker: a test stops it (the broker
//! looks gone: connections are cut, new ones refused) and starts it again, or freezes it
//! (the broker looks hung: connections stay open, nothing passes) and thaws it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Forwards 127.0.0.1:`port` to a broker while running.
pub struct Proxy {
    pub port: u16,
    target: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    frozen: watch::Sender<bool>,
}

impl Proxy {
    /// A running proxy to `target` on a free port.
    pub async fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let proxy = Proxy {
            port,
            target: target.parse().unwrap(),
            tasks: Arc::default(),
            frozen: watch::Sender::new(false),
        };
        proxy.serve(listener);
        proxy
    }

    /// Where clients connect: 127.0.0.1 and the proxy's port.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Cuts every connection and refuses new ones (once this returns, the port is closed).
    pub async fn stop(&self) {
        // The accept loop may hand on one more connection while it is being stopped.
        loop {
            let tasks: Vec<_> = self.tasks.lock().unwrap().drain(..).collect();
            if tasks.is_empty() {
                return;
            }
            for task in &tasks {
                task.abort();
            }
            for task in tasks {
                let _ = task.await;
            }
        }
    }

    /// Accepts again, on the same port.
    pub async fn resume(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.expect("bind the proxy again");
        self.serve(listener);
    }

    /// Stops passing bytes either way, connections left open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Passes bytes again (what was held back goes on).
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    fn serve(&self, listener: TcpListener) {
        let target = self.target;
        let tasks = Arc::clone(&self.tasks);
        let frozen = self.frozen.subscribe();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let frozen = frozen.clone();
                let pipe = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else { return };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pass(client_read, server_write, frozen.clone()),
                        pass(server_read, client_write, frozen)
                    );
                });
                tasks.lock().unwrap().push(pipe);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }
}

/// Copies `from` to `to` while not frozen, until either side closes.
async fn pass(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|f| !f).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}
