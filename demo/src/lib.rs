//! The demo's library part: its command line ([`cli`]), so the settings
//! reference is generated from the binary's own definition.

pub mod cli;
