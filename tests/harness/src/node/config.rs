//! The node's configuration files, as pure functions of its paths and names.

use std::path::Path;

use serde_json::json;

/// Everything the files name.
#[derive(Debug, Clone)]
pub struct Layout<'a> {
    pub dir: &'a Path,
    pub node_ip: &'a str,
    pub cgroup_root: &'a str,
    pub pause_image: &'a str,
    pub cni_bin_dir: &'a Path,
    pub bridge: &'a str,
    pub kubelet_port: u16,
    pub kubelet_healthz_port: u16,
    pub client_ca: &'a Path,
}

impl Layout<'_> {
    pub fn containerd_dir(&self) -> std::path::PathBuf {
        self.dir.join("containerd")
    }
    pub fn containerd_socket(&self) -> std::path::PathBuf {
        self.containerd_dir().join("containerd.sock")
    }
    pub fn cni_conf_dir(&self) -> std::path::PathBuf {
        self.dir.join("cni").join("net.d")
    }
    pub fn kubelet_root(&self) -> std::path::PathBuf {
        self.dir.join("kubelet")
    }
    pub fn pod_logs_dir(&self) -> std::path::PathBuf {
        self.dir.join("pod-logs")
    }
}

/// containerd's config: its own root, state, socket and runc root, so several instances (and the host's own,
/// if any) never share a file; the CRI settings this VM needs.
pub fn containerd_toml(l: &Layout<'_>) -> String {
    let c = l.containerd_dir();
    let c = c.display();
    format!(
        r#"version = 2
root = "{c}/root"
state = "{c}/state"
# Snapshotters that need host setup or kernel modules; overlayfs is the one used.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{c}/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "{c}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails in runc create.
  restrict_oom_score_adj = true
  # A fixed port (the default 10010) would collide between nodes.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{c}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"#,
        pause = l.pause_image,
        cni_bin = l.cni_bin_dir.display(),
        cni_conf = l.cni_conf_dir().display(),
    )
}

/// A bridge network for pods without `hostNetwork`. The tier's pods use host networking (see
/// docs/development.md); containerd still reports the node's network ready only once a network config
/// exists. Its IPAM state stays in the node's directory.
pub fn cni_conflist(l: &Layout<'_>) -> String {
    json!({
        "cniVersion": "0.4.0",
        "name": l.bridge,
        "plugins": [
            {
                "type": "bridge",
                "bridge": l.bridge,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.244.0.0/24"}]],
                    "dataDir": l.dir.join("cni").join("ipam"),
                },
            },
            {"type": "loopback"},
        ],
    })
    .to_string()
}

/// The kubelet's configuration (JSON, which its YAML reader takes).
pub fn kubelet_config(l: &Layout<'_>) -> String {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // The host is cgroup v1, which v1.36 refuses unless told.
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": l.cgroup_root,
        // Otherwise the kubelet adds KUBE-FIREWALL chains, with a DROP rule for non-loopback sources to
        // 127.0.0.0/8, to the host's iptables.
        "makeIPTablesUtilChains": false,
        "containerRuntimeEndpoint": format!("unix://{}", l.containerd_socket().display()),
        "podLogsDir": l.pod_logs_dir(),
        "volumePluginDir": l.dir.join("volume-plugins"),
        // Ports of their own, so two nodes can share the host; the read-only port off.
        "address": l.node_ip,
        "port": l.kubelet_port,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": l.kubelet_healthz_port,
        "readOnlyPort": 0,
        // Only the control plane's CA's certificates authenticate; nothing anonymous.
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": false},
            "x509": {"clientCAFile": l.client_ca},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "failSwapOn": false,
        "serializeImagePulls": false,
        // The imported images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        // The node shares a build host's disk, which other builds fill and empty by gigabytes: thresholds in
        // percent (2% of a 250 GB disk is 5 GB) tainted the node with disk pressure mid-test. A test node needs
        // little room; what it must not do is stop scheduling because of somebody else's build.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "256Mi",
            "imagefs.available": "256Mi",
            "nodefs.inodesFree": "1%",
        },
    })
    .to_string()
}

/// The cgroup v1 hierarchies under `/sys/fs/cgroup` (and the v2 `unified` one of a hybrid host): every
/// directory that holds a `cgroup.procs`.
pub fn cgroup_hierarchies() -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut found: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file() && !p.is_symlink())
        .collect();
    found.sort();
    found
}

/// Mount points under `dir` in a `/proc/self/mountinfo` text, deepest first.
pub fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    let exact = dir.display().to_string();
    let mut found: Vec<String> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&prefix) || *point == exact)
        .map(str::to_owned)
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.len()));
    found.dedup();
    found
}

/// The first global IPv4 address in `ip -o -4 addr show scope global` output.
pub fn first_global_ipv4(ip_output: &str) -> Option<String> {
    ip_output.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == "inet")?;
        words.next()?.split('/').next().map(str::to_owned)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn layout(dir: &Path) -> Layout<'_> {
        Layout {
            dir,
            node_ip: "192.0.2.2",
            cgroup_root: "/arc-rs-n1",
            pause_image: "docker.io/arc-rs/pause:test",
            cni_bin_dir: Path::new("/usr/lib/cni"),
            bridge: "arcrs1",
            kubelet_port: 1,
            kubelet_healthz_port: 2,
            client_ca: Path::new("/cp/ca.crt"),
        }
    }

    #[test]
    fn containerd_keeps_everything_in_the_node_directory() {
        let dir = PathBuf::from("/tmp/node-x");
        let toml = containerd_toml(&layout(&dir));
        for needle in [
            r#"root = "/tmp/node-x/containerd/root""#,
            r#"state = "/tmp/node-x/containerd/state""#,
            r#"address = "/tmp/node-x/containerd/containerd.sock""#,
            r#"Root = "/tmp/node-x/containerd/runc""#,
            "restrict_oom_score_adj = true",
            "SystemdCgroup = false",
            r#"sandbox_image = "docker.io/arc-rs/pause:test""#,
            r#"stream_server_port = "0""#,
        ] {
            assert!(toml.contains(needle), "{needle} in\n{toml}");
        }
    }

    #[test]
    fn the_kubelet_has_the_settings_this_host_needs() {
        let dir = PathBuf::from("/tmp/node-x");
        let config: serde_json::Value =
            serde_json::from_str(&kubelet_config(&layout(&dir))).unwrap();
        assert_eq!(config["failCgroupV1"], false);
        assert_eq!(config["cgroupDriver"], "cgroupfs");
        assert_eq!(config["makeIPTablesUtilChains"], false);
        assert_eq!(config["evictionHard"]["nodefs.available"], "256Mi");
        assert_eq!(config["cgroupRoot"], "/arc-rs-n1");
        assert_eq!(config["podLogsDir"], "/tmp/node-x/pod-logs");
        assert_eq!(config["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(
            config["containerRuntimeEndpoint"],
            "unix:///tmp/node-x/containerd/containerd.sock"
        );
    }

    #[test]
    fn mounts_under_a_directory_come_deepest_first() {
        let info = "\
22 1 254:0 / / rw - ext4 /dev/vda rw
90 22 0:50 / /tmp/node-x/kubelet rw shared:1 - ext4 /dev/vda rw
91 90 0:51 / /tmp/node-x/kubelet/pods/u/volumes/kubernetes.io~projected/t rw - tmpfs tmpfs rw
92 22 0:52 / /tmp/node-xy/other rw - tmpfs tmpfs rw
";
        assert_eq!(
            mounts_under(info, Path::new("/tmp/node-x")),
            vec![
                "/tmp/node-x/kubelet/pods/u/volumes/kubernetes.io~projected/t".to_owned(),
                "/tmp/node-x/kubelet".to_owned(),
            ]
        );
    }

    #[test]
    fn the_node_ip_is_the_first_global_address() {
        let out = "2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever\n";
        assert_eq!(first_global_ipv4(out).as_deref(), Some("192.0.2.2"));
        assert_eq!(first_global_ipv4(""), None);
    }
}
