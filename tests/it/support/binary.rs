//! The real binary, started as a child process, its JSON log read as it runs.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The real `dedupe-proxy` binary, started on a configuration file.
pub struct Binary {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
}

pub fn binary_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_dedupe-proxy"))
}

/// The proxy's and the admin port's addresses, if `line` is the ready line: a JSON one,
/// or a text one (`... dedupe-proxy ready proxy=ADDR admin=ADDR`).
fn ready_addresses(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    if let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) {
        if entry["fields"]["message"] != "dedupe-proxy ready" {
            return None;
        }
        let address = |name: &str| entry["fields"][name].as_str()?.parse().ok();
        return Some((address("proxy")?, address("admin")?));
    }
    let (_, fields) = line.split_once("dedupe-proxy ready ")?;
    let address = |name: &str| {
        fields
            .split(' ')
            .find_map(|field| field.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Some((address("proxy")?, address("admin")?))
}

impl Binary {
    /// Starts `dedupe-proxy run -c config --log-format json` and waits until it is ready.
    pub fn start(config: &Path) -> Binary {
        Binary::start_with_env(config, &[])
    }

    pub fn start_with_env(config: &Path, env: &[(&str, &str)]) -> Binary {
        let args = [
            "run".into(),
            "-c".into(),
            config.display().to_string(),
            "--log-format".into(),
            "json".into(),
        ];
        Binary::spawn(&args, env)
    }

    /// Starts the binary with exactly these arguments and environment, and waits until it
    /// logs that it is ready.
    pub fn spawn(args: &[String], env: &[(&str, &str)]) -> Binary {
        Binary::spawn_wrapped(&[], args, env)
    }

    /// Like [`Binary::spawn`], with the binary run by `wrapper` (a program and its
    /// arguments, the binary's path and `args` after them): `prlimit --nofile=...`, say.
    pub fn spawn_wrapped(wrapper: &[&str], args: &[String], env: &[(&str, &str)]) -> Binary {
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(binary_path());
                command
            }
            None => Command::new(binary_path()),
        };
        let mut child = command
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                env.iter()
                    .find(|(name, _)| *name == "RUST_LOG")
                    .map_or("info", |(_, value)| value),
            )
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let ready = ready_addresses(&line);
                // Logged before it is announced, so that a caller reading the log once
                // the binary is ready finds the ready line in it.
                lines.lock().unwrap().push(line);
                if let Some(addresses) = ready {
                    let _ = ready_tx.send(addresses);
                }
            }
        });
        let (addr, admin) = match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addresses) => addresses,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the binary did not become ready; log:\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        };
        Binary {
            child,
            addr,
            admin,
            log,
        }
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, up to `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "the binary did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The first JSON log line whose message is `message`.
    pub fn log_entry(&self, message: &str) -> Option<serde_json::Value> {
        // The log is read from the process's stderr by a thread of its own: a line the
        // process has just written (a delivery's, as its answer goes out) may not be read
        // yet, so it is waited for, up to 5 s.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found = self
                .log
                .lock()
                .unwrap()
                .iter()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .find(|entry| entry["fields"]["message"] == message);
            if found.is_some() || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
