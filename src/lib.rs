//! provm's features over its engine (`provm_engine`): the debugger, hypervisor
//! blame, forks, queries and exports, reproducibility checks, provenance
//! graphs and trace inspection. Each is a module with one entry point; the
//! command line (`main.rs` and `cli/`) parses arguments and dispatches to them.

#![forbid(unsafe_code)]

pub mod agent_outputs;
pub mod analyses;
pub mod blame;
pub mod diff;
pub mod explain;
pub mod export;
pub mod fork;
pub mod gdb;
pub mod inspect;
pub mod observers;
pub mod output;
pub mod provenance;
pub mod query;
pub mod repro;
