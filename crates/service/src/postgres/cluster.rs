//! A private PostgreSQL cluster, owned by the process that starts it.
//!
//! The service's embedded mode keeps one under `PAYMENTS_DATA_DIR`; the test suite starts a
//! throwaway one per run. Either way the cluster
//! - is initialised on first use (`initdb`) and keeps its data across restarts;
//! - listens only on a Unix socket in its own `0700` directory: it cannot collide with another
//!   cluster's port, and only its owner (or root) can connect, which is what makes `trust`
//!   authentication safe here;
//! - runs as the `postgres` OS user when we are root, because PostgreSQL refuses to run as root;
//! - lives exactly as long as its owner. The postmaster is started by a small shell watchdog that
//!   holds the read end of a pipe whose write end only we hold. When we close it, on a clean stop
//!   or because this process died in any way (even `kill -9`), the watchdog asks PostgreSQL for a
//!   fast shutdown, so no orphaned server is ever left behind.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The socket's port number. Only the socket's file name depends on it (`.s.PGSQL.5432`), and the
/// socket lives in the cluster's own directory, so the standard port never collides.
const PORT: u16 = 5432;

/// How long a start may take: crash recovery after an unclean stop can take a while.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Unix socket paths are limited to 107 bytes by the kernel.
const MAX_SOCKET_PATH: usize = 107;

/// The watchdog. It starts the postmaster in the background, prints its pid, and waits on the
/// owner's pipe (kept on fd 3: background jobs of a script otherwise get /dev/null as stdin).
/// SIGINT is PostgreSQL's "fast" shutdown: open transactions roll back, data is flushed. If the
/// postmaster exits by itself, the reader goes too, so it can never signal a reused pid.
const WATCHDOG: &str = r#"
exec 3<&0 </dev/null
"$@" 3<&- >&2 &
pid=$!
echo "$pid"
{ read -r _ <&3; kill -INT "$pid"; } 2>/dev/null &
reader=$!
exec 3<&-
wait "$pid"
status=$?
kill "$reader" 2>/dev/null
exit "$status"
"#;

/// Whether the cluster must survive a machine crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// PostgreSQL's defaults: every commit is flushed to disk (the service's embedded mode).
    Durable,
    /// No fsync: much faster, and a machine crash may lose the data (test clusters).
    Throwaway,
}

/// A running cluster; dropping it shuts the server down.
pub struct Cluster {
    root: PathBuf,
    watchdog: Child,
    owner_pipe: Option<ChildStdin>,
}

impl Cluster {
    /// Starts the cluster kept under `root` (data in `root/data`, socket in `root/run`), running
    /// `initdb` first if `root` holds none yet, and returns once it accepts connections.
    pub fn start(root: &Path, durability: Durability) -> anyhow::Result<Cluster> {
        Cluster::start_with_settings(root, durability, &[])
    }

    /// [`Cluster::start`], with extra server settings (`name=value`, as `postgres -c` takes them)
    /// applied last, so they override ours: the benchmark preloads `pg_stat_statements`, say.
    pub fn start_with_settings(root: &Path, durability: Durability, settings: &[&str]) -> anyhow::Result<Cluster> {
        let bin = server_binaries()?;
        fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
        // One spelling of the path for everything, the socket's length check included: the one
        // connection strings use.
        let root = std::path::absolute(root)?;
        let (data, run) = (root.join("data"), socket_dir(&root));
        let socket = run.join(format!(".s.PGSQL.{PORT}"));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            bail!(
                "the socket path {} is longer than {MAX_SOCKET_PATH} bytes; choose a shorter data directory",
                socket.display()
            );
        }
        let user = ServerUser::for_this_process()?;
        user.make_reachable(&root)?;
        for dir in [&data, &run] {
            fs::create_dir_all(dir)?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
            user.take_ownership(dir)?;
        }
        let log_path = root.join("postgres.log");
        let log = fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        user.take_ownership(&log_path)?;

        if !data.join("PG_VERSION").exists() {
            let mut initdb = user.command(bin.join("initdb"));
            initdb.args(["-D".as_ref(), data.as_os_str()]);
            initdb.args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale"]);
            if durability == Durability::Throwaway {
                initdb.arg("--no-sync");
            }
            let status = initdb.stdout(log.try_clone()?).stderr(log.try_clone()?).status()?;
            if !status.success() {
                bail!("initdb failed ({status}); see {}:\n{}", log_path.display(), tail(&log_path));
            }
        }

        let mut postgres = user.command("/bin/sh");
        postgres.args(["-c", WATCHDOG, "watchdog"]).arg(bin.join("postgres"));
        postgres.args(["-D".as_ref(), data.as_os_str(), "-k".as_ref(), run.as_os_str()]);
        postgres.args(["-p", &PORT.to_string(), "-c", "listen_addresses=", "-c", "max_connections=300"]);
        if durability == Durability::Throwaway {
            postgres.args(["-c", "fsync=off", "-c", "synchronous_commit=off"]);
            postgres.args(["-c", "full_page_writes=off"]);
        }
        for setting in settings {
            postgres.args(["-c", setting]);
        }
        // Its own process group: a Ctrl-C in the terminal reaches only us, and we stop the
        // cluster after the HTTP server has drained, not at the same moment.
        postgres.process_group(0);
        let mut watchdog = postgres
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("cannot start the PostgreSQL watchdog (/bin/sh)")?;
        let owner_pipe = watchdog.stdin.take();
        let mut cluster = Cluster { root, watchdog, owner_pipe };
        cluster.wait_until_ready(&data.join("postmaster.pid"), &log_path)?;
        Ok(cluster)
    }

    /// The connection string for `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        url(&self.root, database)
    }

    /// Stops the server (fast shutdown) and waits for it to exit.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shut_down()
    }

    /// Stops the server at once, as a crash would (an immediate shutdown: every connection cut,
    /// no checkpoint, so the next start recovers from the WAL), and waits for it to exit.
    pub fn crash(mut self) -> anyhow::Result<()> {
        let pid_file = self.root.join("data/postmaster.pid");
        let pid: i32 = fs::read_to_string(&pid_file)?
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .with_context(|| format!("no postmaster pid in {}", pid_file.display()))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGQUIT)?;
        drop(self.owner_pipe.take());
        // It exits with the status of a server that did not shut down cleanly: expected here.
        self.watchdog.wait()?;
        Ok(())
    }

    fn shut_down(&mut self) -> anyhow::Result<()> {
        drop(self.owner_pipe.take());
        let status = self.watchdog.wait()?;
        // The postmaster exits with 0 after a fast shutdown; anything else was a crash.
        if !status.success() {
            bail!("PostgreSQL exited with {status}; see {}", self.root.join("postgres.log").display());
        }
        Ok(())
    }

    fn wait_until_ready(&mut self, pid_file: &Path, log_path: &Path) -> anyhow::Result<()> {
        let mut line = String::new();
        let stdout = self.watchdog.stdout.take().context("watchdog has no stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        let pid = line.trim().to_owned();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.watchdog.try_wait()? {
                bail!("PostgreSQL did not start ({status}); see {}:\n{}", log_path.display(), tail(log_path));
            }
            // The postmaster writes its pid on line 1 and its state on line 8 of postmaster.pid;
            // checking the pid ignores a stale file left by an earlier, crashed server.
            let contents = fs::read_to_string(pid_file).unwrap_or_default();
            let lines: Vec<&str> = contents.lines().collect();
            if lines.first() == Some(&pid.as_str()) && lines.get(7).map(|s| s.trim()) == Some("ready") {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("PostgreSQL did not become ready within {START_TIMEOUT:?}; see {}", log_path.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.owner_pipe.is_some()
            && let Err(error) = self.shut_down()
        {
            tracing::warn!(%error, "stopping the PostgreSQL cluster");
        }
    }
}

/// The connection string for `database` on the cluster under `root`: libpq's key/value form,
/// which tokio-postgres understands, with the socket directory as the host.
pub fn url(root: &Path, database: &str) -> String {
    let quote = |value: &str| value.replace('\\', r"\\").replace('\'', r"\'");
    format!(
        "host='{}' port={PORT} user=postgres dbname='{}'",
        quote(&socket_dir(root).to_string_lossy()),
        quote(database)
    )
}

/// Where the socket of the cluster under `root` is (for `psql -h`).
pub fn socket_dir(root: &Path) -> PathBuf {
    std::path::absolute(root).unwrap_or_else(|_| root.to_owned()).join("run")
}

/// Whether a server already runs the cluster under `root` (another process of ours owns it).
pub fn is_running(root: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket_dir(root).join(format!(".s.PGSQL.{PORT}"))).is_ok()
}

/// The OS user the server runs as: ourselves, or `postgres` when we are root.
struct ServerUser(Option<nix::unistd::User>);

impl ServerUser {
    fn for_this_process() -> anyhow::Result<ServerUser> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(ServerUser(None));
        }
        let user = nix::unistd::User::from_name("postgres")?.context(
            "PostgreSQL refuses to run as root, and there is no `postgres` user to run it as; \
             create one (e.g. `useradd --system postgres`) or run as another user",
        )?;
        Ok(ServerUser(Some(user)))
    }

    /// The server user must pass through every directory above `root` to reach its data, and a
    /// checkout in a private directory (`mktemp -d` makes them `0700`) would stop it. Open the
    /// way: passage only (`o+x`; nobody may list them), and say so.
    fn make_reachable(&self, root: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let Some(user) = &self.0 else { return Ok(()) };
        for dir in root.ancestors() {
            let metadata = fs::metadata(dir)?;
            let mode = metadata.permissions().mode();
            if metadata.uid() != user.uid.as_raw() && mode & 0o001 == 0 {
                fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o001))
                    .with_context(|| format!("cannot let the postgres user pass through {}", dir.display()))?;
                tracing::warn!(dir = %dir.display(), "let the postgres user pass through (o+x) to reach the embedded cluster");
            }
        }
        Ok(())
    }

    fn take_ownership(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(user) = &self.0 {
            chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .with_context(|| format!("cannot hand {} to the postgres user", path.display()))?;
        }
        Ok(())
    }

    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        // A working directory the server user can enter (it may not be allowed into ours).
        command.current_dir("/");
        if let Some(user) = &self.0 {
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        command
    }
}

/// The directory of `initdb` and `postgres` (and of `psql` and `pgbench`, where installed): on
/// `PATH`, else in Debian's and Ubuntu's versioned directories.
pub fn server_binaries() -> anyhow::Result<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    let on_path =
        std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect::<Vec<_>>()).unwrap_or_default();
    let mut versioned: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| dirs.filter_map(|d| d.ok()).map(|d| d.path().join("bin")).collect())
        .unwrap_or_default();
    versioned.sort_by_key(|dir| {
        let version = dir.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str());
        std::cmp::Reverse(version.and_then(|v| v.parse::<u32>().ok()))
    });
    on_path.into_iter().chain(versioned).find(|dir| has_both(dir)).context(
        "embedded mode needs the PostgreSQL server binaries (initdb, postgres), and none were found \
         on PATH or under /usr/lib/postgresql; install them (Debian/Ubuntu: `apt install postgresql`) \
         or set DATABASE_URL to use an existing server",
    )
}

/// The last lines of a log file, for an error message.
fn tail(path: &Path) -> String {
    let mut text = String::new();
    let _ = fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
