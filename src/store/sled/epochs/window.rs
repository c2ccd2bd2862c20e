//! Expiry windows: the span of time whose done records share one sled tree, and that
//! tree's name.

use crate::store::Millis;

/// Epoch trees are named `epoch.<width>.<end>.<bucket bytes>`, in milliseconds.
const TREE_PREFIX: &str = "epoch.";

/// The narrowest window.
pub(super) const MIN_WIDTH: Millis = 1024;

/// The time window `[end - width, end)` of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Window {
    pub(super) end: Millis,
    pub(super) width: Millis,
}

impl Window {
    /// The window of a record expiring at `expires_at` that was kept for `retention`.
    /// Its width is a power of two near an eighth of the retention: about eight to
    /// sixteen trees hold a route's records, and an expired record stays on disk at most
    /// an eighth of its retention longer.
    pub(super) fn holding(expires_at: Millis, retention: Millis) -> Window {
        let target = (retention / 8).max(MIN_WIDTH);
        let width = 1 << target.ilog2();
        Window {
            end: (expires_at / width).saturating_add(1).saturating_mul(width),
            width,
        }
    }

    pub(super) fn tree_name(self, bucket_bytes: usize) -> String {
        format!("{TREE_PREFIX}{}.{}.{bucket_bytes}", self.width, self.end)
    }

    /// The window and bucket width of an epoch tree's name.
    pub(super) fn from_tree_name(name: &[u8]) -> Option<(Window, usize)> {
        let name = std::str::from_utf8(name).ok()?.strip_prefix(TREE_PREFIX)?;
        let (window, bucket_bytes) = name.rsplit_once('.')?;
        let bucket_bytes = bucket_bytes
            .parse()
            .ok()
            .filter(|bytes| (1..=16).contains(bytes))?;
        let (width, end) = window.split_once('.')?;
        Some((
            Window {
                end: end.parse().ok()?,
                width: width.parse().ok()?,
            },
            bucket_bytes,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_about_an_eighth_of_the_retention_and_name_their_trees() {
        let day = 86_400_000;
        let window = Window::holding(1_800_000_000_000, 7 * day);
        assert!(window.width <= 7 * day / 8 && window.width > 7 * day / 16);
        assert!(window.end > 1_800_000_000_000);
        assert!(window.end - window.width <= 1_800_000_000_000);
        assert_eq!(Window::holding(5_000, 1_000).width, MIN_WIDTH);
        assert_eq!(
            Window::from_tree_name(window.tree_name(3).as_bytes()),
            Some((window, 3))
        );
        assert_eq!(Window::from_tree_name(b"done"), None);
        assert_eq!(Window::from_tree_name(b"epoch.1024.2048"), None);
        assert_eq!(Window::from_tree_name(b"epoch.1024.2048.0"), None);
        assert_eq!(Window::from_tree_name(b"__sled__default"), None);
    }
}
