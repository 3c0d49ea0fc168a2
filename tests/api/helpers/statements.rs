//! What the service's own connections run, per test database, through diesel's instrumentation:
//! which statements it prepared (and kept), and which it executed.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, Once};

use diesel::connection::{Instrumentation, InstrumentationEvent, set_default_instrumentation};

/// The statements of one test database's service connections.
#[derive(Debug, Default, Clone)]
pub struct Statements {
    /// SQL texts put in a connection's statement cache (once per connection).
    pub prepared: Vec<String>,
    /// Everything executed, in order: prepared statements and plain ones (BEGIN, COMMIT).
    pub executed: Vec<String>,
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
    database: Option<String>,
    /// Only the service's pool sets `application_name = 'payments'`: the tests' own connections
    /// (for seeding and assertions) are not recorded.
    is_service: bool,
}

impl Instrumentation for Recorder {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::StartEstablishConnection { url, .. } => {
                self.database =
                    url.split_once("dbname='").and_then(|(_, rest)| rest.split_once('\'')).map(|(db, _)| db.to_owned());
            }
            InstrumentationEvent::StartQuery { query, .. } => {
                let sql = query.to_string();
                if sql.contains("application_name = 'payments'") {
                    self.is_service = true;
                } else {
                    self.record(|statements| statements.executed.push(sql));
                }
            }
            InstrumentationEvent::CacheQuery { sql, .. } => {
                let sql = sql.to_owned();
                self.record(|statements| statements.prepared.push(sql));
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
