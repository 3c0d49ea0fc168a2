//! A TCP proxy in front of the test cluster's socket, to take the database away and give it back.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, UnixStream};
use tokio::task::AbortHandle;

pub struct DbProxy {
    pub port: u16,
    broken: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept_loop: AbortHandle,
}

impl DbProxy {
    /// Forwards every connection on a free local port to the Unix socket at `socket`.
    pub async fn start(socket: PathBuf) -> DbProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let broken = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (is_broken, open) = (broken.clone(), connections.clone());
        let accept_loop = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if is_broken.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is closed at once
                }
                let socket = socket.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = UnixStream::connect(&socket).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                open.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        DbProxy { port, broken, connections, accept_loop }
    }

    /// A connection string for `database` through the proxy.
    pub fn url(&self, database: &str) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname={database}", self.port)
    }

    /// The database is gone: open connections are cut, new ones are closed on arrival.
    pub fn break_connections(&self) {
        self.broken.store(true, Ordering::SeqCst);
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// The database is back.
    pub fn restore(&self) {
        self.broken.store(false, Ordering::SeqCst);
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.accept_loop.abort();
        self.break_connections();
    }
}
