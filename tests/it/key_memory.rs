//! A JSON key costs no memory beyond the body: extracting it from a 1 MiB body of half a
//! million tiny values allocates almost nothing, where parsing the body into a
//! `serde_json::Value` first would take tens of MiB, per delivery, at the sender's choice.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dedupe_proxy::key::{Delivery, KeyTemplate};
use http::HeaderMap;

/// Counts the bytes allocated and not yet freed, and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        // SAFETY: forwards the caller's layout to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most memory `work` held at once beyond what was live before it.
fn peak_of<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let result = work();
    (result, PEAK.load(Ordering::SeqCst) - before)
}

#[test]
fn a_json_key_costs_no_memory_beyond_the_body() {
    let zeros = vec!["0"; 500_000].join(",");
    let body = format!(r#"{{"items":[{zeros}],"nested":{{"a":[{{"b":1}}]}},"id":"evt_big"}}"#);
    assert!(body.len() > 1_000_000);
    let headers = HeaderMap::new();
    let delivery = Delivery {
        headers: &headers,
        query: None,
        body: body.as_bytes(),
    };
    let template: KeyTemplate = "{json:/id}".parse().unwrap();
    let (key, peak) = peak_of(|| template.extract(&delivery));
    assert_eq!(key.unwrap(), "evt_big");
    assert!(
        peak < 64 * 1024,
        "extracting the key held {peak} bytes at once"
    );

    // What the check guards against, measured the same way.
    let (parsed, full_parse) = peak_of(|| serde_json::from_str::<serde_json::Value>(&body));
    assert!(parsed.is_ok());
    eprintln!("peak allocation: key extraction {peak} bytes, full parse {full_parse} bytes");
    assert!(
        full_parse > 10 * 1024 * 1024,
        "a full parse held {full_parse} bytes"
    );
}
