//! A minimal ustar writer: regular files, directories and symbolic links, which is all an image layer of
//! this tier holds. Written here rather than taken from a crate because it is small and its output must be
//! byte-for-byte reproducible (the layer's digest is the image's identity).

use crate::{Error, Result};

const BLOCK: usize = 512;

/// One entry of an archive. Paths are relative (`lib/x.so`), directories without a trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
        contents: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::Dir { path, .. } | Entry::File { path, .. } | Entry::Symlink { path, .. } => {
                path
            }
        }
    }
}

/// The archive of `entries`, in the given order, with every timestamp at zero.
pub fn archive(entries: &[Entry]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for entry in entries {
        match entry {
            Entry::Dir { path, mode } => {
                out.extend(header(&format!("{path}/"), *mode, 0, 0, 0, b'5', "")?);
            }
            Entry::File {
                path,
                mode,
                uid,
                gid,
                contents,
            } => {
                out.extend(header(
                    path,
                    *mode,
                    *uid,
                    *gid,
                    contents.len() as u64,
                    b'0',
                    "",
                )?);
                out.extend_from_slice(contents);
                out.resize(out.len().next_multiple_of(BLOCK), 0);
            }
            Entry::Symlink { path, target } => {
                out.extend(header(path, 0o777, 0, 0, 0, b'2', target)?);
            }
        }
    }
    // The end of an archive: two zero blocks.
    out.resize(out.len() + 2 * BLOCK, 0);
    Ok(out)
}

fn header(
    path: &str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    kind: u8,
    link: &str,
) -> Result<[u8; BLOCK]> {
    let bad = |reason: &str| Error::TarEntry {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if path.is_empty() || path.starts_with('/') {
        return Err(bad("paths must be relative and non-empty"));
    }
    let (prefix, name) = split_path(path).ok_or_else(|| bad("path too long for ustar"))?;
    if link.len() > 100 {
        return Err(bad("link target longer than 100 bytes"));
    }
    let mut h = [0u8; BLOCK];
    put(&mut h[0..100], name.as_bytes());
    octal(&mut h[100..108], u64::from(mode));
    octal(&mut h[108..116], u64::from(uid));
    octal(&mut h[116..124], u64::from(gid));
    if size >= 8u64.pow(11) {
        return Err(bad("file larger than 8 GiB"));
    }
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0);
    h[156] = kind;
    put(&mut h[157..257], link.as_bytes());
    put(&mut h[257..263], b"ustar\0");
    put(&mut h[263..265], b"00");
    put(&mut h[345..500], prefix.as_bytes());
    // The checksum is computed with its own field as spaces.
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let digits = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(digits.as_bytes());
    Ok(h)
}

/// Splits a path into ustar's prefix (up to 155 bytes) and name (up to 100 bytes) at a slash.
fn split_path(path: &str) -> Option<(&str, &str)> {
    if path.len() <= 100 {
        return Some(("", path));
    }
    path.match_indices('/')
        .map(|(i, _)| (&path[..i], &path[i + 1..]))
        .find(|(prefix, name)| prefix.len() <= 155 && name.len() <= 100 && !name.is_empty())
}

fn put(field: &mut [u8], value: &[u8]) {
    field[..value.len()].copy_from_slice(value);
}

/// Zero-padded octal with a terminating NUL, filling the field.
fn octal(field: &mut [u8], value: u64) {
    let last = field.len() - 1;
    let digits = format!("{value:0last$o}");
    field[..last].copy_from_slice(digits.as_bytes());
    field[last] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn sample() -> Vec<Entry> {
        vec![
            Entry::Dir {
                path: "lib".into(),
                mode: 0o755,
            },
            Entry::File {
                path: "lib/a.so".into(),
                mode: 0o644,
                uid: 0,
                gid: 0,
                contents: b"hello".to_vec(),
            },
            Entry::File {
                path: format!("{}/{}", "d".repeat(120), "f".repeat(90)),
                mode: 0o755,
                uid: 65532,
                gid: 65532,
                contents: vec![7; 1000],
            },
            Entry::Symlink {
                path: "listener".into(),
                target: "ghalistener".into(),
            },
        ]
    }

    #[test]
    fn the_system_tar_reads_what_we_write() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.tar");
        std::fs::write(&file, archive(&sample()).unwrap()).unwrap();
        let listing = Command::new("tar")
            .args(["-tvf"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(listing.status.success(), "{listing:?}");
        let text = String::from_utf8(listing.stdout).unwrap();
        assert!(text.contains("lib/a.so"), "{text}");
        assert!(text.contains("65532/65532"), "{text}");
        assert!(text.contains("listener -> ghalistener"), "{text}");
        assert!(text.contains(&"f".repeat(90)), "{text}");
        let out = dir.path().join("x");
        std::fs::create_dir(&out).unwrap();
        let extract = Command::new("tar")
            .arg("-xf")
            .arg(&file)
            .arg("-C")
            .arg(&out)
            .status()
            .unwrap();
        assert!(extract.success());
        assert_eq!(std::fs::read(out.join("lib/a.so")).unwrap(), b"hello");
    }

    #[test]
    fn archives_are_reproducible_and_block_aligned() {
        let a = archive(&sample()).unwrap();
        assert_eq!(a, archive(&sample()).unwrap());
        assert_eq!(a.len() % BLOCK, 0);
    }

    #[test]
    fn bad_paths_are_refused() {
        for path in ["", "/abs", &"x".repeat(300)] {
            let entry = Entry::Dir {
                path: path.to_owned(),
                mode: 0o755,
            };
            assert!(archive(&[entry]).is_err(), "{path:?}");
        }
    }
}
