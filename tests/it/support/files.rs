//! Files of the repository, by their path in it.

use std::path::{Path, PathBuf};

/// A file or folder of the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}
