//! gpool-core: the domain model and every scheduling decision, as pure functions.
//!
//! Nothing in this crate does I/O, spawns, sleeps or reads a clock: time comes
//! in as an argument, results come out as data.

pub mod accounting;
pub mod array;
pub mod auth;
pub mod deps;
pub mod enforce;
pub mod feasibility;
pub mod fencing;
pub mod fragmentation;
pub mod health;
pub mod ids;
pub mod job_state;
pub mod model;
pub mod policy;
pub mod power;
pub mod sched;
pub mod sessions;
pub mod share;
pub mod sim;
pub mod slurm;
pub mod spec;
pub mod stragglers;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod toml_text;
pub mod topology;

pub use ids::{Epoch, JobId, Timestamp};
pub use job_state::{IllegalTransition, JobEvent, JobState};
pub use model::{Gpu, GpuModel, Job, JobSpec, Node, NodePlacement, NodeState, PoolDef};
