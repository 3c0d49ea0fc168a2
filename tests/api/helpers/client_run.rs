//! `payments pay` and `payments refund` as a script runs them: what they print, and how they end.

use serde_json::Value;
use tokio::process::Command;

use super::TestApp;

/// What a run printed, and how it ended.
pub struct ClientRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl ClientRun {
    /// `payments <command> <args>` against `app` (its first `--url`) with its API key
    /// (`--api-key` in `args` overrides it).
    pub async fn of(app: &TestApp, command: &str, args: &[&str]) -> ClientRun {
        let mut run = Command::new(env!("CARGO_BIN_EXE_payments"));
        run.args([command, "--url", &app.address]).args(args).env("PAYMENTS_API_KEY", &app.api_key);
        let output = run.output().await.expect("running payments");
        ClientRun {
            code: output.status.code().expect("exited"),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    pub fn body(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|_| panic!("stdout is one JSON body: {}", self.stdout))
    }

    /// The attempt lines on stderr.
    pub fn attempts(&self) -> Vec<&str> {
        self.stderr.lines().filter(|line| line.starts_with("attempt ")).collect()
    }

    /// The key a run that gave up printed, to resume with.
    pub fn key_to_resume(&self) -> String {
        let key = self.stderr.split("--key ").nth(1).and_then(|rest| rest.split_whitespace().next());
        key.unwrap_or_else(|| panic!("no key printed: {}", self.stderr)).to_owned()
    }
}
