//! Starting the real binaries in temp dirs on loopback ports (or on
//! addresses in network namespaces the tests create).

pub mod cluster;
pub mod netns;
pub mod process;
