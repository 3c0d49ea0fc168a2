//! What the service's own connections run, per test database, through diesel's instrumentation:
//! which statements it prepared (and kept), and which it executed.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, Once};

use diesel::connection::{Instrumentation, InstrumentationEvent, set_default_instrumentation};

/// The statements of one test database's service connections.
#[derive(Debug, Default, Clone)]
pub struct Statements {
    /// SQL texts put in a connection's statement cache (once per connection), each with the
    /// connection's number (in the order the process opened them).
    pub prepared: Vec<(usize, String)>,
    /// Everything executed, in order: prepared statements and plain ones (BEGIN, COMMIT), but
    /// the workers' wake-ups.
    pub executed: Vec<String>,
    /// The wake-ups sent after commits (`NOTIFY ...`): coalesced, so not a cost of each request.
    pub wake_ups: Vec<String>,
}

static RECORDED: LazyLock<Mutex<HashMap<String, Statements>>> = LazyLock::new(Default::default);

/// Records statements of every connection established from now on in this process.
pub fn record_statements() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        set_default_instrumentation(|| Some(Box::new(Recorder::default()))).expect("installing the recorder");
    });
}

/// What the service's connections to `database` have run so far.
pub fn statements(database: &str) -> Statements {
    RECORDED.lock().unwrap().get(database).cloned().unwrap_or_default()
}

#[derive(Default)]
struct Recorder {
    /// Which of the process's connections it records.
    connection: usize,
    database: Option<String>,
    /// Only the service's pool sets `application_name = 'payments'`: the tests' own connections
    /// (for seeding and assertions) are not recorded.
    is_service: bool,
}

impl Instrumentation for Recorder {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::StartEstablishConnection { url, .. } => {
                static OPENED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                self.connection = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.database =
                    url.split_once("dbname='").and_then(|(_, rest)| rest.split_once('\'')).map(|(db, _)| db.to_owned());
            }
            InstrumentationEvent::StartQuery { query, .. } => {
                let sql = query.to_string();
                if sql.contains("application_name = 'payments'") {
                    self.is_service = true;
                } else if sql.starts_with("NOTIFY ") {
                    self.record(|statements| statements.wake_ups.push(sql));
                } else {
                    self.record(|statements| statements.executed.push(sql));
                }
            }
            InstrumentationEvent::CacheQuery { sql, .. } => {
                let (connection, sql) = (self.connection, sql.to_owned());
                self.record(|statements| statements.prepared.push((connection, sql)));
            }
            _ => {}
        }
    }
}

impl Recorder {
    fn record(&self, change: impl FnOnce(&mut Statements)) {
        if let (true, Some(database)) = (self.is_service, &self.database) {
            change(RECORDED.lock().unwrap().entry(database.clone()).or_default());
        }
    }
}
