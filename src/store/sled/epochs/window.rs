//! Expiry windows: the span of time whose done records share one sled tree, and that
//! tree's name.

use crate::store::Millis;

/// Epoch trees are named `epoch.<width>.<end>.<layout>`, in milliseconds; the layout is
/// `chunks`, or the bucket width of a tree that files its records by key.
const TREE_PREFIX: &str = "epoch.";

/// The layout part of a tree that files its records in chunks, in the order written.
const CHUNKS: &str = "chunks";

/// How a window's tree files its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// In the order they were written, a few to a chunk (every tree this version
    /// creates).
    Chunks,
    /// By record key: the records whose keys share their first `bucket_bytes` bytes
    /// share a bucket (trees earlier versions created, read and written until their
    /// window ends).
    ByKey { bucket_bytes: usize },
}

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

    pub(super) fn tree_name(self, layout: Layout) -> String {
        let (width, end) = (self.width, self.end);
        match layout {
            Layout::Chunks => format!("{TREE_PREFIX}{width}.{end}.{CHUNKS}"),
            Layout::ByKey { bucket_bytes } => format!("{TREE_PREFIX}{width}.{end}.{bucket_bytes}"),
        }
    }

    /// The window and layout of an epoch tree's name.
    pub(super) fn from_tree_name(name: &[u8]) -> Option<(Window, Layout)> {
        let name = std::str::from_utf8(name).ok()?.strip_prefix(TREE_PREFIX)?;
        let (window, layout) = name.rsplit_once('.')?;
        let layout = match layout {
            CHUNKS => Layout::Chunks,
            bytes => Layout::ByKey {
                bucket_bytes: bytes
                    .parse()
                    .ok()
                    .filter(|bytes| (1..=16).contains(bytes))?,
            },
        };
        let (width, end) = window.split_once('.')?;
        Some((
            Window {
                end: end.parse().ok()?,
                width: width.parse().ok()?,
            },
            layout,
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
        for layout in [Layout::Chunks, Layout::ByKey { bucket_bytes: 3 }] {
            assert_eq!(
                Window::from_tree_name(window.tree_name(layout).as_bytes()),
                Some((window, layout))
            );
        }
        assert!(window.tree_name(Layout::Chunks).ends_with(".chunks"));
        assert_eq!(Window::from_tree_name(b"done"), None);
        assert_eq!(Window::from_tree_name(b"epoch.1024.2048"), None);
        assert_eq!(Window::from_tree_name(b"epoch.1024.2048.0"), None);
        assert_eq!(Window::from_tree_name(b"epoch.1024.2048.chunk"), None);
        assert_eq!(Window::from_tree_name(b"__sled__default"), None);
    }
}
