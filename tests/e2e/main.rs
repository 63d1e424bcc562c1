//! End-to-end tests: the real gpoold and gpool binaries on loopback ports in
//! temp dirs. Build the binaries first: `cargo build --workspace`.

mod harness;

mod accounting;
mod agents;
mod arrays;
mod bad_input;
mod cgroup_v2;
mod crashes;
mod differential;
mod disk;
mod durability;
mod faults;
mod fractions;
mod ha;
mod health;
mod history;
mod interactive;
mod jobs;
mod las;
mod metrics;
mod notify;
mod nvml;
mod placement;
mod power;
mod preemption;
mod security;
mod sharing;
mod sim;
mod slurm_scripts;
mod status_page;
mod systemd;
mod watches;
