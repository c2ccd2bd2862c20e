//! The README read literally. Its shell lines run as a new user runs them: in a fresh
//! checkout (the files git tracks, nothing built, nothing left behind), with a new home
//! and the PATH a new shell has, each terminal a `bash` fed the README's lines one by one.
//! Under a command, `# ...` lines show its output: their pieces (split at `...`) must
//! appear in that order, and the command must end with status 0 unless the last shown
//! line says `(exit status N)`; a `# NNN` comment on the command's own line is the HTTP
//! status `curl` must print. The walkthrough runs twice in the same checkout, so its way
//! of starting again clean is tested too.
//!
//! `cargo` in that shell is a stand-in: `cargo run --release -- ARGS` and `cargo install
//! --locked --path .` put the binary this suite built where the real ones leave it and run
//! it (CI makes no release build, which would add the minutes the README states).
//! Any other cargo command fails, so the README cannot drift to a form this does not model.
//! `python3`, `curl`, `kill`, `rm` and the proxy are the real ones.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

/// One command of a shell block (continuation lines joined, as the shell joins them),
/// with the output the README shows under it.
#[derive(Debug, Clone)]
struct Line {
    text: String,
    shown: Vec<String>,
}

impl Line {
    /// The HTTP status a `# NNN ...` comment on the command's own line promises.
    fn http_status(&self) -> Option<&str> {
        let (_, comment) = self.text.rsplit_once("  # ")?;
        let code = comment.get(..3)?;
        code.bytes().all(|b| b.is_ascii_digit()).then_some(code)
    }

    /// The exit status the shown output ends with, `(exit status N)`, else 0.
    fn exit_status(&self) -> i32 {
        self.shown
            .last()
            .and_then(|line| line.trim_end().strip_suffix(')'))
            .and_then(|line| line.rsplit_once("(exit status "))
            .map_or(0, |(_, status)| status.parse().unwrap())
    }

    /// The pieces of the shown output, in order.
    fn shown_pieces(&self) -> Vec<String> {
        let mut pieces = Vec::new();
        for line in &self.shown {
            let line = match line.trim_end().rsplit_once("(exit status ") {
                Some((before, _)) => before,
                None => line,
            };
            pieces.extend(
                line.split("...")
                    .map(str::trim)
                    .filter(|piece| !piece.is_empty())
                    .map(str::to_owned),
            );
        }
        pieces
    }

    /// Runs the proxy in the foreground until Ctrl-C.
    fn is_the_proxy(&self) -> bool {
        self.text.starts_with("cargo run --release -- run ")
    }
}

/// A ```sh block: the terminal its first line names (`# terminal N`), its commands, the
/// section it is in and the prose just before it.
#[derive(Debug, Clone)]
struct Block {
    terminal: Option<u8>,
    lines: Vec<Line>,
    section: String,
    prose_before: String,
}

impl Block {
    fn text(&self) -> String {
        let lines: Vec<&str> = self.lines.iter().map(|line| line.text.as_str()).collect();
        lines.join("\n")
    }
}

fn shell_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut section = String::new();
    let mut prose = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading.to_owned();
        }
        let fence = line.trim_start();
        if fence.starts_with("```") && fence != "```sh" {
            // Another language's block: skipped whole.
            for inner in lines.by_ref() {
                if inner.trim_start() == "```" {
                    break;
                }
            }
            continue;
        }
        if fence != "```sh" {
            prose.push_str(line);
            prose.push('\n');
            continue;
        }
        let indent = line.len() - fence.len();
        let mut block = Block {
            terminal: None,
            lines: Vec::new(),
            section: section.clone(),
            prose_before: std::mem::take(&mut prose),
        };
        let mut continued = false;
        for inner in lines.by_ref() {
            if inner.trim_start() == "```" {
                break;
            }
            let inner = inner.get(indent..).unwrap_or(inner.trim_start());
            if continued {
                let last = block.lines.last_mut().unwrap();
                last.text.push('\n');
                last.text.push_str(inner);
            } else if let Some(comment) = inner.strip_prefix('#') {
                let comment = comment.trim();
                match comment.strip_prefix("terminal ") {
                    Some(number) if block.lines.is_empty() && block.terminal.is_none() => {
                        block.terminal = Some(number.parse().expect("# terminal N"));
                    }
                    _ => block
                        .lines
                        .last_mut()
                        .unwrap_or_else(|| panic!("a shown output before any command: {inner}"))
                        .shown
                        .push(comment.to_owned()),
                }
            } else {
                block.lines.push(Line {
                    text: inner.to_owned(),
                    shown: Vec::new(),
                });
            }
            continued = inner.ends_with('\\');
        }
        blocks.push(block);
    }
    blocks
}

/// The inline code spans of the README's prose, whitespace made one space.
fn inline_spans(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The inline spans that are commands: a program the README's reader has, and arguments.
fn inline_commands(text: &str) -> Vec<String> {
    const PROGRAMS: [&str; 7] = [
        "cargo ",
        "dedupe-proxy ",
        "target/",
        "docker ",
        "kubectl ",
        "python3 ",
        "curl ",
    ];
    inline_spans(text)
        .into_iter()
        .filter(|span| span.contains(' ') && PROGRAMS.iter().any(|p| span.starts_with(p)))
        .collect()
}

/// The proxy's flags (`--name`) a command names: a `cargo ... --` command's after `--`.
fn flags_of(command: &str) -> Vec<String> {
    let own = match command.split_once(" -- ") {
        Some((_, after)) if command.starts_with("cargo ") => after,
        _ if command.starts_with("cargo ") => "",
        _ => command,
    };
    own.split_whitespace()
        .filter_map(|word| word.strip_prefix("--"))
        .map(|name| name.trim_end_matches(|c: char| !c.is_alphanumeric()))
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A copy of the files git tracks: the checkout a new user clones.
fn fresh_checkout(into: &Path) {
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .expect("git lists the tracked files");
    assert!(listed.status.success(), "git ls-files failed");
    for name in listed.stdout.split(|byte| *byte == 0) {
        let name = std::str::from_utf8(name).unwrap();
        let from = root().join(name);
        if name.is_empty() || !from.is_file() {
            continue;
        }
        let to = into.join(name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&from, &to).unwrap();
    }
}

/// A new user's home: rustup's `~/.cargo/bin` on the PATH, holding the `cargo` stand-in.
fn new_home(into: &Path) -> PathBuf {
    let bin = into.join(".cargo/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let stand_in = format!(
        "#!/bin/sh\n\
         # The README test's cargo: the binary the suite built, where the real cargo leaves it.\n\
         built='{built}'\n\
         case \"$*\" in\n\
         \"run --release -- \"*)\n\
         \x20 shift 3\n\
         \x20 mkdir -p target/release && ln -sf \"$built\" target/release/dedupe-proxy\n\
         \x20 exec target/release/dedupe-proxy \"$@\" ;;\n\
         \"install --locked --path .\")\n\
         \x20 mkdir -p target/release && ln -sf \"$built\" target/release/dedupe-proxy\n\
         \x20 ln -sf \"$built\" \"$HOME/.cargo/bin/dedupe-proxy\" ;;\n\
         *) echo \"the README test's cargo does not model: cargo $*\" >&2; exit 101 ;;\n\
         esac\n",
        built = support::binary_path().display()
    );
    let cargo = bin.join("cargo");
    std::fs::write(&cargo, stand_in).unwrap();
    let status = Command::new("chmod")
        .arg("+x")
        .arg(&cargo)
        .status()
        .unwrap();
    assert!(status.success());
    bin
}

/// One terminal: a shell in the checkout, fed lines as a user types them; what it prints
/// (both streams, as a terminal shows them) kept whole.
struct Terminal {
    number: u8,
    shell: Child,
    input: Option<ChildStdin>,
    output: Arc<Mutex<String>>,
    sent: usize,
    /// Where the output of the program left running in the foreground starts, and its
    /// status line's number.
    foreground: Option<(usize, usize)>,
    closed: bool,
    watchdog: Child,
}

const STATUS_MARK: &str = "@@readme-status";

impl Terminal {
    fn open(number: u8, checkout: &Path, home: &Path) -> Terminal {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let mut command = Command::new("bash");
        command
            .env_clear()
            .env("HOME", home)
            .env(
                "PATH",
                format!("{}/.cargo/bin:/usr/local/bin:/usr/bin:/bin", home.display()),
            )
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb")
            .current_dir(checkout)
            .stdin(Stdio::piped())
            .stdout(writer.try_clone().unwrap())
            .stderr(writer);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut shell = command.spawn().expect("bash starts");
        drop(command);
        // Should this test's process die without unwinding (a CI timeout, Ctrl-C), what
        // the terminal started goes too, rather than keep the walkthrough's ports.
        let group = shell.id();
        let watchdog = format!(
            "while kill -0 {} && kill -0 -- -{group}; do sleep 1; done 2>/dev/null; \
             kill -KILL -- -{group} 2>/dev/null",
            std::process::id()
        );
        let watchdog = Command::new("bash")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("bash starts");
        let output = Arc::new(Mutex::new(String::new()));
        let kept = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(read) = reader.read(&mut chunk) {
                if read == 0 {
                    break;
                }
                kept.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&chunk[..read]));
            }
        });
        let input = shell.stdin.take();
        Terminal {
            number,
            shell,
            input,
            output,
            sent: 0,
            foreground: None,
            closed: false,
            watchdog,
        }
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Types `line`, then a line that prints its status once it ends; returns where its
    /// output starts and the status line's number.
    fn type_line(&mut self, line: &str) -> (usize, usize) {
        let from = self.output.lock().unwrap().len();
        self.sent += 1;
        let input = self.input.as_mut().expect("the terminal is open");
        writeln!(input, "{line}").unwrap();
        writeln!(input, "printf '\\n{STATUS_MARK} {} %d\\n' $?", self.sent).unwrap();
        input.flush().unwrap();
        (from, self.sent)
    }

    /// Waits until `pieces` appear, in order, in the output after `from`: while the
    /// `number`th line typed runs (a background job may print after it ends).
    fn wait_for(&self, from: usize, number: usize, pieces: &[String], what: &str) {
        let start = Instant::now();
        let mark = format!("{STATUS_MARK} {number} ");
        let mut ended = false;
        loop {
            let output = self.output();
            let mut rest = output.get(from..).unwrap_or("");
            let missing = pieces.iter().find(|piece| match rest.find(piece.as_str()) {
                Some(at) => {
                    rest = &rest[at + piece.len()..];
                    false
                }
                None => true,
            });
            let Some(missing) = missing else { return };
            assert!(
                !ended && start.elapsed() < Duration::from_secs(60),
                "terminal {}: `{what}` did not print `{missing}`; it printed:\n{}",
                self.number,
                output.get(from..).unwrap_or("")
            );
            // Once it has ended, one more look: what it printed last may follow the mark.
            ended = output.get(from..).unwrap_or("").contains(&mark) && !what.ends_with('&');
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The status of the `number`th line typed, once it has ended.
    fn status(&self, from: usize, number: usize, what: &str) -> i32 {
        let mark = format!("{STATUS_MARK} {number} ");
        let start = Instant::now();
        loop {
            let output = self.output();
            if let Some((_, after)) = output.get(from..).unwrap_or("").split_once(&mark) {
                return after.lines().next().unwrap().trim().parse().unwrap();
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "terminal {}: `{what}` did not end; it printed:\n{}",
                self.number,
                output.get(from..).unwrap_or("")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a README line as the README says it behaves. The proxy is left running.
    fn run(&mut self, line: &Line) -> String {
        let (from, number) = self.type_line(&line.text);
        self.wait_for(from, number, &line.shown_pieces(), &line.text);
        if line.is_the_proxy() {
            self.wait_for(from, number, &["dedupe-proxy ready".to_owned()], &line.text);
            self.foreground = Some((from, number));
            return String::new();
        }
        let status = self.status(from, number, &line.text);
        let printed = self.output()[from..].to_owned();
        assert_eq!(
            status,
            line.exit_status(),
            "terminal {}: `{}` ended with status {status}:\n{printed}",
            self.number,
            line.text
        );
        if let Some(code) = line.http_status() {
            assert!(
                printed.contains(&format!("HTTP/1.1 {code} ")),
                "terminal {}: `{}` did not answer {code}:\n{printed}",
                self.number,
                line.text
            );
        }
        printed
    }

    /// Ctrl-C: SIGINT to the program left running in the foreground, which must end
    /// with status 0 (the proxy shuts down cleanly).
    fn ctrl_c(&mut self) {
        let (from, number) = self
            .foreground
            .take()
            .expect("a program runs in the foreground");
        let status = Command::new("kill")
            .args(["-INT", "--", &format!("-{}", self.shell.id())])
            .status()
            .unwrap();
        assert!(status.success());
        let status = self.status(from, number, "Ctrl-C");
        assert_eq!(status, 0, "{}", &self.output()[from..]);
    }

    fn close(mut self) -> String {
        drop(self.input.take());
        let start = Instant::now();
        while self.shell.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "terminal {}'s shell did not end:\n{}",
                self.number,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.closed = true;
        self.output()
    }
}

impl Drop for Terminal {
    /// Whatever a failed test left running there ends with it.
    fn drop(&mut self) {
        if !self.closed {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.shell.id())])
                .stderr(Stdio::null())
                .status();
            let _ = self.shell.wait();
        }
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

/// The walkthrough's blocks, in order, and where it ends.
fn walkthrough(blocks: &[Block]) -> Vec<Block> {
    let steps: Vec<Block> = blocks
        .iter()
        .filter(|block| block.section.contains("walkthrough"))
        .cloned()
        .collect();
    assert!(
        steps.len() >= 6,
        "the walkthrough has its steps: {steps:#?}"
    );
    for step in &steps {
        assert!(
            step.terminal.is_some(),
            "each walkthrough block opens with `# terminal N`: {step:#?}"
        );
    }
    steps
}

/// The user's part between blocks: Ctrl-C in terminal 1 where the prose says so.
fn follow(block: &Block, terminals: &mut BTreeMap<u8, Terminal>) {
    if block.prose_before.contains("Ctrl-C in terminal 1") {
        terminals.get_mut(&1).expect("terminal 1 is open").ctrl_c();
    }
}

fn run_block(
    block: &Block,
    terminals: &mut BTreeMap<u8, Terminal>,
    checkout: &Path,
    home: &Path,
) -> Vec<String> {
    let number = block.terminal.unwrap_or(2);
    let terminal = terminals
        .entry(number)
        .or_insert_with(|| Terminal::open(number, checkout, home));
    block.lines.iter().map(|line| terminal.run(line)).collect()
}

/// Whether what the walkthrough needs is here: the programs it runs, a git checkout to
/// copy, and its ports free (a walkthrough still running, or an app on 8080, would answer).
fn walkthrough_can_run() -> bool {
    let programs = [
        ("python3", "--version"),
        ("curl", "--version"),
        ("git", "--version"),
    ];
    if !programs
        .iter()
        .all(|(program, flag)| support::installed(program, program, &[flag]))
    {
        return false;
    }
    if !root().join(".git").exists() {
        eprintln!("skipped: not a git checkout, so there is no fresh checkout to copy");
        return false;
    }
    for port in [8080, 8081, 9091] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} is taken: the README's walkthrough needs it (is one still running?)"
        );
    }
    true
}

#[test]
fn the_walkthrough_runs_as_written_twice_in_a_row_from_a_fresh_checkout() {
    if !walkthrough_can_run() {
        return;
    }
    let text = readme();
    let blocks = shell_blocks(&text);
    let steps = walkthrough(&blocks);
    let last = steps.last().unwrap();
    assert!(
        last.text().contains("rm -rf dedupe-data"),
        "the walkthrough ends by starting clean: {last:#?}"
    );
    let commands = inline_commands(&text);
    let install = commands
        .iter()
        .find(|command| command.starts_with("cargo install"))
        .expect("the README says how to put dedupe-proxy on the PATH");
    let idempotency = blocks
        .iter()
        .find(|block| block.text().contains("Idempotency-Key"))
        .expect("the idempotency-key example");
    // Every shell block is run here (the first of the two commands is step 1's), or is
    // the test command, which CI runs itself (.ci/run).
    let unrun: Vec<&Block> = blocks
        .iter()
        .filter(|block| {
            !block.section.contains("walkthrough")
                && block.text() != idempotency.text()
                && block.text() != "cargo run --release -- run -c config/example.yaml"
                && block.text() != "tests/setup && cargo test"
        })
        .collect();
    assert!(
        unrun.is_empty(),
        "README blocks this test does not run: {unrun:#?}"
    );
    let idempotency_proxy = commands
        .iter()
        .find(|command| command.contains("config/idempotency-key.yaml"))
        .expect("the idempotency-key example says how to run it");

    let dir = tempfile::tempdir().unwrap();
    let checkout = dir.path().join("dedupe-proxy");
    let home = dir.path().join("home");
    fresh_checkout(&checkout);
    new_home(&home);

    for round in 1..=2 {
        let mut terminals = BTreeMap::new();
        for (index, step) in steps.iter().enumerate() {
            if index == steps.len() - 1 && round == 1 {
                // The README's other commands, with the walkthrough's proxy to answer.
                run_inline_commands(&commands, install, terminals.get_mut(&2).unwrap());
            }
            follow(step, &mut terminals);
            run_block(step, &mut terminals, &checkout, &home);
        }
        let printed = terminals.remove(&2).unwrap().close();
        assert_eq!(
            printed.matches("app did the work for evt_1").count(),
            1,
            "round {round}: the app did evt_1's work once:\n{printed}"
        );
        assert_eq!(printed.matches("app did the work for evt_2").count(), 1);
        terminals.remove(&1).unwrap().close();
        assert!(
            !checkout.join("dedupe-data").exists(),
            "round {round} left its keys behind"
        );
    }

    // The idempotency-key example, on the walkthrough's app.
    let mut terminals = BTreeMap::new();
    let proxy = Line {
        text: idempotency_proxy.clone(),
        shown: Vec::new(),
    };
    terminals
        .entry(1)
        .or_insert_with(|| Terminal::open(1, &checkout, &home))
        .run(&proxy);
    let app = steps
        .iter()
        .find(|step| step.text().starts_with("python3 examples/app.py"))
        .unwrap();
    run_block(app, &mut terminals, &checkout, &home);
    let answers = run_block(idempotency, &mut terminals, &checkout, &home);
    assert!(
        answers[2]
            .to_lowercase()
            .contains("idempotent-replayed: true"),
        "the second payment is the first one's answer again:\n{}",
        answers[2]
    );
    follow(last, &mut terminals);
    run_block(last, &mut terminals, &checkout, &home);
    let printed = terminals.remove(&2).unwrap().close();
    assert_eq!(
        printed.matches("app did the work for").count(),
        1,
        "one payment was made:\n{printed}"
    );
}

/// The README's inline commands other than the walkthrough's: `cargo install`, then each
/// `dedupe-proxy ...` on the PATH it gives, each `target/...` and `cargo run` as written.
/// Those that need what this machine has not (a container engine, a cluster), and the
/// suite itself, are named here, with why.
fn run_inline_commands(commands: &[String], install: &str, terminal: &mut Terminal) {
    terminal.run(&Line {
        text: install.to_owned(),
        shown: Vec::new(),
    });
    for command in commands {
        if command == install || command.starts_with("cargo run --release -- run ") {
            continue;
        }
        if command == "cargo test" {
            // The suite this test is part of: CI runs it (.ci/run).
            continue;
        }
        if command.starts_with("docker ") || command.starts_with("kubectl ") {
            // No container engine or cluster here: tests/it/deploy.rs runs what the image
            // runs, and deploy/validate checks the manifests.
            continue;
        }
        // No key of the walkthrough is held: the API refuses, and the CLI says why.
        let shown = if command.contains("keys resolve") {
            vec!["not_held, HTTP 409 (exit status 1)".to_owned()]
        } else {
            Vec::new()
        };
        let printed = terminal.run(&Line {
            text: command.clone(),
            shown,
        });
        if command.ends_with(" demo") {
            // What the README says the demo's table ends with.
            let rows = printed.split_whitespace().collect::<Vec<_>>().join(" ");
            for row in [
                "upstream executions 200",
                "extra executions 0",
                "events lost 0",
            ] {
                assert!(rows.contains(row), "the demo's table: {printed}");
            }
        }
    }
}

/// Every flag the README names is one the binary takes.
#[test]
fn every_flag_the_readme_names_is_the_binarys() {
    use clap::CommandFactory;
    fn flags(command: &clap::Command, into: &mut Vec<String>) {
        for argument in command.get_arguments() {
            into.extend(argument.get_long().map(str::to_owned));
        }
        for sub in command.get_subcommands() {
            flags(sub, into);
        }
    }
    let mut known = vec!["help".to_owned(), "version".to_owned()];
    flags(&dedupe_proxy::cli::Cli::command(), &mut known);
    let text = readme();
    let in_blocks = shell_blocks(&text)
        .into_iter()
        .flat_map(|block| block.lines)
        .map(|line| line.text);
    let unknown: Vec<String> = inline_spans(&text)
        .into_iter()
        .chain(in_blocks)
        .filter(|command| {
            !["curl ", "pay ", "docker ", "kubectl "]
                .iter()
                .any(|p| command.starts_with(p))
        })
        .flat_map(|command| flags_of(&command))
        .filter(|flag| !known.contains(flag))
        .collect();
    assert!(
        unknown.is_empty(),
        "flags the binary does not take: {unknown:?}"
    );
}
