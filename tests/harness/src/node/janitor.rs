//! Teardown of a node that leaves nothing behind, however the test ends.
//!
//! The janitor is a small `sh` process started before anything else of the node, holding a pipe from the
//! test process (the same lifeline as [`crate::process`]): when the pipe closes (the node is dropped, the test
//! panics, or the test process dies), it stops every process of the node and removes what the kubelet and
//! containerd left on the host. [`leftovers`] then checks that nothing is left.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::Error;

/// Where containerd's runc shims put their sockets, whatever containerd's own state directory is.
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";

/// `$1` node directory, `$2` cgroup root (`/name`), `$3` containerd socket, `$4` bridge name, `$5` `keep` to
/// keep the logs, then host directories that did not exist before the node started (removed when empty, or
/// for `/var/lib/kubelet` when no other kubelet runs).
const SCRIPT: &str = r#"
dir="$1"; cgroup="$2"; sock="$3"; bridge="$4"; keep="$5"; shift 5
cat >/dev/null
pid_of() { [ -f "$dir/$1.log.pid" ] && cat "$dir/$1.log.pid"; }
# The kubelet first, so it restarts nothing; the scheduler with it.
for name in kubelet kube-scheduler; do
  p="$(pid_of "$name")"; [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
done
# The shims' sockets, named in the task state, are in /run/containerd/s, which every containerd shares.
# One line per file: the files have no trailing newline, and the containers of a pod share their shim.
sockets="$(for f in "$dir"/containerd/state/io.containerd.runtime.v2.task/*/*/address; do
  [ -f "$f" ] && sed 's|^unix://||' "$f" && echo; done | sort -u)"
# Shims outlive containerd by design; containers live in the node's cgroups.
i=0
while [ $i -lt 50 ]; do
  left=0
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q -- "-address $sock "; then
      kill -KILL "${p#/proc/}" 2>/dev/null; left=1
    fi
  done
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h${cgroup#/}" ] || continue
    for f in $(find "$h${cgroup#/}" -name cgroup.procs 2>/dev/null); do
      for p in $(cat "$f" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; left=1; done
    done
  done
  [ $left = 0 ] && break
  i=$((i + 1)); sleep 0.2
done
p="$(pid_of containerd)"; [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
# Wait (bounded) for the node's own processes to be gone before unmounting.
i=0
while [ $i -lt 50 ]; do
  busy=0
  for name in kubelet kube-scheduler containerd; do
    p="$(pid_of "$name")"; [ -n "$p" ] && [ -d "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null && busy=1
  done
  [ $busy = 0 ] && break
  i=$((i + 1)); sleep 0.1
done
for round in 1 2 3; do
  awk '{print $5}' /proc/self/mountinfo | grep -e "^$dir/" -e "^$dir\$" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2- |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done
for h in /sys/fs/cgroup/*/; do
  [ -d "$h${cgroup#/}" ] && find "$h${cgroup#/}" -depth -type d -exec rmdir {} \; 2>/dev/null
done
for s in $sockets; do rm -f "$s"; done
for l in /var/log/containers/*; do
  case "$(readlink "$l" 2>/dev/null)" in "$dir"/*) rm -f "$l" ;; esac
done
[ -e "/sys/class/net/$bridge" ] && ip link del "$bridge" 2>/dev/null
rm -f /var/lib/cni/results/"$bridge"-* 2>/dev/null
for created in "$@"; do
  [ -d "$created" ] || continue
  if [ "$created" = /var/lib/kubelet ]; then
    pgrep -x kubelet >/dev/null || rm -rf "$created"
  else
    find "$created" -depth -type d -empty -delete 2>/dev/null
  fi
done
if [ "$keep" = keep ]; then
  rm -rf "$dir/containerd" "$dir/kubelet" "$dir/cni"
else
  rm -rf "$dir"
fi
"#;

/// The janitor of one node.
#[derive(Debug)]
pub struct Janitor {
    child: Child,
    lifeline: Option<ChildStdin>,
}

/// What the janitor needs to know.
pub struct Scope<'a> {
    pub dir: &'a Path,
    pub cgroup_root: &'a str,
    pub socket: &'a Path,
    pub bridge: &'a str,
    pub keep_logs: bool,
    pub created_host_dirs: &'a [PathBuf],
}

impl Janitor {
    pub fn start(scope: &Scope<'_>) -> Result<Self, Error> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("node-janitor")
            .arg(scope.dir)
            .arg(scope.cgroup_root)
            .arg(scope.socket)
            .arg(scope.bridge)
            .arg(if scope.keep_logs { "keep" } else { "remove" })
            .args(scope.created_host_dirs)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| Error::StartProcess {
                name: "node janitor".to_owned(),
                source,
            })?;
        let lifeline = child.stdin.take();
        Ok(Self { child, lifeline })
    }

    /// Runs the cleanup now and waits (bounded) for it to finish.
    pub fn clean(&mut self) {
        self.lifeline.take();
        for _ in 0..600 {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        self.clean();
    }
}

/// What of a node is still on the host, one line per thing; empty when teardown was complete.
pub fn leftovers(
    dir: &Path,
    cgroup_root: &str,
    socket: &Path,
    bridge: &str,
    keep_logs: bool,
) -> Vec<String> {
    let mut left = Vec::new();
    let dir_text = dir.display().to_string();
    let socket_text = socket.display().to_string();
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for entry in procs.filter_map(Result::ok) {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if (cmdline.contains(&dir_text) || cmdline.contains(&socket_text))
                && !cmdline.contains("node-janitor")
            {
                left.push(format!(
                    "process {}: {}",
                    entry.file_name().to_string_lossy(),
                    cmdline.trim()
                ));
            }
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for mount in super::config::mounts_under(&mountinfo, dir) {
        left.push(format!("mount {mount}"));
    }
    for hierarchy in super::config::cgroup_hierarchies() {
        let cgroup = hierarchy.join(cgroup_root.trim_start_matches('/'));
        if cgroup.exists() {
            left.push(format!("cgroup {}", cgroup.display()));
        }
    }
    if let Ok(links) = std::fs::read_dir("/var/log/containers") {
        for link in links.filter_map(Result::ok) {
            if std::fs::read_link(link.path()).is_ok_and(|target| target.starts_with(dir)) {
                left.push(format!("log link {}", link.path().display()));
            }
        }
    }
    // Shim sockets live in a directory every containerd shares; one nobody listens on is a leftover, whoever
    // left it (a live node's sockets accept connections).
    if let Ok(sockets) = std::fs::read_dir(SHIM_SOCKET_DIR) {
        for socket in sockets.filter_map(Result::ok) {
            if std::os::unix::net::UnixStream::connect(socket.path()).is_err() {
                left.push(format!("stale shim socket {}", socket.path().display()));
            }
        }
    }
    if Path::new("/sys/class/net").join(bridge).exists() {
        left.push(format!("bridge {bridge}"));
    }
    for sub in ["containerd", "kubelet", "cni"] {
        if dir.join(sub).exists() {
            left.push(format!("directory {}", dir.join(sub).display()));
        }
    }
    if !keep_logs && dir.exists() {
        left.push(format!("directory {}", dir.display()));
    }
    left
}
