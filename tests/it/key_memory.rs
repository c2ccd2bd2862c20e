//! A JSON key costs no memory beyond the body: extracting it from a 1 MiB body of half a
//! million tiny values allocates almost nothing, where parsing the body into a
//! `serde_json::Value` first would take tens of MiB, per delivery, at the sender's choice.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use dedupe_proxy::key::{Delivery, KeyTemplate};
use http::HeaderMap;

/// Counts the bytes this thread allocated and has not freed, and their peak. Per thread:
/// the other tests of the binary allocate at the same time, on threads of their own.
struct Counting;

thread_local! {
    // Negative while this thread frees more than it allocated since it started.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn counted(change: isize) {
    // `try_with`: an allocation while the thread's locals are torn down goes uncounted.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + change;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(layout.size().cast_signed());
        // SAFETY: forwards the caller's layout to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        counted(-layout.size().cast_signed());
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most memory `work` held at once, on this thread, beyond what was live before it.
fn peak_of<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(before));
    let result = work();
    let peak = PEAK.with(Cell::get) - before;
    (result, peak.unsigned_abs())
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
