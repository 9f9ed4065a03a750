//! Server processes that cannot outlive the test process.
//!
//! Statics are never dropped in Rust, and a test binary may also die by panic, abort or SIGKILL, so "kill in
//! Drop" is not enough. Each server is started under a tiny `sh` watchdog whose stdin is a pipe from the test
//! process: the kernel closes that pipe however the test process ends, the watchdog reads EOF and stops the
//! server (SIGTERM, then SIGKILL after a grace period). This needs no `unsafe` (no `pre_exec`/`prctl`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::Error;

// Background jobs of a non-interactive shell get /dev/null as stdin, so the lifeline pipe is kept on fd 3.
const WATCHDOG: &str = r#"
log="$1"; shift
exec 3<&0
"$@" </dev/null 3<&- >>"$log" 2>&1 &
pid=$!
echo "$pid" >"$log.pid"
# EOF on the lifeline: the test process is gone, or asked us to stop the server.
( cat <&3 >/dev/null; kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL "$pid" 2>/dev/null ) &
exec 3<&-
wait "$pid"
"#;

/// A server process under a watchdog.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    log: PathBuf,
    watchdog: Child,
    lifeline: Option<ChildStdin>,
}

impl Supervised {
    /// Starts `program args...`, appending its stdout and stderr to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> Result<Self, Error> {
        let start_err = |source| Error::StartProcess {
            name: name.to_owned(),
            source,
        };
        let log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(start_err)?;
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(log)
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            // Never inherit the test's stdout: a pipe reader (e.g. `| tee` in CI) would wait for the watchdog.
            .stdout(Stdio::from(log_file.try_clone().map_err(start_err)?))
            .stderr(Stdio::from(log_file))
            .spawn()
            .map_err(start_err)?;
        let mut this = Self {
            name: name.to_owned(),
            log: log.to_owned(),
            watchdog,
            lifeline: None,
        };
        this.lifeline = this.watchdog.stdin.take();
        Ok(this)
    }

    /// `Some(status)` once the server has exited on its own.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.watchdog.try_wait().ok().flatten()
    }

    /// The last `max` bytes of the server's log, for error messages.
    pub fn log_tail(&self, max: u64) -> String {
        log_tail(&self.log, max)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's process id (the watchdog's child), once the watchdog has recorded it.
    pub fn pid(&self) -> Option<u32> {
        for _ in 0..50 {
            if let Some(pid) = std::fs::read_to_string(pid_file(&self.log))
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                return Some(pid);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the server with SIGKILL, as the OOM killer or a node failure would; the watchdog then exits with
    /// the server's status.
    pub fn kill(&mut self) -> Result<(), Error> {
        let name = self.name.clone();
        let error = |reason: String| Error::KillProcess {
            name: name.clone(),
            reason,
        };
        let pid = self
            .pid()
            .ok_or_else(|| error("its process id was never recorded".to_owned()))?;
        if self.exited().is_some() {
            return Err(error("it has already exited".to_owned()));
        }
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .map_err(|e| error(e.to_string()))?;
        if status.success() {
            Ok(())
        } else {
            Err(error(format!("kill -KILL {pid}: {status}")))
        }
    }

    /// Stops the server and waits (bounded) for it to exit.
    pub fn stop(&mut self) {
        self.lifeline.take();
        for _ in 0..100 {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where the watchdog records the server's process id: beside its log.
fn pid_file(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".pid");
    PathBuf::from(name)
}

/// The last `max` bytes of a log, without the flag dump Kubernetes components print at start-up (it would
/// push the actual error out of the tail).
pub fn log_tail(path: &Path, max: u64) -> String {
    let text = read_tail(path, max * 8);
    let lines: Vec<&str> = text.lines().filter(|l| !l.contains("] FLAG: --")).collect();
    let joined = lines.join("\n");
    let start = joined.len().saturating_sub(max as usize);
    let start = (start..joined.len())
        .find(|&i| joined.is_char_boundary(i))
        .unwrap_or(0);
    joined[start..].to_owned()
}

fn read_tail(path: &Path, max: u64) -> String {
    read_from(path, file_len(path).saturating_sub(max))
        .unwrap_or_else(|| format!("(no log at {})", path.display()))
}

/// The length of the file at `path` now (0 when it cannot be read): where a later [`read_from`] starts.
pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

/// What the file at `path` holds from byte `offset` on (a log's part written since), `None` when it cannot be
/// opened.
pub fn read_from(path: &Path, offset: u64) -> Option<String> {
    let mut file = File::open(path).ok()?;
    let _ = file.seek(SeekFrom::Start(offset));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Removes `dir` once the test process has gone and its servers had time to stop, unless
/// `ARC_RS_KEEP_CONTROL_PLANE=1` asks to keep it (its logs help when debugging).
pub fn remove_dir_when_process_exits(dir: &Path) -> Result<ChildStdin, Error> {
    let keep = std::env::var("ARC_RS_KEEP_CONTROL_PLANE").is_ok_and(|v| v == "1");
    let script = if keep {
        r#"cat >/dev/null"#
    } else {
        r#"cat >/dev/null; sleep 6; rm -rf "$1""#
    };
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("cleanup")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|source| Error::StartProcess {
            name: "cleanup".to_owned(),
            source,
        })?;
    child.stdin.take().ok_or_else(|| Error::StartProcess {
        name: "cleanup".to_owned(),
        source: std::io::Error::other("no stdin pipe"),
    })
}
