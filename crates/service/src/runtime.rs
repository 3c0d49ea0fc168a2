//! Where work runs that must outlive the runtime of the task that starts it.
//!
//! The HTTP server runs each of its worker threads on a runtime of its own, and at a clean stop a
//! worker stops as soon as it has no request, its runtime with it. A connection (to the database,
//! to the gateway) is driven by a task on the runtime that opened it, and kept in a pool for later
//! calls from anywhere: opened on an idle worker's runtime, it would die under the requests other
//! workers are still draining, and under the background workers still finishing their unit of
//! work. So the pool and the gateway client open theirs on the process's own runtime, which
//! outlives them all.

use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::JoinError;

/// The runtime a pool or a client was made on: the process's own, made at start-up.
#[derive(Debug, Clone)]
pub struct ProcessRuntime(Option<Handle>);

impl ProcessRuntime {
    /// The caller's runtime, if it runs on one.
    pub fn current() -> ProcessRuntime {
        ProcessRuntime(Handle::try_current().ok())
    }

    /// Starts `work` on that runtime (or on the caller's, for something made outside any), and
    /// lets it run to its end on its own.
    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        match &self.0 {
            Some(runtime) => drop(runtime.spawn(work)),
            None => drop(tokio::spawn(work)),
        }
    }

    /// Makes something that starts tasks of its own as it is made (a pool, its reaper) on that
    /// runtime, wherever it is called from.
    pub fn make<T>(&self, make: impl FnOnce() -> T) -> T {
        match &self.0 {
            Some(runtime) => {
                let _on = runtime.enter();
                make()
            }
            None => make(),
        }
    }

    /// Runs `work` on that runtime (or right here, for something made outside any runtime); an
    /// error only if that runtime dropped it, stopping.
    pub async fn run<T: Send + 'static>(&self, work: impl Future<Output = T> + Send + 'static) -> Result<T, JoinError> {
        match &self.0 {
            Some(runtime) => runtime.spawn(work).await,
            None => Ok(work.await),
        }
    }
}
