//! gpool-proto: the gpool.v1 wire contract (generated code) and its
//! conversions to gpool-core types, which live in `convert` (and `states`,
//! which it re-exports) and nowhere else.

#[allow(clippy::all, clippy::pedantic)]
#[rustfmt::skip]
pub mod pb {
    include!("gen/gpool.v1.rs");
    /// Held with its specs encoded (`submit`).
    pub use crate::submit::SubmitJobsRequest;
    /// Sent with its jobs encoded where gpoold reads them (`listing`).
    pub use crate::listing::ListJobsResponse;
}

pub mod convert;
pub mod dial;
pub mod inherited;
pub mod listing;
mod states;
pub mod submit;

/// The largest request gpoold takes unless its config says otherwise
/// (`max_message_size`): a batch of jobs, or anything else a client sends.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// The largest message any gpool program decodes from another, and the
/// most `max_message_size` may be. A job spec is far smaller (see the
/// limits in `gpool_core::spec`), so every Launch reaches its agent.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The largest reply gpoold sends the CLI (a page of listed jobs holds many
/// specs).
pub const MAX_REPLY_BYTES: usize = 1024 * 1024 * 1024;

/// gRPC metadata key that carries the caller's user name (trusted in dev
/// mode only).
pub const USER_METADATA_KEY: &str = "x-gpool-user";

/// Where a running dev controller (`gpoold --dev`) records its address, so
/// that `gpool` finds it without `--server`: `$XDG_RUNTIME_DIR/gpool/dev.addr`,
/// else `<tmp>/gpool-<uid>/dev.addr`.
pub fn dev_address_file() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => std::path::Path::new(&dir).join("gpool").join("dev.addr"),
        _ => std::env::temp_dir()
            .join(format!("gpool-{}", nix::unistd::getuid()))
            .join("dev.addr"),
    }
}
