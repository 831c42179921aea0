//! The local stack: see the crate description.
