//! A TCP proxy in front of the test cluster's socket, to take the database away and give it back.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, UnixStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

pub struct DbProxy {
    pub port: u16,
    broken: Arc<AtomicBool>,
    frozen: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept_loop: AbortHandle,
}

impl DbProxy {
    /// Forwards every connection on a free local port to the Unix socket at `socket`.
    pub async fn start(socket: PathBuf) -> DbProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let broken = Arc::new(AtomicBool::new(false));
        let (frozen, is_frozen) = watch::channel(false);
        let connections = Arc::new(Mutex::new(Vec::new()));
        let (is_broken, open) = (broken.clone(), connections.clone());
        let accept_loop = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if is_broken.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is closed at once
                }
                let (socket, mut frozen) = (socket.clone(), is_frozen.clone());
                let task = tokio::spawn(async move {
                    let already_frozen = *frozen.borrow();
                    if already_frozen {
                        return std::future::pending().await; // held open, never answered
                    }
                    let Ok(mut server) = UnixStream::connect(&socket).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = async { drop(frozen.wait_for(|frozen| *frozen).await) } => {
                            drop(server);
                            std::future::pending::<()>().await; // the client hears nothing more
                        }
                    }
                });
                open.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        DbProxy { port, broken, frozen, connections, accept_loop }
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

    /// The database stops answering, as behind a network partition: connections stay open, and
    /// nothing comes back on them.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// The database is back.
    pub fn restore(&self) {
        self.broken.store(false, Ordering::SeqCst);
        self.frozen.send_replace(false);
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.accept_loop.abort();
        self.break_connections();
    }
}
