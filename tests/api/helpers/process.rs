//! The real binary, as a child process: `payments serve` and `payments gateway`.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// How long a process may take to print its ready line (embedded mode runs initdb first).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `payments` process, killed when dropped.
pub struct Process {
    child: Child,
    /// The URL from its ready line.
    pub url: String,
    /// Everything else it printed on stdout, in order (the lines before the ready line too).
    pub stdout: watch::Receiver<Vec<String>>,
    /// Its logs: every line it printed on stderr, a pipe as in production (`TEST_LOG=1` echoes them).
    pub stderr: watch::Receiver<Vec<String>>,
}

impl Process {
    /// Starts `payments <args>` with `env`, and waits for the line that starts with `ready_prefix`
    /// followed by the URL it serves.
    pub async fn start(args: &[&str], env: &[(&str, &str)], ready_prefix: &str) -> Process {
        let mut command = Command::new(env!("CARGO_BIN_EXE_payments"));
        command.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        // Only what the test passes: nothing from the environment the tests run in.
        let inherited = std::env::vars_os().map(|(var, _)| var).filter(|var| {
            let var = var.to_string_lossy();
            var.starts_with("PAYMENTS_") || var == "DATABASE_URL" || var == "GATEWAY_URL"
        });
        for var in inherited {
            command.env_remove(var);
        }
        command.envs(env.iter().copied());
        let mut child = command.spawn().expect("starting the payments binary");
        let stderr = collect_lines(
            BufReader::new(child.stderr.take().unwrap()),
            Vec::new(),
            std::env::var_os("TEST_LOG").is_some(),
        );
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut before = Vec::new();
        let url = tokio::time::timeout(READY_TIMEOUT, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(rest) = line.strip_prefix(ready_prefix) {
                    return rest.trim().to_owned();
                }
                before.push(line);
            }
            panic!("payments {args:?} exited before printing {ready_prefix:?}");
        })
        .await
        .unwrap_or_else(|_| panic!("payments {args:?} did not print {ready_prefix:?} in time"));
        let stdout = collect_lines(lines.into_inner(), before, false);
        Process { child, url, stdout, stderr }
    }

    /// The URL of its metrics, from the `metrics:` line it prints before its ready line (`serve`
    /// always; `worker` with `PAYMENTS_METRICS_BIND`).
    pub fn metrics_url(&self) -> String {
        let lines = self.stdout.borrow();
        let line = lines.iter().find_map(|line| line.strip_prefix(payments_service::startup::METRICS_AT));
        let url = line.and_then(|rest| rest.split_whitespace().next());
        url.unwrap_or_else(|| panic!("no metrics line before the ready line in {lines:?}")).to_owned()
    }

    /// The URL of the in-process mock gateway a `serve` started, from the line it prints (which
    /// may come after its ready line).
    pub async fn mock_gateway_url(&self) -> String {
        const MOCK_AT: &str = "gateway: in-process mock at ";
        let mut stdout = self.stdout.clone();
        let lines = stdout.wait_for(|lines| lines.iter().any(|line| line.starts_with(MOCK_AT))).await;
        let lines = lines.expect("serve prints where its mock gateway is");
        let line = lines.iter().find_map(|line| line.strip_prefix(MOCK_AT));
        line.and_then(|rest| rest.split_whitespace().next()).expect("a URL after the prefix").to_owned()
    }

    /// `payments serve <args>` against `database_url`, on free ports (the API's and the metrics'),
    /// with these extra variables.
    pub async fn serve(database_url: &str, gateway_url: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        let mut all = vec![
            ("DATABASE_URL", database_url),
            ("GATEWAY_URL", gateway_url),
            ("PAYMENTS_BIND", "127.0.0.1:0"),
            ("PAYMENTS_METRICS_BIND", "127.0.0.1:0"),
        ];
        all.extend_from_slice(env);
        let args: Vec<&str> = ["serve"].iter().chain(args).copied().collect();
        Process::start(&args, &all, payments_service::startup::LISTENING).await
    }

    /// `payments <args>` (a `serve` of some kind) with exactly these variables, on free ports
    /// unless they say otherwise, once it listens.
    pub async fn serve_with(args: &[&str], env: &[(&str, &str)]) -> Process {
        let mut all = vec![("PAYMENTS_BIND", "127.0.0.1:0"), ("PAYMENTS_METRICS_BIND", "127.0.0.1:0")];
        all.extend_from_slice(env);
        Process::start(args, &all, payments_service::startup::LISTENING).await
    }

    /// `payments worker` against `database_url`, with these extra variables.
    pub async fn worker(database_url: &str, gateway_url: &str, env: &[(&str, &str)]) -> Process {
        let mut all = vec![("DATABASE_URL", database_url), ("GATEWAY_URL", gateway_url)];
        all.extend_from_slice(env);
        Process::start(&["worker"], &all, payments_service::startup::WORKER_RUNNING).await
    }

    /// `payments gateway` on a free port.
    pub async fn gateway() -> Process {
        Process::start(&["gateway", "--bind", "127.0.0.1:0", "--control"], &[], "payments gateway listening on").await
    }

    /// Waits for the process to exit by itself.
    pub async fn exited(&mut self) -> ExitStatus {
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the process did not exit")
            .unwrap()
    }

    /// Whether the process is stopped (by SIGSTOP, say), as `/proc` tells.
    pub fn is_stopped(&self) -> bool {
        let pid = self.child.id().expect("still running");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
    }

    /// Waits for the process to exit by itself, then returns everything it logged.
    pub async fn logs(&mut self) -> Vec<String> {
        self.exited().await;
        // The sender goes when the pipe closes, after the last line.
        while self.stderr.changed().await.is_ok() {}
        self.stderr.borrow().clone()
    }

    /// Sends a signal (SIGTERM for a clean stop).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().expect("still running") as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }
}

/// Reads `output` to its end in a task of its own, so the pipe never fills, and keeps its lines,
/// after those already read, for the tests that look (echoing them to the test's stderr if `echo`).
fn collect_lines(
    output: impl AsyncBufRead + Unpin + Send + 'static,
    read: Vec<String>,
    echo: bool,
) -> watch::Receiver<Vec<String>> {
    let (sender, lines) = watch::channel(read);
    let mut output = output.lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = output.next_line().await {
            if echo {
                eprintln!("{line}");
            }
            sender.send_modify(|all| all.push(line));
        }
    });
    lines
}
