//! The processes the benchmark starts: this very binary in another role (`serve`, `gateway`,
//! `bench-endpoint`, `migrate`, `accounts create`), as a user would start them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// How long a process may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a process may take to stop after SIGTERM before it is killed. `serve` drains its
/// requests and lets its workers finish what they are on, which takes well under this.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running child process. Dropped without [`Child::stop`] (on an error, say), it is killed.
pub struct Child {
    name: String,
    child: tokio::process::Child,
    log: PathBuf,
    /// What its ready line said after the prefix: the address it serves.
    pub address: String,
}

/// `payments <args>`, with exactly `env` among the variables the service reads (none is inherited
/// from the benchmark's environment).
pub fn payments(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Command> {
    let mut command = Command::new(this_binary()?);
    // Named as a user would have started it, in `ps` and in its own `argv[0]`.
    command.arg0("payments").args(args).stdin(Stdio::null()).kill_on_drop(true);
    for (var, _) in std::env::vars_os() {
        let name = var.to_string_lossy();
        if name.starts_with("PAYMENTS_") || ["DATABASE_URL", "GATEWAY_URL", "RUST_LOG"].contains(&name.as_ref()) {
            command.env_remove(&var);
        }
    }
    command.envs(env.iter().copied());
    die_with_this_process(&mut command);
    Ok(command)
}

/// On Linux, the child is killed when this process dies, however it dies: a run stopped with
/// Ctrl-C or killed by a CI timeout leaves no `serve` behind, not even one it had frozen with
/// `SIGSTOP` (which would never act on a gentler signal).
#[cfg(target_os = "linux")]
fn die_with_this_process(command: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec, and makes one system call
    // (prctl), which is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_this_process(_command: &mut Command) {}

impl Child {
    /// Starts `command`, with its logs (stderr) going to `log`, and waits for the line on its
    /// stdout that starts with `ready`.
    pub async fn start(name: &str, mut command: Command, log: &Path, ready: &str) -> anyhow::Result<Child> {
        let log_file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        command.stdout(Stdio::piped()).stderr(log_file);
        let mut child = command.spawn().with_context(|| format!("starting {name}"))?;
        let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        let address = tokio::time::timeout(READY_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix(ready) {
                    return Ok(Some(rest.trim().to_owned()));
                }
            }
            Ok::<_, std::io::Error>(None)
        })
        .await;
        let address = match address {
            Ok(Ok(Some(address))) => address,
            Ok(Ok(None) | Err(_)) => bail!("{name} exited before it was ready; its log:\n{}", tail(log)),
            Err(_) => bail!("{name} was not ready within {READY_TIMEOUT:?}; its log:\n{}", tail(log)),
        };
        // Whatever else it prints is read and dropped, so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Child { name: name.to_owned(), child, log: log.to_owned(), address })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills it with SIGKILL, as a crash would, and waits for it to be gone.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().await.with_context(|| format!("killing {}", self.name))
    }

    /// Sends it a signal (`SIGSTOP` to freeze it, as a stalled machine would; `SIGCONT` to thaw it).
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = self.child.id().with_context(|| format!("{} has exited", self.name))?;
        kill(Pid::from_raw(pid as i32), signal).with_context(|| format!("signalling {}", self.name))
    }

    /// Whether it has exited by itself (aborted at a crash point, say).
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops it cleanly: SIGTERM, then a wait; killed if it takes longer than [`STOP_TIMEOUT`].
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) if status.as_ref().is_ok_and(|status| status.success()) => Ok(()),
            Ok(status) => bail!("{} exited with {:?} on SIGTERM; its log:\n{}", self.name, status?, tail(&self.log)),
            Err(_) => {
                self.child.kill().await?;
                bail!("{} did not stop within {STOP_TIMEOUT:?} of SIGTERM, and was killed", self.name)
            }
        }
    }
}

/// This very binary, even if it has been rebuilt since it started: on Linux `/proc/self/exe`,
/// which names the running file itself, so that a process restarted mid-run is the same build
/// as the rest (`current_exe` would name whatever is at that path now, or nothing).
fn this_binary() -> anyhow::Result<PathBuf> {
    let running = Path::new("/proc/self/exe");
    match running.exists() {
        true => Ok(running.to_owned()),
        false => std::env::current_exe().context("finding this binary"),
    }
}

/// Runs `command` to its end and returns its stdout; an error, with its stderr, if it failed.
pub async fn output(name: &str, mut command: Command) -> anyhow::Result<String> {
    let output = command.output().await.with_context(|| format!("running {name}"))?;
    if !output.status.success() {
        bail!("{name} failed ({}):\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The last lines of a log, for an error message.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
