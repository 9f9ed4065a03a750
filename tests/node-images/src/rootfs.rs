//! Root filesystems for dynamically linked binaries.
//!
//! The project's binaries link glibc dynamically (the Dockerfile's runtime image, distroless/cc, is glibc
//! plus libgcc for that reason). A static build would need the musl target, which the toolchain here does
//! not have and cannot download; so an image gets the host's copies of exactly the libraries `ldd` names,
//! at the same paths, plus the dynamic loader. That is the same glibc the binary was linked against, which
//! is what makes it work.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tar::Entry;
use crate::{Error, Result};

/// The shared objects an `ldd` listing names: resolved libraries (`name => /path (addr)`) and the loader
/// (`/path (addr)`), not the kernel's vDSO.
pub fn parse_ldd(listing: &str) -> Vec<PathBuf> {
    listing
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// `ldd binary`, parsed. A static binary has no dependencies.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| Error::Ldd {
            binary: binary.to_owned(),
            reason: e.to_string(),
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stdout.contains("not a dynamic executable") || stderr.contains("not a dynamic executable") {
        return Ok(Vec::new());
    }
    if !output.status.success() {
        return Err(Error::Ldd {
            binary: binary.to_owned(),
            reason: format!("{}: {stderr}", output.status),
        });
    }
    if let Some(missing) = stdout.lines().find(|l| l.contains("not found")) {
        return Err(Error::Ldd {
            binary: binary.to_owned(),
            reason: format!("a library is missing: {}", missing.trim()),
        });
    }
    Ok(parse_ldd(&stdout))
}

/// Builds the entries of a root filesystem: directories are created as files need them.
#[derive(Debug, Default)]
pub struct Rootfs {
    dirs: BTreeSet<String>,
    entries: Vec<Entry>,
}

impl Rootfs {
    pub fn new() -> Self {
        let mut this = Self::default();
        this.dir("tmp", 0o1777);
        this.dir("etc", 0o755);
        // Names for root and the distroless nonroot user, so tools that look the user up find it.
        this.file(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
                .to_vec(),
        );
        this.file(
            "etc/group",
            0o644,
            b"root:x:0:\nnonroot:x:65532:\n".to_vec(),
        );
        this
    }

    fn dir(&mut self, path: &str, mode: u32) {
        if self.dirs.insert(path.to_owned()) {
            self.entries.push(Entry::Dir {
                path: path.to_owned(),
                mode,
            });
        }
    }

    fn parents(&mut self, path: &str) {
        let mut at = 0;
        while let Some(i) = path[at..].find('/') {
            let dir = &path[..at + i];
            self.dir(dir, 0o755);
            at += i + 1;
        }
    }

    /// A file with the given contents (root-owned).
    pub fn file(&mut self, path: &str, mode: u32, contents: Vec<u8>) {
        self.parents(path);
        self.entries.push(Entry::File {
            path: path.to_owned(),
            mode,
            uid: 0,
            gid: 0,
            contents,
        });
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parents(path);
        self.entries.push(Entry::Symlink {
            path: path.to_owned(),
            target: target.to_owned(),
        });
    }

    /// Copies a host file (following symbolic links) to `at`.
    pub fn copy(&mut self, host: &Path, at: &str, mode: u32) -> Result<()> {
        let contents = std::fs::read(host).map_err(|source| Error::Read {
            path: host.to_owned(),
            source,
        })?;
        self.file(at, mode, contents);
        Ok(())
    }

    /// Copies `binary` to `at` with every shared library it needs, at the paths the loader looks for them.
    pub fn binary(&mut self, binary: &Path, at: &str) -> Result<()> {
        for library in shared_libraries(binary)? {
            let path = library.to_string_lossy().trim_start_matches('/').to_owned();
            if !self.entries.iter().any(|e| e.path() == path) {
                self.copy(&library, &path, 0o755)?;
            }
        }
        self.copy(binary, at.trim_start_matches('/'), 0o755)
    }

    pub fn into_entries(self) -> Vec<Entry> {
        self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_listings_name_libraries_and_the_loader() {
        let listing = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                       \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                       \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                       \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(listing),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse_ldd("\tstatically linked\n").is_empty());
    }

    #[test]
    fn a_binary_comes_with_its_libraries_and_parent_directories() {
        let mut rootfs = Rootfs::new();
        rootfs.binary(Path::new("/bin/sh"), "/sh").unwrap();
        let entries = rootfs.into_entries();
        let paths: Vec<&str> = entries.iter().map(Entry::path).collect();
        assert!(paths.contains(&"sh"), "{paths:?}");
        assert!(paths.contains(&"lib64/ld-linux-x86-64.so.2"), "{paths:?}");
        assert!(paths.contains(&"lib64"), "{paths:?}");
        // Every parent directory comes before what it holds.
        for (i, path) in paths.iter().enumerate() {
            if let Some((parent, _)) = path.rsplit_once('/') {
                assert!(paths[..i].contains(&parent), "{path} before {parent}");
            }
        }
    }
}
