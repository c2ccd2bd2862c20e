//! Reading the configuration file whole, or not at all. A reload reads a file that others
//! change under it: an editor truncates and writes it in place, the kubelet swaps the
//! `..data` symlink a ConfigMap's file points through, anyone may put a FIFO or a
//! directory where it was. A file that changed while it was read could parse as valid
//! with routes missing (and their requests would pass unchecked), so such a read is
//! refused, as is anything but a regular file.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use super::errors::ConfigError;

/// The largest configuration file read: far above any real one.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// How many times in all a file that changes while it is read is read, and the pause
/// between.
const TRIES: u32 = 3;
const PAUSE: Duration = Duration::from_millis(100);

/// The file's text, read whole: see the module's doc. A read that met a change is tried
/// again a few times. Opened without blocking, so that a FIFO is refused, not waited on;
/// a filesystem that hangs still holds the calling thread (the reload runs it apart).
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    read_file_while(path, &mut |_| {})
}

/// [`read_file`], calling `meanwhile` with the try's number between each read and the
/// check that follows it: where a test changes the file.
fn read_file_while(path: &Path, meanwhile: &mut dyn FnMut(u32)) -> Result<String, ConfigError> {
    let refused = |source: std::io::Error| ConfigError::Read {
        file: path.display().to_string(),
        source,
    };
    let mut tries = 1;
    loop {
        match read_once(path, &mut || meanwhile(tries)) {
            Err(Unread::Changed) if tries < TRIES => {
                tries += 1;
                std::thread::sleep(PAUSE);
            }
            Err(Unread::Changed) => {
                return Err(refused(std::io::Error::other(
                    "the file changed while it was read, each time it was tried",
                )));
            }
            Err(Unread::Io(error)) => return Err(refused(error)),
            Ok(text) => return Ok(text),
        }
    }
}

enum Unread {
    Changed,
    Io(std::io::Error),
}

impl From<std::io::Error> for Unread {
    fn from(error: std::io::Error) -> Unread {
        Unread::Io(error)
    }
}

fn read_once(path: &Path, meanwhile: &mut dyn FnMut()) -> Result<String, Unread> {
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let before = file.metadata()?;
    if !before.file_type().is_file() {
        return Err(Unread::Io(std::io::Error::other(
            "not a regular file (a directory, a FIFO, a device?)",
        )));
    }
    if before.len() > MAX_FILE_BYTES {
        return Err(Unread::Io(std::io::Error::other(format!(
            "larger than {MAX_FILE_BYTES} bytes"
        ))));
    }
    let mut bytes = Vec::with_capacity(before.len() as usize);
    (&file).take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    meanwhile();
    let after = file.metadata()?;
    // What the path names now: another file if the symlink was swapped meanwhile.
    let named = std::fs::metadata(path)?;
    if bytes.len() as u64 != after.len() || !same(&before, &after) || !same_file(&after, &named) {
        return Err(Unread::Changed);
    }
    String::from_utf8(bytes).map_err(|_| {
        Unread::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not UTF-8 text",
        ))
    })
}

/// Whether a file's size and modification time are as they were.
fn same(before: &Metadata, after: &Metadata) -> bool {
    before.len() == after.len()
        && before.mtime() == after.mtime()
        && before.mtime_nsec() == after.mtime_nsec()
}

fn same_file(a: &Metadata, b: &Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino() && same(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "routes: []\n").unwrap();
        assert_eq!(read_file(&file).unwrap(), "routes: []\n");
        let error = read_file(dir.path()).unwrap_err().to_string();
        assert!(error.contains("not a regular file"), "{error}");
        let fifo = dir.path().join("fifo.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let error = read_file(&fifo).unwrap_err().to_string();
        assert!(error.contains("not a regular file"), "{error}");
        let large = dir.path().join("large.yaml");
        std::fs::write(&large, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        let error = read_file(&large).unwrap_err().to_string();
        assert!(error.contains("larger than"), "{error}");
    }

    /// A file changed between its read and the check after it: grown, cut short,
    /// rewritten in place at the same size, or swapped through the `..data` symlink as
    /// the kubelet does. Each is refused while it keeps happening, and the file read
    /// once a try meets no change.
    #[test]
    fn a_file_changed_while_read_is_read_again_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("..2026_12_05_a");
        let second = dir.path().join("..2026_12_05_b");
        std::fs::create_dir(&first).unwrap();
        std::fs::create_dir(&second).unwrap();
        std::fs::write(first.join("config.yaml"), "routes: []\n").unwrap();
        std::fs::write(second.join("config.yaml"), "routes: [] # b\n").unwrap();
        let data = dir.path().join("..data");
        std::os::unix::fs::symlink(&first, &data).unwrap();
        let file = dir.path().join("config.yaml");
        std::os::unix::fs::symlink(data.join("config.yaml"), &file).unwrap();
        let swap = |to: &Path| {
            let next = dir.path().join("..data_tmp");
            std::os::unix::fs::symlink(to, &next).unwrap();
            std::fs::rename(&next, &data).unwrap();
        };
        let target = || std::fs::read_link(&data).unwrap().join("config.yaml");
        let changes: [(&str, &dyn Fn()); 4] = [
            ("grown", &|| {
                let mut grown = OpenOptions::new().append(true).open(target()).unwrap();
                std::io::Write::write_all(&mut grown, b"# more\n").unwrap();
            }),
            ("cut short", &|| {
                let text = std::fs::read(target()).unwrap();
                std::fs::write(target(), &text[..text.len() / 2]).unwrap();
            }),
            ("rewritten", &|| {
                let path = target();
                let text = std::fs::read(&path).unwrap();
                let file = OpenOptions::new().write(true).open(&path).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&file, &text, 0).unwrap();
                // The kernel's clock for file times ticks every few milliseconds: a
                // rewrite within the read's tick would show no change (nor can any check).
                file.set_modified(std::time::SystemTime::now() + Duration::from_secs(1))
                    .unwrap();
            }),
            ("swapped", &|| {
                let now = std::fs::read_link(&data).unwrap();
                swap(if now == first { &second } else { &first });
            }),
        ];
        for (what, change) in changes {
            let error = read_file_while(&file, &mut |_| change())
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("changed while it was read"),
                "{what}: {error}"
            );
            let mut tries = Vec::new();
            let text = read_file_while(&file, &mut |tried| {
                tries.push(tried);
                if tried == 1 {
                    change();
                }
            })
            .unwrap();
            assert_eq!(tries, [1, 2], "{what}");
            assert_eq!(text, std::fs::read_to_string(target()).unwrap(), "{what}");
        }
    }
}
