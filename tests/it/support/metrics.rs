//! Metrics as a scraper reads them from an admin port.

use std::net::SocketAddr;

use super::client::send;

/// The text of `GET /metrics` on `admin`.
pub async fn scrape(admin: SocketAddr) -> String {
    send(admin, "GET", "/metrics", &[], "").await.body
}

/// The value of the series `series` (its name and labels, as exposed) in scraped `text`.
pub fn series_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{series}` in:\n{text}"))
}

/// The value of `series` on `admin` now.
pub async fn metric_at(admin: SocketAddr, series: &str) -> f64 {
    series_value(&scrape(admin).await, series)
}
