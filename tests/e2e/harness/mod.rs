//! Starting the real binaries in temp dirs on loopback ports.

pub mod cluster;
pub mod process;
