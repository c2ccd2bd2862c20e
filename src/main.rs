//! The binary: the allocator, then the command line's command (`cli::process`).

use std::process::ExitCode;

/// jemalloc, for what it hands back to the system: sled rewrites its values whole, and
/// with mimalloc the memory held grew with every million done keys at the same CPU per
/// delivery (figures in `docs/performance.md`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts (`_RJEM_MALLOC_CONF` in the environment still
/// overrides them). One arena instead of four per CPU: each thread (the workers, sled's,
/// the main runtime's) would otherwise keep freed pages in an arena of its own.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_OPTIONS: &u8 = &b"narenas:1\0"[0];

fn main() -> ExitCode {
    dedupe_proxy::cli::process::main()
}
