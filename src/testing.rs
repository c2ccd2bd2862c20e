//! What this crate's integration tests and fuzz targets reach inside the proxy, behind the
//! `testing` feature: functions whose inputs a property test or a fuzzer tries, the
//! presets and the check for misleading characters that tests compare with, and the
//! per-core runtimes some tests start by hand. Not part of the proxy.

pub use crate::body::empty as empty_body;
pub use crate::misleading::is_misleading;
pub use crate::order::{SORT_KEY_DIGITS, parse_version};
pub use crate::preset::Preset;
pub use crate::target::{addressed, normal_path};
pub use crate::upstream::outbound;
pub use crate::workers::{Workers, current as current_worker};
