//! Open files: each connection a sender opens takes a descriptor, and so does each one to
//! the app, besides the store's connections, sled's files and the runtime's own. A process
//! out of descriptors fails every accept with EMFILE, probes included. So at start the soft
//! limit is raised to the hard one (as Go's runtime does), and if the limit still cannot
//! carry `limits.max_connections` and `limits.max_requests`, both are lowered to fit, with
//! a warning: below the limit, connections over `max_connections` are refused politely
//! and the admin port keeps descriptors of its own.

use crate::config::Limits;

/// Descriptors kept for what is neither a connection nor the store's: sled's files, the
/// runtime's, the log's, the configuration watcher's, the trace exporter's.
pub const RESERVED: u64 = 64;

/// Descriptors kept for the admin port: its connections and those it refuses.
pub const ADMIN: u64 = 2 * crate::admin::MAX_CONNECTIONS as u64;

/// Connections the proxy listener takes beyond `max_connections` to refuse them (see
/// `server.rs`).
pub const OVER_LIMIT: u64 = crate::server::MAX_OVER_LIMIT as u64;

/// The fewest requests and connections worth starting with.
const FEWEST: u64 = 8;

/// The descriptors `limits` need besides `store`'s: a connection per sender, and per
/// request in progress up to two to the app (a worker's idle connections close a second
/// or two after use, while another worker may open its own), and the reserves.
pub fn needed(limits: &Limits, store: u64) -> u64 {
    limits.max_connections as u64
        + 2 * limits.max_requests as u64
        + OVER_LIMIT
        + ADMIN
        + RESERVED
        + store
}

/// Raises the soft limit on open files to the hard one, and returns `limits` as the
/// limit can carry them beside `store` connections of the store, with a warning if they
/// had to be lowered; an error if it cannot carry even a few connections.
pub fn fit(limits: &Limits, store: u64) -> Result<(Limits, Option<String>), String> {
    let available = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        // No limit to read (not a Unix): nothing to fit.
        Err(_) => return Ok((limits.clone(), None)),
    };
    fit_within(limits, store, available)
}

/// [`fit`] with `available` descriptors.
fn fit_within(
    limits: &Limits,
    store: u64,
    available: u64,
) -> Result<(Limits, Option<String>), String> {
    let needed = needed(limits, store);
    if needed <= available {
        return Ok((limits.clone(), None));
    }
    let kept = OVER_LIMIT + ADMIN + RESERVED + store;
    let room = available.saturating_sub(kept);
    // Each request may take a sender's connection and two to the app.
    let weight = limits.max_connections as u64 + 2 * limits.max_requests as u64;
    let share = |value: usize| (value as u64 * room / weight).max(1);
    let (connections, requests) = (share(limits.max_connections), share(limits.max_requests));
    if connections < FEWEST || requests < FEWEST {
        return Err(format!(
            "the open-file limit ({available}) leaves no room for connections: the proxy needs about {needed} for limits.max_connections {} and max_requests {} (and its store's connections), and at least {} for any; raise it (ulimit -n, systemd's LimitNOFILE=, the container runtime's nofile)",
            limits.max_connections,
            limits.max_requests,
            kept + 3 * FEWEST
        ));
    }
    let fitted = Limits {
        max_connections: connections as usize,
        max_requests: requests as usize,
        ..limits.clone()
    };
    let warning = format!(
        "the open-file limit ({available}) cannot carry limits.max_connections {} and max_requests {} (about {needed} descriptors with the store's connections): lowered to {connections} and {requests}; raise the limit (ulimit -n, systemd's LimitNOFILE=, the container runtime's nofile) to keep them",
        limits.max_connections, limits.max_requests
    );
    Ok((fitted, Some(warning)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(connections: usize, requests: usize) -> Limits {
        Limits {
            max_connections: connections,
            max_requests: requests,
            ..Limits::default()
        }
    }

    #[test]
    fn limits_that_fit_are_kept() {
        let asked = limits(1024, 1024);
        let (kept, warning) = fit_within(&asked, 10, needed(&asked, 10)).unwrap();
        assert_eq!(kept, asked);
        assert_eq!(warning, None);
    }

    #[test]
    fn limits_that_do_not_fit_are_lowered_in_proportion_with_a_warning() {
        let (fitted, warning) = fit_within(&limits(3000, 1000), 10, 1024).unwrap();
        assert!(needed(&fitted, 10) <= 1024, "{fitted:?}");
        let three_to_one = fitted.max_connections as i64 - 3 * fitted.max_requests as i64;
        assert!(three_to_one.abs() <= 3, "{fitted:?}");
        let warning = warning.unwrap();
        assert!(warning.contains("open-file limit (1024)"), "{warning}");
        assert!(warning.contains("lowered to"), "{warning}");
    }

    #[test]
    fn a_limit_with_no_room_for_connections_stops_the_start() {
        let error = fit_within(&limits(1024, 1024), 10, 250).unwrap_err();
        assert!(error.contains("ulimit -n"), "{error}");
    }
}
