//! A TCP proxy on a port of its own in front of a broker: [`Proxy::stop`] closes its
//! connections and its port (the broker is gone, as far as a client can tell), and
//! [`Proxy::start`] opens the same port again.

use std::net::SocketAddr;

use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    target: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy to `target` (host:port), started.
    pub async fn to(target: &str) -> Proxy {
        let target: SocketAddr = target.parse().expect("an address");
        let listener = bind("127.0.0.1:0".parse().unwrap());
        let addr = listener.local_addr().unwrap();
        let mut proxy = Proxy { addr, target, task: None };
        proxy.task = Some(tokio::spawn(serve(listener, target)));
        proxy
    }

    /// Closes the port and every connection through it.
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Opens the port again.
    pub fn start(&mut self) {
        assert!(self.task.is_none(), "the proxy is running");
        self.task = Some(tokio::spawn(serve(bind(self.addr), self.target)));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap_or_else(|e| panic!("bind the proxy to {addr}: {e}"));
    socket.listen(64).unwrap()
}

/// Accepts and forwards until aborted; aborting it aborts every connection's task too.
async fn serve(listener: tokio::net::TcpListener, target: SocketAddr) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((mut client, _)) = listener.accept().await else { continue };
        connections.spawn(async move {
            let Ok(mut server) = TcpStream::connect(target).await else { return };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
        while connections.try_join_next().is_some() {}
    }
}
